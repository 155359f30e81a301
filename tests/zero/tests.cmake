# Test sources of tests/zero for engine_tests: the gradient paths, and every ZeRO stage (stage 3
# apart) against stage 0.
list(APPEND DSCPP_ENGINE_TEST_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/reducer_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stages_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stage3_test.cpp)
