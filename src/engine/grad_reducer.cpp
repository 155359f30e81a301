// Implements GradReducer (see grad_reducer.h and NOTE [bucket order]).
#include "engine/grad_reducer.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <chrono>
#include <unordered_map>
#include <unordered_set>

#include "dscpp/error.h"
#include "util/log.h"

namespace dscpp::engine {
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

// Before a parameter's gradient accumulator runs: where the gradient will go can still change.
class ArrivingHook final : public torch::autograd::FunctionPreHook {
 public:
  explicit ArrivingHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    fn_();
    return grads;
  }

 private:
  std::function<void()> fn_;
};

}  // namespace

int64_t capped_bucket_size(int64_t configured, int64_t numel) {
  const int64_t cap = std::max(kMinBucketCap, (numel + kBucketsPerModel - 1) / kBucketsPerModel);
  return std::min(configured, cap);
}

GradReducer::GradReducer(std::vector<at::Tensor> params, std::vector<std::string> names,
                         comm::Communicator& comm, GradReduceOptions options, int64_t side_channel)
    : params_(std::move(params)), names_(std::move(names)), comm_(comm), options_(options) {
  DSCPP_CHECK(!params_.empty(), ConfigError,
              "the model has no trainable parameters (requires_grad). HINT: nothing to train");
  DSCPP_CHECK(options_.reduce_bucket_size > 0, ConfigError,
              "zero_optimization.reduce_bucket_size must be > 0");
  DSCPP_CHECK(side_channel == 0 || (options_.mode == ReduceMode::kAllReduce && options_.dtype == at::kFloat),
              Error, "internal: the gradient side channel needs fp32 all-reduce");
  auto device = params_[0].device();
  int64_t total = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& p = params_[i];
    DSCPP_CHECK(p.scalar_type() == at::kFloat, ConfigError, "parameter '", names_[i], "' is ",
                p.scalar_type(),
                "; dscpp keeps the model in fp32 and casts for mixed precision itself. HINT: "
                "build the model in fp32 and enable bf16/fp16 in the config");
    DSCPP_CHECK(p.device() == device, ConfigError, "parameter '", names_[i], "' is on ",
                p.device(), " but '", names_[0], "' is on ", device,
                ". HINT: move the whole model to one device before initialize()");
    segments_.emplace_back(total, p.numel());
    total += p.numel();
  }
  auto opts = params_[0].options().dtype(options_.dtype).requires_grad(false);
  numel_ = total;
  // Padded so that every rank's shard is equal (ZeRO); stage 0 only ever reads [0, numel).
  const int64_t world = comm_.world_size();
  const int64_t padded = (total + world - 1) / world * world;
  // Filled parameter by parameter, each original freed as soon as it is copied (set_data), so
  // the model never exists twice at once (untouched pages of `empty` are not resident).
  flat_params_ = at::empty({padded}, opts);
  flat_params_.narrow(0, total, padded - total).zero_();
  {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      auto [off, n] = segments_[i];
      flat_params_.narrow(0, off, n).copy_(params_[i].reshape({-1}));
      params_[i].set_data(flat_params_.narrow(0, off, n).view(params_[i].sizes()));
    }
  }
  if (options_.mode == ReduceMode::kReduceScatter) {
    grad_shard_ = at::zeros({shard_numel()}, opts);
    for (auto& p : params_) p.mutable_grad() = at::Tensor();
  } else {
    // [side channel | gradients | padding] (NOTE [side channel]).
    grad_storage_ = at::zeros({side_channel + padded}, opts);
    side_channel_ = grad_storage_.narrow(0, 0, side_channel);
    flat_grads_ = grad_storage_.narrow(0, side_channel, padded);
    if (options_.mode == ReduceMode::kReduceScatterInPlace) {
      grad_shard_ = flat_grads_.narrow(0, shard_offset(), shard_numel());
    }
    attach_grad_views();
  }
  // Buckets from the end of the buffer; a parameter is never split across buckets.
  bucket_of_param_.assign(params_.size(), -1);
  for (int i = static_cast<int>(params_.size()) - 1; i >= 0; --i) {
    if (buckets_.empty() ||
        buckets_.back().numel + segments_[i].second > options_.reduce_bucket_size &&
            !buckets_.back().params.empty()) {
      buckets_.emplace_back();
    }
    Bucket& b = buckets_.back();
    b.params.push_back(i);
    b.offset = segments_[i].first;
    b.numel += segments_[i].second;
    bucket_of_param_[i] = static_cast<int>(buckets_.size()) - 1;
  }
  if (options_.mode == ReduceMode::kReduceScatter) {
    // NOTE [stage 2 slots]: one slot, or two with overlap_comm.
    const int slots = options_.overlap_comm ? 2 : 1;
    staging_.resize(slots);
    slot_bucket_.assign(slots, -1);
    int64_t largest = 0;
    for (const auto& b : buckets_) largest = std::max(largest, b.numel);
    if (options_.contiguous_gradients) {
      for (auto& slot : staging_) slot = at::empty({largest}, opts);
    }
  }
  got_grad_.assign(params_.size(), 0);
  for (size_t i = 0; i < params_.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    DSCPP_CHECK(acc, Error, "parameter '", names_[i], "' has no gradient accumulator");
    int index = static_cast<int>(i);
    uintptr_t key =
        acc->add_post_hook(std::make_unique<ReadyHook>([this, index] { on_grad_ready(index); }));
    auto arriving = std::make_unique<ArrivingHook>([this, index] { on_grad_arriving(index); });
    hooks_.push_back({acc, key, arriving.get()});
    acc->add_pre_hook(std::move(arriving));
  }
  DSCPP_LOG_DEBUG("gradient buckets: {} over {} parameters ({} elements, reduce_bucket_size {})",
                  buckets_.size(), params_.size(), total, options_.reduce_bucket_size);
}

