// Implements the shared bucket machinery of GradReducer (see reducer.h and NOTE [bucket order]).
#include "zero/reducer.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <unordered_map>
#include <unordered_set>

#include "dscpp/error.h"
#include "util/fault_inject.h"
#include "util/log.h"
#include "zero/unit_functions.h"

namespace dscpp::zero {
namespace {

// After a parameter's gradient accumulator ran: the gradient is in.
class ReadyHook final : public torch::autograd::FunctionPostHook {
 public:
  explicit ReadyHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

// Before a parameter's gradient accumulator runs: where the gradient will go can still change,
// and the gradient path may take it in itself (NOTE [first gradient is written] in
// grad_buffer.h), leaving the accumulator nothing to add (it skips an undefined gradient).
class ArrivingHook final : public torch::autograd::FunctionPreHook {
 public:
  explicit ArrivingHook(std::function<bool(const at::Tensor&)> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    if (fn_(grads.empty() ? at::Tensor() : grads[0])) return {at::Tensor()};
    return grads;
  }

 private:
  std::function<bool(const at::Tensor&)> fn_;
};

}  // namespace

int64_t capped_bucket_size(int64_t configured, int64_t numel) {
  const int64_t cap = std::max(kMinBucketCap, (numel + kBucketsPerModel - 1) / kBucketsPerModel);
  return std::min(configured, cap);
}

GradReducer::GradReducer(std::vector<at::Tensor> params, std::vector<std::string> names,
                         std::vector<std::pair<int64_t, int64_t>> segments,
                         std::vector<GroupGeometry> groups, std::vector<int> param_group,
                         comm::Communicator& comm, ReduceOptions options)
    : params_(std::move(params)),
      names_(std::move(names)),
      segments_(std::move(segments)),
      groups_(std::move(groups)),
      param_group_(std::move(param_group)),
      comm_(comm),
      options_(options) {
  DSCPP_CHECK(!params_.empty(), ConfigError,
              "the model has no trainable parameters (requires_grad). HINT: nothing to train");
  DSCPP_CHECK(options_.reduce_bucket_size > 0, ConfigError,
              "zero_optimization.reduce_bucket_size must be > 0");
  buffer_options_ = params_[0].options()
                       .dtype(options_.accumulate_dtype.value_or(options_.dtype))
                       .requires_grad(false);
  if (param_group_.empty()) param_group_.assign(params_.size(), 0);
  DSCPP_CHECK(param_group_.size() == params_.size() && segments_.size() == params_.size(), Error,
              "internal: ", params_.size(), " parameters, ", segments_.size(), " segments and ",
              param_group_.size(), " group indices");
  // Each parameter's wire dtype, unset where it is the buffers' (NOTE [wire dtype]).
  auto wire_of = [this](int i) {
    const auto own = options_.wire_dtype_of.find(names_[i]);
    std::optional<at::ScalarType> w =
        own != options_.wire_dtype_of.end() ? own->second : options_.wire_dtype;
    if (w == buffer_options_.dtype().toScalarType()) w.reset();
    return w;
  };
  // Buckets from the end of the flat space; a parameter is never split, a group or a change of
  // wire dtype never crossed.
  bucket_of_param_.assign(params_.size(), -1);
  for (int i = static_cast<int>(params_.size()) - 1; i >= 0; --i) {
    const std::optional<at::ScalarType> wire = wire_of(i);
    if (buckets_.empty() || buckets_.back().group != param_group_[i] ||
        buckets_.back().wire != wire ||
        (buckets_.back().numel + segments_[i].second > options_.reduce_bucket_size &&
         !buckets_.back().params.empty())) {
      buckets_.emplace_back();
      buckets_.back().group = param_group_[i];
      buckets_.back().wire = wire;
    }
    Bucket& b = buckets_.back();
    b.params.push_back(i);
    b.offset = segments_[i].first;
    b.numel += segments_[i].second;
    bucket_of_param_[i] = static_cast<int>(buckets_.size()) - 1;
  }
  got_grad_.assign(params_.size(), 0);
  DSCPP_LOG_DEBUG("gradient buckets: {} over {} parameters (reduce_bucket_size {})",
                  buckets_.size(), params_.size(), options_.reduce_bucket_size);
}

void GradReducer::install_hooks() {
  for (size_t i = 0; i < params_.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    DSCPP_CHECK(acc, Error, "parameter '", names_[i], "' has no gradient accumulator");
    int index = static_cast<int>(i);
    uintptr_t key =
        acc->add_post_hook(std::make_unique<ReadyHook>([this, index] { on_grad_ready(index); }));
    auto arriving = std::make_unique<ArrivingHook>(
        [this, index](const at::Tensor& g) { return on_grad_arriving(index, g); });
    hooks_.push_back({acc, key, arriving.get()});
    acc->add_pre_hook(std::move(arriving));
  }
}

GradReducer::~GradReducer() {
  for (auto& h : hooks_) {
    h.acc->del_post_hook(h.post_key);
    auto& pre = h.acc->pre_hooks();
    pre.erase(
        std::remove_if(pre.begin(), pre.end(), [&](const auto& p) { return p.get() == h.pre; }),
        pre.end());
  }
}

void GradReducer::drain_quietly() {
  std::lock_guard<std::mutex> g(mu_);
  for (auto& f : in_flight_) {
    try {
      f.work->wait();
    } catch (...) {
    }
  }
  in_flight_.clear();
}

void GradReducer::prepare_backward(bool reduce, const at::Tensor& loss) {
  reduce = reduce || reduces_every_backward();
  before_backward();
  std::vector<char> reach = reduce && loss.defined() ? reachable_from(loss) : std::vector<char>{};
  std::lock_guard<std::mutex> g(mu_);
  in_flight_.clear();  // left by a backward that failed midway
  reset_locked();
  reducing_ = reduce;
  next_bucket_ = 0;
  std::fill(got_grad_.begin(), got_grad_.end(), 0);
  late_gradient_ = false;
  wait_seconds_ = 0;
  for (auto& b : buckets_) {
    b.pending = static_cast<int>(b.params.size());
    b.launched = false;
    b.slot = -1;
  }
  // Parameters the loss cannot reach get no gradient in this backward: ready now.
  for (size_t i = 0; i < reach.size(); ++i) {
    if (reach[i]) continue;
    got_grad_[i] = 2;
    mark_ready_locked(static_cast<int>(i));
  }
}

std::vector<char> GradReducer::reachable_from(const at::Tensor& loss) const {
  const auto& root = loss.grad_fn();
  if (!root) return {};
  std::unordered_map<const torch::autograd::Node*, int> param_of;
  for (size_t i = 0; i < hooks_.size(); ++i)
    param_of.emplace(hooks_[i].acc.get(), static_cast<int>(i));
  std::vector<char> reach(params_.size(), 0);
  std::unordered_set<const torch::autograd::Node*> seen{root.get()};
  std::vector<torch::autograd::Node*> todo{root.get()};
  while (!todo.empty()) {
    torch::autograd::Node* node = todo.back();
    todo.pop_back();
    // zero::checkpoint runs a backward of its own over its module's parameters.
    for (const auto& p : parameters_behind(node)) {
      auto acc = torch::autograd::impl::try_get_grad_accumulator(p);
      if (!acc) continue;
      if (auto it = param_of.find(acc.get()); it != param_of.end()) reach[it->second] = 1;
    }
    for (const auto& edge : node->next_edges()) {
      torch::autograd::Node* next = edge.function.get();
      if (!next || !seen.insert(next).second) continue;
      if (auto it = param_of.find(next); it != param_of.end()) reach[it->second] = 1;
      todo.push_back(next);
    }
  }
  return reach;
}

bool GradReducer::on_grad_arriving(int param, const at::Tensor& grad) {
  std::lock_guard<std::mutex> g(mu_);
  if (reducing_) {
    Bucket& b = buckets_[bucket_of_param_[param]];
    if (b.launched) return false;  // a late gradient: on_grad_ready reports it
    on_arriving_locked(param, b);
  }
  return grad.defined() && take_gradient_locked(param, grad);
}

void GradReducer::on_grad_ready(int param) {
  std::lock_guard<std::mutex> g(mu_);
  if (reducing_ && buckets_[bucket_of_param_[param]].launched) {
    // A gradient after its bucket was reduced: a second one for the same parameter, or one the
    // loss's autograd graph did not show (a custom function that runs a backward of its own,
    // such as reentrant activation checkpointing). It would be lost: say so, and spoil the window.
    late_gradient_ = true;
    DSCPP_FAIL(Error, "parameter '", names_[param],
               "' received a gradient in this backward after "
               "its bucket had been reduced, so that gradient would be lost. HINT: a function "
               "that runs a backward of its own (activation checkpointing) must be "
               "dscpp::zero::checkpoint, whose parameters dscpp knows");
  }
  // A second gradient before the reduction is accumulated, fine; one for a parameter counted
  // as unreachable is too (it was counted ready already).
  if (got_grad_[param]) {
    got_grad_[param] = 1;
    return;
  }
  got_grad_[param] = 1;
  if (!reducing_) return;
  if (options_.check_finite) {
    // Its whole gradient for this reduction is in .grad now (any dtype sums in fp32 or wider
    // and rounds to its own, whose range is fp32's or more; a sum overflowing to Inf needs
    // gradients near the dtype's limit, non-finite in any norm). The sums stay on the device:
    // reading one here would wait for it once per parameter in backward; only the error path
    // (first_nonfinite) reads them.
    const at::Tensor g = accumulated_grad_locked(param);
    if (g.defined()) {
      if (!sums_.defined()) {
        at::Tensor sums = at::zeros({static_cast<int64_t>(params_.size())}, g.options());
        std::vector<at::Tensor> slots;
        for (int64_t p = 0; p < sums.numel(); ++p) slots.push_back(sums.select(0, p));
        sums_ = std::move(sums);
        sum_slots_ = std::move(slots);
      }
      sum_slots_[param].add_(g.sum());
    }
  }
  mark_ready_locked(param);
  retire_completed_locked();
}

int GradReducer::first_nonfinite() const {
  std::lock_guard<std::mutex> g(mu_);
  if (!sums_.defined()) return -1;
  const at::Tensor sums = sums_.to(at::kCPU, at::kDouble).contiguous();
  const double* s = sums.data_ptr<double>();
  for (int64_t p = 0; p < sums.numel(); ++p) {
    if (!std::isfinite(s[p])) return static_cast<int>(p);
  }
  return -1;
}

void GradReducer::clear_nonfinite() {
  std::lock_guard<std::mutex> g(mu_);
  if (sums_.defined()) sums_.zero_();
}

bool GradReducer::late_gradient() const {
  std::lock_guard<std::mutex> g(mu_);
  return late_gradient_;
}

void GradReducer::mark_ready_locked(int param) {
  Bucket& b = buckets_[bucket_of_param_[param]];
  if (b.pending > 0 && --b.pending == 0) on_bucket_complete_locked(b);
  launch_in_order_locked();
}

void GradReducer::launch_in_order_locked() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    Bucket& b = buckets_[next_bucket_];
    if (!may_launch_locked(b)) break;
    launch_locked(b);
    b.launched = true;
    ++next_bucket_;
    fault::point(fault::Phase::backward);
  }
}

