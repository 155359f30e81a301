# Test sources of tests/profiling for engine_tests: the flops profiler's counts against the GPT's
# analytic FLOPs, convolutions, and the engine's profiled step and report.
list(APPEND DSCPP_ENGINE_TEST_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/flops_profiler_test.cpp)
