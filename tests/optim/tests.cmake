# Test sources of tests/optim for engine_tests: the fused optimizers on every kernel path
# (Optim*) and the LR schedules (LR*).
list(APPEND DSCPP_ENGINE_TEST_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/optim_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/lr_schedule_test.cpp)