GradReducer::~GradReducer() {
  for (auto& h : hooks_) {
    h.acc->del_post_hook(h.post_key);
    auto& pre = h.acc->pre_hooks();
    pre.erase(std::remove_if(pre.begin(), pre.end(), [&](const auto& p) { return p.get() == h.pre; }),
              pre.end());
  }
  // Reductions still in flight (a backward that threw) must finish before their buffers go.
  for (auto& f : in_flight_) {
    try {
      f.work->wait();
    } catch (...) {
    }
  }
}

void GradReducer::attach_grad_views() {
  // A user's model->zero_grad() (set_to_none in libtorch 2.x) or optimizer may have replaced a
  // gradient; put the flat-buffer view back so reductions and the optimizer see it.
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto [off, n] = segments_[i];
    auto view = flat_grads_.narrow(0, off, n);
    const at::Tensor& g = params_[i].grad();
    if (g.defined() && g.data_ptr() == view.data_ptr()) continue;
    if (g.defined()) view.copy_(g.reshape({-1}));
    else view.zero_();
    params_[i].mutable_grad() = view.view(params_[i].sizes());
  }
}

void GradReducer::prepare_backward(bool reduce, const at::Tensor& loss) {
  if (options_.mode == ReduceMode::kReduceScatter) {
    // Every backward reduces (the shard accumulates); autograd allocates fresh gradients.
    reduce = true;
    for (auto& p : params_) p.mutable_grad() = at::Tensor();
  } else {
    attach_grad_views();
  }
  std::vector<char> reach = reduce && loss.defined() ? reachable_from(loss) : std::vector<char>{};
  std::lock_guard<std::mutex> g(mu_);
  in_flight_.clear();  // left by a backward that failed midway
  std::fill(slot_bucket_.begin(), slot_bucket_.end(), -1);
  if (!options_.contiguous_gradients) {
    for (auto& slot : staging_) slot = at::Tensor();
  }
  reducing_ = reduce;
  next_bucket_ = 0;
  works_.clear();
  std::fill(got_grad_.begin(), got_grad_.end(), 0);
  late_gradient_ = false;
  kept_gradients_ = 0;
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
  for (size_t i = 0; i < hooks_.size(); ++i) param_of.emplace(hooks_[i].acc.get(), static_cast<int>(i));
  std::vector<char> reach(params_.size(), 0);
  std::unordered_set<const torch::autograd::Node*> seen{root.get()};
  std::vector<torch::autograd::Node*> todo{root.get()};
  while (!todo.empty()) {
    torch::autograd::Node* node = todo.back();
    todo.pop_back();
    for (const auto& edge : node->next_edges()) {
      torch::autograd::Node* next = edge.function.get();
      if (!next || !seen.insert(next).second) continue;
      if (auto it = param_of.find(next); it != param_of.end()) reach[it->second] = 1;
      todo.push_back(next);
    }
  }
  return reach;
}

