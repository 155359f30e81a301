// What this machine and this build offer dscpp, for `dscpp report` and `dscpp check`:
// versions, collective backends, CUDA devices, the BLAS actually loaded and its measured speed,
// SIMD level, threads, io_uring, memory. Each item is a name, a value and, when the value is a
// problem, a hint.
#pragma once

#include <c10/core/ScalarType.h>

#include <string>
#include <vector>

namespace dscpp {

struct SystemItem {
  std::string name;
  std::string value;
  std::string hint;  // empty when nothing needs doing
};

// Measures the BLAS (a 1024x1024 fp32 matmul on this process's threads, and a bf16 one on one
// thread, best of a few each) when `measure_blas` is true.
std::vector<SystemItem> collect_system_info(bool measure_blas = true);

// GFLOP/s of an n x n matmul in `dtype` (fp32 by default) on this process's threads, best of
// `repeats`.
double measure_matmul_gflops(int n = 1024, int repeats = 5, at::ScalarType dtype = at::kFloat);


}  // namespace dscpp
