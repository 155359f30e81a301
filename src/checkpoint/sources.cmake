# Sources of src/checkpoint: the manifest (dscpp_base: the launcher's tools read it without
# libtorch); publishing, verification and consolidation (dscpp).
target_sources(dscpp_base PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/manifest.cpp)
target_sources(dscpp PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/live_snapshot.cpp
  ${CMAKE_CURRENT_LIST_DIR}/publish.cpp
  ${CMAKE_CURRENT_LIST_DIR}/verify.cpp
  ${CMAKE_CURRENT_LIST_DIR}/consolidate.cpp
)