void GradReducer::on_grad_arriving(int param) {
  if (options_.mode == ReduceMode::kAllReduce) return;
  std::lock_guard<std::mutex> g(mu_);
  if (!reducing_) return;
  Bucket& b = buckets_[bucket_of_param_[param]];
  if (b.launched) return;  // a late gradient: on_grad_ready reports it
  if (options_.mode == ReduceMode::kReduceScatterInPlace) {
    // overlap_comm false: the reductions in flight finish before a later bucket accumulates.
    if (!options_.overlap_comm) {
      while (!in_flight_.empty()) retire_oldest_locked();
    }
    return;
  }
  if (b.slot < 0) acquire_slot_locked(b);  // NOTE [stage 2 slots]
}

void GradReducer::on_grad_ready(int param) {
  std::lock_guard<std::mutex> g(mu_);
  if (reducing_ && buckets_[bucket_of_param_[param]].launched) {
    // A gradient after its bucket was reduced: a second one for the same parameter, or one the
    // loss's autograd graph did not show (a custom function that runs a backward of its own,
    // such as reentrant activation checkpointing). It would be lost: say so, and spoil the window.
    late_gradient_ = true;
    DSCPP_FAIL(Error, "parameter '", names_[param], "' received a gradient in this backward after "
               "its bucket had been reduced, so that gradient would be lost. HINT: reentrant "
               "activation checkpointing (a function that runs its own backward) is not "
               "supported; use non-reentrant checkpointing");
  }
  // A second gradient before the reduction is accumulated, fine; one for a parameter counted
  // as unreachable is too (it was counted ready already).
  if (got_grad_[param]) {
    got_grad_[param] = 1;
    return;
  }
  got_grad_[param] = 1;
  if (!reducing_) return;
  mark_ready_locked(param);
  retire_completed_locked();
}

int64_t GradReducer::kept_gradients() const {
  std::lock_guard<std::mutex> g(mu_);
  return kept_gradients_;
}

bool GradReducer::late_gradient() const {
  std::lock_guard<std::mutex> g(mu_);
  return late_gradient_;
}

void GradReducer::mark_ready_locked(int param) {
  Bucket& b = buckets_[bucket_of_param_[param]];
  if (b.pending > 0) --b.pending;
  launch_in_order_locked();
}

void GradReducer::launch_in_order_locked() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    Bucket& b = buckets_[next_bucket_];
    // The side channel's bucket waits for finish_backward (NOTE [side channel]).
    if (&b == &buckets_.back() && side_channel_.numel() > 0 && !finishing_) break;
    if (options_.mode == ReduceMode::kAllReduce) launch_all_reduce(b);
    else launch_reduce_scatter(b);
    b.launched = true;
    ++next_bucket_;
  }
}

