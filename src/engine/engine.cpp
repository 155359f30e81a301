// Implements dscpp::Engine (stage 0: data parallelism with gradient accumulation). The order of
// events in an optimizer step is visible in Engine::step() and Engine::apply_step().
#include "dscpp/engine.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <unistd.h>

#include <fstream>
#include <unordered_set>

#include "dscpp/error.h"
#include "dscpp/lr_schedule.h"
#include "dscpp/optim.h"
#include "engine/grad_reducer.h"
#include "engine/loss_scaler.h"
#include "util/log.h"

namespace dscpp {
namespace {

using Clock = std::chrono::steady_clock;

// Elements per piece of the mixed-precision optimizer step (16 MiB of fp32 gradient).
constexpr int64_t kStepPiece = int64_t{1} << 22;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Resident set size of this process in GiB (Linux), for the step log.
double rss_gib() {
  std::ifstream f("/proc/self/statm");
  long pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1 << 30);
}

}  // namespace

Engine::Engine(std::shared_ptr<torch::nn::Module> model, Config config, InitOptions options)
    : model_(std::move(model)),
      config_(std::move(config)),
      comm_(options.comm),
      client_optimizer_(std::move(options.optimizer)),
      client_lr_scheduler_(std::move(options.lr_scheduler)) {
  DSCPP_CHECK(model_, ConfigError, "initialize() was given a null model");
  if (!comm_) comm_ = comm::init_from_env(comm::CommOptions::from_config(&config_));
  ProcessEnv pe = detect_process_env();
  config_.resolve_batch(comm_->world_size(), comm_->world_size() == pe.world_size
                                                 ? pe.source
                                                 : "the communicator passed to initialize()");
  if (comm_->rank() == 0) DSCPP_LOG_INFO("resolved config (values in force):\n{}", config_.describe());

  stage_ = config_.zero_optimization.stage;
  DSCPP_CHECK(stage_ <= 2, ConfigError, "zero_optimization.stage ", stage_,
              " is not implemented yet; this dscpp trains with stages 0 (data parallelism), 1 "
              "(sharded optimizer state) and 2 (+ sharded gradients). HINT: set "
              "zero_optimization.stage to 0, 1 or 2");
  DSCPP_CHECK(!(stage_ > 0 && client_optimizer_ && !config_.zero_allow_untested_optimizer),
              ConfigError,
              "You are using an untested ZeRO Optimizer. Please add <\"zero_allow_untested_optimizer\": "
              "true> in the configuration file to use it. (DeepSpeed's rule: a client optimizer with "
              "ZeRO stage ", stage_, ")");
  DSCPP_CHECK(!(stage_ > 0 && client_optimizer_), ConfigError,
              "a client optimizer with ZeRO stage ", stage_, " is not implemented yet: ZeRO runs "
              "dscpp's own optimizer on each rank's shard. HINT: describe the optimizer in the "
              "config's optimizer section");
  if (config_.bf16.enabled) dtype_ = at::kBFloat16;
  if (config_.fp16.enabled) dtype_ = at::kHalf;
  const bool mixed = dtype_ != at::kFloat;
  DSCPP_CHECK(!(mixed && client_optimizer_), ConfigError,
              "a client optimizer with ", config_.fp16.enabled ? "fp16" : "bf16",
              " is not implemented: mixed precision keeps fp32 master weights that only dscpp's "
              "own optimizers update. HINT: describe the optimizer in the config's optimizer "
              "section, or train in fp32");
  DSCPP_CHECK(!(config_.fp16.enabled && config_.fp16.auto_cast), ConfigError,
              "fp16.auto_cast is not implemented: dscpp does not cast the model's inputs. HINT: "
              "set fp16.auto_cast to false and pass inputs in fp16 (or integer token ids)");
  if (config_.communication_data_type) {
    const std::string want = dtype_ == at::kBFloat16 ? "bf16" : dtype_ == at::kHalf ? "fp16" : "fp32";
    DSCPP_CHECK(*config_.communication_data_type == want, ConfigError,
                "communication_data_type \"", *config_.communication_data_type, "\" is not "
                "implemented: gradients are reduced in the training dtype (", want, "). HINT: "
                "remove communication_data_type or set it to \"", want, "\"");
  }
  if (config_.fp16.enabled) {
    scaler_ = std::make_unique<engine::LossScaler>(engine::LossScalerOptions::from_config(config_.fp16));
  }

  // Trainable parameters, each once (a tied parameter registered twice is one parameter).
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  std::unordered_set<const void*> seen;
  for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    params.push_back(item.value());
    names.push_back(item.key());
  }
  // Mixed precision: rank 0's fp32 values become every rank's master weights (this rank's
  // shard of them, copied piece by piece: no full fp32 copy), the model trains on a cast.
  const int world = comm_->world_size();
  if (mixed) {
    std::vector<comm::WorkHandle> works;
    for (auto& p : params) works.push_back(comm_->broadcast(p.detach(), 0));
    for (auto& w : works) w->wait();
    int64_t numel = 0;
    for (auto& p : params) numel += p.numel();
    const int64_t shard = stage_ == 0 ? numel : (numel + world - 1) / world;
    const int64_t begin = stage_ == 0 ? 0 : comm_->rank() * shard;
    master_ = at::zeros({shard}, params[0].options().dtype(at::kFloat).requires_grad(false));
    int64_t off = 0;
    for (auto& p : params) {
      const int64_t lo = std::max(off, begin), hi = std::min(off + p.numel(), begin + shard);
      if (lo < hi) master_.narrow(0, lo - begin, hi - lo).copy_(p.detach().reshape({-1}).narrow(0, lo - off, hi - lo));
      off += p.numel();
    }
  }
  const auto& zc = config_.zero_optimization;
  engine::GradReduceOptions ro;
  ro.mode = stage_ == 0 ? engine::ReduceMode::kAllReduce
          : stage_ == 1 ? engine::ReduceMode::kReduceScatterInPlace
                        : engine::ReduceMode::kReduceScatter;
  ro.dtype = dtype_;
  // NOTE [bucket cap] in grad_reducer.h: buckets above a sixteenth of the model help nothing.
  int64_t trainable = 0;
  for (auto& p : params) trainable += p.numel();
  ro.reduce_bucket_size = engine::capped_bucket_size(zc.reduce_bucket_size, trainable);
  allgather_bucket_size_ = engine::capped_bucket_size(zc.allgather_bucket_size, trainable);
  std::string capped;
  if (ro.reduce_bucket_size < zc.reduce_bucket_size) {
    capped = fmt::format("reduce_bucket_size {} -> {}", zc.reduce_bucket_size, ro.reduce_bucket_size);
  }
  if (stage_ > 0 && allgather_bucket_size_ < zc.allgather_bucket_size) {
    capped += fmt::format("{}allgather_bucket_size {} -> {}", capped.empty() ? "" : ", ",
                          zc.allgather_bucket_size, allgather_bucket_size_);
  }
  if (comm_->rank() == 0 && !capped.empty()) {
    DSCPP_LOG_INFO("zero_optimization.{} elements: buckets are capped at 1/{} of the model's {} "
                   "trainable elements, since a larger one only delays the first reduction (and "
                   "at stage 2 enlarges the staging buffers); bucket sizes do not change what is "
                   "trained (docs/zero.md)",
                   capped, engine::kBucketsPerModel, trainable);
  }
  ro.prescale_gradients = config_.prescale_gradients;
  ro.gradient_predivide_factor = config_.gradient_predivide_factor;
  ro.overlap_comm = zc.overlap_comm;
  ro.contiguous_gradients = zc.contiguous_gradients;
  ro.reduce_scatter = zc.reduce_scatter;
  // Stage 0 in fp32: the statistics ride in the gradient all-reduce (NOTE [side channel] in
  // grad_reducer.h): [0] the window's loss sum, [1] its micro-steps, [2 + r] rank r's flags
  // (window_flags()). Otherwise one small all-reduce at the boundary carries them.
  const bool side_channel = stage_ == 0 && !mixed;
  reducer_ = std::make_unique<engine::GradReducer>(params, names, *comm_, ro,
                                                   side_channel ? 2 + world : 0);
  shard_numel_ = stage_ == 0 ? reducer_->numel() : reducer_->shard_numel();
  shard_offset_ = stage_ == 0 ? 0 : reducer_->shard_offset();
  if (stage_ > 0) {
    // Stage 1: a view of this rank's chunk of the full gradient buffer, where the in-place
    // reduce-scatter leaves the sum (no second gradient shard); stage 2: the shard itself.
    grad_shard_ = reducer_->grad_shard();
    DSCPP_CHECK(config_.optimizer.type != "Lamb", ConfigError,
                "the Lamb optimizer needs per-parameter norms across shards and is not "
                "supported with ZeRO stage ", stage_, ". HINT: use stage 0, or Adam/AdamW");
    DSCPP_LOG_INFO("ZeRO stage {}: {} parameters padded to {}, this rank updates [{}, {})",
                   stage_, reducer_->numel(), reducer_->padded_numel(), shard_offset_,
                   shard_offset_ + shard_numel_);
  }
  // Ranks start identical whatever their seeds: trainable parameters (mixed precision: above),
  // frozen parameters and buffers from rank 0 (in fp32: Gloo cannot move every dtype).
  std::vector<comm::WorkHandle> works;
  if (!mixed) works.push_back(comm_->broadcast(reducer_->flat_params(), 0));
  for (auto& p : model_->parameters(/*recurse=*/true)) {
    if (!p.requires_grad() && p.numel() > 0) works.push_back(comm_->broadcast(p.detach(), 0));
  }
  for (auto& b : model_->buffers(/*recurse=*/true)) {
    if (b.defined() && b.numel() > 0) works.push_back(comm_->broadcast(b, 0));
  }
  for (auto& w : works) w->wait();
  if (mixed) {
    // Everything else the forward touches trains in the same dtype (DeepSpeed casts the whole
    // module): frozen parameters and floating-point buffers.
    at::NoGradGuard no_grad;
    for (auto& p : model_->parameters(/*recurse=*/true)) {
      if (!p.requires_grad() && p.is_floating_point()) p.set_data(p.detach().to(dtype_));
    }
    for (auto& b : model_->buffers(/*recurse=*/true)) {
      if (b.defined() && b.is_floating_point()) b.set_data(b.detach().to(dtype_));
    }
  } else {
    master_ = reducer_->padded_params().narrow(0, shard_offset_, shard_numel_);
  }
  DSCPP_CHECK(master_.numel() == shard_numel_, Error, "internal: master shard of ",
              master_.numel(), " elements, expected ", shard_numel_);

  if (client_optimizer_) {
    DSCPP_CHECK(config_.optimizer.type.empty(), ConfigError,
                "both the config's optimizer section (", config_.optimizer.type,
                ") and a client optimizer were given. HINT: remove one of them");
  } else {
    DSCPP_CHECK(!config_.optimizer.type.empty(), ConfigError,
                "the config has no optimizer section and no optimizer was passed to "
                "initialize(). HINT: add {\"optimizer\": {\"type\": \"AdamW\", \"params\": "
                "{\"lr\": 1e-3}}}");
    // Stage 0 updates everything; stage 1 only this rank's shard of the flat buffer.
    optimizer_ = optim::make_optimizer(config_.optimizer, shard_numel_, master_.options(),
                                       stage_ == 0 ? reducer_->segments()
                                                   : std::vector<std::pair<int64_t, int64_t>>{});
  }
  if (client_lr_scheduler_) {
    DSCPP_CHECK(config_.scheduler.type.empty(), ConfigError,
                "both the config's scheduler section (", config_.scheduler.type,
                ") and a client LR scheduler were given. HINT: remove one of them");
  } else if (optimizer_) {
    lr_schedule_ = make_lr_schedule(config_.scheduler, *optimizer_);
  } else {
    DSCPP_CHECK(config_.scheduler.type.empty(), ConfigError,
                "a scheduler section needs the config's optimizer; with a client optimizer pass "
                "a client LR scheduler too");
  }
  window_start_ = Clock::now();
}

