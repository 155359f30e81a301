# Sources of src/precision that need libtorch (where the fp32 values live, part_store.h), appended
# to the dscpp library; the loss scaler needs none and is part of dscpp_base.
target_sources(dscpp PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/part_store.cpp)
