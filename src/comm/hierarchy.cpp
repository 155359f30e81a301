// Implements HostHierarchy (NOTE [hierarchical collectives] in hierarchy.h): the layout check
// and each collective as shared-memory steps inside the host around ring steps across hosts.
#include "comm/hierarchy.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <map>

#include "comm/quantized_reduce.h"
#include "dscpp/error.h"

namespace dscpp::comm {
namespace {

std::string host_name(const std::string& identity) {
  return identity.substr(0, identity.find(' '));
}

}  // namespace

std::optional<HostLayout> HostLayout::of(const std::vector<std::string>& hosts, int rank,
                                         std::string* why) {
  const int world = static_cast<int>(hosts.size());
  // Hosts in the order they first appear; each must hold one run of consecutive ranks.
  std::vector<int> first;  // first rank of each host
  std::map<std::string, int> index;
  for (int r = 0; r < world; ++r) {
    auto [it, added] = index.emplace(hosts[r], static_cast<int>(first.size()));
    if (added) {
      first.push_back(r);
    } else if (hosts[r - 1] != hosts[r]) {
      *why = fmt::format(
          "the ranks of host '{}' are not consecutive (rank {} is there, rank {} "
          "on '{}')",
          host_name(hosts[r]), r, r - 1, host_name(hosts[r - 1]));
      return std::nullopt;
    }
  }
  HostLayout l;
  l.hosts = static_cast<int>(first.size());
  l.per_host = world / l.hosts;
  std::string sizes;
  bool even = world % l.hosts == 0;
  for (int h = 0; h < l.hosts; ++h) {
    const int size = (h + 1 < l.hosts ? first[h + 1] : world) - first[h];
    even = even && size == l.per_host;
    if (h < 8)
      sizes += fmt::format("{}{} on '{}'", h ? ", " : "", size, host_name(hosts[first[h]]));
  }
  if (!even) {
    *why = fmt::format("the hosts run different numbers of ranks ({}{})", sizes,
                       l.hosts > 8 ? ", ..." : "");
    return std::nullopt;
  }
  if (l.hosts < 2 || l.per_host < 2) {
    *why = l.hosts < 2 ? "every rank is on one host" : "each host runs one rank";
    return std::nullopt;
  }
  l.host = rank / l.per_host;
  l.local_rank = rank % l.per_host;
  return l;
}

HostHierarchy::HostHierarchy(HostLayout layout, std::unique_ptr<ShmGroup> local,
                             c10::intrusive_ptr<c10d::Backend> column,
                             std::chrono::milliseconds timeout)
    : layout_(layout), local_(std::move(local)), column_(std::move(column)), timeout_(timeout) {}

void HostHierarchy::wait(const c10::intrusive_ptr<c10d::Work>& work) const {
  DSCPP_CHECK(work->wait(timeout_), CommTimeout,
              "the ranks of this column on the other hosts did not finish within the timeout");
}

void HostHierarchy::column_reduce_scatter(const RingContext& ctx, at::Tensor& output,
                                          const at::Tensor& input,
                                          const std::vector<int64_t>& counts, ReduceOp op) {
  // NOTE [tree order]: the hosts' sums in the tree a host's shared memory uses, when it is one.
  if (is_power_of_two(layout_.hosts)) {
    tree_reduce_scatter(ctx, output, input, counts, op);
  } else {
    ring_reduce_scatter(ctx, output, input, counts, op);
  }
}

RingContext HostHierarchy::column_ring(int64_t seq) {
  RingContext ctx{*column_, layout_.host, layout_.hosts, ring_tag_base(seq), timeout_};
  ctx.traffic = &traffic_;
  ctx.next_on_other_host = true;  // every member of a column is on a host of its own
  return ctx;
}

Traffic HostHierarchy::take_traffic() {
  Traffic t = traffic_;
  traffic_ = {};
  return t;
}

void HostHierarchy::all_reduce(const at::Tensor& tensor, ReduceOp op, int64_t seq) {
  at::Tensor flat = tensor.view({-1});
  const auto shares = split_evenly(flat.numel(), layout_.per_host);
  const auto off = offsets_of(shares);
  at::Tensor mine = flat.narrow(0, off[layout_.local_rank], shares[layout_.local_rank]);
  local_->reduce_scatter(mine, flat, shares, op, seq);

  const auto pieces = split_evenly(mine.numel(), layout_.hosts);
  const auto poff = offsets_of(pieces);
  at::Tensor piece = mine.narrow(0, poff[layout_.host], pieces[layout_.host]);
  RingContext ctx = column_ring(seq);
  column_reduce_scatter(ctx, piece, mine, pieces, op);
  ctx.tag_base += 2048;
  ring_all_gather(ctx, mine, piece, pieces);

  std::vector<at::Tensor> outputs;
  for (int l = 0; l < layout_.per_host; ++l) outputs.push_back(flat.narrow(0, off[l], shares[l]));
  local_->all_gather(outputs, mine, seq);
}

std::vector<int64_t> HostHierarchy::reduce_in_host(const at::Tensor& input,
                                                   const std::vector<int64_t>& counts, ReduceOp op,
                                                   int64_t seq, at::Tensor* sums) {
  const int R = layout_.per_host, H = layout_.hosts, l = layout_.local_rank;
  const auto off = offsets_of(counts);
  at::Tensor in = input.view({-1});
  // The chunks of local rank l on every host, summed over this host's ranks.
  std::vector<int64_t> column_counts;
  for (int h = 0; h < H; ++h) column_counts.push_back(counts[layout_.rank_of(h, l)]);
  const auto coff = offsets_of(column_counts);
  *sums = at::empty({coff[H]}, in.options());
  for (int h = 0; h < H; ++h) {
    const int first = layout_.rank_of(h, 0);
    std::vector<int64_t> local_counts(counts.begin() + first, counts.begin() + first + R);
    local_->reduce_scatter(sums->narrow(0, coff[h], column_counts[h]),
                           in.narrow(0, off[first], off[first + R] - off[first]), local_counts, op,
                           seq);
  }
  return column_counts;
}

void HostHierarchy::reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                                   const std::vector<int64_t>& counts, ReduceOp op, int64_t seq) {
  at::Tensor sums;
  const auto column_counts = reduce_in_host(input, counts, op, seq, &sums);
  at::Tensor out = output.view({-1});
  column_reduce_scatter(column_ring(seq), out, sums, column_counts, op);
}

