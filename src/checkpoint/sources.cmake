# Sources of src/checkpoint that need the library (the manifest itself is in dscpp_base).
target_sources(dscpp PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/publish.cpp
  ${CMAKE_CURRENT_LIST_DIR}/verify.cpp
  ${CMAKE_CURRENT_LIST_DIR}/consolidate.cpp
)