void GradReducer::prescale(at::Tensor& t) const {
  if (!options_.average) return;
  if (options_.prescale_gradients)
    t.div_(comm_.world_size());
  else if (options_.gradient_predivide_factor != 1.0)
    t.mul_(1.0 / options_.gradient_predivide_factor);
}

comm::ReduceOp GradReducer::reduce_op() const {
  if (!options_.average) return comm::ReduceOp::sum;
  const bool mean = !options_.prescale_gradients && options_.gradient_predivide_factor == 1.0;
  return mean ? comm::ReduceOp::avg : comm::ReduceOp::sum;
}

double GradReducer::postscale_factor() const {
  if (!options_.average) return 1.0;
  if (options_.prescale_gradients || reduce_op() == comm::ReduceOp::avg) return 1.0;
  return options_.gradient_predivide_factor / comm_.world_size();
}

std::vector<int64_t> GradReducer::rank_counts(const Bucket& b, int64_t* own_start) const {
  // The ranks' parts of [b.offset, b.offset + b.numel) within the group are consecutive, so
  // this rank's part starts where the earlier ranks' parts end.
  const GroupGeometry& g = groups_[b.group];
  const int world = comm_.world_size();
  std::vector<int64_t> counts(world);
  for (int r = 0; r < world; ++r) {
    const int64_t lo = std::max(b.offset, g.base + r * g.shard);
    const int64_t hi = std::min(b.offset + b.numel, g.base + (r + 1) * g.shard);
    counts[r] = std::max<int64_t>(0, hi - lo);
  }
  *own_start = std::clamp(g.base + comm_.rank() * g.shard, b.offset, b.offset + b.numel);
  return counts;
}