void HostHierarchy::reduce_scatter_quantized(const at::Tensor& output, const at::Tensor& input,
                                             const std::vector<int64_t>& counts, ReduceOp op,
                                             int64_t seq) {
  at::Tensor sums;
  const auto column_counts = reduce_in_host(input, counts, op, seq, &sums);
  quantized_reduce_scatter(column_ring(seq), output, sums, column_counts,
                           std::vector<bool>(layout_.hosts, true));
  if (op == ReduceOp::avg) output.div_(layout_.hosts);
}

void HostHierarchy::all_gather(const std::vector<at::Tensor>& outputs, const at::Tensor& input,
                               int64_t seq) {
  const int R = layout_.per_host, H = layout_.hosts, l = layout_.local_rank;
  std::vector<at::Tensor> column;
  for (int h = 0; h < H; ++h) column.push_back(outputs[layout_.rank_of(h, l)]);
  ring_all_gather(column_ring(seq), column, input);
  for (int h = 0; h < H; ++h) {
    std::vector<at::Tensor> host(outputs.begin() + layout_.rank_of(h, 0),
                                 outputs.begin() + layout_.rank_of(h, 0) + R);
    local_->all_gather(host, host[l], seq);
  }
}

void HostHierarchy::broadcast(const at::Tensor& tensor, int root, int64_t seq) {
  const int root_local = root % layout_.per_host;
  if (layout_.local_rank == root_local)
    ring_broadcast(column_ring(seq), tensor, root / layout_.per_host);
  local_->broadcast(tensor, root_local, seq);
}

void HostHierarchy::barrier(int64_t seq) {
  local_->barrier(seq);
  c10d::BarrierOptions o;
  o.timeout = timeout_;
  wait(column_->barrier(o));
  traffic_.counted = false;
  local_->barrier(seq);
}

}  // namespace dscpp::comm
