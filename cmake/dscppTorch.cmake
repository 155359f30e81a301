# Finds libtorch 2.x for dscpp and for the projects that find_package(dscpp): CMakeLists.txt and
# dscppConfig.cmake both include this file, so a user's program links the same libraries dscpp
# was built and tested with. Sets what find_package(Torch) sets (TORCH_LIBRARIES, ...).
# DSCPP_TORCH_HINT, when set, is where to look first (the config passes the Torch_DIR dscpp was
# built against). Sets DSCPP_TORCH_LIBRARY_DIRS: the folders of libtorch and of the CUDA
# libraries it loads, for an installed program's run-time search path.

# Torch's CUDA set-up compiles a probe in the CUDA language at CMAKE_CXX_STANDARD unless told
# otherwise, and CMake 3.25 (Debian 12) knows no C++20 flag for nvcc: CUDA sources use C++17
# unless the project chose.
if(NOT DEFINED CMAKE_CUDA_STANDARD)
  set(CMAKE_CUDA_STANDARD 17)
endif()
find_package(Torch REQUIRED HINTS ${DSCPP_TORCH_HINT})
if(Torch_VERSION VERSION_LESS 2.0)
  message(FATAL_ERROR "dscpp: libtorch ${Torch_VERSION} at ${TORCH_INSTALL_PREFIX} is too old; "
    "dscpp needs libtorch 2.x. HINT: run scripts/setup.sh, which installs the pinned PyTorch "
    "wheel into .venv, or pass -DCMAKE_PREFIX_PATH=$(python -c 'import torch.utils; "
    "print(torch.utils.cmake_prefix_path)') for a wheel of your own")
endif()

# NOTE [the wheel's CUDA libraries]: libtorch_cuda needs the CUDA runtime, cuBLAS, cuDNN and NCCL
# of the versions the wheel was built with, which pip installed beside it (site-packages/nvidia),
# while Torch's CMake config links programs against the machine's toolkit (nvcc 13.0 here, its
# NCCL older than the wheel's: the link fails on NCCL symbols, and a program would load the
# toolkit's CUDA runtime instead of the wheel's). Programs link and run against the wheel's
# copies: the CUDA runtime and NVRTC targets point at them, and the linker resolves
# libtorch_cuda's own needs there. The machine's toolkit still supplies nvcc and the headers.
set(DSCPP_TORCH_LIBRARY_DIRS "${TORCH_INSTALL_PREFIX}/lib")
get_filename_component(_dscpp_wheel_nvidia "${TORCH_INSTALL_PREFIX}/../nvidia" ABSOLUTE)
if(EXISTS "${_dscpp_wheel_nvidia}")
  foreach(_dscpp_lib cudart nvrtc)
    file(GLOB _dscpp_found "${_dscpp_wheel_nvidia}/*/lib/lib${_dscpp_lib}.so.[0-9]*")
    if(TARGET CUDA::${_dscpp_lib} AND _dscpp_found)
      list(GET _dscpp_found 0 _dscpp_found)
      set_target_properties(CUDA::${_dscpp_lib} PROPERTIES IMPORTED_LOCATION "${_dscpp_found}")
      if(_dscpp_lib STREQUAL "nvrtc" AND CUDA_NVRTC_LIB)  # Torch also links NVRTC by its path
        list(TRANSFORM TORCH_LIBRARIES REPLACE "^${CUDA_NVRTC_LIB}$" "${_dscpp_found}")
        if(TARGET caffe2::nvrtc_runtime)
          set_target_properties(caffe2::nvrtc_runtime PROPERTIES
                                INTERFACE_LINK_LIBRARIES "${_dscpp_found}")
        endif()
      endif()
    endif()
  endforeach()
  file(GLOB _dscpp_dirs LIST_DIRECTORIES true "${_dscpp_wheel_nvidia}/*/lib")
  list(APPEND DSCPP_TORCH_LIBRARY_DIRS ${_dscpp_dirs})
  string(REPLACE ";" ":" _dscpp_dirs "${_dscpp_dirs}")
  set_property(TARGET torch APPEND PROPERTY INTERFACE_LINK_OPTIONS
               "LINKER:-rpath-link,${_dscpp_dirs}")
endif()
