# Test sources of tests/engine for engine_tests.
list(APPEND DSCPP_ENGINE_TEST_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/engine_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/check_supported_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/check_model_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/estimate_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/train_test.cpp)