Engine::~Engine() = default;

bool Engine::is_gradient_accumulation_boundary() const {
  return (micro_steps_ + 1) % config_.batch.gradient_accumulation_steps == 0;
}

double Engine::get_lr() const {
  if (lr_schedule_) return lr_schedule_->get_lr();
  if (client_optimizer_) {
    auto& group = client_optimizer_->param_groups().at(0);
    return group.options().get_lr();
  }
  return 0;
}

void Engine::backward(const at::Tensor& loss) {
  DSCPP_CHECK(loss.defined() && loss.numel() == 1, Error,
              "backward() needs the scalar loss of this micro-batch, got a tensor of ",
              loss.defined() ? loss.numel() : 0, " elements");
  auto t0 = Clock::now();
  double value = loss.item<double>();
  window_loss_sum_ += std::isfinite(value) ? value : 0.0;
  window_nonfinite_ += std::isfinite(value) ? 0 : 1;
  ++window_micro_steps_;
  const bool boundary = is_gradient_accumulation_boundary();
  DSCPP_LOG_DEBUG("micro step {}/{} (global step {}): backward{}",
                  micro_steps_ % gradient_accumulation_steps() + 1, gradient_accumulation_steps(),
                  global_steps_, boundary && !no_sync_depth_ ? " + gradient all-reduce" : "");
  // Stages 0-1 reduce buckets during the boundary backward (all-reduce, reduce-scatter); stage 2
  // reduce-scatters in every backward (the reducer decides).
  const bool reduce = stage_ <= 1 && boundary && no_sync_depth_ == 0;
  if (reduce && reducer_->side_channel().numel() > 0) write_side_channel();
  reducer_->prepare_backward(reduce, loss);
  // The gradient applied at the boundary is the mean over the global batch: each micro-batch
  // loss is a mean over its samples, so scale by 1/GAS here and average over ranks. fp16 also
  // multiplies by the loss scale (in fp32: 2^16 is no fp16 number), divided out in apply_step().
  const double scale = loss_scale() / static_cast<double>(gradient_accumulation_steps());
  // When backward fails the other ranks go on reducing: this rank launches and finishes its
  // buckets too, so the collectives stay in step. Unless every gradient was complete, the window
  // is spoiled: it is flagged to every rank (at stage 0 in the side channel, whose bucket goes
  // only in finish_backward) and step() drops it everywhere.
  auto fail_window = [&] {
    if (!reducer_->all_gradients_ready() || reducer_->late_gradient()) {
      window_failed_ = true;
      if (reduce && reducer_->side_channel().numel() > 0) write_side_channel();
    }
    reducer_->finish_backward();
    window_reduced_ = reduce;
  };
  try {
    (loss.to(at::kFloat) * scale).backward();
  } catch (...) {
    fail_window();
    throw;
  }
  if (reducer_->late_gradient()) {
    // The hook's error was caught inside backward (by the user's code in a hook, say): the
    // gradient is still lost.
    fail_window();
    DSCPP_FAIL(Error, "a gradient arrived after its bucket had been reduced in this backward on "
               "rank ", comm_->rank(), ", so it was lost; the window is dropped on every rank. "
               "HINT: reentrant activation checkpointing (a function that runs its own backward) "
               "is not supported");
  }
  t_reduce_wait_ += reducer_->finish_backward();
  window_reduced_ = reduce;
  if (stage_ == 2 && !config_.zero_optimization.ignore_unused_parameters) {
    auto unused = reducer_->unused_in_last_backward();
    DSCPP_CHECK(unused.empty(), Error, unused.size(), " parameter(s) got no gradient in this "
                "backward on rank ", comm_->rank(), " (first: '", unused[0], "') and "
                "zero_optimization.ignore_unused_parameters is false. HINT: set "
                "ignore_unused_parameters to true (their gradient is then zero), or freeze them "
                "with requires_grad(false) before initialize()");
  }
  t_backward_ += seconds_since(t0);
}

