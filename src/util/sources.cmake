# Sources of src/util: checksums and SHA-256, logging, memory, the fault-injection points, the process's
# environment, strings (dscpp_base, no libtorch); the machine's description (dscpp).
target_sources(dscpp_base PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/crc32c.cpp
  ${CMAKE_CURRENT_LIST_DIR}/log.cpp
  ${CMAKE_CURRENT_LIST_DIR}/memory.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fault_inject.cpp
  ${CMAKE_CURRENT_LIST_DIR}/process_env.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sha256.cpp
  ${CMAKE_CURRENT_LIST_DIR}/strings.cpp)
target_sources(dscpp PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/system_info.cpp)
