// The step's order of events: backward() on every micro-batch, step() at the accumulation
// boundary (apply_step() reads top to bottom), flush_accumulation() at an epoch's ragged end.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <iostream>

#include "dscpp/error.h"
#include "engine/engine_impl.h"
#include "optim/dispatch.h"
#include "util/fault_inject.h"
#include "util/log.h"
#include "util/memory.h"
#include "zero/grad_shard.h"

namespace dscpp::engine {
namespace {

using Clock = std::chrono::steady_clock;

// wall_clock_breakdown: the ops listed in the step line's table (NOTE [op times]).
constexpr size_t kOpTableRows = 12;

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

// The parts' gradients as maximal runs of adjacent memory (a stage's parts are pieces of one
// gradient shard), so how a stage cuts its part (stage 3: resident, in memory, on disk) does not
// change the rounding of the gradient norm.
std::vector<at::Tensor> adjacent_runs(const std::vector<zero::Part>& parts) {
  std::vector<at::Tensor> runs;
  for (const auto& p : parts) {
    const at::Tensor& g = p.grads;
    if (!runs.empty()) {
      at::Tensor& last = runs.back();
      const bool adjacent = last.is_contiguous() && g.is_contiguous() && last.dim() == 1 &&
                            g.dim() == 1 && last.scalar_type() == g.scalar_type() &&
                            last.is_alias_of(g) &&
                            last.storage_offset() + last.numel() == g.storage_offset();
      if (adjacent) {
        last = last.as_strided({last.numel() + g.numel()}, {1});
        continue;
      }
    }
    runs.push_back(g);
  }
  return runs;
}

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

bool EngineImpl::is_gradient_accumulation_boundary() const {
  return (micro_steps_ + 1) % config_.batch.gradient_accumulation_steps == 0;
}

double EngineImpl::get_lr() const {
  if (lr_schedule_) return lr_schedule_->get_lr();
  if (client_optimizer_) return client_optimizer_->param_groups().at(0).options().get_lr();
  return 0;
}

void EngineImpl::backward(const at::Tensor& loss) {
  DSCPP_CHECK(loss.defined() && loss.numel() == 1, Error,
              "backward() needs the scalar loss of this micro-batch, got a tensor of ",
              loss.defined() ? loss.numel() : 0, " elements");
  check_usable();
  // step() counts the micro-steps (as DeepSpeed's does): one backward() per step() call.
  const int64_t gas = gradient_accumulation_steps();
  DSCPP_CHECK(window_micro_steps_ <= micro_steps_ % gas, Error,
              "backward() called again without step() after the previous backward() (micro-step ",
              micro_steps_ % gas + 1, " of ", gas,
              "). HINT: call step() after every backward(), as in DeepSpeed: step() counts the "
              "micro-steps and applies the optimizer update only at the gradient accumulation "
              "boundary, every ",
              gas,
              " calls (the DDP habit of several backward() calls and one "
              "step() accumulates here through gradient_accumulation_steps instead)");
  // NOTE [autocast]: a forward outside Engine::autocast() would train fp32 gradients silently.
  DSCPP_CHECK(!autocast_ || autocast_scopes_ > 0, Error,
              "torch_autocast is enabled, but this micro-step's forward ran outside "
              "engine->autocast(), so it computed in fp32. HINT: run the forward inside the "
              "scope: { auto autocast = engine->autocast(); loss = model->forward(...); } "
              "engine->backward(loss); or disable torch_autocast");
  autocast_scopes_ = 0;
  strategy_->before_backward(loss);
  auto t0 = Clock::now();
  if (profiler_) profiler_->set_phase(profiling::Phase::backward);
  double value = loss.item<double>();
  window_loss_sum_ += std::isfinite(value) ? value : 0.0;
  window_nonfinite_ += std::isfinite(value) ? 0 : 1;
  ++window_micro_steps_;
  const bool boundary = is_gradient_accumulation_boundary();
  DSCPP_LOG_DEBUG("micro step {}/{} (global step {}): backward{}",
                  micro_steps_ % gradient_accumulation_steps() + 1, gradient_accumulation_steps(),
                  global_steps_, boundary && !no_sync_depth_ ? " + gradient reduction" : "");
  zero::GradReducer& reducer = strategy_->reducer();
  // Stages 0-1 reduce buckets during the boundary backward (all-reduce, reduce-scatter); stage 2
  // reduce-scatters in every backward (the reducer decides).
  const bool reduce = boundary && no_sync_depth_ == 0;
  const bool side_channel =
      reduce && strategy_->side_channel().defined() && strategy_->side_channel().numel() > 0;
  if (side_channel) write_side_channel();
  reducer.set_final(reduce);  // this backward's reductions complete the window
  reducer.prepare_backward(reduce, loss);
  // The gradient applied at the boundary is the mean over the global batch: each micro-batch
  // loss is a mean over its samples, so scale by 1/GAS here and average over ranks. fp16 also
  // multiplies by the loss scale (in fp32: 2^16 is no fp16 number), divided out in apply_step().
  const double scale = loss_scale() / static_cast<double>(gradient_accumulation_steps());
  // When backward fails the other ranks go on reducing: this rank launches and finishes its
  // buckets too, so the collectives stay in step. Unless every gradient was complete, the window
  // is spoiled: it is flagged to every rank (at stage 0 in the side channel, whose bucket goes
  // only in finish_backward) and step() drops it everywhere.
  auto fail_window = [&] {
    if (!reducer.all_gradients_ready() || reducer.late_gradient()) {
      window_failed_ = true;
      if (side_channel) write_side_channel();
    }
    try {
      reducer.finish_backward();
    } catch (const IoError&) {
      window_failed_ = true;  // the gradient shard's disk: the ranks are still in step
    }
    strategy_->after_backward();
    window_reduced_ = reduce;
  };
  // Where the rest of the backward is only gradient buckets, the ranks stay in step. At stage 3
  // it also gathers the parameters of the units not yet reached, which this rank skips: the
  // collectives then fail (a mismatch, at once). This rank still throws the error that made its
  // backward fail, the cause (an I/O error, a user's hook), logs the collectives' error unless
  // its backward failed in a collective itself, and the engine stops.
  auto finish_failed_backward = [&](bool log) {
    try {
      fail_window();
    } catch (const std::exception& e) {
      broken_ = std::string(
                    "after its backward failed, this rank's collectives fell out of "
                    "step with the other ranks': ") +
                e.what();
      if (log) DSCPP_LOG_ERROR("rank {}: {}", comm_->rank(), broken_);
    }
  };
  try {
    (loss.to(at::kFloat) * scale).backward();
  } catch (const CommError&) {
    finish_failed_backward(/*log=*/false);  // the collectives' error is the cause
    throw;
  } catch (...) {
    finish_failed_backward(/*log=*/true);
    throw;
  }
  if (reducer.late_gradient()) {
    // The hook's error was caught inside backward (by the user's code in a hook, say): the
    // gradient is still lost.
    fail_window();
    DSCPP_FAIL(Error,
               "a gradient arrived after its bucket had been reduced in this backward on "
               "rank ",
               comm_->rank(),
               ", so it was lost; the window is dropped on every rank. "
               "HINT: a function that runs a backward of its own must be dscpp::zero::checkpoint, "
               "whose parameters dscpp knows");
  }
  try {
    t_reduce_wait_ += reducer.finish_backward();
  } catch (const CommError&) {
    throw;  // the collectives failed: the communicator's error stops every rank
  } catch (...) {
    // This rank could not keep its gradients (its gradient shard's disk failed, NOTE [gradients
    // on disk], or memory ran out adding a piece) while the collectives stayed in step: the
    // window is dropped on every rank at the step.
    window_failed_ = true;
    strategy_->after_backward();
    window_reduced_ = reduce;
    throw;
  }
  strategy_->after_backward();
  window_reduced_ = reduce;
  if (strategy_->reduces_every_backward() && !config_.zero_optimization.ignore_unused_parameters) {
    auto unused = reducer.unused_in_last_backward();
    DSCPP_CHECK(unused.empty(), Error, unused.size(),
                " parameter(s) got no gradient in this "
                "backward on rank ",
                comm_->rank(), " (first: '", unused[0],
                "') and "
                "zero_optimization.ignore_unused_parameters is false. HINT: set "
                "ignore_unused_parameters to true (their gradient is then zero), or freeze them "
                "with requires_grad(false) before initialize()");
  }
  t_backward_ += seconds_since(t0);
  if (profiler_) profiler_->set_phase(profiling::Phase::forward);  // the next micro-step's
}

void EngineImpl::step() {
  check_usable();
  const bool boundary = is_gradient_accumulation_boundary();
  if (boundary) {
    DSCPP_CHECK(no_sync_depth_ == 0, Error,
                "step() at a gradient accumulation boundary inside no_sync(): the gradients were "
                "not averaged over ranks. HINT: leave the no_sync scope before the boundary step");
    DSCPP_CHECK(window_micro_steps_ == gradient_accumulation_steps(), Error,
                "step() at the "
                "boundary after ",
                window_micro_steps_,
                " backward() calls in this window, "
                "expected ",
                gradient_accumulation_steps(), " (one per micro-step)");
    try {
      apply_step();
    } catch (...) {
      ++micro_steps_;  // the window is over either way (apply_step dropped its gradients)
      drop_profiler();
      throw;
    }
  }
  ++micro_steps_;
}

void EngineImpl::flush_accumulation() {
  // Collective: ranks may have taken different numbers of micro-steps in this window (uneven
  // shards at the end of an epoch), so the count travels with the statistics.
  const int64_t gas = gradient_accumulation_steps();
  DSCPP_LOG_INFO("flushing the accumulation window: {} of {} micro-steps on this rank",
                 window_micro_steps_, gas);
  window_reduced_ = false;  // apply_step() averages what there is, with the counts
  try {
    apply_step();
  } catch (...) {
    if (micro_steps_ % gas != 0) micro_steps_ += gas - micro_steps_ % gas;
    drop_profiler();
    throw;
  }
  if (micro_steps_ % gas != 0) micro_steps_ += gas - micro_steps_ % gas;  // a new window
}

void EngineImpl::enter_no_sync() {
  DSCPP_CHECK(!strategy_->reduces_every_backward(), Error,
              "no_sync() is incompatible with ZeRO stage ", config_.zero_optimization.stage,
              ": its gradients are reduce-scattered into shards as backward runs (DeepSpeed's "
              "rule too). HINT: use gradient_accumulation_steps, which accumulates without extra "
              "memory, or stage 0/1");
  ++no_sync_depth_;
}

void EngineImpl::abandon_window() {
  if (store_)
    store_->drain();  // a dropped window's gradients may still be on their way to host memory
  strategy_->reducer().set_final(false);
  strategy_->reducer().zero_grads();
  strategy_->reducer().clear_nonfinite();
  window_micro_steps_ = 0;
  window_loss_sum_ = 0;
  window_nonfinite_ = 0;
  window_failed_ = false;
  window_reduced_ = false;
  t_backward_ = t_reduce_wait_ = t_optimizer_ = t_boundary_ = t_gather_ = 0;
  strategy_->take_fetch_stats();  // the next window counts its own
  window_start_ = Clock::now();
}

int EngineImpl::window_flags() const {
  return (window_nonfinite_ > 0 ? kNonFiniteLoss : 0) | (window_failed_ ? kBackwardFailed : 0);
}

EngineImpl::Reduced EngineImpl::reduce_window() {
  const int world = comm_->world_size();
  Reduced r;
  const at::Tensor side = strategy_->side_channel();
  const bool side_channel = side.defined() && side.numel() > 0;
  if (!strategy_->reduces_every_backward() && !window_reduced_) {
    // The boundary backward did not reduce (no_sync, or a flush): do it now, as DDP does at the
    // next synchronising backward.
    if (side_channel) write_side_channel();
    strategy_->reducer().set_final(true);
    strategy_->reduce_accumulated();
  }
  r.parts = strategy_->parts();
  store_->gradients_final(r.parts);  // they may travel while the statistics are summed
  // The same arithmetic for every stage's part, so every stage clips alike; a shard on disk took
  // its sums as it was written, with the bits of the shard in memory (NOTE [gradients on disk]).
  double part_sq_norm = 0;
  zero::GradShard* on_disk = r.parts.empty() ? nullptr : r.parts.front().grads_on_disk;
  if (on_disk) {
    for (const auto& p : r.parts) {
      DSCPP_CHECK(p.grads_on_disk == on_disk, Error,
                  "internal: a part's gradients in memory beside a shard on disk");
    }
    part_sq_norm = on_disk->squared_norm();
  } else {
    for (const auto& g : adjacent_runs(r.parts)) part_sq_norm += optim::squared_norm(g);
  }
  if (side_channel) {
    at::Tensor s = side.to(at::kCPU, at::kDouble);  // may live on a GPU
    const double* p = s.data_ptr<double>();
    r.loss_sum = p[0];
    r.micro_batches = p[1];
    r.nonfinite_ranks = ranks_flagged(p + 2, world, kNonFiniteLoss);
    r.failed_ranks = ranks_flagged(p + 2, world, kBackwardFailed);
    r.grad_sq_norm = part_sq_norm;  // stage 0: every rank holds the whole gradient
    return r;
  }
  reduce_stats(r, strategy_->replicated() ? 0.0 : part_sq_norm);
  if (strategy_->replicated()) r.grad_sq_norm = part_sq_norm;
  return r;
}

void EngineImpl::reduce_stats(Reduced& r, double part_sq_norm) {
  // One small all-reduce: the window's loss sum, its micro-steps, which ranks saw a non-finite
  // loss, and the parts' squared gradient norms.
  const int world = comm_->world_size();
  at::Tensor st = at::zeros({3 + world}, at::kDouble);
  auto* p = st.data_ptr<double>();
  p[0] = window_loss_sum_;
  p[1] = static_cast<double>(window_micro_steps_);
  p[2 + comm_->rank()] = window_flags();
  p[2 + world] = part_sq_norm;
  at::Tensor dev = st.to(strategy_->options().device());
  comm_->all_reduce(dev)->wait();
  st = dev.to(at::kCPU);
  p = st.data_ptr<double>();
  r.loss_sum = p[0];
  r.micro_batches = p[1];
  r.nonfinite_ranks = ranks_flagged(p + 2, world, kNonFiniteLoss);
  r.failed_ranks = ranks_flagged(p + 2, world, kBackwardFailed);
  r.grad_sq_norm = p[2 + world];
}

void EngineImpl::apply_step() {
  auto t_opt = Clock::now();
  if (profiler_) profiler_->set_phase(profiling::Phase::optimizer);
  const int world = comm_->world_size();

  // 1. Gradients averaged over ranks (stages 1-2: this rank's shard of them), the loss over the
  // global batch, and whether any rank saw a non-finite one.
  Reduced red = reduce_window();
  t_boundary_ += seconds_since(t_opt);
  if (red.micro_batches == 0) {  // a flush with nothing accumulated anywhere
    abandon_window();
    if (profiler_) profiler_->set_phase(profiling::Phase::forward);
    return;
  }
  if (!red.failed_ranks.empty()) abandon_window();
  DSCPP_CHECK(red.failed_ranks.empty(), Error, "backward() failed on rank(s) ", red.failed_ranks,
              " in the accumulation window of optimizer step ", global_steps_ + 1,
              ", so the "
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
  // fp32 boundary).
  const double unscale = gradient_accumulation_steps() * world / red.micro_batches / loss_scale();

  // 2. Global gradient norm: of the whole gradient (stage 0, every rank holds it), or from the
  // parts' squared norms summed over ranks; the same arithmetic either way.
  const double grad_norm = std::sqrt(red.grad_sq_norm) * unscale;
  if (!std::isfinite(grad_norm) && scaler_) return skip_step(loss, lr);
  if (!std::isfinite(grad_norm)) {
    const std::string origin = nonfinite_origin();
    abandon_window();
    DSCPP_FAIL(Error, "the gradient norm is ", grad_norm, " at optimizer step ", global_steps_ + 1,
               " although every loss was finite", origin,
               "; the step is not applied. HINT: an operation overflowed in backward on that "
               "rank; look at its data for this step, lower the learning rate, or enable "
               "gradient_clipping");
  }
  // 3. Clip by the global norm, as DeepSpeed does.
  const double clip = config_.gradient_clipping;
  const double coef = clip > 0 ? std::min(1.0, clip / (grad_norm + 1e-6)) : 1.0;

  // 4. The optimizer step at the LR in force on this rank's (fp32 master) weights; the update
  // cast back into the training dtype and made every rank's (stages 1-2: all-gathered); then
  // the schedule ticks.
  DSCPP_LOG_DEBUG("optimizer step {}: loss {:.6f}, grad_norm {:.6f}, lr {:.6e}", global_steps_ + 1,
                  loss, grad_norm, lr);
  release_live_state();  // a checkpoint in flight copies what it has not written yet
  strategy_->before_update();
  update_parameters(red, unscale, coef, lr);
  const auto t_gather = Clock::now();
  strategy_->publish_params();
  t_gather_ += seconds_since(t_gather);
  const double used_scale = loss_scale();
  if (scaler_) scaler_->update(/*overflow=*/false);
  if (lr_schedule_) lr_schedule_->step();
  if (adam_lr_schedule_) adam_lr_schedule_->step();
  if (client_lr_scheduler_) client_lr_scheduler_->step();
  t_optimizer_ += seconds_since(t_opt);

  ++global_steps_;
  comm_->set_step(global_steps_);
  global_samples_ += train_batch_size();
  double window_s = seconds_since(window_start_);
  last_step_ = StepStats{
      global_steps_, loss,       lr,   grad_norm, window_s > 0 ? train_batch_size() / window_s : 0,
      window_s,      used_scale, false};
  fetch_ = strategy_->take_fetch_stats();
  store_report_ = store_->take_report();
  if (config_.steps_per_print && global_steps_ % *config_.steps_per_print == 0) log_step();
  write_monitors();
  finish_profiler();
  abandon_window();  // zeroes the gradients, resets the window's counters and timers
  start_profiler_if_due();
  // 5. A checkpoint written in the background is published once every rank's file is durable.
  publish_written_checkpoint();
}

void EngineImpl::run_optimizer(const Reduced& red, double unscale, double coef, double lr) {
  // The unscale and the clip coefficient: one multiplier, which dscpp's optimizers apply as they
  // read each gradient (StepContext::grad_scale) instead of a pass of its own over the gradients.
  const double multiplier = unscale * coef;
  if (!optimizer_) {  // the client reads param.grad (fp32: check_supported)
    if (multiplier != 1.0) {
      for (const auto& part : red.parts) part.grads.mul_(multiplier);
    }
    client_optimizer_->step();
    return;
  }
  optim::StepContext ctx;
  ctx.grad_scale = 1.0 / multiplier;
  ctx.lr = lr;
  ctx.step = global_steps_ + 1 - skipped_steps_;
  ctx.betas_override = lr_schedule_ ? lr_schedule_->get_betas() : std::nullopt;
  if (adam_lr_schedule_) ctx.adam_lr = adam_lr_schedule_->get_lr();
  // Muon: each matrix's momentum folded, gathered on its owner, orthogonalised and its update
  // handed to the ranks that hold it (NOTE [Muon across ranks]), before the part is stepped.
  if (muon_matrices_)
    muon_matrices_->prepare_step(static_cast<optim::Muon&>(*optimizer_), red.parts, ctx.grad_scale);
  store_->step(*optimizer_, red.parts, std::move(ctx));
}

void EngineImpl::update_parameters(const Reduced& red, double unscale, double coef, double lr) {
  fault::point(fault::Phase::optimizer);
  bool midway = store_->can_fail_midway();
  for (const auto& p : red.parts) midway = midway || p.sink;
  if (!midway) return run_optimizer(red, unscale, coef, lr);
  std::exception_ptr error;
  try {
    run_optimizer(red, unscale, coef, lr);
    zero::finish_stores(red.parts);
  } catch (...) {
    error = std::current_exception();
    try {
      zero::finish_stores(red.parts);  // nothing may still be writing from a buffer
    } catch (...) {
    }
  }
  // Ranks whose swap or copy failed have a part that is neither the old one nor the new one, while
  // the others updated theirs: no rank may go on (the next all-gather would mix them). Every rank
  // learns it here, before publishing, and the engine refuses further steps.
  try {
    on_every_rank(
        "the offloaded optimizer step " + std::to_string(global_steps_ + 1),
        [&] {
          if (error) std::rethrow_exception(error);
        },
        /*checkpoint_error=*/false);
  } catch (const std::exception& e) {
    broken_ = std::string(e.what()) +
              "; this engine cannot train on (its ranks' states differ). HINT: fix the cause "
              "and restart from the last checkpoint";
    throw;
  }
}

std::string EngineImpl::nonfinite_origin() {
  // Every rank is here at once (they all see the same norm): one small all-reduce of where each
  // rank's own gradients first turned non-finite (ReduceOptions::check_finite).
  const int world = comm_->world_size();
  zero::GradReducer& reducer = strategy_->reducer();
  at::Tensor first = rank_values(world, device_);
  first[comm_->rank()] = static_cast<double>(reducer.first_nonfinite() + 1);
  comm_->all_reduce(first)->wait();
  first = first.cpu();
  std::string out;
  for (int q = 0; q < world; ++q) {
    const auto p = static_cast<int>(first.data_ptr<double>()[q]) - 1;
    if (p < 0) continue;
    out +=
        fmt::format("{}rank {} (first in '{}')", out.empty() ? "" : ", ", q, reducer.names().at(p));
  }
  return out.empty() ? "; no rank's own gradients were non-finite, so their sum overflowed"
                     : "; the gradients were non-finite before averaging on " + out;
}

void EngineImpl::check_usable() const {
  DSCPP_CHECK(broken_.empty(), Error, "the engine stopped after an earlier failure: ", broken_);
}

void EngineImpl::skip_step(double loss, double lr) {
  // DeepSpeed's fp16 overflow: no update, no schedule tick, the step still counts.
  const double used = loss_scale();
  const double window_s = seconds_since(window_start_);
  ++skipped_steps_;
  ++global_steps_;
  comm_->set_step(global_steps_);
  global_samples_ += train_batch_size();
  last_step_ = StepStats{global_steps_, loss, lr, std::nan(""), 0, window_s, used, true};
  finish_profiler();  // before the window's counters and timers reset
  abandon_window();
  scaler_->update(/*overflow=*/true);  // throws at the minimum scale
  write_monitors();
  start_profiler_if_due();
  if (comm_->rank() == 0) {
    DSCPP_LOG_INFO(
        "step {}: fp16 gradient overflow with loss scale {}; update skipped ({} so "
        "far), {}",
        global_steps_, used, skipped_steps_, scaler_->describe());
  }
}

MemoryStats EngineImpl::memory_stats() {
  MemoryStats m;
  m.params = strategy_->param_bytes();
  m.grads = strategy_->grad_bytes();
  m.master = store_->bytes();
  if (optimizer_) m.optimizer_state = optimizer_->state_bytes();
  m.optimizer_state += store_->state_bytes();
  m.staging = strategy_->staging_bytes();
  m.gathered = strategy_->gathered_peak_bytes();
  m.offload_buffers = store_->buffer_bytes() + strategy_->param_swap_buffer_bytes() +
                      strategy_->grad_swap_buffer_bytes();
  if (store_->steps_on_host()) m.host = m.master + m.optimizer_state + store_->buffer_bytes();
  m.host += strategy_->param_host_bytes();
  return m;
}

void EngineImpl::write_side_channel() {
  at::Tensor side = strategy_->side_channel();
  side.zero_();
  side[0] = window_loss_sum_;
  side[1] = static_cast<float>(window_micro_steps_);
  side[2 + comm_->rank()] = static_cast<float>(window_flags());
}

void EngineImpl::log_step() {
  if (comm_->rank() != 0) return;
  const auto& s = last_step_;
  std::string line =
      fmt::format("step {} | loss {:.6f} | lr {:.4e} | grad_norm {:.4f} | {:.1f} samples/s", s.step,
                  s.loss, s.lr, s.grad_norm, s.samples_per_s);
  if (tokens_per_sample_ > 0)
    line += fmt::format(" | {:.0f} tokens/s", s.samples_per_s * tokens_per_sample_);
  if (scaler_) line += fmt::format(" | loss scale {} | skipped {}", s.loss_scale, skipped_steps_);
  line += fmt::format(" | rss {:.2f} GiB", rss_gib());
  if (config_.wall_clock_breakdown) {
    line += fmt::format(
        " | window {:.1f} ms: forward+data {:.1f} ms, backward {:.1f} ms (waiting "
        "for gradient reductions {:.1f} ms), optimizer {:.1f} ms (boundary reductions {:.1f} "
        "ms, update {:.1f} ms, all-gather {:.1f} ms)",
        s.seconds * 1e3, (s.seconds - t_backward_ - t_optimizer_) * 1e3, t_backward_ * 1e3,
        t_reduce_wait_ * 1e3, t_optimizer_ * 1e3, t_boundary_ * 1e3,
        (t_optimizer_ - t_boundary_ - t_gather_) * 1e3, t_gather_ * 1e3);
    if (fetch_.gathers > 0) {
      line += fmt::format(
          ", waiting for stage-3 parameter gathers {:.1f} ms ({} gathers, {} "
          "prefetched)",
          fetch_.wait_seconds * 1e3, fetch_.gathers, fetch_.prefetched);
    }
    if (!store_report_.empty()) line += "; " + store_report_;
    if (fetch_.disk_reads > 0 || fetch_.disk_bytes_written > 0) {
      line += fmt::format(
          "; parameters {}: read {} shards ({} ahead of their request, {:.1f} MiB), wrote "
          "{:.1f} MiB, waited for them {:.1f} ms",
          fetch_.shards_where, fetch_.disk_reads, fetch_.disk_reads_ahead,
          fetch_.disk_bytes_read / double(1 << 20), fetch_.disk_bytes_written / double(1 << 20),
          fetch_.disk_wait_seconds * 1e3);
    }
    if (op_times_) {
      const auto now = Clock::now();
      const double since = std::chrono::duration<double>(now - op_times_since_).count();
      line += "\nrank 0 since the previous step line, " +
              profiling::format_op_table(op_times_->take(), since, kOpTableRows);
      op_times_since_ = now;
    }
  }
  log_detail(line);
}

void EngineImpl::start_op_times() {
  if (!config_.wall_clock_breakdown || comm_->rank() != 0) return;
  if (!device_.is_cpu()) {
    DSCPP_LOG_INFO(
        "wall_clock_breakdown: no table of ops on {} (the host sees kernel launches, not their "
        "time); the phases are timed",
        device_.str());
    return;
  }
  try {
    op_times_ = std::make_unique<profiling::OpTimes>();
    op_times_since_ = Clock::now();
  } catch (const std::exception& e) {
    DSCPP_LOG_WARN("wall_clock_breakdown: no table of ops: {}", e.what());
  }
}

void EngineImpl::start_profiler_if_due() {
  const auto& fp = config_.flops_profiler;
  if (!fp.enabled || comm_->rank() != 0 || profiler_ || global_steps_ != fp.profile_step) return;
  // NOTE [rank-0 observers]: the monitors and the profiler run on rank 0 alone, after the step's
  // collectives; an exception there would leave the other ranks waiting at the next collective,
  // so a failure is logged as an error and that observer stops, while training goes on.
  try {
    profiler_ = std::make_unique<profiling::FlopsProfiler>(*model_, fp);
  } catch (const std::exception& e) {
    DSCPP_LOG_ERROR("flops_profiler: not profiling step {}: {}", global_steps_ + 1, e.what());
  }
}

void EngineImpl::drop_profiler() {
  if (!profiler_) return;
  DSCPP_LOG_WARN("flops_profiler: the profiled step failed; no report");
  profiler_.reset();
}

void EngineImpl::finish_profiler() {
  if (!profiler_) return;
  profiling::WindowInfo info;
  info.step = global_steps_;
  info.micro_steps = static_cast<int>(window_micro_steps_);
  info.world = comm_->world_size();
  info.tokens =
      tokens_per_sample_ * config_.batch.train_micro_batch_size_per_gpu * window_micro_steps_;
  info.seconds = last_step_.seconds;
  info.backward_s = t_backward_;
  info.reduce_wait_s = t_reduce_wait_;
  info.optimizer_s = t_optimizer_;
  info.dtype = dtype_;
  info.device = device_;
  const auto& file = config_.flops_profiler.output_file;
  try {  // NOTE [rank-0 observers]
    std::string report = profiler_->finish(info);
    if (last_step_.skipped) report += "(the profiled step was skipped: fp16 gradient overflow)\n";
    profiler_.reset();
    if (!file) {
      std::cout << report << std::flush;
      return;
    }
    std::ofstream out(*file, std::ios::trunc);
    out << report;
    out.close();
    DSCPP_CHECK(out.good(), IoError, "flops_profiler.output_file: cannot write '", *file, "'");
    DSCPP_LOG_INFO("flops_profiler: report of step {} written to {}", global_steps_, *file);
  } catch (const std::exception& e) {
    profiler_.reset();
    DSCPP_LOG_ERROR("flops_profiler: no report of step {}: {}", global_steps_, e.what());
  }
}

void EngineImpl::write_monitors() {
  // NOTE [monitor events]: DeepSpeed's tags and x axis (global_samples), one event per scalar
  // after every optimizer step on rank 0: train_loss (here the mean over the whole global batch;
  // DeepSpeed logs rank 0's own loss), lr, and loss_scale under fp16; then what DeepSpeed's
  // users read from the log line instead: grad_norm (not on a skipped step, where it is not
  // finite), samples_per_sec, tokens_per_sec (when set_tokens_per_sample was called) and rank
  // 0's resident and peak memory; with wall_clock_breakdown DeepSpeed's elapsed_time_ms_* of the
  // window (forward includes the data loading between micro-steps, as the log line's does).
  if (monitors_.empty()) return;
  const StepStats& s = last_step_;
  const int64_t x = global_samples_;
  std::vector<monitor::Event> events;
  auto add = [&](const char* name, double value) {
    events.push_back({std::string("Train/Samples/") + name, value, x});
  };
  add("train_loss", s.loss);
  add("lr", s.lr);
  if (scaler_) add("loss_scale", s.loss_scale);
  if (!s.skipped) {
    add("grad_norm", s.grad_norm);
    add("samples_per_sec", s.samples_per_s);
    if (tokens_per_sample_ > 0) add("tokens_per_sec", s.samples_per_s * tokens_per_sample_);
  }
  add("rss_gib", rss_gib());
  add("peak_rss_gib", static_cast<double>(peak_rss_bytes()) / (1 << 30));
  if (config_.wall_clock_breakdown && !s.skipped) {
    add("elapsed_time_ms_forward", (s.seconds - t_backward_ - t_optimizer_) * 1e3);
    add("elapsed_time_ms_backward", t_backward_ * 1e3);
    add("elapsed_time_ms_backward_inner", (t_backward_ - t_reduce_wait_) * 1e3);
    add("elapsed_time_ms_backward_allreduce", t_reduce_wait_ * 1e3);
    add("elapsed_time_ms_step", t_optimizer_ * 1e3);
  }
  for (auto it = monitors_.begin(); it != monitors_.end();) {
    try {  // NOTE [rank-0 observers]
      (*it)->write(events);
      ++it;
    } catch (const std::exception& e) {
      DSCPP_LOG_ERROR("monitor: {} stopped at step {}: {}; training goes on without it",
                      (*it)->describe(), global_steps_, e.what());
      it = monitors_.erase(it);
    }
  }
}

}  // namespace dscpp::engine
