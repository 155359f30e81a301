// HostHierarchy: collectives on CPU tensors when the ranks span several hosts with several
// ranks on each: shared memory inside each host (ShmGroup), TCP between hosts (a Gloo group per
// local rank), so each byte crosses the network once per host instead of once per rank pair
// that a flat ring happens to place across hosts.
//
// NOTE [hierarchical collectives]
// Layout: H hosts of R ranks each, rank = host * R + local rank (what dscpp launch, mpirun's
// by-slot mapping and srun's block distribution give). Rank (h, l) belongs to its host's shared-
// memory group and to "column" l: the H ranks with local rank l, one per host, joined by a Gloo
// group of their own. Every column works at once on its own share of the data, so all R ranks of
// a host use the network in parallel and none carries more than 1/R of the host's bytes.
//   all_reduce      shared-memory reduce-scatter of R equal shares (share l to local rank l);
//                   column l all-reduces share l across hosts (reduce-scatter: a tree when
//                   H is a power of two, NOTE [tree order], else a ring; then a ring
//                   all-gather); shared-memory all-gather of the shares.
//   reduce_scatter  rank (h, l) must end with chunk h*R + l reduced over every rank. For each
//                   host h' the chunks h'R .. h'R+R-1 are consecutive in the input: one shared-
//                   memory reduce-scatter per h' leaves local rank l with its host's sum of
//                   chunk h'R + l. Column l holds, per host, the host sums of the chunks of
//                   local rank l everywhere; a reduce-scatter over the column (tree or ring, as
//                   above) gives each member its own chunk.
//   all_gather      column l gathers the inputs of local rank l on every host (ring), then one
//                   shared-memory all-gather per host h' hands those H chunks to the host's other
//                   ranks.
//   broadcast       the root's column passes the tensor along its ring of hosts; each host's
//                   rank in that column broadcasts it through shared memory.
//   barrier         shared memory, the column's barrier, shared memory again: when the last one
//                   returns, every rank of every host has arrived.
// Every byte a column sends goes to another host: take_traffic() reports them exactly (the
// barrier's few bytes are Gloo's and not counted).
// Bytes between hosts per host, for a buffer of N bytes: all_reduce 2(H-1)/H N, reduce_scatter and
// all_gather (H-1)/H N: the least any algorithm can send without compressing (each host must
// receive the other hosts' contribution to each of its R chunks). A flat ring in rank order
// crosses each host boundary on one link that carries (P-1)/P N per pass (P = H R ranks), so
// the hierarchy sends ((H-1)/H) / ((P-1)/P) of the flat ring's bytes between hosts: 2/3 at
// 2 x 2, 4/7 at 2 x 4; its gain is in using R connections per host at once and in H-1 ring steps
// across the network instead of P-1.
//
// Order of sums: inside a host in a balanced tree over its ranks (ShmGroup), then across hosts
// in a tree over the hosts when they are a power of two (NOTE [tree order]; recursive halving,
// log2 H steps), else in the column's ring order. Every rank gets the same bits (each element
// is reduced once, by one rank, then copied). With powers of two of hosts and of ranks per host
// the two trees make the tree one host of all the ranks sums in: the same bits as one host (fp32);
// against a flat ring across hosts the bits may differ in the last place, as two rings of
// different lengths do. avg averages at each level (over a host's R ranks, then over the H
// hosts), so fp16 and bf16 sums never grow past what one level adds; dividing by powers of two
// is exact, so that keeps the same bits too.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/c10d.h"
#include "comm/host_collectives.h"
#include "comm/ring.h"
#include "comm/shm.h"

namespace dscpp::comm {

// Which host each rank is on, when the ranks form H >= 2 hosts of R >= 2 consecutive ranks.
struct HostLayout {
  int hosts = 1;
  int per_host = 1;
  int host = 0;        // this rank's host, in the order hosts first appear by rank
  int local_rank = 0;  // this rank's place on its host
  // From each rank's host name (ShmGroup::Setup::hosts); nullopt with *why when the ranks do not
  // form such a layout (one rank on some host, hosts of different sizes, ranks interleaved).
  static std::optional<HostLayout> of(const std::vector<std::string>& hosts, int rank,
                                      std::string* why);
  int rank_of(int h, int l) const { return h * per_host + l; }
};

class HostHierarchy final : public HostCollectives {
 public:
  // `local`: the shared-memory group of this host's ranks (local ranks); `column`: a Gloo group
  // of the ranks with this local rank, one per host, ranked by host.
  HostHierarchy(HostLayout layout, std::unique_ptr<ShmGroup> local,
                c10::intrusive_ptr<c10d::Backend> column, std::chrono::milliseconds timeout);

  bool supports(const at::Tensor& t) const override { return local_->supports(t); }
  std::string name() const override { return "shm+hosts"; }
  const HostLayout& layout() const { return layout_; }

  void all_reduce(const at::Tensor& tensor, ReduceOp op, int64_t seq) override;
  void reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                      const std::vector<int64_t>& counts, ReduceOp op, int64_t seq) override;
  // The shared-memory steps as reduce_scatter's, exact; between hosts the column exchanges its
  // sums quantized, all-to-all (NOTE [quantized reduce-scatter]).
  void reduce_scatter_quantized(const at::Tensor& output, const at::Tensor& input,
                                const std::vector<int64_t>& counts, ReduceOp op,
                                int64_t seq) override;
  void all_gather(const std::vector<at::Tensor>& outputs, const at::Tensor& input,
                  int64_t seq) override;
  // This host's ranks only, through shared memory (ZeRO++ hpZ's secondary gathers).
  int host_size() const override { return layout_.per_host; }
  void host_all_gather(const std::vector<at::Tensor>& outputs, const at::Tensor& input,
                       int64_t seq) override {
    local_->all_gather(outputs, input, seq);
  }
  void broadcast(const at::Tensor& tensor, int root, int64_t seq) override;
  void barrier(int64_t seq) override;
  Traffic take_traffic() override;

 private:
  void wait(const c10::intrusive_ptr<c10d::Work>& work) const;
  // The column's ring for collective `seq`; every byte it sends goes to another host.
  RingContext column_ring(int64_t seq);
  // The column's reduce-scatter: a tree when the hosts are a power of two (NOTE [tree order]),
  // else the ring.
  void column_reduce_scatter(const RingContext& ctx, at::Tensor& output, const at::Tensor& input,
                             const std::vector<int64_t>& counts, ReduceOp op);
  // reduce_scatter's shared-memory steps: `sums` [column's counts] gets, per host h', this
  // host's sum of chunk (h', local rank); returns the column's counts.
  std::vector<int64_t> reduce_in_host(const at::Tensor& input, const std::vector<int64_t>& counts,
                                      ReduceOp op, int64_t seq, at::Tensor* sums);

  HostLayout layout_;
  std::unique_ptr<ShmGroup> local_;
  c10::intrusive_ptr<c10d::Backend> column_;
  std::chrono::milliseconds timeout_;
  Traffic traffic_;
};

}  // namespace dscpp::comm
