// The four PartStores (part_store.h): in the parameters, master weights, swap file, host memory.
#include "precision/part_store.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "dscpp/device_link.h"
#include "dscpp/error.h"
#include "offload/optimizer_swapper.h"
#include "precision/device_copies.h"
#include "zero/grad_shard.h"

namespace dscpp::precision {
namespace {

// Elements per piece of the mixed-precision optimizer step (16 MiB of fp32 gradient).
constexpr int64_t kStepPiece = int64_t{1} << 22;
// bf16 master weights widen a piece of parameters and one of gradients: smaller pieces keep the
// two scratch buffers (8 MiB) below what dropping the fp32 master weights saves on small models.
constexpr int64_t kBf16MasterPiece = int64_t{1} << 20;

// Elements [offset, offset + n) of the part where the parameters are the fp32 values.
at::Tensor values_in_parameters(const std::vector<zero::Part>& parts, int64_t offset, int64_t n) {
  for (const auto& p : parts) {
    if (p.params.defined() && offset >= p.offset && offset + n <= p.offset + p.numel())
      return p.params.narrow(0, offset - p.offset, n);
  }
  DSCPP_FAIL(Error, "internal: elements [", offset, ", ", offset + n, ") lie in no part");
}

// The gradients the optimizer reads in fp32: the gradients themselves in fp32; under mixed
// precision cast a piece at a time, so the step never holds an fp32 copy of the whole (shard of
// the) gradient. The pieces (and offload's sub-groups) are cast into one buffer kept across steps:
// a fresh allocation per piece costs more in page faults than the cast itself once it exceeds
// malloc's mmap threshold (32 MiB; a sub-group of 1e7 elements spent 86% of its step there).
class Fp32Grads {
 public:
  explicit Fp32Grads(int64_t limit) : limit_(limit) {}
  at::Tensor operator()(const at::Tensor& grads) {
    if (grads.scalar_type() == at::kFloat) return grads;
    if (grads.numel() > limit_) return grads.to(at::kFloat);
    if (!scratch_.defined() || scratch_.numel() < grads.numel())
      scratch_ = at::empty({limit_}, grads.options().dtype(at::kFloat));
    at::Tensor g = scratch_.narrow(0, 0, grads.numel());
    g.copy_(grads);
    return g;
  }

