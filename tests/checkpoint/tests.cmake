# Test sources of tests/checkpoint for engine_tests: finding and verifying checkpoints on disk, and
# the engine's save and load end to end, crash trials with real kills
# (the manifest's own tests are in base_tests).
list(APPEND DSCPP_ENGINE_TEST_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/verify_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/engine_checkpoint_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/background_save_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/crash_test.cpp)
