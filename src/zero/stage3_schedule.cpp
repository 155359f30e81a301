// ZeRO stage 3 (stage3.h), its fetch schedule: a unit's call gathers it (zero::call, through
// run_unit), the first step records the order of requests, later steps prefetch and keep units
// by that record and release them once backward is done with them (NOTE [stage 3 prefetch
// order]); the ranks check they ran the same units in the same order; and the step's hooks
// around backward and the update.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <chrono>
#include <unordered_map>
#include <unordered_set>

#include "dscpp/error.h"
#include "util/log.h"
#include "zero/shard_all_gather.h"
#include "zero/stage3.h"
#include "zero/unit_functions.h"

namespace dscpp::zero {
namespace {

// One 52-bit hash of a sequence of unit indices (exact in a double).
double order_hash(const std::vector<int>& order) {
  uint64_t h = 1469598103934665603ull;
  for (int u : order) {
    h ^= static_cast<uint64_t>(u) + 0x9e3779b97f4a7c15ull;
    h *= 1099511628211ull;
  }
  return static_cast<double>(h >> 12);
}

}  // namespace

// ----- running a unit -------------------------------------------------------------------------

template <typename Fn>
bool Stage3::thread_through(std::vector<at::Tensor>& tensors, int64_t owner, int u) {
  std::vector<size_t> diff;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].defined() && tensors[i].requires_grad()) diff.push_back(i);
  }
  if (diff.empty()) return false;
  torch::autograd::variable_list xs;
  for (size_t i : diff) xs.push_back(tensors[i]);
  xs = Fn::apply(at::TensorList(xs), owner, static_cast<int64_t>(u));
  for (size_t k = 0; k < diff.size(); ++k) tensors[diff[k]] = xs[k];
  return true;
}

void Stage3::raise_deferred() {
  if (deferred_error_.empty()) return;
  std::string msg = std::move(deferred_error_);
  deferred_error_.clear();
  DSCPP_FAIL(Error, msg);
}

std::vector<at::Tensor> Stage3::run_unit(int u, const detail::UnitFn& fn,
                                         const std::vector<at::Tensor>& inputs, bool recompute) {
  raise_deferred();
  DSCPP_CHECK(running_ < 0, Error, "stage-3 unit '", unit_name(u), "' was called while unit '",
              unit_name(running_),
              "' runs: units do not nest. HINT: make only one of them a "
              "unit (InitOptions::zero_units), or call the inner one after the outer returns");
  struct Running {
    int& r;
    ~Running() { r = -1; }
  } running{running_};
  if (!at::GradMode::is_enabled()) {
    // No backward will follow (evaluation): gather, run, release; the record is not touched.
    {
      OwnOps own;
      request(u, /*record=*/false);
    }
    running_ = u;
    std::vector<at::Tensor> out = fn(inputs);
    OwnOps own;
    if (!whole_model_unit_ && units_[u].held == 0) fetcher_.release(units_[u].storage);
    return out;
  }
  {
    OwnOps own;
    request(u, /*record=*/true);
  }
  running_ = u;
  std::vector<at::Tensor> out;
  if (recompute) {
    ++units_[u].pending_inputs;  // the checkpoint's backward says when it is done
    out = detail::checkpoint_apply(*units_[u].module, fn, inputs, registry_id_, u);
  } else {
    // Inputs that require grad go through UnitInputs, outputs through UnitOutputs (NOTE [stage 3
    // backward]).
    std::vector<at::Tensor> in = inputs;
    if (thread_through<UnitInputs>(in, registry_id_, u)) ++units_[u].pending_inputs;
    out = fn(in);
    thread_through<UnitOutputs>(out, registry_id_, u);
  }
  OwnOps own;
  maybe_release(u);
  return out;
}

void Stage3::check_unchanged(int u) const {
  const Unit& unit = units_[u];
  const c10::StorageImpl* storage = unit.storage.full.storage().unsafeGetStorageImpl();
  for (size_t i = 0; i < unit.params.size(); ++i) {
    const at::Tensor& p = unit.params[i];
    const bool moved = p.storage().unsafeGetStorageImpl() != storage;
    DSCPP_CHECK(!moved && p.sizes() == c10::IntArrayRef(unit.shapes[i]), Error, "parameter '",
                unit.names[i], "' of stage-3 unit '", unit_name(u),
                "' changed after the model "
                "was sharded (",
                moved ? "it was given storage of its own" : "its shape is now ",
                moved ? std::string() : c10::str(p.sizes()),
                "); stage 3 can no longer gather "
                "it. HINT: change parameters before initialize(), or change their values inside "
                "dscpp::zero::GatheredParameters with a modifier rank");
  }
}

