# Sources of src/offload (optimizer state swapped to disk, sub-group by sub-group), appended to
# the dscpp library.
target_sources(dscpp PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/optimizer_swapper.cpp)
