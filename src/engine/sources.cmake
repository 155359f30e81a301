# Sources of src/engine, appended to the dscpp library.
target_sources(dscpp PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/engine.cpp
  ${CMAKE_CURRENT_LIST_DIR}/grad_reducer.cpp)