 private:
  int64_t limit_;
  at::Tensor scratch_;
};

// The optimizer over `weights` (the part's fp32 values, at part offsets) a piece at a time under
// mixed precision. `fused`: bf16 gradients in, bf16 parameters written in the update's pass
// (NOTE [bf16 in the optimizer pass]).
void step_in_memory(optim::Optimizer& optimizer, const std::vector<zero::Part>& parts,
                    const std::function<at::Tensor(const zero::Part&)>& weights_of,
                    int64_t part_numel, bool pieces, bool fused, Fp32Grads& fp32_grads,
                    optim::StepContext ctx) {
  pieces = pieces && optimizer.supports_pieces();
  for (const auto& part : parts) {
    const int64_t n = part.numel();
    at::Tensor weights = weights_of(part);
    const int64_t piece = pieces ? kStepPiece : n;
    for (int64_t off = 0; off < n; off += piece) {
      const int64_t len = std::min(piece, n - off);
      at::Tensor w = weights.narrow(0, off, len);
      if (len < part_numel) ctx.offset = part.offset + off;
      at::Tensor g = part.grads.narrow(0, off, len);
      if (fused) {
        ctx.bf16_params = part.params.narrow(0, off, len);
        optimizer.step(w, g, ctx);
      } else {
        optimizer.step(w, fp32_grads(g), ctx);
      }
    }
  }
}

// fn(k, part, lo, n) for each overlap [lo, lo + n) of sub-group k (of `sub` elements, over a
// part of `part_numel`) with a part, in order of k.
void for_each_piece(const std::vector<zero::Part>& parts, int64_t sub, int64_t part_numel,
                    const std::function<void(int64_t, const zero::Part&, int64_t, int64_t)>& fn) {
  for (int64_t k = 0; k * sub < part_numel; ++k) {
    const int64_t begin = k * sub, end = std::min(begin + sub, part_numel);
    for (const auto& part : parts) {
      const int64_t lo = std::max(begin, part.offset);
      const int64_t hi = std::min(end, part.offset + part.numel());
      if (lo < hi) fn(k, part, lo, hi - lo);
    }
  }
}

// The parameters hold the values: in fp32 training the optimizer updates them in place; with
// bf16.bf16_master_weights_and_grads (DeepSpeed 0.18.3+: no fp32 master weights) the bf16
// parameters are the values, and each piece of them and of its gradients is widened to fp32,
// stepped, and rounded back into the parameters once (what DeepSpeed's CPU Adam does to bf16
// parameters), so every step's update is rounded to bf16. With bf16.bf16_optimizer_states the
// store holds the optimizer's states too, in bf16, and widens and rounds back each piece of them
// beside the parameters' (DeepSpeed's CPU Adam with fp32_optimizer_states false; its fused GPU
// Adam does the same in registers).
class ParamsStore final : public PartStore {
 public:
  ParamsStore(bool widen, std::vector<std::pair<std::string, float>> bf16_states, at::Device device)
      : widen_(widen), state_init_(std::move(bf16_states)), device_(device) {
    DSCPP_CHECK(widen_ || state_init_.empty(), Error,
                "internal: bf16 optimizer states without bf16 master weights");
    for (size_t i = 0; i < state_init_.size(); ++i) widened_states_.emplace_back(kBf16MasterPiece);
  }
  zero::PartTap open(int64_t part_numel) override {
    part_numel_ = part_numel;
    states_.clear();
    for (const auto& [name, initial] : state_init_)
      states_.push_back(
          at::full({part_numel}, initial, at::TensorOptions(device_).dtype(at::kBFloat16)));
    return nullptr;
  }
  bool holds_optimizer_states() const override { return !state_init_.empty(); }
  void step(optim::Optimizer& optimizer, const std::vector<zero::Part>& parts,
            optim::StepContext ctx) override {
    if (!widen_) {
      step_in_memory(
          optimizer, parts, [](const zero::Part& p) { return p.params; }, part_numel_,
          /*pieces=*/false, /*fused=*/false, fp32_grads_, std::move(ctx));
      return;
    }
    at::NoGradGuard no_grad;
    const bool pieces = optimizer.supports_pieces();
    for (const auto& part : parts) {
      DSCPP_CHECK(part.params.defined() && part.sink == nullptr, Error,
                  "internal: bf16 master weights with parameters out of memory");
      const int64_t n = part.numel(), piece = pieces ? kBf16MasterPiece : n;
      for (int64_t off = 0; off < n; off += piece) {
        const int64_t len = std::min(piece, n - off);
        at::Tensor params = part.params.narrow(0, off, len);
        at::Tensor w = widened_(params);
        if (len < part_numel_) ctx.offset = part.offset + off;
        ctx.state.clear();
        for (size_t s = 0; s < states_.size(); ++s)
          ctx.state.push_back(widened_states_[s](states_[s].narrow(0, part.offset + off, len)));
        optimizer.step(w, fp32_grads_(part.grads.narrow(0, off, len)), ctx);
        params.copy_(w);
        for (size_t s = 0; s < states_.size(); ++s)
          states_[s].narrow(0, part.offset + off, len).copy_(ctx.state[s]);
      }
    }
  }
  void publish(const std::vector<zero::Part>&) override {}
  at::Tensor values(const std::vector<zero::Part>& parts, int64_t offset,
                    int64_t n) const override {
    return values_in_parameters(parts, offset, n);  // bf16: a checkpoint reads them as fp32
  }
  at::Tensor state_view(const std::string& name, int64_t offset, int64_t n) const override {
    for (size_t s = 0; s < states_.size(); ++s) {
      if (state_init_[s].first == name) return states_[s].narrow(0, offset, n);
    }
    return {};
  }
  int64_t state_bytes() const override {
    int64_t b = 0;
    for (const auto& t : states_) b += static_cast<int64_t>(t.nbytes());
    return b;
  }

