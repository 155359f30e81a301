// Which implementation an optimizer step runs (scalar, AVX2, AVX-512 or ATen ops), the
// DSCPP_OPTIM_SIMD override, and the multithreaded loop the fused kernels run under.
//
// NOTE [optimizer SIMD dispatch]: the AVX2 and AVX-512 kernels live in kernels_avx2.cpp and
// kernels_avx512.cpp, the only files compiled with -mavx2 -mfma / -mavx512f. Those files include
// nothing but <immintrin.h>, <cstdint> and kernels.h, and keep every function in an anonymous
// namespace: had they included a libtorch or standard header, its inline functions would be
// emitted there with AVX-512 code as weak symbols, and the linker could pick that copy for the
// whole program. The tables they export are reached only through kernel_table(), after
// cpu_supports() has asked the CPU (__builtin_cpu_supports, which also checks that the OS saves
// the wider registers). So a CPU without AVX2 or AVX-512 never executes such an instruction.
// The kernels run inside parallel_elements(): the element range is cut at multiples of 64
// elements (so only the buffer's last partial vector takes the scalar tail, and results do not
// depend on the thread count), grain 32K elements, threads as at::get_num_threads().
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>

#include "optim/kernels.h"

namespace dscpp::optim {

enum class KernelPath {
  kScalar,  // kernels_scalar.cpp
  kAvx2,    // kernels_avx2.cpp (AVX2 + FMA)
  kAvx512,  // kernels_avx512.cpp (AVX-512F)
  kTorch,   // ATen ops: any device, any floating dtype
};

// "scalar", "avx2", "avx512", "torch".
const char* to_string(KernelPath path);
// Parses the names above; nullopt for anything else.
std::optional<KernelPath> parse_kernel_path(std::string_view name);
// Whether this CPU (and OS) can run the path. Scalar and torch: always.
bool cpu_supports(KernelPath path);
// The widest SIMD path this CPU supports.
KernelPath best_kernel_path();

// The path CPU fp32 steps take: the innermost ScopedKernelPath if any, else DSCPP_OPTIM_SIMD
// (scalar|avx2|avx512|torch; unset or "auto": best_kernel_path()). Throws dscpp::Error when the
// variable names an unknown path or one this CPU cannot run.
KernelPath active_kernel_path();

// Forces the path for the process while alive (tests, benchmarks). Throws dscpp::Error when the
// CPU cannot run it. Not thread-safe against concurrent steps.
class ScopedKernelPath {
 public:
  explicit ScopedKernelPath(KernelPath path);
  ~ScopedKernelPath();
  ScopedKernelPath(const ScopedKernelPath&) = delete;
  ScopedKernelPath& operator=(const ScopedKernelPath&) = delete;

 private:
  std::optional<KernelPath> previous_;
};

// The kernel table of a SIMD path (not kTorch). Throws dscpp::Error when the CPU lacks it.
const kernels::Table& kernel_table(KernelPath path);

// Runs fn(begin, end) over [0, n) in parallel chunks cut at multiples of 64 elements, grain
// 32768 elements (NOTE [optimizer SIMD dispatch]). fn must not throw.
void parallel_elements(int64_t n, const std::function<void(int64_t, int64_t)>& fn);
// Runs fn(begin, end) over [0, count) items in parallel (grain 1 item). fn must not throw.
void parallel_items(int64_t count, const std::function<void(int64_t, int64_t)>& fn);

// Elements per chunk of the sums of squares below.
constexpr int64_t kSquaresChunk = int64_t{1} << 20;
// The sum of t's squares in fp64 through the kernel table's sum_sq, reading fp32 or bf16 as it
// is (the gradient norm, without a widened copy of the gradients); nullopt unless t is a
// contiguous fp32 or bf16 CPU tensor and the active path is not kTorch (the caller then sums
// with ATen ops). Chunks of kSquaresChunk elements are summed in order: the same bits for any
// number of threads.
std::optional<double> sum_squares(const at::Tensor& t);
// The sum of a 1-D tensor's squares in fp64: sum_squares, or else ATen ops over the same chunks
// summed in order (any device or dtype, without a full-size fp64 copy). So a tensor's sum equals
// the in-order sum of its kSquaresChunk-element chunks' sums, bit for bit (the gradient norm of
// a shard on disk, NOTE [gradients on disk]).
double squared_norm(const at::Tensor& t);

}  // namespace dscpp::optim
