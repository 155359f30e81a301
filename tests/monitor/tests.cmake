# Test sources of tests/monitor for engine_tests: TensorBoard event files read back through their
# framing, csv_monitor's layout, and the engine's events.
list(APPEND DSCPP_ENGINE_TEST_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/monitor_test.cpp)
