// comm_bench: all_reduce against the ring reduce_scatter and all_gather that dscpp supplies for
// Gloo, run as real processes through dscpp launch. For each message size it alternates the
// operations (A B C A B C ...), reports median wall time per operation, and measures the bytes
// that actually crossed the loopback interface (/proc/net/dev) per operation, so the "half of
// all_reduce's traffic" claim is a measurement, not arithmetic.
//
//   build/dscpp launch --num_procs 2 build/bench/comm_bench --sizes_mib 1,16,64 --iters 15
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "dscpp/comm.h"

using namespace dscpp;
using Clock = std::chrono::steady_clock;

namespace {

// Bytes sent over loopback so far (all processes on this machine).
int64_t loopback_tx_bytes() {
  std::ifstream f("/proc/net/dev");
  std::string line;
  while (std::getline(f, line)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    if (name != "lo") continue;
    std::istringstream is(line.substr(colon + 1));
    int64_t v[9];
    for (auto& x : v) is >> x;
    return v[8];  // the 9th field is transmit bytes
  }
  return -1;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> sizes_mib{1, 16, 64};
  int iters = 15;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (a == "--sizes_mib" && i + 1 < argc) {
      sizes_mib.clear();
      std::stringstream ss(argv[++i]);
      std::string tok;
      while (std::getline(ss, tok, ',')) sizes_mib.push_back(std::stoll(tok));
    } else {
      std::cerr << "usage: comm_bench [--sizes_mib 1,16,64] [--iters N]\n";
      return 2;
    }
  }
  at::set_num_threads(1);
  auto comm = comm::init_from_env(comm::CommOptions::from_config());
  const int w = comm->world_size(), r = comm->rank();
  if (r == 0) {
    std::cout << fmt::format("# {} ranks, gloo, median of {} runs per cell (operations interleaved)\n", w, iters)
              << "| message | all_reduce ms | reduce_scatter ms | all_gather ms | RS/AR time | "
                 "AR bytes sent | RS bytes sent | RS/AR bytes |\n"
              << "|---|---|---|---|---|---|---|---|\n";
  }
  for (int64_t mib : sizes_mib) {
    int64_t n = mib * 1024 * 1024 / 4 / w * w;
    auto full = at::ones({n});
    auto shard = at::ones({n / w});
    enum { AR, RS, AG };
    auto run = [&](int which) {
      if (which == AR) comm->all_reduce(full)->wait();
      else if (which == RS) comm->reduce_scatter(shard, full)->wait();
      else comm->all_gather(full, shard)->wait();
    };
    std::vector<double> t[3];
    int64_t bytes[3] = {0, 0, 0};
    for (int k = 0; k < 3; ++k) run(k);  // warm-up
    for (int i = 0; i < iters; ++i) {
      for (int k = 0; k < 3; ++k) {
        comm->barrier()->wait();
        int64_t b0 = loopback_tx_bytes();
        auto t0 = Clock::now();
        run(k);
        t[k].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        comm->barrier()->wait();
        bytes[k] += loopback_tx_bytes() - b0;
      }
    }
    if (r == 0) {
      double ar = median(t[AR]), rs = median(t[RS]), ag = median(t[AG]);
      // Loopback counts every rank's traffic; divide per operation and per rank.
      double arb = double(bytes[AR]) / iters / w, rsb = double(bytes[RS]) / iters / w;
      std::cout << fmt::format("| {} MiB | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.1f} MiB | {:.1f} MiB | {:.2f} |\n",
                               mib, ar * 1e3, rs * 1e3, ag * 1e3, rs / ar, arb / 1048576,
                               rsb / 1048576, rsb / arb);
    }
  }
  return 0;
}
