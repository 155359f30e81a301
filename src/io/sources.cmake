# Sources of src/io: the FileSystem seam (POSIX and fault-injecting), asynchronous direct I/O
# (io_uring or a thread pool, and its fault-injecting wrapper) and safetensors.
target_sources(dscpp PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/posix_file_system.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fault_file_system.cpp
  ${CMAKE_CURRENT_LIST_DIR}/async_io.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fault_async_io.cpp
  ${CMAKE_CURRENT_LIST_DIR}/safetensors.cpp
)