 private:
  bool widen_;
  int64_t part_numel_ = 0;
  Fp32Grads fp32_grads_{kBf16MasterPiece};
  Fp32Grads widened_{kBf16MasterPiece};  // the piece's parameters in fp32 (widen_)
  // bf16 optimizer states: each state's name and starting value, the states [part_numel] bf16,
  // and a piece of each in fp32 for the step.
  std::vector<std::pair<std::string, float>> state_init_;
  at::Device device_;
  std::vector<at::Tensor> states_;
  std::vector<Fp32Grads> widened_states_;
};

// Mixed precision: the optimizer updates fp32 master weights (this rank's part of them, rank 0's
// original values taken piece by piece as the model is moved into its flat buffers, so the model
// never exists twice in fp32), and the training-dtype parameters are cast from them.
class MasterStore final : public PartStore {
 public:
  MasterStore(at::ScalarType dtype, at::Device device) : dtype_(dtype), device_(device) {}
  zero::PartTap open(int64_t part_numel) override {
    // Elements no parameter covers (padding) stay zero.
    weights_ = at::zeros({part_numel}, at::TensorOptions(device_).dtype(at::kFloat));
    return [this](int64_t off, const at::Tensor& v) {
      at::NoGradGuard no_grad;
      weights_.narrow(0, off, v.numel()).copy_(v.reshape({-1}));
    };
  }
  void step(optim::Optimizer& optimizer, const std::vector<zero::Part>& parts,
            optim::StepContext ctx) override {
    // bf16 gradients in, bf16 parameters out, in the update's pass when the optimizer can and
    // every part's parameters are in memory.
    bool fused = dtype_ == at::kBFloat16 && optimizer.fuses_bf16();
    for (const auto& part : parts) {
      // (fp32 gradients: NOTE [accumulation dtype] in src/zero/grad_buffer.h.)
      fused = fused && part.sink == nullptr && part.grads.scalar_type() == at::kBFloat16;
    }
    step_in_memory(
        optimizer, parts,
        [this](const zero::Part& p) { return weights_.narrow(0, p.offset, p.numel()); },
        weights_.numel(), /*pieces=*/true, fused, fp32_grads_, std::move(ctx));
    if (!fused) publish(parts);
  }
  void publish(const std::vector<zero::Part>& parts) override {
    at::NoGradGuard no_grad;
    for (const auto& p : parts) p.store(0, weights_.narrow(0, p.offset, p.numel()));
  }
  at::Tensor values(const std::vector<zero::Part>&, int64_t offset, int64_t n) const override {
    return weights_.narrow(0, offset, n);
  }
  int64_t bytes() const override {
    return weights_.defined() ? static_cast<int64_t>(weights_.nbytes()) : 0;
  }

