# Sources of src/offload (optimizer state swapped to disk sub-group by sub-group; stage 3's
# parameter shards swapped unit by unit; the copy streams between a GPU and host memory, CUDA
# where the build has it), appended to the dscpp library.
target_sources(dscpp PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/device_link.cpp
  ${CMAKE_CURRENT_LIST_DIR}/device_shards.cpp
  ${CMAKE_CURRENT_LIST_DIR}/grad_swapper.cpp
  ${CMAKE_CURRENT_LIST_DIR}/optimizer_swapper.cpp
  ${CMAKE_CURRENT_LIST_DIR}/param_swapper.cpp)