void Engine::step() {
  const bool boundary = is_gradient_accumulation_boundary();
  if (boundary) {
    DSCPP_CHECK(no_sync_depth_ == 0, Error,
                "step() at a gradient accumulation boundary inside no_sync(): the gradients were "
                "not averaged over ranks. HINT: leave the no_sync scope before the boundary step");
    DSCPP_CHECK(window_micro_steps_ == gradient_accumulation_steps(), Error, "step() at the "
                "boundary after ", window_micro_steps_, " backward() calls in this window, "
                "expected ", gradient_accumulation_steps(), " (one per micro-step)");
    try {
      apply_step();
    } catch (...) {
      ++micro_steps_;  // the window is over either way (apply_step dropped its gradients)
      throw;
    }
  }
  ++micro_steps_;
}

void Engine::flush_accumulation() {
  // Collective: ranks may have taken different numbers of micro-steps in this window (uneven
  // shards at the end of an epoch), so the count travels in the side channel.
  const int64_t gas = gradient_accumulation_steps();
  DSCPP_LOG_INFO("flushing the accumulation window: {} of {} micro-steps on this rank",
                 window_micro_steps_, gas);
  window_reduced_ = false;  // apply_step() averages what there is, with the counts
  try {
    apply_step();
  } catch (...) {
    if (micro_steps_ % gas != 0) micro_steps_ += gas - micro_steps_ % gas;
    throw;
  }
  if (micro_steps_ % gas != 0) micro_steps_ += gas - micro_steps_ % gas;  // a new window
}