 private:
  at::ScalarType dtype_;
  at::Device device_;
  at::Tensor weights_;  // [part_numel] fp32
  Fp32Grads fp32_grads_{kStepPiece};
};

// offload_optimizer nvme: sub-group by sub-group through the swap file (NOTE [swap file layout]):
// its tensors are the fp32 values (when with_values_), then the optimizer's states.
class SwapStore final : public PartStore {
 public:
  explicit SwapStore(const PartStoreOptions& o)
      : make_swapper_(o.make_swapper),
        // A model on a device: its parameters are out of the step's reach, so the values are in
        // the swap file even in fp32.
        with_values_(o.dtype != at::kFloat || o.params_on_disk || o.link),
        sub_group_size_(o.sub_group_size),
        fp32_grads_(o.sub_group_size) {
    if (o.link) {  // NOTE [host step], with the swap file's sub-groups
      copies_ = std::make_unique<DeviceCopies>(*o.link, o.dtype, o.sub_group_size, o.pin_memory,
                                               o.buffer_count, /*staged=*/true);
    }
  }
  zero::PartTap open(int64_t part_numel) override {
    swapper_ = make_swapper_(part_numel, with_values_);
    if (copies_) copies_->open(part_numel);
    // The fp32 gradients' buffer never longer than the part (the default sub_group_size is 1e9).
    fp32_grads_ = Fp32Grads(std::max<int64_t>(1, std::min(sub_group_size_, part_numel)));
    if (!with_values_) return nullptr;
    return [s = swapper_.get()](int64_t off, const at::Tensor& v) { s->write(0, off, v); };
  }
  bool holds_optimizer_states() const override {
    return swapper_->names().size() > (with_values_ ? 1 : 0);
  }
  bool steps_on_host() const override { return copies_ != nullptr; }
  bool can_fail_midway() const override { return true; }
  bool takes_final_pieces() const override { return copies_ && copies_->takes_pieces(); }
  void gradient_piece_final(int64_t pos, const at::Tensor& grads) override {
    copies_->piece_final(pos, grads);
  }
  void gradients_final(const std::vector<zero::Part>& parts) override {
    if (copies_) copies_->gradients_final(parts);
  }
  void drain() override {
    if (copies_) copies_->drain();
  }

  void step(optim::Optimizer& optimizer, const std::vector<zero::Part>& parts,
            optim::StepContext ctx) override {
    // A sub-group may span parts (stage 3's units); each overlap is one optimizer call, and when
    // the values are swapped its updated values are cast into the parameters (or handed to the
    // parameters' swap file) at once; for a model on a device its gradients came down first and
    // its parameters go up.
    if (copies_) copies_->gradients_final(parts);
    const size_t first_state = with_values_ ? 1 : 0;
    // A gradient shard on disk (NOTE [gradients on disk]) is read sub-group by sub-group, the
    // next one while this one steps (every part's, when one has it: the engine checks).
    grads_on_disk_ = parts.empty() ? nullptr : parts.front().grads_on_disk;
    const int64_t numel = swapper_->numel();
    auto sub_group_at = [&](int64_t begin) { return std::min(sub_group_size_, numel - begin); };
    if (grads_on_disk_ && numel > 0) grads_on_disk_->read_ahead(0, sub_group_at(0));
    try {
      swapper_->for_each_sub_group(
          [&](int64_t begin, int64_t length, const std::vector<at::Tensor>& t) {
            const int64_t k = copies_ ? begin / copies_->sub_group_size() : 0;
            if (copies_) copies_->begin_sub_group(k);
            at::Tensor disk_grads;  // [length] training dtype
            if (grads_on_disk_) {
              disk_grads = grads_on_disk_->read(begin, length);
              if (begin + length < numel)
                grads_on_disk_->read_ahead(begin + length, sub_group_at(begin + length));
            }
            for (const auto& part : parts) {
              const int64_t lo = std::max(begin, part.offset);
              const int64_t hi = std::min(begin + length, part.offset + part.numel());
              if (lo >= hi) continue;
              at::Tensor w = with_values_ ? t[0].narrow(0, lo - begin, hi - lo)
                                          : part.params.narrow(0, lo - part.offset, hi - lo);
              ctx.state.clear();
              for (size_t i = first_state; i < t.size(); ++i)
                ctx.state.push_back(t[i].narrow(0, lo - begin, hi - lo));
              if (ctx.state.empty()) ctx.offset = lo;  // a stateless optimizer (SGD, no momentum)
              const at::Tensor g = copies_ ? copies_->grads(lo, hi - lo)
                                   : part.grads.defined()
                                       ? part.grads.narrow(0, lo - part.offset, hi - lo)
                                       : disk_grads.narrow(0, lo - begin, hi - lo);
              optimizer.step(w, fp32_grads_(g), ctx);
              if (copies_ && !part.sink) {
                // The swap buffer is written back and reused: the parameters go up from a copy.
                at::Tensor up = copies_->up_buffer(k, lo, hi - lo);
                up.copy_(w);
                copies_->send_up(k, part.params.narrow(0, lo - part.offset, hi - lo), up);
              } else if (with_values_) {
                part.store(lo - part.offset, w);
              }
            }
          });
      if (copies_) copies_->finish_step();
    } catch (...) {
      if (copies_) copies_->drain();  // nothing may still be copying from or into a buffer
      throw;
    }
  }
  void publish(const std::vector<zero::Part>& parts) override {
    // The parameters are cast from the swap file's values 16 MiB at a time (otherwise they are
    // the values already).
    if (with_values_) {
      constexpr int64_t kPiece = int64_t{1} << 22;
      at::Tensor buffer = at::empty({kPiece}, at::kFloat);
      for (const auto& p : parts) {
        for (int64_t off = 0; off < p.numel(); off += kPiece) {
          const int64_t n = std::min(kPiece, p.numel() - off);
          at::Tensor b = buffer.narrow(0, 0, n);
          swapper_->read(0, p.offset + off, b);
          p.store(off, b);
        }
      }
    }
    swapper_->flush();
  }

