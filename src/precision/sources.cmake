# Sources of src/precision that need libtorch (the fp32 master weights), appended to the dscpp
# library; the loss scaler needs none and is part of dscpp_base.
target_sources(dscpp PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/master_weights.cpp)
