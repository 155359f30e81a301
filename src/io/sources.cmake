# Sources of src/io: the FileSystem seam (POSIX and fault-injecting) and safetensors.
target_sources(dscpp PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/posix_file_system.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fault_file_system.cpp
  ${CMAKE_CURRENT_LIST_DIR}/safetensors.cpp
)