  bool on_disk(const std::string& what) const override { return index(what) >= 0; }
  at::Tensor values(const std::vector<zero::Part>& parts, int64_t offset,
                    int64_t n) const override {
    DSCPP_CHECK(!with_values_, Error, "internal: the fp32 values are in the swap file");
    return values_in_parameters(parts, offset, n);
  }
  void read(const std::string& what, int64_t offset, const at::Tensor& dst) override {
    swapper_->read(checked_index(what), offset, dst);
  }
  void write(const std::string& what, int64_t offset, const at::Tensor& src) override {
    swapper_->write(checked_index(what), offset, src);
  }
  void flush() override { swapper_->flush(); }

  int64_t buffer_bytes() const override {
    return swapper_->buffer_bytes() + (copies_ ? copies_->buffer_bytes() : 0);
  }
  std::string take_report() override {
    const offload::SwapStats s = swapper_->take_stats();
    return fmt::format(
        "offloaded optimizer {:.1f} ms: read {:.1f} MiB, wrote {:.1f} MiB, waited for the "
        "disk {:.1f} ms, stepped {:.1f} ms{}{}",
        s.total_seconds * 1e3, s.bytes_read / double(1 << 20), s.bytes_written / double(1 << 20),
        s.wait_seconds * 1e3, s.step_seconds * 1e3,
        copies_ ? "; " + copies_->take_report() : std::string(),
        grads_on_disk_ ? "; " + grads_on_disk_->take_report() : std::string());
  }

 private:
  // The swap file's tensor holding `what`; -1 when it is not there (the values in fp32).
  int index(const std::string& what) const {
    if (what == kValues) return with_values_ ? 0 : -1;
    const auto& names = swapper_->names();
    const auto it = std::find(names.begin() + (with_values_ ? 1 : 0), names.end(), what);
    return it == names.end() ? -1 : static_cast<int>(it - names.begin());
  }
  int checked_index(const std::string& what) const {
    const int t = index(what);
    DSCPP_CHECK(t >= 0, Error, "internal: '", what, "' is not in the optimizer's swap file");
    return t;
  }

