// ShmGroup: the collectives of ranks that share one host, through one shared-memory segment
// instead of Gloo's loopback TCP. Used by the Gloo communicator for CPU tensors when every rank
// is on the same host (CommOptions::shm). Runs on the communicator's thread; each call blocks
// until done or throws CommTimeout naming the rank that did not arrive.
//
// NOTE [shared-memory collectives]
// Gloo moves every byte of a same-host all-reduce through the kernel's TCP stack: a copy into the
// socket, a copy out, and a thread hand-off per message. On the 2-core development machine a
// 12 MiB gradient all-reduce kept the training thread waiting ~30 ms at each step's end (12% of
// a GPT step), while the same bytes cross memory in a few milliseconds.
//
// The segment holds one flag per rank and two sets of slots, one slot of `slot_bytes` per rank
// per set. A collective is cut into pieces that fit a slot; piece p uses set p % 2 (counted
// across collectives). For each piece every rank copies its data into its own slot and arrives
// at a barrier; then it reads what it needs from the others' slots:
//   all_reduce      rank k reduces sub-range k of the piece over all slots (sums in a balanced
//                   tree over the ranks, NOTE [tree order] in comm/ring.h), and
//                   writes the result back into its own slot's sub-range k; a second barrier;
//                   then every rank copies all sub-ranges out. Each element is reduced once, by
//                   one rank, so every rank gets bit-identical results. bf16 and fp16 are summed
//                   in fp32 and rounded once.
//   reduce_scatter  a slot holds one segment of every rank's chunk; rank k reduces segment k
//                   straight into its output (one barrier per piece).
//   all_gather      every rank copies every other rank's slot into that rank's output.
//   broadcast       the root's slot only.
// Why two sets: a rank may write set s again (piece p + 2) only after every rank has read it
// (piece p). Every rank finishes reading piece p before it arrives at piece p + 1's first
// barrier, and a rank writes piece p + 2 only after passing that barrier.
//
// Each rank stamps what it entered (sequence number, operation, dtype, element count, reduce op,
// root or counts) next to its counter;
// the first barrier of every collective compares the stamps, so ranks that disagree fail at once
// with both sides named instead of reading each other's slots wrongly (a collective with nothing
// to move still meets the others once for this check).
// The barrier is a per-rank generation counter: arriving stores the next generation and wakes
// waiters (a futex on the shared word); waiting spins ~20 us, then sleeps on the futex in 10 ms
// slices until the deadline, checking at each slice that the awaited rank's process still exists
// (a crashed rank is reported at once, not after the timeout). Rank 0 unlinks the segment as
// soon as every rank has mapped it, and on any setup error; only rank 0 being killed while the
// others map the segment at start-up can leave one in /dev/shm (named /dscpp-<pid>-...).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/host_collectives.h"
#include "comm/op_desc.h"
#include "dscpp/comm.h"

namespace dscpp::comm {

// This machine as the ranks tell hosts apart: host name and kernel boot id. Ranks with the same
// value share a kernel and can share memory.
std::string host_identity();

class ShmGroup final : public HostCollectives {
 public:
  // How setting up went, the same on every rank.
  struct Setup {
    enum Result { kReady, kOff, kSeveralHosts, kFailed } result = kFailed;
    std::string why;  // empty when ready
    // Each rank's host as its `host` named it (filled for every result).
    std::vector<std::string> hosts;
  };
  // Collective over `store` (every rank calls it, `off` or not): if any rank is `off`, or the
  // ranks are on more than one host (`host`: this rank's, host_identity() unless a test or
  // CommOptions::host says otherwise), nobody tries; otherwise rank 0 creates the segment and the
  // others map it. Every rank learns whether all succeeded: all get a group or all get null,
  // with *setup saying why, so the choice of transport is the same everywhere. `setup_timeout`
  // bounds the waits on the store here (CommError naming the ranks that did not answer),
  // `timeout` each collective later.
  static std::unique_ptr<ShmGroup> create(c10d::Store& store, const std::string& prefix, int rank,
                                          int world_size, bool off, const std::string& host,
                                          int64_t slot_bytes,
                                          std::chrono::milliseconds setup_timeout,
                                          std::chrono::milliseconds timeout, Setup* setup);
  ~ShmGroup();
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  // Contiguous CPU tensors of a floating or integer dtype.
  bool supports(const at::Tensor& t) const override;
  std::string name() const override { return "shm"; }

  // HostCollectives' calls. `seq` is compared across ranks (the stamps).
  void all_reduce(const at::Tensor& tensor, ReduceOp op, int64_t seq) override;
  void reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                      const std::vector<int64_t>& counts, ReduceOp op, int64_t seq) override;
  void all_gather(const std::vector<at::Tensor>& outputs, const at::Tensor& input,
                  int64_t seq) override;
  // One host: the host group is the world.
  int host_size() const override { return world_; }
  void host_all_gather(const std::vector<at::Tensor>& outputs, const at::Tensor& input,
                       int64_t seq) override {
    all_gather(outputs, input, seq);
  }
  void broadcast(const at::Tensor& tensor, int root, int64_t seq) override;
  void barrier(int64_t seq) override;

  int64_t segment_bytes() const { return bytes_; }

 private:
  ShmGroup(void* base, int64_t bytes, int rank, int world_size, int64_t slot_bytes,
           std::chrono::milliseconds timeout);

  std::atomic<uint32_t>& flag(int r) const;
  // Every collective: begin() stamps what this rank entered and starts the deadline; the first
  // barrier compares every rank's stamp (CollectiveMismatch naming both sides); end() meets the
  // others once if the collective had no piece.
  void begin(OpDesc desc, int64_t seq, int op, int64_t extra);
  void check_stamps();
  void end();
  // Throws CommError when rank r's process has exited (checked while waiting for it).
  void check_alive(int r) const;
  // Slot of rank r in the current piece's set, as `n` elements of `dtype`.
  at::Tensor slot(int r, int64_t n, c10::ScalarType dtype) const;
  int64_t slot_elements(c10::ScalarType dtype) const {
    return slot_bytes_ / static_cast<int64_t>(c10::elementSize(dtype));
  }
  // fn(offset, length) for the consecutive pieces of at most `per` of n elements, each in the
  // other set than the last.
  template <typename Fn>
  void for_each_piece(int64_t n, int64_t per, Fn&& fn) {
    for (int64_t off = 0; off < n; off += per) {
      set_ ^= 1;
      fn(off, std::min(per, n - off));
    }
  }
  void arrive_and_wait();
  void wait_for(int r, uint32_t generation) const;
  // out = op over ins (rank order), through the fp32/own-dtype scratch; out may alias one of ins.
  // Sums in a balanced tree (NOTE [tree order] in comm/ring.h).
  void reduce(const at::Tensor& out, const std::vector<at::Tensor>& ins, ReduceOp op);
  // dst = the tree sum of ins[lo, hi) (accumulating in dst's dtype); the right halves at depth
  // `level` go through partial_.
  void sum_tree(const at::Tensor& dst, const std::vector<at::Tensor>& ins, int lo, int hi,
                int level, bool widen);

  void* base_;
  int64_t bytes_;
  int rank_;
  int world_;
  int64_t slot_bytes_;
  std::chrono::milliseconds timeout_;
  std::chrono::steady_clock::time_point deadline_;  // of the collective in progress
  uint32_t generation_ = 0;
  int set_ = 0;
  int stamp_ = 0;
  bool stamp_checked_ = true;
  at::Tensor scratch_;
  at::Tensor partial_;  // reduce()'s tree: one piece per depth
};

}  // namespace dscpp::comm
