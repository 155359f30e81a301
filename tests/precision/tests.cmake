# Test sources of tests/precision for engine_tests (the loss scaler's own test needs no libtorch
# and is in base_tests).
list(APPEND DSCPP_ENGINE_TEST_SOURCES ${CMAKE_CURRENT_LIST_DIR}/mixed_precision_test.cpp)
list(APPEND DSCPP_ENGINE_TEST_SOURCES ${CMAKE_CURRENT_LIST_DIR}/part_store_test.cpp)
