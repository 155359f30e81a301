// dscpp io-bench: how fast direct I/O runs on a folder (like DeepSpeed's ds_nvme_tune). Writes
// and reads one file of --size GiB with O_DIRECT through dscpp's own AsyncIo for every block
// size x queue depth x thread count of the sweep, prints the table, the best settings as an
// `aio` config fragment, and then runs the optimizer swap pipeline (OptimizerSwapper, what
// offload_optimizer nvme does each step, with no compute) at those settings, as a fraction of
// the plain sequential bandwidth. The file is removed afterwards.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <vector>

#include "dscpp/async_io.h"
#include "dscpp/error.h"
#include "offload/optimizer_swapper.h"
#include "tools.h"
#include "util/log.h"

namespace dscpp::tools {
namespace {

using Clock = std::chrono::steady_clock;

struct Row {
  io::AioOptions o;
  double write_mib_s = 0, read_mib_s = 0;
};

// Writes then reads `bytes` of `path` sequentially in requests of `request` bytes, keeping two
// requests in flight (the swapper's depth); MiB/s of each pass.
std::pair<double, double> sequential(io::AsyncIo& io, const std::string& path, uint64_t bytes,
                                     size_t request) {
  auto file = io.open(path);
  file->reserve(bytes);
  io::AlignedBuffer a(request), b(request);
  std::memset(a.data(), 0x5a, a.size());
  std::memset(b.data(), 0xa5, b.size());
  auto pass = [&](bool write) {
    const auto t0 = Clock::now();
    io::IoHandle prev;
    int i = 0;
    for (uint64_t at = 0; at < bytes; at += request, ++i) {
      void* buf = (i % 2 ? b : a).data();
      io::IoHandle h = write ? file->write(at, buf, request) : file->read(at, buf, request);
      if (prev) prev->wait();
      prev = h;
    }
    if (prev) prev->wait();
    return bytes / double(1 << 20) / std::chrono::duration<double>(Clock::now() - t0).count();
  };
  const double w = pass(true), r = pass(false);
  std::remove(path.c_str());
  return {w, r};
}

}  // namespace

int io_bench_main(int argc, char** argv) {
  CLI::App app{"dscpp io-bench: direct I/O bandwidth on a folder for each aio setting"};
  std::string dir, level = "warning";
  double gib = 1.0;
  bool quick = false;
  app.add_option("--path", dir, "folder to test (offload's nvme_path)")->required();
  app.add_option("--size", gib, "GiB written and read per setting")->check(CLI::PositiveNumber);
  app.add_flag("--quick", quick, "a small sweep (block 256 KiB/1 MiB, depth 4/16, 1 thread)");
  app.add_option("--log_level", level, "debug|info|warning|error");
  CLI11_PARSE(app, argc, argv);
  set_log_level(parse_log_level(level));

  const uint64_t bytes = io::align_up(static_cast<uint64_t>(gib * (1 << 30)));
  const size_t request = 64 << 20;  // what one swap request moves (a 16M-element sub-group run)
  const std::string path = fmt::format("{}/dscpp_io_bench_pid{}.tmp", dir, getpid());
  std::vector<int64_t> blocks = {128 << 10, 256 << 10, 1 << 20, 4 << 20};
  std::vector<int> depths = {1, 4, 8, 16, 32}, threads = {1, 2};
  if (quick) {
    blocks = {256 << 10, 1 << 20};
    depths = {4, 16};
    threads = {1};
  }
  std::cout << fmt::format("dscpp io-bench: {} ({:.2f} GiB per pass, {} MiB requests, O_DIRECT)\n",
                           dir, bytes / double(1 << 30), request >> 20);
  std::cout << fmt::format("{:>10} {:>6} {:>8} {:>12} {:>12}\n", "block", "depth", "threads",
                           "write MiB/s", "read MiB/s");
  std::vector<Row> rows;
  for (int64_t block : blocks) {
    for (int depth : depths) {
      for (int t : threads) {
        Row row;
        row.o.block_size = block;
        row.o.queue_depth = depth;
        row.o.thread_count = t;
        auto io = io::make_async_io(row.o);
        std::tie(row.write_mib_s, row.read_mib_s) = sequential(*io, path, bytes, request);
        std::cout << fmt::format("{:>9}K {:>6} {:>8} {:>12.0f} {:>12.0f}\n", block >> 10, depth, t,
                                 row.write_mib_s, row.read_mib_s)
                  << std::flush;
        rows.push_back(row);
      }
    }
  }
  // Best for a swap, which reads and writes equal amounts: the least total time.
  auto time_of = [](const Row& r) { return 1 / r.write_mib_s + 1 / r.read_mib_s; };
  const Row best = *std::min_element(rows.begin(), rows.end(), [&](const Row& a, const Row& b) {
    return time_of(a) < time_of(b);
  });
  std::cout << fmt::format(
      "\nbest for offload (least time to write and read back): write {:.0f} MiB/s, read {:.0f} "
      "MiB/s\n\"aio\": {{\"block_size\": {}, \"queue_depth\": {}, \"intra_op_parallelism\": {}, "
      "\"single_submit\": false, \"overlap_events\": true}}\n",
      best.write_mib_s, best.read_mib_s, best.o.block_size, best.o.queue_depth,
      best.o.thread_count);

  // The swap pipeline at those settings: fp32 weights and Adam's two states of sub-groups of
  // 16M elements (192 MiB each), written back while the next is read, with nothing to compute.
  auto io = io::make_async_io(best.o);
  offload::SwapperOptions so;
  so.path = path;
  so.names = {"fp32 weights", "exp_avg", "exp_avg_sq"};
  so.initial = {0, 0, 0};
  so.sub_group_size = int64_t{1} << 24;
  so.numel =
      std::max<int64_t>(2 * so.sub_group_size, static_cast<int64_t>(bytes / (3 * sizeof(float))));
  offload::OptimizerSwapper swap(*io, so);
  const auto nothing = [](int64_t, int64_t, const std::vector<at::Tensor>&) {};
  swap.for_each_sub_group(nothing);  // writes every sub-group once
  swap.take_stats();
  swap.for_each_sub_group(nothing);  // the steady state: read and write each
  const offload::SwapStats st = swap.take_stats();
  const double plain_s = st.bytes_read / double(1 << 20) / best.read_mib_s +
                         st.bytes_written / double(1 << 20) / best.write_mib_s;
  std::cout << fmt::format(
      "swap pipeline: read {:.0f} MiB and wrote {:.0f} MiB in {:.2f} s; the plain passes would "
      "take {:.2f} s: {:.0f}% of the plain sequential bandwidth\n",
      st.bytes_read / double(1 << 20), st.bytes_written / double(1 << 20), st.total_seconds,
      plain_s, 100 * plain_s / st.total_seconds);
  return 0;
}

}  // namespace dscpp::tools
