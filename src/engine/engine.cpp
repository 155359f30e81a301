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
#include "util/log.h"

namespace dscpp {
namespace {

using Clock = std::chrono::steady_clock;

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

  DSCPP_CHECK(config_.zero_optimization.stage == 0, ConfigError, "zero_optimization.stage ",
              config_.zero_optimization.stage,
              " is not implemented yet; this dscpp trains with stage 0 (data parallelism). HINT: "
              "set zero_optimization.stage to 0");
  DSCPP_CHECK(!config_.fp16.enabled && !config_.bf16.enabled, ConfigError,
              "fp16/bf16 mixed precision is not implemented yet in this dscpp. HINT: disable "
              "fp16.enabled and bf16.enabled (training runs in fp32)");

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
  engine::GradReduceOptions ro;
  ro.reduce_bucket_size = config_.zero_optimization.reduce_bucket_size;
  ro.prescale_gradients = config_.prescale_gradients;
  ro.gradient_predivide_factor = config_.gradient_predivide_factor;
  // Side channel (NOTE [side channel] in grad_reducer.h): [0] the window's loss sum, [1] its
  // micro-steps, [2 + r] 1 when rank r saw a non-finite loss.
  reducer_ = std::make_unique<engine::GradReducer>(params, names, *comm_, ro,
                                                   2 + comm_->world_size());

  // Ranks start identical whatever their seeds: parameters and buffers from rank 0.
  std::vector<comm::WorkHandle> works{comm_->broadcast(reducer_->flat_params(), 0)};
  for (auto& b : model_->buffers(/*recurse=*/true)) {
    if (b.defined() && b.numel() > 0) works.push_back(comm_->broadcast(b, 0));
  }
  for (auto& w : works) w->wait();