void GradReducer::retire_oldest_locked() {
  DSCPP_CHECK(!in_flight_.empty(), Error, "internal: no gradient reduction in flight to wait for");
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  // The slot is free once the reduction is over, whether it succeeded or threw.
  struct ReleaseSlot {
    GradReducer& r;
    int slot;
    ~ReleaseSlot() {
      if (slot >= 0) r.release_slot_locked(slot);
    }
  } release{*this, f.slot};
  const auto t0 = std::chrono::steady_clock::now();
  f.work->wait();
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (f.wire.defined()) f.wire_into.copy_(f.wire);  // NOTE [wire dtype]
  on_reduced_locked(f);
  if (final_ && on_final_piece_ && f.result.defined() && f.result.numel() > 0)
    on_final_piece_(f.shard_pos, final_piece_locked(f));
}

at::Tensor GradReducer::on_wire(const Bucket& b, const at::Tensor& staging, int64_t from,
                                int64_t count, InFlight& f) {
  if (!b.wire || *b.wire == staging.scalar_type()) return staging;
  while (static_cast<int64_t>(in_flight_.size()) >= kWireCopiesInFlight) retire_oldest_locked();
  at::Tensor wire = staging.to(*b.wire);
  f.wire = wire.narrow(0, from, count);
  f.wire_into = staging.narrow(0, from, count);
  return wire;
}

