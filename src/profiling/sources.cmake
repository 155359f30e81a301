# Sources of src/profiling (DeepSpeed's flops_profiler: RecordFunction callbacks counting
# matmul-like FLOPs by phase and module scope; wall_clock_breakdown's op self times), appended to
# the dscpp library.
target_sources(dscpp PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/flops_profiler.cpp
  ${CMAKE_CURRENT_LIST_DIR}/op_times.cpp)