void Engine::abandon_window() {
  reducer_->zero_grads();
  window_micro_steps_ = 0;
  window_loss_sum_ = 0;
  window_nonfinite_ = 0;
  window_failed_ = false;
  window_reduced_ = false;
  t_backward_ = t_reduce_wait_ = t_optimizer_ = 0;
  window_start_ = Clock::now();
}

namespace {
// Sum of squares in double, in chunks (no full-size double copy of a large shard), read once.
double sq_norm(const at::Tensor& t) {
  constexpr int64_t kChunk = 1 << 20;
  at::Tensor total = at::zeros({}, t.options().dtype(at::kDouble));
  for (int64_t i = 0; i < t.numel(); i += kChunk) {
    at::Tensor c = t.narrow(0, i, std::min(kChunk, t.numel() - i)).to(at::kDouble);
    total.add_(c.dot(c));
  }
  return total.item<double>();
}
}  // namespace

namespace {
// Per-rank window flags, one number per rank in the statistics (NOTE [side channel]).
constexpr int kNonFiniteLoss = 1, kBackwardFailed = 2;
std::string ranks_flagged(const double* flags, int world, int bit) {
  std::string out;
  for (int q = 0; q < world; ++q) {
    if (static_cast<int>(flags[q] + 0.5) & bit) out += (out.empty() ? "" : ",") + std::to_string(q);
  }
  return out;
}
}  // namespace