void GradReducer::set_on_final_piece(FinalPiece f) {
  std::lock_guard<std::mutex> g(mu_);
  on_final_piece_ = std::move(f);
}

void GradReducer::set_final(bool final) {
  std::lock_guard<std::mutex> g(mu_);
  final_ = final;
}

void GradReducer::retire_completed_locked() {
  while (!in_flight_.empty() && in_flight_.front().work->is_completed()) retire_oldest_locked();
}

double GradReducer::finish_backward() {
  std::unique_lock<std::mutex> g(mu_);
  if (!reducing_) return 0;
  for (auto& b : buckets_) {  // unused parameters: reduce what is there
    if (b.pending > 0) {
      b.pending = 0;
      on_bucket_complete_locked(b);
    }
  }
  finishing_ = true;
  launch_in_order_locked();
  finishing_ = false;
  reducing_ = false;
  while (!in_flight_.empty()) retire_oldest_locked();
  const double waited = wait_seconds_;
  g.unlock();
  after_finish();
  return waited;
}

bool GradReducer::all_gradients_ready() const {
  std::lock_guard<std::mutex> g(mu_);
  for (const auto& b : buckets_) {
    if (b.pending > 0) return false;
  }
  return true;
}

size_t GradReducer::buckets_launched() const {
  std::lock_guard<std::mutex> g(mu_);
  return next_bucket_;
}

std::vector<std::string> GradReducer::unused_in_last_backward() const {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<std::string> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (got_grad_[i] != 1) out.push_back(names_[i]);
  }
  return out;
}

}  // namespace dscpp::zero
