# Sources of src/precision: the fp16 loss scaler (dscpp_base, no libtorch) and where the fp32
# values live (part_store.h, dscpp).
target_sources(dscpp_base PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/loss_scaler.cpp)
target_sources(dscpp PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/part_store.cpp)