  SwapperFactory make_swapper_;
  bool with_values_;
  int64_t sub_group_size_;
  std::unique_ptr<DeviceCopies> copies_;  // a model on a device
  std::unique_ptr<offload::OptimizerSwapper> swapper_;
  Fp32Grads fp32_grads_;
  zero::GradShard* grads_on_disk_ = nullptr;  // the parts' of the last step, if on disk
};

// NOTE [host step]: offload_optimizer cpu of a model on a device (ZeRO-Offload). This rank's fp32
// values and the optimizer's states live in host memory (the optimizer is built on the CPU), so
// the device holds only the parameters and gradients in the training dtype. The part is stepped
// in sub-groups of sub_group_size elements; the copies are DeviceCopies' (device_copies.h):
//   backward          each piece of the averaged gradient is copied down into one host buffer
//                     of the part (training dtype) the moment its reduction is retired in the
//                     boundary's backward (gradient_piece_final, NOTE [final pieces] in
//                     src/zero/reducer.h), so the copies run beside the rest of backward; what
//                     no reduction handed over (padding, a flush) goes at gradients_final
//   step, for each k  wait for k's gradients; the CPU optimizer steps k's values and states (bf16
//                     Adam: bf16 gradients in, bf16 parameters out in the same pass); k's updated
//                     parameters, cast to the training dtype into one of buffer_count host
//                     buffers (fp32: straight from the values), are copied up at once, while
//                     k + 1 steps
//   end               wait for every copy up: the device trains on the new parameters next
// The arithmetic per element is the in-memory step's, so training is the same bit for bit. The
// gradient buffer and the values are page-locked with pin_memory (copies then overlap the step;
// pageable memory is copied synchronously by CUDA), the buffers the parameters go up from always.
// The swap file (SwapStore) steps a model on a device the same way, its sub-groups read from
// disk instead of host memory.
class HostStore final : public PartStore {
 public:
  explicit HostStore(const PartStoreOptions& o)
      : link_(*o.link),
        dtype_(o.dtype),
        pin_(o.pin_memory),
        copies_(*o.link, o.dtype, o.sub_group_size, o.pin_memory, o.buffer_count,
                /*staged=*/o.dtype != at::kFloat),
        fp32_grads_(std::max<int64_t>(1, o.sub_group_size)) {}

  zero::PartTap open(int64_t part_numel) override {
    values_ = link_.host_empty(part_numel, at::kFloat, pin_ && dtype_ == at::kFloat);
    values_.zero_();  // elements no parameter covers (padding) stay zero
    copies_.open(part_numel);
    fp32_grads_ = Fp32Grads(std::max<int64_t>(1, std::min(copies_.sub_group_size(), part_numel)));
    return [this](int64_t off, const at::Tensor& v) {
      at::NoGradGuard no_grad;
      values_.narrow(0, off, v.numel()).copy_(v.reshape({-1}));
    };
  }
  bool steps_on_host() const override { return true; }
  bool can_fail_midway() const override { return true; }
  bool takes_final_pieces() const override { return copies_.takes_pieces(); }
  void gradient_piece_final(int64_t pos, const at::Tensor& grads) override {
    copies_.piece_final(pos, grads);
  }
  void gradients_final(const std::vector<zero::Part>& parts) override {
    copies_.gradients_final(parts);
  }

  void step(optim::Optimizer& optimizer, const std::vector<zero::Part>& parts,
            optim::StepContext ctx) override {
    const auto t0 = Clock::now();
    copies_.gradients_final(parts);  // only what is not on its way yet
    // bf16 gradients in, bf16 parameters out, when the optimizer can and no part has a sink.
    bool fused = dtype_ == at::kBFloat16 && optimizer.fuses_bf16();
    for (const auto& part : parts) fused = fused && part.sink == nullptr;
    DSCPP_CHECK(optimizer.supports_pieces(), Error, "internal: ", optimizer.name(),
                " needs whole parameters and cannot step sub-group by sub-group (check_supported "
                "refuses it at stages 1-3)");
    try {
      int64_t k_prev = -1;
      auto step_piece = [&](int64_t k, const zero::Part& part, int64_t lo, int64_t n) {
        if (k != k_prev) copies_.begin_sub_group(k);
        k_prev = k;
        const auto ts = Clock::now();
        at::Tensor w = values_.narrow(0, lo, n);
        at::Tensor g = copies_.grads(lo, n);
        if (n < values_.numel()) ctx.offset = lo;
        at::Tensor up = w;  // what goes up to the device: training dtype, host
        if (dtype_ == at::kFloat) {
          optimizer.step(w, g, ctx);
        } else {
          up = copies_.up_buffer(k, lo, n);
          if (fused) {
            ctx.bf16_params = up;
            optimizer.step(w, g, ctx);
          } else {
            optimizer.step(w, fp32_grads_(g), ctx);
            if (part.sink == nullptr) up.copy_(w);
          }
        }
        step_seconds_ += seconds_since(ts);
        if (part.sink) return part.store(lo - part.offset, w);
        copies_.send_up(k, part.params.narrow(0, lo - part.offset, n), up);
      };
      for_each_piece(parts, copies_.sub_group_size(), values_.numel(), step_piece);
      copies_.finish_step();
    } catch (...) {
      copies_.drain();  // nothing may still be copying from or into a buffer
      throw;
    }
    total_seconds_ += seconds_since(t0);
  }

