# Test sources of tests/offload for engine_tests: the optimizer state swapped to disk reproduces
# training without offload bit for bit, and bad swap folders and failing disks give clear errors.
list(APPEND DSCPP_ENGINE_TEST_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/offload_test.cpp)