int Engine::window_flags() const {
  return (window_nonfinite_ > 0 ? kNonFiniteLoss : 0) | (window_failed_ ? kBackwardFailed : 0);
}

Engine::Reduced Engine::reduce_window() {
  const int world = comm_->world_size();
  Reduced r;
  if (stage_ <= 1 && !window_reduced_) {
    // The boundary backward did not reduce (no_sync, or a flush): do it now, as DDP does at the
    // next synchronising backward.
    if (reducer_->side_channel().numel() > 0) write_side_channel();
    reducer_->reduce_all_now();
  }
  if (stage_ == 0) {
    r.grads = reducer_->flat_grads();
    if (reducer_->side_channel().numel() > 0) {
      at::Tensor side = reducer_->side_channel().to(at::kCPU, at::kDouble);  // may live on a GPU
      const double* p = side.data_ptr<double>();
      r.loss_sum = p[0];
      r.micro_batches = p[1];
      r.nonfinite_ranks = ranks_flagged(p + 2, world, kNonFiniteLoss);
      r.failed_ranks = ranks_flagged(p + 2, world, kBackwardFailed);
    } else {
      reduce_stats(r, 0);
    }
    // The same arithmetic as the shards' norms of stages 1-2, so every stage clips alike.
    r.grad_sq_norm = sq_norm(r.grads);
    return r;
  }
  // Stages 1-2: the backward passes reduce-scattered into this rank's shard.
  r.grads = grad_shard_;
  reduce_stats(r, sq_norm(grad_shard_));
  return r;
}

