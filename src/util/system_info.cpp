// Implements collect_system_info() (see system_info.h). Reads /proc for CPU flags and free
// memory, libtorch's build summary for its BLAS and CPU capability, asks libtorch for versions
// and threads, and probes io_uring.
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
#include <set>
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

// The vector and matrix extensions libtorch's kernels and oneDNN can use, as /proc/cpuinfo lists
// them (amx_bf16: oneDNN's bf16 matmuls run on AMX tiles, several times AVX512-BF16's rate).
std::string cpu_flags() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  std::set<std::string> have;
  while (std::getline(f, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream is(line.substr(line.find(':') + 1));
    for (std::string w; is >> w;) have.insert(w);
    break;
  }
  std::string s;
  for (const char* flag : {"avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "amx_bf16"})
    if (have.count(flag)) s += std::string(flag) + " ";
  return s.empty() ? "none of avx2/fma/avx512/amx" : s.substr(0, s.size() - 1);
}

// One "KEY=value" of libtorch's build summary (at::show_config()), or "" when absent.
std::string build_setting(const std::string& key) {
  std::string cfg = at::show_config();
  auto pos = cfg.find(key + "=");
  if (pos == std::string::npos) return "";
  pos += key.size() + 1;
  return cfg.substr(pos, cfg.find_first_of(",\n", pos) - pos);
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

std::string blas_library() {
  // The wheel links MKL statically into libtorch_cpu, so no BLAS shows in /proc/self/maps: the
  // build summary is the one place that names it.
  std::string blas = build_setting("BLAS_INFO");
  return blas.empty() ? "" : blas + " (libtorch's build; bf16 matmuls by oneDNN)";
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
#if defined(DSCPP_HAVE_NCCL)
  const char* no_gpus = "0 (this libtorch and dscpp have CUDA; no GPU or driver on this host)";
#else
  const char* no_gpus = "0 (dscpp was built without CUDA)";
#endif
  items.push_back({"CUDA devices", gpus ? std::to_string(gpus) : no_gpus, ""});
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
    std::string lib = blas_library();
    std::string hint;
    if (lib.empty() || lib.rfind("generic", 0) == 0)
      hint = "this libtorch has no optimized BLAS (fp32 matmuls run ~16x slower); use a PyTorch "
             "wheel's libtorch (scripts/setup.sh)";
    items.push_back({"BLAS library", lib.empty() ? "not named by this libtorch" : lib, hint});
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
