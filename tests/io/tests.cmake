# Test sources of tests/io for engine_tests: asynchronous direct I/O (both backends) and its
# fault injection. The FileSystem seam is tested with the checkpoints that use it.
list(APPEND DSCPP_ENGINE_TEST_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/async_io_test.cpp)