void Engine::reduce_stats(Reduced& r, double shard_sq_norm) {
  // One small all-reduce: the window's loss sum, its micro-steps, which ranks saw a non-finite
  // loss, and the shards' squared gradient norms.
  const int world = comm_->world_size();
  at::Tensor st = at::zeros({3 + world}, at::kDouble);
  auto* p = st.data_ptr<double>();
  p[0] = window_loss_sum_;
  p[1] = static_cast<double>(window_micro_steps_);
  p[2 + comm_->rank()] = window_flags();
  p[2 + world] = shard_sq_norm;
  at::Tensor dev = st.to(reducer_->flat_params().device());
  comm_->all_reduce(dev)->wait();
  st = dev.to(at::kCPU);
  p = st.data_ptr<double>();
  r.loss_sum = p[0];
  r.micro_batches = p[1];
  r.nonfinite_ranks = ranks_flagged(p + 2, world, kNonFiniteLoss);
  r.failed_ranks = ranks_flagged(p + 2, world, kBackwardFailed);
  r.grad_sq_norm = p[2 + world];
}

void Engine::gather_params() {
  // Stages 1-2: every rank's updated shard to every rank, allgather_bucket_size elements per
  // collective (allgather_bucket_size / N from each rank), straight into the parameter buffer:
  // piece j of rank r's shard lands where it belongs (Gloo: no staging buffer and no copy; NCCL:
  // libtorch's list all-gather stages world x piece).
  at::Tensor flat = reducer_->padded_params();
  const int world = comm_->world_size();
  const int64_t piece = std::max<int64_t>(1, allgather_bucket_size_ / world);
  std::vector<comm::WorkHandle> works;
  for (int64_t start = 0; start < shard_numel_; start += piece) {
    const int64_t len = std::min(piece, shard_numel_ - start);
    std::vector<at::Tensor> outputs;
    for (int r = 0; r < world; ++r) outputs.push_back(flat.narrow(0, r * shard_numel_ + start, len));
    works.push_back(comm_->all_gather_into(outputs, outputs[comm_->rank()]));
  }
  for (auto& w : works) w->wait();
}