void Stage3::request(int u, bool record) {
  try {
    request_gathered(u, record);
  } catch (const CommError& e) {
    // Every forward and backward at stage 3 is a collective; the communicator's message names
    // the collectives, this names the unit and the usual cause.
    const std::string context = fmt::format(
        "\n(stage 3: this rank was gathering unit '{}' for {}. Every forward and backward at "
        "stage 3 is a collective: if a forward ran on some ranks only, an evaluation on rank 0 "
        "say, run it on every rank, or open dscpp::zero::GatheredParameters on every rank and "
        "then evaluate on one)",
        unit_name(u),
        at::GradMode::is_enabled() ? "a forward or backward" : "an evaluation forward (no_grad)");
    if (dynamic_cast<const CommTimeout*>(&e)) throw CommTimeout(e.what() + context);
    throw CommError(e.what() + context);
  }
}

void Stage3::request_gathered(int u, bool record) {
  Unit& unit = units_[u];
  check_unchanged(u);
  if (record) {
    if (!following_ && !whole_model_unit_) check_request_across_ranks(u);
    current_.push_back(u);
    if (following_) {
      if (cursor_ < record_.size() && record_[cursor_] == u) {
        ++cursor_;
      } else {
        DSCPP_LOG_DEBUG(
            "stage 3: unit '{}' was requested where the recorded order has '{}'; "
            "prefetching stops for this pass and the next pass records again",
            unit_name(u), cursor_ < record_.size() ? unit_name(record_[cursor_]) : "nothing");
        following_ = false;
        dropped_ = true;
      }
    }
  }
  if (!unit.storage.gathered) {
    gather(u, request_kind());
    ++stats_.gathers;
  }
  if (unit.storage.work) {
    const auto t0 = std::chrono::steady_clock::now();
    fetcher_.wait(unit.storage);
    stats_.wait_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (record && following_) prefetch();
}

void Stage3::gather(int u, Gather kind) {
  Unit& unit = units_[u];
  if (unit.disk >= 0 && !unit.storage.shard.defined() && !unit.storage.gathered &&
      !ParamFetcher::from_host(unit.storage, kind)) {
    unit.storage.shard = param_swap_->take(unit.disk);
  }
  fetcher_.gather(unit.storage, kind);
}

Gather Stage3::request_kind() const {
  if (backward_) return Gather::kBackward;
  return at::GradMode::is_enabled() ? Gather::kForward : Gather::kPlain;
}

Gather Stage3::ahead_kind(size_t j) const {
  // The end of forward gathers backward's first units ahead.
  return j >= record_backward_ ? Gather::kBackward : request_kind();
}

void Stage3::drop_secondaries() {
  if (fetcher_.secondary_group() == 1) return;
  for (auto& u : units_) fetcher_.drop_secondary(u.storage);
}

void Stage3::read_ahead() {
  // NOTE [stage 3 parameter offload]: the shards of the next requests' units, in record order,
  // as far as the swapper has buffers for; units gathered now need none.
  for (size_t j = cursor_; j < record_.size(); ++j) {
    const Unit& v = units_[record_[j]];
    // A unit with a secondary shard is gathered inside the host until backward is done with it
    // (NOTE [secondary partition]); a second forward request takes its shard on demand.
    if (v.disk < 0 || v.storage.gathered || v.storage.secondary.defined()) continue;
    if (!param_swap_->read_ahead(v.disk)) break;
  }
}

Strategy::FetchStats Stage3::take_fetch_stats() {
  FetchStats s = stats_;
  stats_ = FetchStats();
  if (param_swap_) {
    const ShardSwapStats d = param_swap_->take_stats();
    s.shards_where = param_swap_->where();
    s.disk_reads = d.reads;
    s.disk_reads_ahead = d.reads_ahead;
    s.disk_bytes_read = d.bytes_read;
    s.disk_bytes_written = d.bytes_written;
    s.disk_wait_seconds = d.wait_seconds;
  }
  return s;
}

void Stage3::prefetch() {
  // NOTE [stage 3 prefetch order]: the next requests' units, within the prefetch and live budgets.
  // Shards on disk are read ahead first, so the gathers below find theirs read (or reading), and
  // again after them, into the buffers the gathers took theirs from (NOTE [stage 3 parameter
  // offload]).
  if (param_swap_) read_ahead();
  gather_ahead();
  if (param_swap_) read_ahead();
}

void Stage3::gather_ahead() {
  if (s3_.prefetch_bucket_size <= 0) return;
  const int64_t item = static_cast<int64_t>(c10::elementSize(options_.dtype().toScalarType()));
  int64_t in_flight = 0;
  for (size_t j = cursor_; j < record_.size(); ++j) {
    if (in_flight >= s3_.prefetch_bucket_size) break;
    Unit& v = units_[record_[j]];
    const int64_t n = v.layout.padded;
    if (v.storage.gathered) {
      if (v.storage.work) in_flight += n;
      continue;
    }
    if (fetcher_.live_bytes() / item + n > s3_.max_live_parameters) break;
    gather(record_[j], ahead_kind(j));
    ++stats_.gathers;
    ++stats_.prefetched;
    in_flight += n;
  }
}

bool Stage3::reused_soon(int u) const {
  // Following the record: u's next request comes within stage3_max_reuse_distance elements.
  if (!following_) return false;
  int64_t distance = 0;
  for (size_t j = cursor_; j < record_.size(); ++j) {
    if (record_[j] == u) return distance <= s3_.max_reuse_distance;
    distance += units_[record_[j]].layout.padded;
  }
  return false;
}

void Stage3::maybe_release(int u) {
  Unit& unit = units_[u];
  if (whole_model_unit_ || !unit.storage.gathered) return;
  // In backward a unit goes once its gradients are in and its inputs passed (NOTE [stage 3
  // backward]); in forward once its fn returned.
  if (unit.in_backward && (!unit.grads_done || unit.pending_inputs > 0)) return;
  if (unit.held > 0 || reused_soon(u)) return;
  fetcher_.release(unit.storage);
  if (unit.in_backward) fetcher_.drop_secondary(unit.storage);  // NOTE [secondary partition]
}

void Stage3::enter_backward(int u) {
  Unit& unit = units_[u];
  unit.in_backward = true;
  request(u, /*record=*/true);
}

void Stage3::inputs_done(int u) {
  Unit& unit = units_[u];
  if (unit.pending_inputs > 0) --unit.pending_inputs;
  if (unit.grads_done && unit.pending_inputs == 0) maybe_release(u);
}

void Stage3::on_group_complete(int group) {
  // Under the reducer's lock (reduce_scatter.h): every gradient of the group has arrived.
  for (size_t u = 0; u < units_.size(); ++u) {
    if (units_[u].group != group) continue;
    units_[u].grads_done = true;
    if (units_[u].pending_inputs == 0) maybe_release(static_cast<int>(u));
  }
}

// ----- around the step ------------------------------------------------------------------------

void Stage3::before_backward(const at::Tensor& loss) {
  raise_deferred();
  backward_ = true;
  current_backward_ = current_.size();
  watch_paused_ = true;
  if (s3_.debug && !whole_model_unit_) check_used_inside_units(loss);
}

void Stage3::check_used_inside_units(const at::Tensor& loss) const {
  // For each unit, walk the loss's graph knowing whether the walk is inside one of the unit's
  // calls: its UnitOutputs' backward enters a call, its UnitInputs' leaves it, and a checkpoint's
  // backward has the call's inputs as its edges (outside). Reaching one of the unit's parameters
  // from outside means forward used it outside zero::call, where its storage is released
  // (NaN-filled in debug mode).
  using torch::autograd::Node;
  const auto& root = loss.grad_fn();
  if (!root) return;
  for (size_t u = 0; u < units_.size(); ++u) {
    const int unit = static_cast<int>(u);
    std::unordered_map<const Node*, int> param_of;
    for (size_t i = 0; i < units_[u].params.size(); ++i) {
      auto acc = torch::autograd::impl::try_get_grad_accumulator(units_[u].params[i]);
      if (acc) param_of.emplace(acc.get(), static_cast<int>(i));
    }
    if (param_of.empty()) continue;
    std::unordered_set<const Node*> seen[2];  // [inside]
    seen[0].insert(root.get());
    std::vector<std::pair<Node*, bool>> todo{{root.get(), false}};
    while (!todo.empty()) {
      auto [node, inside] = todo.back();
      todo.pop_back();
      const UnitNode kind = unit_node(node, registry_id_, unit);
      if (kind == UnitNode::kOutputs) inside = true;
      if (kind == UnitNode::kInputs || kind == UnitNode::kCheckpoint) inside = false;
      for (const auto& edge : node->next_edges()) {
        Node* next = edge.function.get();
        if (!next) continue;
        if (auto it = param_of.find(next); it != param_of.end()) {
          DSCPP_CHECK(inside, Error, "parameter '", units_[u].names[it->second],
                      "' of stage-3 unit '", unit_name(unit),
                      "' is used outside zero::call of its unit, where its storage is released "
                      "(debug mode fills it with NaN). HINT: run every use of the parameter "
                      "inside the unit's call");
          continue;
        }
        if (seen[inside].insert(next).second) todo.push_back({next, inside});
      }
    }
  }
}

void Stage3::after_backward() {
  raise_deferred();
  // Every unit is released at the end of a pass (kept ones too), and the pass's order becomes the
  // record when it was recorded (NOTE [stage 3 prefetch order]).
  for (auto& u : units_) {
    if (!whole_model_unit_ && u.held == 0) fetcher_.release(u.storage);
    u.pending_inputs = 0;
    u.in_backward = false;
    u.grads_done = false;
  }
  backward_ = false;
  drop_secondaries();
  if (!following_ || dropped_) {
    if (!current_.empty() && !whole_model_unit_) check_order_across_ranks();
    record_ = current_;
    record_backward_ = current_backward_;
    following_ = !record_.empty();
  }
  dropped_ = false;
  current_.clear();
  stop_watching();  // NOTE [released reads]: the first pass is over
  cursor_ = 0;
}

void Stage3::check_request_across_ranks(int u) {
  // While recording (NOTE [stage 3 prefetch order]) every rank must request the same unit: one
  // all-reduce of (u, -u) with max says which units the ranks asked for.
  at::Tensor t = at::tensor({static_cast<double>(u), -static_cast<double>(u)}, at::kDouble)
                     .to(options_.device());
  comm_.all_reduce(t, comm::ReduceOp::max)->wait();
  t = t.to(at::kCPU);
  const int hi = static_cast<int>(t[0].item<double>()), lo = static_cast<int>(-t[1].item<double>());
  if (hi == lo) return;
  DSCPP_FAIL(Error, "the ranks ran different stage-3 units at the same point: this rank (",
             comm_.rank(), ") ran '", unit_name(u), "' while another ran '",
             unit_name(u == hi ? lo : hi), "' (request ", current_.size() + 1,
             " of this forward "
             "and backward); every rank must run the same units in the same order, since each "
             "gathers its parameters from all ranks. HINT: make data-dependent branches take the "
             "same path on every rank");
}

void Stage3::check_order_across_ranks() {
  // One all-reduce of (hash, -hash) with max: every rank ran the same units in the same order
  // exactly when max and -max(-hash) agree.
  const double h = order_hash(current_);
  at::Tensor t = at::tensor({h, -h}, at::kDouble).to(options_.device());
  comm_.all_reduce(t, comm::ReduceOp::max)->wait();
  t = t.to(at::kCPU);
  const double hi = t[0].item<double>(), lo = -t[1].item<double>();
  if (hi == lo) return;
  std::string order;
  for (size_t i = 0; i < current_.size() && i < 12; ++i) {
    order += (i ? ", " : "") + unit_name(current_[i]);
  }
  if (current_.size() > 12) order += ", ...";
  DSCPP_FAIL(Error,
             "the stage-3 units ran in a different order on different ranks in this "
             "forward and backward (rank ",
             comm_.rank(), ": ", order,
             "); every rank must run "
             "the same units in the same order, since each gathers its parameters from all ranks. "
             "HINT: make data-dependent branches take the same path on every rank");
}

void Stage3::before_update() {
  OwnOps own;                                                  // NOTE [released reads]
  if (whole_model_unit_) fetcher_.release(units_[0].storage);  // the step runs on the shards
  drop_secondaries();  // the shards change (a forward without backward may have left some)
}

void Stage3::reduce_accumulated() {
  DSCPP_FAIL(Error, "internal: stage 3 reduces in every backward");
}

void Stage3::publish_params() {
  OwnOps own;  // NOTE [released reads]
  drop_secondaries();  // the shards changed (a step or a load)
  // The resident group is all-gathered as at stage 2; units keep only their (updated) shards.
  if (resident_layout_.padded > 0) {
    gather_in_place(comm_, resident_flat_, resident_layout_.shard, allgather_bucket_size_);
  }
  if (whole_model_unit_) {
    // A GatheredParameters scope open across the step reads (and may write back) exact values
    // (NOTE [block-wise quantization]).
    gather(0, units_[0].held > 0 ? Gather::kExact : Gather::kPlain);
    fetcher_.wait(units_[0].storage);
  }
}

}  // namespace dscpp::zero
