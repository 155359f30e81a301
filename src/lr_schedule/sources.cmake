# Sources of src/lr_schedule (DeepSpeed's LR schedules), appended to the dscpp library.
target_sources(dscpp PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/lr_schedule.cpp
  ${CMAKE_CURRENT_LIST_DIR}/warmup.cpp
  ${CMAKE_CURRENT_LIST_DIR}/one_cycle.cpp
  ${CMAKE_CURRENT_LIST_DIR}/lr_range_test.cpp)