void Engine::apply_step() {
  auto t_opt = Clock::now();
  const int world = comm_->world_size();

  // 1. Gradients averaged over ranks (stages 1-2: this rank's shard of them), the loss over the
  // global batch, and whether any rank saw a non-finite one.
  Reduced red = reduce_window();
  if (red.micro_batches == 0) {  // a flush with nothing accumulated anywhere
    abandon_window();
    return;
  }
  if (!red.failed_ranks.empty()) abandon_window();
  DSCPP_CHECK(red.failed_ranks.empty(), Error, "backward() failed on rank(s) ", red.failed_ranks,
              " in the accumulation window of optimizer step ", global_steps_ + 1, ", so the "
              "gradients are incomplete; the step is dropped on every rank. HINT: the exception "
              "backward() raised on that rank says why; training can go on with the next window");
  const double loss = red.loss_sum / red.micro_batches;
  const double lr = get_lr();
  if (!red.nonfinite_ranks.empty() && scaler_) return skip_step(loss, lr);
  if (!red.nonfinite_ranks.empty()) abandon_window();
  DSCPP_CHECK(red.nonfinite_ranks.empty(), Error, "non-finite loss at optimizer step ",
              global_steps_ + 1, " on rank(s) ", red.nonfinite_ranks,
              "; the step is not applied. HINT: lower the learning rate, enable "
              "gradient_clipping, or look at the data of that step (fp16 training skips such "
              "steps through its loss scaler)");
  // Each micro-batch gradient was scaled by loss_scale/GAS and averaged over ranks; the mean
  // over the micro-batches actually taken needs gas * world / taken / loss_scale (1 at a normal
  // fp32 boundary). Mixed precision steps on an fp32 copy of the (shard of the) gradients.
  const double unscale = gradient_accumulation_steps() * world / red.micro_batches / loss_scale();

  // 2. Global gradient norm: of the whole gradient (stage 0, every rank holds it), or from the
  // shards' squared norms summed over ranks; the same arithmetic either way.
  const double grad_norm = std::sqrt(red.grad_sq_norm) * unscale;
  if (!std::isfinite(grad_norm) && scaler_) return skip_step(loss, lr);
  if (!std::isfinite(grad_norm)) abandon_window();
  DSCPP_CHECK(std::isfinite(grad_norm), Error, "the gradient norm is ", grad_norm,
              " at optimizer step ", global_steps_ + 1,
              " although every loss was finite. HINT: an operation overflowed in backward; lower "
              "the learning rate or enable gradient_clipping");
  // 3. Clip by the global norm, as DeepSpeed does.
  const double clip = config_.gradient_clipping;
  const double coef = clip > 0 ? std::min(1.0, clip / (grad_norm + 1e-6)) : 1.0;
  // Unscaled and clipped fp32 gradients: in place in fp32; under mixed precision cast a piece at
  // a time, so the step never holds an fp32 copy of the whole (shard of the) gradient.
  auto fp32_grads = [&](int64_t offset, int64_t len) {
    at::Tensor g = red.grads.narrow(0, offset, len);
    if (dtype_ != at::kFloat) g = g.to(at::kFloat);
    if (unscale != 1.0) g.mul_(unscale);
    if (coef < 1.0) g.mul_(coef);
    return g;
  };
  // 4. The optimizer step at the LR in force on the (fp32 master) weights, the update cast
  // back into the training dtype and all-gathered (stages 1-2), then the schedule ticks.
  DSCPP_LOG_DEBUG("optimizer step {}: loss {:.6f}, grad_norm {:.6f}, lr {:.6e}", global_steps_ + 1,
                  loss, grad_norm, lr);
  if (optimizer_) {
    optim::StepContext ctx;
    ctx.lr = lr;
    ctx.step = global_steps_ + 1 - skipped_steps_;
    ctx.betas_override = lr_schedule_ ? lr_schedule_->get_betas() : std::nullopt;
    const int64_t n = master_.numel();
    const int64_t piece = dtype_ != at::kFloat && optimizer_->supports_pieces() ? kStepPiece : n;
    for (int64_t off = 0; off < n; off += piece) {
      const int64_t len = std::min(piece, n - off);
      at::Tensor p = master_.narrow(0, off, len);
      if (piece < n) ctx.offset = off;
      optimizer_->step(p, fp32_grads(off, len), ctx);
    }
  } else {
    fp32_grads(0, red.grads.numel());  // in place: the client optimizer reads param.grad
    client_optimizer_->step();
  }
  if (dtype_ != at::kFloat) reducer_->padded_params().narrow(0, shard_offset_, shard_numel_).copy_(master_);
  if (stage_ > 0) gather_params();
  const double used_scale = loss_scale();
  if (scaler_) scaler_->update(/*overflow=*/false);
  if (lr_schedule_) lr_schedule_->step();
  if (client_lr_scheduler_) client_lr_scheduler_->step();
  t_optimizer_ += seconds_since(t_opt);

  ++global_steps_;
  double window_s = seconds_since(window_start_);
  last_step_ = StepStats{global_steps_, loss, lr, grad_norm,
                         window_s > 0 ? train_batch_size() / window_s : 0, window_s,
                         used_scale, false};
  if (config_.steps_per_print > 0 && global_steps_ % config_.steps_per_print == 0) log_step();
  abandon_window();  // zeroes the gradients, resets the window's counters and timers
}

