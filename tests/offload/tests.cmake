# Test sources of tests/offload for engine_tests: the optimizer state swapped to disk, or stepped
# in host memory for a model on a device (a stand-in for a GPU), reproduces training without
# offload bit for bit, and bad swap folders, failing disks and failing copies give clear errors.
list(APPEND DSCPP_ENGINE_TEST_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/offload_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/host_offload_test.cpp)