  void publish(const std::vector<zero::Part>& parts) override {
    try {
      int64_t k_prev = -1;
      auto publish_piece = [&](int64_t k, const zero::Part& part, int64_t lo, int64_t n) {
        at::Tensor w = values_.narrow(0, lo, n);
        if (part.sink) return part.store(lo - part.offset, w);
        at::Tensor up = w;
        if (dtype_ != at::kFloat) {
          if (k != k_prev) copies_.begin_sub_group(k);
          k_prev = k;
          up = copies_.up_buffer(k, lo, n);
          up.copy_(w);
        }
        copies_.send_up(k, part.params.narrow(0, lo - part.offset, n), up);
      };
      for_each_piece(parts, copies_.sub_group_size(), values_.numel(), publish_piece);
      copies_.finish_step();
    } catch (...) {
      copies_.drain();
      throw;
    }
  }
  void drain() override { copies_.drain(); }

  at::Tensor values(const std::vector<zero::Part>&, int64_t offset, int64_t n) const override {
    return values_.narrow(0, offset, n);
  }
  int64_t bytes() const override {
    return values_.defined() ? static_cast<int64_t>(values_.nbytes()) : 0;
  }
  int64_t buffer_bytes() const override { return copies_.buffer_bytes(); }
  std::string take_report() override {
    const std::string out =
        fmt::format("offloaded optimizer {:.1f} ms: {}, stepped {:.1f} ms", total_seconds_ * 1e3,
                    copies_.take_report(), step_seconds_ * 1e3);
    total_seconds_ = step_seconds_ = 0;
    return out;
  }

 private:
  using Clock = std::chrono::steady_clock;
  static double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  }

  offload::DeviceLink& link_;
  at::ScalarType dtype_;
  bool pin_;
  DeviceCopies copies_;
  at::Tensor values_;  // [part_numel] fp32, host (pinned in fp32 with pin_memory: it goes up)
  Fp32Grads fp32_grads_;
  double total_seconds_ = 0, step_seconds_ = 0;
};
}  // namespace

void PartStore::read(const std::string& what, int64_t, const at::Tensor&) {
  DSCPP_FAIL(Error, "internal: '", what, "' is in memory, not on disk");
}

void PartStore::write(const std::string& what, int64_t, const at::Tensor&) {
  DSCPP_FAIL(Error, "internal: '", what, "' is in memory, not on disk");
}

std::unique_ptr<PartStore> make_part_store(const PartStoreOptions& options) {
  DSCPP_CHECK(
      options.bf16_states.empty() || (options.bf16_master && !options.nvme && !options.link), Error,
      "internal: bf16 optimizer states outside the bf16 parameters' store");
  if (options.nvme) return std::make_unique<SwapStore>(options);
  if (options.link) return std::make_unique<HostStore>(options);
  if (options.dtype != at::kFloat && !options.bf16_master)
    return std::make_unique<MasterStore>(options.dtype, options.device);
  return std::make_unique<ParamsStore>(/*widen=*/options.bf16_master, options.bf16_states,
                                       options.device);
}

}  // namespace dscpp::precision
