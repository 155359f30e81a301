# Sources of src/optim (the fused optimizers), appended to the dscpp library.
# NOTE [optimizer SIMD dispatch] (src/optim/dispatch.h): only kernels_avx2.cpp and
# kernels_avx512.cpp get -m flags, and they must not use the precompiled header (it would pull
# libtorch's inline code into a file compiled for AVX-512). dispatch.cpp calls at::parallel_for,
# which is parallel only in a file compiled with OpenMP; it skips the precompiled header too,
# since that was built without _OPENMP.
target_sources(dscpp PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/optimizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/adam.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sgd.cpp
  ${CMAKE_CURRENT_LIST_DIR}/adagrad.cpp
  ${CMAKE_CURRENT_LIST_DIR}/lamb.cpp
  ${CMAKE_CURRENT_LIST_DIR}/lion.cpp
  ${CMAKE_CURRENT_LIST_DIR}/muon.cpp
  ${CMAKE_CURRENT_LIST_DIR}/dispatch.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kernels_scalar.cpp)
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/kernels_scalar.cpp
  PROPERTIES SKIP_PRECOMPILE_HEADERS ON)

if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64|i.86)$")
  target_sources(dscpp PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/kernels_avx2.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kernels_avx512.cpp)
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/kernels_avx2.cpp
    PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma" SKIP_PRECOMPILE_HEADERS ON)
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/kernels_avx512.cpp
    PROPERTIES COMPILE_OPTIONS "-mavx512f" SKIP_PRECOMPILE_HEADERS ON)
  set_property(SOURCE ${CMAKE_CURRENT_LIST_DIR}/dispatch.cpp APPEND
    PROPERTY COMPILE_DEFINITIONS DSCPP_OPTIM_HAVE_X86_KERNELS=1)
  message(STATUS "dscpp: optimizer kernels: scalar, AVX2+FMA, AVX-512F (chosen at run time)")
else()
  message(STATUS "dscpp: optimizer kernels: scalar only on ${CMAKE_SYSTEM_PROCESSOR}")
endif()

find_package(OpenMP COMPONENTS CXX)
if(OpenMP_CXX_FOUND)
  set_property(SOURCE ${CMAKE_CURRENT_LIST_DIR}/dispatch.cpp APPEND
    PROPERTY COMPILE_OPTIONS ${OpenMP_CXX_FLAGS})
  # The runtime only: OpenMP::OpenMP_CXX would put -fopenmp on every file of the library.
  target_link_libraries(dscpp PRIVATE ${OpenMP_CXX_LIBRARIES})
  message(STATUS "dscpp: optimizer kernels multithreaded with OpenMP (at::parallel_for)")
else()
  message(STATUS "dscpp: OpenMP not found: the optimizer kernels run on one thread")
endif()
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/dispatch.cpp
  PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
