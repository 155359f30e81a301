# Sources of src/data: token streams, the built-in reverse task, samples and the batch sampler.
target_sources(dscpp PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/token_streams.cpp
  ${CMAKE_CURRENT_LIST_DIR}/reverse_task.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sampler.cpp
)
