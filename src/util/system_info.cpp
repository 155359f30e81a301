// Implements collect_system_info() (see system_info.h). Reads /proc for the loaded BLAS and free
// memory, asks libtorch for versions, threads and CPU capability, and probes io_uring.
#include "util/system_info.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/version.h>
#include <unistd.h>

#if defined(DSCPP_HAVE_URING)
#include <liburing.h>
#endif

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace dscpp {
namespace {

std::string meminfo(const std::string& key) {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key + ":", 0) == 0) {
      std::istringstream is(line.substr(key.size() + 1));
      double kb = 0;
      is >> kb;
      return fmt::format("{:.1f} GiB", kb / 1024 / 1024);
    }
  }
  return "unknown";
}

std::string cpu_capability() {
  // libtorch does not export its capability query; its build summary names the one in use.
  std::string cfg = at::show_config();
  auto pos = cfg.find("CPU capability usage:");
  if (pos == std::string::npos) return "not reported by this libtorch";
  pos += std::string("CPU capability usage:").size();
  auto end = cfg.find('\n', pos);
  std::string v = cfg.substr(pos, end - pos);
  v.erase(0, v.find_first_not_of(' '));
  return v;
}

std::string cpu_flags() {
  std::string s;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) s += "avx2 ";
  if (__builtin_cpu_supports("fma")) s += "fma ";
  if (__builtin_cpu_supports("avx512f")) s += "avx512f ";
  if (__builtin_cpu_supports("avx512bw")) s += "avx512bw ";
  return s.empty() ? "none of avx2/fma/avx512" : s.substr(0, s.size() - 1);
}

std::string uring_status(std::string& hint) {
#if defined(DSCPP_HAVE_URING)
  io_uring ring;
  int rc = io_uring_queue_init(8, &ring, 0);
  if (rc == 0) {
    io_uring_queue_exit(&ring);
    return "available";
  }
  hint = "the kernel refused io_uring; NVMe offload will use pread/pwrite";
  return fmt::format("built in, but unavailable here ({})", strerror(-rc));
#else
  hint = "install liburing-dev and rebuild for asynchronous NVMe offload";
  return "not built in (liburing not found at build time): pread/pwrite";
#endif
}

}  // namespace

double measure_matmul_gflops(int n, int repeats, at::ScalarType dtype) {
  auto a = at::randn({n, n}).to(dtype), b = at::randn({n, n}).to(dtype);
  auto c = at::matmul(a, b);  // warm-up: loads the BLAS and its threads
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    at::matmul_out(c, a, b);
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * n * n * n / best / 1e9;
}

std::string loaded_blas_library() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    auto pos = line.find('/');
    if (pos == std::string::npos) continue;
    std::string path = line.substr(pos);
    if (path.find("blas") != std::string::npos && path.find(".so") != std::string::npos) {
      char resolved[4096];
      if (realpath(path.c_str(), resolved)) return resolved;
      return path;
    }
  }
  return "";
}

std::vector<SystemItem> collect_system_info(bool measure_blas) {
  std::vector<SystemItem> items;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  items.push_back({"dscpp version", DSCPP_VERSION_STRING, ""});
  items.push_back({"libtorch version", TORCH_VERSION, ""});
  items.push_back({"host", host, ""});
  items.push_back({
    "collective backends",
#if defined(DSCPP_HAVE_NCCL)
        "gloo (CPU), nccl (CUDA)",
#else
        "gloo (CPU); nccl: no (libtorch built without NCCL)",
#endif
        ""
  });
  items.push_back({"mpi", "used only as a launcher (dscpp launch --launcher openmpi)", ""});
  size_t gpus = torch::cuda::device_count();
  items.push_back({"CUDA devices",
                   gpus ? std::to_string(gpus) : "0 (no CUDA in this libtorch, or no driver)", ""});
  items.push_back({"cpu cores online", std::to_string(sysconf(_SC_NPROCESSORS_ONLN)), ""});
  items.push_back({"SIMD (libtorch kernels)", cpu_capability(), ""});
  items.push_back({"SIMD (cpu flags)", cpu_flags(), ""});
  const char* omp = std::getenv("OMP_NUM_THREADS");
  items.push_back(
      {"intra-op threads",
       fmt::format("{} (OMP_NUM_THREADS={})", at::get_num_threads(), omp ? omp : "unset"), ""});
  items.push_back({"OpenMP", at::get_openmp_version(), ""});
  if (measure_blas) {
    double gflops = measure_matmul_gflops();
    std::string lib = loaded_blas_library();
    std::string hint;
    bool reference =
        lib.find("openblas") == std::string::npos && lib.find("mkl") == std::string::npos;
    if (reference)
      hint =
          "reference BLAS is about 16x slower than OpenBLAS; apt-get install libopenblas0-openmp";
    items.push_back({"BLAS library", lib.empty() ? "not found in this process" : lib, hint});
    items.push_back({"matmul 1024x1024 fp32", fmt::format("{:.1f} GFLOP/s", gflops), ""});
    // The bf16 peak of one core: the denominator of the model FLOPs utilization of a bf16 run
    // with one intra-op thread per rank (docs/benchmarks.md). oneDNN's kernels on a CPU with
    // AVX512-BF16 (or AMX); elsewhere libtorch's much slower fallback, which this shows too.
    const int threads = at::get_num_threads();
    at::set_num_threads(1);
    std::string bf16;
    try {
      bf16 = fmt::format("{:.1f} GFLOP/s on one thread",
                         measure_matmul_gflops(1024, 5, at::kBFloat16));
    } catch (const std::exception& e) {
      bf16 = std::string("not measurable: ") + e.what();
    }
    at::set_num_threads(threads);
    items.push_back({"matmul 1024x1024 bf16", bf16, ""});
  }
  std::string uring_hint;
  std::string uring = uring_status(uring_hint);
  items.push_back({"io_uring", uring, uring_hint});
  items.push_back({"memory total", meminfo("MemTotal"), ""});
  items.push_back({"memory available", meminfo("MemAvailable"), ""});
  return items;
}

}  // namespace dscpp
