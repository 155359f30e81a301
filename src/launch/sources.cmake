# Sources of src/launch: dscpp launch, its hostfile, process groups and failure lines
# (dscpp_base: the launcher builds and tests without libtorch).
target_sources(dscpp_base PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/error_lines.cpp
  ${CMAKE_CURRENT_LIST_DIR}/hostfile.cpp
  ${CMAKE_CURRENT_LIST_DIR}/launcher.cpp
  ${CMAKE_CURRENT_LIST_DIR}/process_group.cpp)
