# Sources of src/precision: the fp16 loss scaler (dscpp_base, no libtorch) and where the fp32
# values live (part_store.h, dscpp) and the copies of a step in host memory for a model on a
# device (device_copies.h).
target_sources(dscpp_base PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/loss_scaler.cpp)
target_sources(dscpp PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/autocast.cpp
  ${CMAKE_CURRENT_LIST_DIR}/part_store.cpp
  ${CMAKE_CURRENT_LIST_DIR}/device_copies.cpp)
