# Sources of src/profiling (DeepSpeed's flops_profiler: RecordFunction callbacks counting
# matmul-like FLOPs by phase and module scope), appended to the dscpp library.
target_sources(dscpp PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/flops_profiler.cpp)