namespace {
// DeepSpeed's order of scaling (engine.allreduce_bucket): with prescale_gradients divide by the
// world size before summing; otherwise divide by gradient_predivide_factor before and multiply by
// predivide / world after. Both give the mean over ranks.
void prescale(at::Tensor& t, const GradReduceOptions& o, int world) {
  if (o.prescale_gradients) t.div_(world);
  else if (o.gradient_predivide_factor != 1.0) t.mul_(1.0 / o.gradient_predivide_factor);
}
double postscale_factor(const GradReduceOptions& o, int world) {
  return o.prescale_gradients ? 1.0 : o.gradient_predivide_factor / world;
}
}  // namespace

void GradReducer::launch_all_reduce(Bucket& b) {
  auto slice = flat_grads_.narrow(0, b.offset, b.numel);
  prescale(slice, options_, comm_.world_size());
  // The bucket at the start of the buffer, launched last, also carries the side channel just
  // before it (NOTE [side channel]).
  const int64_t side = side_channel_.numel();
  at::Tensor t = &b == &buckets_.back() && side > 0 ? grad_storage_.narrow(0, 0, side + b.numel) : slice;
  works_.push_back(comm_.all_reduce(t, comm::ReduceOp::sum));
}

void GradReducer::launch_reduce_scatter(Bucket& b) {
  const bool in_place = options_.mode == ReduceMode::kReduceScatterInPlace;
  at::Tensor staging;
  if (in_place) {
    staging = flat_grads_.narrow(0, b.offset, b.numel);
  } else {
    // The bucket's gradients are in its slot (NOTE [stage 2 slots]), or in a buffer of its own
    // when every slot serves a bucket still accumulating.
    if (b.slot < 0) acquire_slot_locked(b);
    if (b.slot >= 0) {
      staging = staging_[b.slot].narrow(0, 0, b.numel);
    } else {
      staging = at::empty({b.numel}, flat_params_.options());
      copy_kept_gradients(b, staging);
    }
    for (int p : b.params) params_[p].mutable_grad() = at::Tensor();
  }
  const int world = comm_.world_size();
  prescale(staging, options_, world);
  // The part of [b.offset, b.offset + b.numel) in each rank's shard; the ranks' parts are
  // consecutive, so this rank's part starts where the earlier ranks' parts end.
  const int64_t S = shard_numel();
  std::vector<int64_t> counts(world);
  for (int r = 0; r < world; ++r) {
    const int64_t lo = std::max(b.offset, r * S), hi = std::min(b.offset + b.numel, (r + 1) * S);
    counts[r] = std::max<int64_t>(0, hi - lo);
  }
  const int rank = comm_.rank();
  const int64_t own_start = std::clamp(rank * S, b.offset, b.offset + b.numel);
  InFlight f;
  f.staging = staging;
  f.result = staging.narrow(0, own_start - b.offset, counts[rank]);
  f.shard_pos = own_start - rank * S;
  f.slot = b.slot;
  f.work = options_.reduce_scatter ? comm_.reduce_scatter(f.result, staging, counts)
                                   : comm_.all_reduce(staging, comm::ReduceOp::sum);
  in_flight_.push_back(std::move(f));
}

void GradReducer::retire_oldest_locked() {
  DSCPP_CHECK(!in_flight_.empty(), Error, "internal: no gradient reduction in flight to wait for");
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  {
    // A stage-2 slot is free once its reduction is over, whether it succeeded or threw.
    struct ReleaseSlot {
      GradReducer& r;
      int slot;
      ~ReleaseSlot() {
        if (slot < 0) return;
        r.slot_bucket_[slot] = -1;
        if (!r.options_.contiguous_gradients) r.staging_[slot] = at::Tensor();
      }
    } release{*this, f.slot};
    f.work->wait();
    add_to_shard(f);
  }
}

