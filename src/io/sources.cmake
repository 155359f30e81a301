# Sources of src/io: the FileSystem seam's POSIX implementation, asynchronous direct I/O (io_uring
# or a thread pool) and safetensors. The interfaces are public (include/dscpp/file_system.h,
# async_io.h); the fault-injecting implementations are the tests' (tests/support/). The
# safetensors header parser needs no libtorch (dscpp_base).
target_sources(dscpp_base PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/safetensors_header.cpp)
target_sources(dscpp PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/posix_file_system.cpp
  ${CMAKE_CURRENT_LIST_DIR}/async_io.cpp
  ${CMAKE_CURRENT_LIST_DIR}/safetensors.cpp
)
