# Test sources of tests/checkpoint for engine_tests: finding and verifying checkpoints on disk
# (the manifest's own tests are in base_tests).
list(APPEND DSCPP_ENGINE_TEST_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/verify_test.cpp)