void Engine::skip_step(double loss, double lr) {
  // DeepSpeed's fp16 overflow: no update, no schedule tick, the step still counts.
  const double used = loss_scale();
  abandon_window();
  ++skipped_steps_;
  ++global_steps_;
  scaler_->update(/*overflow=*/true);  // throws at the minimum scale
  double window_s = seconds_since(window_start_);
  last_step_ = StepStats{global_steps_, loss, lr, std::nan(""), 0, window_s, used, true};
  if (comm_->rank() == 0) {
    DSCPP_LOG_INFO("step {}: fp16 gradient overflow with loss scale {}; update skipped ({} so "
                   "far), {}", global_steps_, used, skipped_steps_, scaler_->describe());
  }
}

double Engine::loss_scale() const { return scaler_ ? scaler_->scale() : 1.0; }

MemoryStats Engine::memory_stats() {
  MemoryStats m;
  m.params = static_cast<int64_t>(reducer_->padded_params().nbytes());
  m.grads = reducer_->grad_bytes();
  m.master = dtype_ == at::kFloat ? 0 : static_cast<int64_t>(master_.nbytes());
  if (optimizer_) {
    for (auto& [name, t] : optimizer_->state()) m.optimizer_state += static_cast<int64_t>(t.nbytes());
  }
  m.staging = reducer_->staging_bytes();
  return m;
}

void Engine::write_side_channel() {
  at::Tensor side = reducer_->side_channel();
  side.zero_();
  side[0] = window_loss_sum_;
  side[1] = static_cast<float>(window_micro_steps_);
  side[2 + comm_->rank()] = static_cast<float>(window_flags());
}

void Engine::log_step() const {
  if (comm_->rank() != 0) return;
  const auto& s = last_step_;
  std::string line = fmt::format("step {} | loss {:.6f} | lr {:.4e} | grad_norm {:.4f} | {:.1f} samples/s",
                                 s.step, s.loss, s.lr, s.grad_norm, s.samples_per_s);
  if (tokens_per_sample_ > 0)
    line += fmt::format(" | {:.0f} tokens/s", s.samples_per_s * tokens_per_sample_);
  if (scaler_) line += fmt::format(" | loss scale {} | skipped {}", s.loss_scale, skipped_steps_);
  line += fmt::format(" | rss {:.2f} GiB", rss_gib());
  if (config_.wall_clock_breakdown) {
    line += fmt::format(" | window {:.1f} ms: forward+data {:.1f} ms, backward {:.1f} ms (waiting "
                        "for all-reduce {:.1f} ms), optimizer {:.1f} ms",
                        s.seconds * 1e3, (s.seconds - t_backward_ - t_optimizer_) * 1e3,
                        t_backward_ * 1e3, t_reduce_wait_ * 1e3, t_optimizer_ * 1e3);
  }
  DSCPP_LOG_INFO("{}", line);
}

Engine::NoSync::NoSync(Engine& e) : engine_(e) {
  DSCPP_CHECK(engine_.stage_ < 2, Error,
              "no_sync() is incompatible with ZeRO stage ", engine_.stage_, ": its gradients are "
              "reduce-scattered into shards as backward runs (DeepSpeed's rule too). HINT: use "
              "gradient_accumulation_steps, which accumulates without extra memory, or stage 0/1");
  ++engine_.no_sync_depth_;
}
Engine::NoSync::~NoSync() { --engine_.no_sync_depth_; }

std::shared_ptr<Engine> initialize(std::shared_ptr<torch::nn::Module> model,
                                   const std::string& config_path_or_json, InitOptions options) {
  return std::make_shared<Engine>(std::move(model), Config::parse(config_path_or_json),
                                  std::move(options));
}

}  // namespace dscpp
