# Sources of src/engine (set-up, the step's order of events, what is supported), appended to the
# dscpp library.
target_sources(dscpp PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/engine.cpp
  ${CMAKE_CURRENT_LIST_DIR}/setup.cpp
  ${CMAKE_CURRENT_LIST_DIR}/step.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint.cpp
  ${CMAKE_CURRENT_LIST_DIR}/every_rank.cpp
  ${CMAKE_CURRENT_LIST_DIR}/check_supported.cpp
  ${CMAKE_CURRENT_LIST_DIR}/check_model.cpp
  ${CMAKE_CURRENT_LIST_DIR}/estimate.cpp
  ${CMAKE_CURRENT_LIST_DIR}/step_time.cpp)