void GradReducer::add_to_shard(const InFlight& f) {
  const double factor = postscale_factor(options_, comm_.world_size());
  if (f.result.numel() == 0) return;
  if (options_.mode == ReduceMode::kReduceScatterInPlace) {
    if (factor != 1.0) f.result.mul_(factor);
    return;
  }
  at::Tensor dst = grad_shard_.narrow(0, f.shard_pos, f.result.numel());
  if (factor != 1.0) dst.add_(f.result, factor);
  else dst.add_(f.result);
}

void GradReducer::retire_completed_locked() {
  while (!in_flight_.empty() && in_flight_.front().work->is_completed()) {
    retire_oldest_locked();
  }
}

void GradReducer::acquire_slot_locked(Bucket& b) {
  for (;;) {
    for (size_t s = 0; s < staging_.size(); ++s) {
      if (slot_bucket_[s] >= 0) continue;
      attach_locked(b, static_cast<int>(s));
      return;
    }
    // Every slot is busy: wait for the oldest reduction to free one (backpressure), unless
    // every slot serves a bucket still accumulating (gradients arriving out of bucket order).
    if (in_flight_.empty()) return;
    retire_oldest_locked();
  }
}

void GradReducer::attach_locked(Bucket& b, int slot) {
  slot_bucket_[slot] = static_cast<int>(&b - buckets_.data());
  b.slot = slot;
  if (!staging_[slot].defined()) staging_[slot] = at::empty({b.numel}, flat_params_.options());
  at::Tensor region = staging_[slot].narrow(0, 0, b.numel);
  copy_kept_gradients(b, region);
  for (int p : b.params) {
    auto [off, n] = segments_[p];
    params_[p].mutable_grad() = region.narrow(0, off - b.offset, n).view(params_[p].sizes());
  }
}

void GradReducer::copy_kept_gradients(const Bucket& b, const at::Tensor& dst) {
  at::NoGradGuard no_grad;
  for (int p : b.params) {
    auto [off, n] = segments_[p];
    at::Tensor view = dst.narrow(0, off - b.offset, n);
    const at::Tensor& g = params_[p].grad();
    if (g.defined()) {
      view.copy_(g.reshape({-1}));
      ++kept_gradients_;
    } else {
      view.zero_();
    }
  }
}

double GradReducer::finish_backward() {
  std::vector<comm::WorkHandle> works;
  std::unique_lock<std::mutex> g(mu_);
  if (!reducing_) return 0;
  for (auto& b : buckets_) b.pending = 0;  // unused parameters: reduce what is there
  finishing_ = true;
  launch_in_order_locked();
  finishing_ = false;
  works.swap(works_);
  reducing_ = false;
  auto t0 = std::chrono::steady_clock::now();
  while (!in_flight_.empty()) retire_oldest_locked();
  g.unlock();
  for (auto& w : works) w->wait();
  if (options_.mode == ReduceMode::kAllReduce) {
    const double factor = postscale_factor(options_, comm_.world_size());
    if (factor != 1.0) flat_grads_.narrow(0, 0, numel_).mul_(factor);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void GradReducer::reduce_all_now() {
  DSCPP_CHECK(options_.mode != ReduceMode::kReduceScatter, Error,
              "internal: stage 2 reduces in every backward");
  prepare_backward(true);
  finish_backward();
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

int64_t GradReducer::grad_bytes() const {
  const at::Tensor& t = options_.mode == ReduceMode::kReduceScatter ? grad_shard_ : grad_storage_;
  return static_cast<int64_t>(t.nbytes());
}

int64_t GradReducer::staging_bytes() const {
  int64_t total = 0;
  if (!options_.contiguous_gradients) return 0;  // allocated per bucket, freed once reduced
  for (const auto& s : staging_) total += static_cast<int64_t>(s.nbytes());
  return total;
}

void GradReducer::zero_grads() {
  if (options_.mode == ReduceMode::kReduceScatter) {
    grad_shard_.zero_();
    for (auto& p : params_) p.mutable_grad() = at::Tensor();
  } else {
    grad_storage_.zero_();
  }
}

}  // namespace dscpp::engine
