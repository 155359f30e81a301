# Test sources of tests/profiling for engine_tests: the flops profiler's counts against the GPT's
# analytic FLOPs, convolutions, and the engine's profiled step and report; wall_clock_breakdown's
# op self times.
list(APPEND DSCPP_ENGINE_TEST_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/flops_profiler_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/op_times_test.cpp)
