# Sources of src/models: the built-in GPT and its fused bf16 kernels (NOTE [GPT fused kernels]
# in fused_ops.h). As for the optimizer's (src/optim/sources.cmake), only kernels_avx512.cpp gets
# -m flags, and the kernel files skip the precompiled header.
target_sources(dscpp PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/gpt.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fused_ops.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kernels/kernels_scalar.cpp)
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/kernels/kernels_scalar.cpp
  PROPERTIES SKIP_PRECOMPILE_HEADERS ON)

if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64|i.86)$")
  target_sources(dscpp PRIVATE ${CMAKE_CURRENT_LIST_DIR}/kernels/kernels_avx512.cpp)
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/kernels/kernels_avx512.cpp
    PROPERTIES COMPILE_OPTIONS "-mavx512f" SKIP_PRECOMPILE_HEADERS ON)
  set_property(SOURCE ${CMAKE_CURRENT_LIST_DIR}/fused_ops.cpp APPEND
    PROPERTY COMPILE_DEFINITIONS DSCPP_GPT_HAVE_X86_KERNELS=1)
endif()
