// Ring reduce-scatter and all-gather over point-to-point send/recv, for backends that lack
// flat uneven versions: Gloo's reduce_scatter_single / all_gather_single (libtorch 2.x) take
// equal shards only, and ZeRO's shards of a flat buffer are uneven. Each rank sends and receives (n-1)/n of the buffer, half of what a ring
// all-reduce moves, so ZeRO's reduce-scatter costs what the paper says it costs.
// Runs on the communicator's thread; blocks until done or throws (timeouts from the backend).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "comm/c10d.h"
#include "comm/op_desc.h"
#include "dscpp/comm.h"

namespace dscpp::comm {

struct RingContext {
  c10d::Backend& backend;
  int rank;
  int world_size;
  int tag_base;  // distinct per collective, so steps of different collectives never match
  std::chrono::milliseconds timeout;
  Traffic* traffic = nullptr;       // when set, every byte sent is added here
  // Whether what this rank sends goes to another host (for `traffic`): rank + 1's host for a
  // ring; a tree (below) runs only in a hierarchy's column, whose members are one per host.
  bool next_on_other_host = false;
};

// The first tag of collective number `seq`'s ring steps: point-to-point tags 0..4095 are for
// user send/recv; each collective gets 4096 of its own (two rings of at most 2048 steps).
inline int ring_tag_base(int64_t seq) { return static_cast<int>((seq % (1 << 18)) + 1) * 4096; }

// Where each chunk starts: [counts.size() + 1] prefix sums of counts.
std::vector<int64_t> offsets_of(const std::vector<int64_t>& counts);

// Elements per piece of the reduce-scatter's pipeline (4 MiB of fp32).
inline constexpr int64_t kRingPieceElements = int64_t{1} << 20;

// output [counts[rank]] gets the reduction of chunk `rank` of input [sum(counts)]. The input is
// not modified, except where output aliases its chunk `rank` (in place, as ZeRO uses it).
// Extra memory: two buffers of min(largest chunk, kRingPieceElements), while it runs.
void ring_reduce_scatter(const RingContext& ctx, at::Tensor& output, const at::Tensor& input,
                         const std::vector<int64_t>& counts, ReduceOp op);

// NOTE [tree order]: ring_reduce_scatter's result by recursive halving, for a power-of-two
// number of ranks: at step k (k = 0 .. log2 n - 1) rank r exchanges with rank r ^ 2^k the
// chunks whose bit k differs from its own among those it still holds, and adds what it receives.
// It sends what the ring sends, (n-1)/n of the buffer, in log2 n steps instead of n - 1, and
// sums every chunk in one fixed order: a balanced binary tree over the ranks, neighbours first
// (((x0 + x1) + (x2 + x3)) + ...). Shared memory sums in the same tree (ShmGroup), so the
// hierarchy, whose columns reduce this way, sums as one host of all the ranks does when the
// ranks per host and the hosts are powers of two: the same bits (fp32; fp16 and bf16 round in
// the same places when a host has at most 2 ranks). Extra memory: three buffers of at most
// kRingPieceElements.
void tree_reduce_scatter(const RingContext& ctx, at::Tensor& output, const at::Tensor& input,
                         const std::vector<int64_t>& counts, ReduceOp op);
inline bool is_power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

// input [counts[rank]]; output [sum(counts)] gets all inputs in rank order. No extra memory.
void ring_all_gather(const RingContext& ctx, at::Tensor& output, const at::Tensor& input,
                     const std::vector<int64_t>& counts);
// The same into one tensor per rank (outputs[r] gets rank r's input; input may be
// outputs[rank]).
void ring_all_gather(const RingContext& ctx, const std::vector<at::Tensor>& outputs,
                     const at::Tensor& input);

// tensor from `root` to every rank along the ring (root, root + 1, ...), in pieces of
// kRingPieceElements that pipeline: each rank forwards a piece while the next one arrives. Every
// rank but the one before root sends the tensor once.
void ring_broadcast(const RingContext& ctx, const at::Tensor& tensor, int root);

}  // namespace dscpp::comm
