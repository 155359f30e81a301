// Implements GradReducer (see grad_reducer.h and NOTE [bucket order]).
#include "engine/grad_reducer.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <chrono>

#include "dscpp/error.h"
#include "util/log.h"

namespace dscpp::engine {
namespace {

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

}  // namespace

GradReducer::GradReducer(std::vector<at::Tensor> params, std::vector<std::string> names,
                         comm::Communicator& comm, GradReduceOptions options,
                         int64_t side_channel, int64_t pad_multiple)
    : params_(std::move(params)), names_(std::move(names)), comm_(comm), options_(options) {
  DSCPP_CHECK(!params_.empty(), ConfigError,
              "the model has no trainable parameters (requires_grad). HINT: nothing to train");
  DSCPP_CHECK(options_.reduce_bucket_size > 0, ConfigError,
              "zero_optimization.reduce_bucket_size must be > 0");
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
  auto opts = params_[0].options().requires_grad(false);
  numel_ = total;
  const int64_t padded = (total + pad_multiple - 1) / pad_multiple * pad_multiple;
  flat_params_ = at::zeros({padded}, opts);
  grad_storage_ = at::zeros({padded + side_channel}, opts);
  flat_grads_ = grad_storage_.narrow(0, 0, padded);
  side_channel_ = grad_storage_.narrow(0, padded, side_channel);
  {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      auto [off, n] = segments_[i];
      flat_params_.narrow(0, off, n).copy_(params_[i].reshape({-1}));
      params_[i].set_data(flat_params_.narrow(0, off, n).view(params_[i].sizes()));
      params_[i].mutable_grad() = flat_grads_.narrow(0, off, n).view(params_[i].sizes());
    }
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
  for (size_t i = 0; i < params_.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    DSCPP_CHECK(acc, Error, "parameter '", names_[i], "' has no gradient accumulator");
    int index = static_cast<int>(i);
    uintptr_t key =
        acc->add_post_hook(std::make_unique<ReadyHook>([this, index] { on_grad_ready(index); }));
    hooks_.emplace_back(acc, key);
  }
  DSCPP_LOG_DEBUG("gradient buckets: {} over {} parameters ({} elements, reduce_bucket_size {})",
                  buckets_.size(), params_.size(), total, options_.reduce_bucket_size);
}

GradReducer::~GradReducer() {
  for (auto& [acc, key] : hooks_) acc->del_post_hook(key);
}

void GradReducer::reattach_grads() {
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

void GradReducer::prepare_backward(bool reduce) {
  reattach_grads();
  std::lock_guard<std::mutex> g(mu_);
  reducing_ = reduce;
  next_bucket_ = 0;
  works_.clear();
  for (auto& b : buckets_) {
    b.pending = static_cast<int>(b.params.size());
    b.launched = false;
  }
}

void GradReducer::on_grad_ready(int param) {
  std::lock_guard<std::mutex> g(mu_);
  if (!reducing_) return;
  Bucket& b = buckets_[bucket_of_param_[param]];
  if (b.pending > 0) --b.pending;
  launch_in_order_locked();
}

void GradReducer::launch_in_order_locked() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    launch(buckets_[next_bucket_]);
    ++next_bucket_;
  }
}

void GradReducer::launch(Bucket& b) {
  // DeepSpeed's order of scaling (engine.allreduce_bucket): with prescale_gradients divide by
  // the world size before summing; otherwise divide by gradient_predivide_factor before and
  // multiply by predivide / world after (finish_backward). Both give the mean over ranks.
  auto slice = flat_grads_.narrow(0, b.offset, b.numel);
  // The bucket at the end of the parameters also carries the padding and the side channel
  // (NOTE [side channel]).
  const bool last = b.offset + b.numel == numel_;
  const int64_t end = last ? grad_storage_.numel() : b.offset + b.numel;
  const double pre = options_.gradient_predivide_factor;
  if (options_.prescale_gradients) slice.div_(comm_.world_size());
  else if (pre != 1.0) slice.mul_(1.0 / pre);
  b.launched = true;
  works_.push_back(comm_.all_reduce(grad_storage_.narrow(0, b.offset, end - b.offset),
                                    comm::ReduceOp::sum));
}

double GradReducer::finish_backward() {
  std::vector<comm::WorkHandle> works;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!reducing_) return 0;
    for (auto& b : buckets_) b.pending = 0;  // unused parameters: reduce what is there
    launch_in_order_locked();
    works.swap(works_);
    reducing_ = false;
  }
  auto t0 = std::chrono::steady_clock::now();
  for (auto& w : works) w->wait();
  if (!options_.prescale_gradients) {
    const double factor = options_.gradient_predivide_factor / comm_.world_size();
    if (factor != 1.0) flat_grads_.narrow(0, 0, numel_).mul_(factor);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void GradReducer::reduce_all_now() {
  prepare_backward(true);
  finish_backward();
}

void GradReducer::zero_grads() { grad_storage_.zero_(); }

}  // namespace dscpp::engine