  if (client_optimizer_) {
    DSCPP_CHECK(config_.optimizer.type.empty(), ConfigError,
                "both the config's optimizer section (", config_.optimizer.type,
                ") and a client optimizer were given. HINT: remove one of them");
  } else {
    DSCPP_CHECK(!config_.optimizer.type.empty(), ConfigError,
                "the config has no optimizer section and no optimizer was passed to "
                "initialize(). HINT: add {\"optimizer\": {\"type\": \"AdamW\", \"params\": "
                "{\"lr\": 1e-3}}}");
    optimizer_ = optim::make_optimizer(config_.optimizer, reducer_->numel(),
                                       reducer_->flat_params().options(), reducer_->segments());
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
  const bool reduce = boundary && no_sync_depth_ == 0;
  if (reduce) write_side_channel();
  reducer_->prepare_backward(reduce);
  // The gradient applied at the boundary is the mean over the global batch: each micro-batch
  // loss is a mean over its samples, so scale by 1/GAS here and average over ranks.
  try {
    (loss / static_cast<double>(gradient_accumulation_steps())).backward();
  } catch (...) {
    // The other ranks go on reducing: launch and finish this rank's buckets too, so the
    // collectives stay in step, then report the error.
    reducer_->finish_backward();
    throw;
  }
  t_reduce_wait_ += reducer_->finish_backward();
  window_reduced_ = reduce;
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
    if (!window_reduced_) {
      // The boundary backward ran inside no_sync(): average what was accumulated now, as DDP
      // does at the next synchronising backward.
      write_side_channel();
      reducer_->reduce_all_now();
    }
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
  write_side_channel();
  reducer_->reduce_all_now();
  if (reducer_->side_channel()[1].item<double>() > 0) {
    try {
      apply_step();
    } catch (...) {
      if (micro_steps_ % gas != 0) micro_steps_ += gas - micro_steps_ % gas;
      throw;
    }
  } else {
    reducer_->zero_grads();
  }
  if (micro_steps_ % gas != 0) micro_steps_ += gas - micro_steps_ % gas;  // a new window
}

void Engine::abandon_window() {
  reducer_->zero_grads();
  window_micro_steps_ = 0;
  window_loss_sum_ = 0;
  window_nonfinite_ = 0;
  window_reduced_ = false;
  t_backward_ = t_reduce_wait_ = t_optimizer_ = 0;
  window_start_ = Clock::now();
}

void Engine::apply_step() {
  auto t_opt = Clock::now();
  at::Tensor grads = reducer_->flat_grads();

  // 1. The loss over the global batch, and whether any rank saw a non-finite one: summed over
  // ranks with the gradients (NOTE [side channel]). CPU copy: the buffers may be on a GPU.
  const int world = comm_->world_size();
  at::Tensor stats = reducer_->side_channel().to(at::kCPU, at::kDouble);
  const double* st = stats.data_ptr<double>();
  const double micro_batches = st[1];  // over all ranks; gas * world unless flushing early
  std::string bad;
  for (int r = 0; r < world; ++r) {
    if (st[2 + r] > 0) bad += (bad.empty() ? "" : ",") + std::to_string(r);
  }
  if (!bad.empty()) abandon_window();
  DSCPP_CHECK(bad.empty(), Error, "non-finite loss at optimizer step ", global_steps_ + 1,
              " on rank(s) ", bad,
              "; the step is not applied. HINT: lower the learning rate, enable "
              "gradient_clipping, or look at the data of that step (fp16 training skips such "
              "steps through its loss scaler)");
  const double loss = st[0] / micro_batches;
  // Each micro-batch gradient was scaled by 1/GAS and averaged over ranks; the mean over the
  // micro-batches actually taken needs gas * world / taken (1 at a normal boundary).
  const double rescale = gradient_accumulation_steps() * world / micro_batches;
  if (rescale != 1.0) grads.mul_(rescale);

  // 2. Global gradient norm (stage 0: every rank holds the whole averaged gradient).
  const double grad_norm = grads.norm().item<double>();
  if (!std::isfinite(grad_norm)) abandon_window();
  DSCPP_CHECK(std::isfinite(grad_norm), Error, "the gradient norm is ", grad_norm,
              " at optimizer step ", global_steps_ + 1,
              " although every loss was finite. HINT: an operation overflowed in backward; lower "
              "the learning rate or enable gradient_clipping");
  // 3. Clip by the global norm, as DeepSpeed does.
  const double clip = config_.gradient_clipping;
  if (clip > 0) {
    const double coef = clip / (grad_norm + 1e-6);
    if (coef < 1.0) grads.mul_(coef);
  }
  // 4. The optimizer step at the LR in force, then the schedule ticks.
  const double lr = get_lr();
  DSCPP_LOG_DEBUG("optimizer step {}: loss {:.6f}, grad_norm {:.6f}, lr {:.6e}", global_steps_ + 1,
                  loss, grad_norm, lr);
  if (optimizer_) {
    optim::StepContext ctx;
    ctx.lr = lr;
    ctx.step = global_steps_ + 1;
    ctx.betas_override = lr_schedule_ ? lr_schedule_->get_betas() : std::nullopt;
    at::Tensor params = reducer_->flat_params();
    optimizer_->step(params, grads, ctx);
  } else {
    client_optimizer_->step();
  }
  if (lr_schedule_) lr_schedule_->step();
  if (client_lr_scheduler_) client_lr_scheduler_->step();
  t_optimizer_ += seconds_since(t_opt);

  ++global_steps_;
  double window_s = seconds_since(window_start_);
  last_step_ = StepStats{global_steps_, loss, lr, grad_norm,
                         window_s > 0 ? train_batch_size() / window_s : 0, window_s};
  if (config_.steps_per_print > 0 && global_steps_ % config_.steps_per_print == 0) log_step();
  abandon_window();  // gradients already zeroed; resets the window's counters and timers
}

void Engine::write_side_channel() {
  at::Tensor side = reducer_->side_channel();
  side.zero_();
  side[0] = window_loss_sum_;
  side[1] = static_cast<float>(window_micro_steps_);
  side[2 + comm_->rank()] = static_cast<float>(window_nonfinite_);
}

void Engine::log_step() const {
  if (comm_->rank() != 0) return;
  const auto& s = last_step_;
  std::string line = fmt::format("step {} | loss {:.6f} | lr {:.4e} | grad_norm {:.4f} | {:.1f} samples/s",
                                 s.step, s.loss, s.lr, s.grad_norm, s.samples_per_s);
  if (tokens_per_sample_ > 0)
    line += fmt::format(" | {:.0f} tokens/s", s.samples_per_s * tokens_per_sample_);
  line += fmt::format(" | rss {:.2f} GiB", rss_gib());
  if (config_.wall_clock_breakdown) {
    line += fmt::format(" | window {:.1f} ms: forward+data {:.1f} ms, backward {:.1f} ms (waiting "
                        "for all-reduce {:.1f} ms), optimizer {:.1f} ms",
                        s.seconds * 1e3, (s.seconds - t_backward_ - t_optimizer_) * 1e3,
                        t_backward_ * 1e3, t_reduce_wait_ * 1e3, t_optimizer_ * 1e3);
  }
  DSCPP_LOG_INFO("{}", line);
}

Engine::NoSync::NoSync(Engine& e) : engine_(e) { ++engine_.no_sync_depth_; }
Engine::NoSync::~NoSync() { --engine_.no_sync_depth_; }

std::shared_ptr<Engine> initialize(std::shared_ptr<torch::nn::Module> model,
                                   const std::string& config_path_or_json, InitOptions options) {
  return std::make_shared<Engine>(std::move(model), Config::parse(config_path_or_json),
                                  std::move(options));
}

}  // namespace dscpp
