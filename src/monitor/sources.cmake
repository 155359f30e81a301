# Sources of src/monitor (DeepSpeed's tensorboard and csv_monitor), appended to the dscpp
# library. TensorBoard's event messages are compiled by protoc when protobuf is found; without
# it tensorboard.enabled is refused with the reason, and csv_monitor still works.
target_sources(dscpp PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/csv_monitor.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tensorboard.cpp)
find_package(Protobuf QUIET)
if(Protobuf_FOUND AND Protobuf_PROTOC_EXECUTABLE)
  set(DSCPP_HAVE_PROTOBUF ON)
  set(_tb_out ${CMAKE_CURRENT_BINARY_DIR}/generated/monitor)
  file(MAKE_DIRECTORY ${_tb_out})
  add_custom_command(
    OUTPUT ${_tb_out}/tensorboard_event.pb.cc ${_tb_out}/tensorboard_event.pb.h
    COMMAND ${Protobuf_PROTOC_EXECUTABLE} --cpp_out=${_tb_out}
            -I${CMAKE_CURRENT_LIST_DIR} ${CMAKE_CURRENT_LIST_DIR}/tensorboard_event.proto
    DEPENDS ${CMAKE_CURRENT_LIST_DIR}/tensorboard_event.proto
    COMMENT "protoc: TensorBoard's event messages")
  target_sources(dscpp PRIVATE ${_tb_out}/tensorboard_event.pb.cc)
  set_source_files_properties(${_tb_out}/tensorboard_event.pb.cc PROPERTIES
    SKIP_PRECOMPILE_HEADERS ON)
  target_include_directories(dscpp PRIVATE ${CMAKE_CURRENT_BINARY_DIR}/generated)
  target_include_directories(dscpp SYSTEM PRIVATE ${Protobuf_INCLUDE_DIRS})
  target_link_libraries(dscpp PRIVATE ${Protobuf_LIBRARIES})
  target_compile_definitions(dscpp PRIVATE DSCPP_HAVE_PROTOBUF=1)
  message(STATUS "dscpp: protobuf ${Protobuf_VERSION} found: TensorBoard event files")
else()
  set(DSCPP_HAVE_PROTOBUF OFF)
  message(STATUS "dscpp: protobuf (protoc) not found: tensorboard.enabled will be refused")
endif()
