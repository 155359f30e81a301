// The three PartStores (part_store.h): in the parameters, master weights, swap file.
#include "precision/part_store.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>

#include "dscpp/error.h"
#include "offload/optimizer_swapper.h"

namespace dscpp::precision {
namespace {

// Elements per piece of the mixed-precision optimizer step (16 MiB of fp32 gradient).
constexpr int64_t kStepPiece = int64_t{1} << 22;

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

// fp32 training: the optimizer updates the parameters in place.
class ParamsStore final : public PartStore {
 public:
  zero::PartTap open(int64_t part_numel) override {
    part_numel_ = part_numel;
    return nullptr;
  }
  void step(optim::Optimizer& optimizer, const std::vector<zero::Part>& parts,
            optim::StepContext ctx) override {
    step_in_memory(
        optimizer, parts, [](const zero::Part& p) { return p.params; }, part_numel_,
        /*pieces=*/false, /*fused=*/false, fp32_grads_, std::move(ctx));
  }
  void publish(const std::vector<zero::Part>&) override {}
  at::Tensor values(const std::vector<zero::Part>& parts, int64_t offset,
                    int64_t n) const override {
    return values_in_parameters(parts, offset, n);
  }

 private:
  int64_t part_numel_ = 0;
  Fp32Grads fp32_grads_{kStepPiece};
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
    for (const auto& part : parts) fused = fused && part.sink == nullptr;
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
        with_values_(o.dtype != at::kFloat || o.params_on_disk),
        fp32_grads_(o.sub_group_size) {}
  zero::PartTap open(int64_t part_numel) override {
    swapper_ = make_swapper_(part_numel, with_values_);
    if (!with_values_) return nullptr;
    return [s = swapper_.get()](int64_t off, const at::Tensor& v) { s->write(0, off, v); };
  }
  bool holds_optimizer_states() const override {
    return swapper_->names().size() > (with_values_ ? 1 : 0);
  }
  bool uses_disk() const override { return true; }

  void step(optim::Optimizer& optimizer, const std::vector<zero::Part>& parts,
            optim::StepContext ctx) override {
    // A sub-group may span parts (stage 3's units); each overlap is one optimizer call, and when
    // the values are swapped its updated values are cast into the parameters (or handed to the
    // parameters' swap file) at once.
    const size_t first_state = with_values_ ? 1 : 0;
    swapper_->for_each_sub_group(
        [&](int64_t begin, int64_t length, const std::vector<at::Tensor>& t) {
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
            optimizer.step(w, fp32_grads_(part.grads.narrow(0, lo - part.offset, hi - lo)), ctx);
            if (with_values_) part.store(lo - part.offset, w);
          }
        });
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

  int64_t buffer_bytes() const override { return swapper_->buffer_bytes(); }
  std::string take_report() override {
    const offload::SwapStats s = swapper_->take_stats();
    return fmt::format(
        "offloaded optimizer {:.1f} ms: read {:.1f} MiB, wrote {:.1f} MiB, waited for the "
        "disk {:.1f} ms, stepped {:.1f} ms",
        s.total_seconds * 1e3, s.bytes_read / double(1 << 20), s.bytes_written / double(1 << 20),
        s.wait_seconds * 1e3, s.step_seconds * 1e3);
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
  std::unique_ptr<offload::OptimizerSwapper> swapper_;
  Fp32Grads fp32_grads_;
};

}  // namespace

void PartStore::read(const std::string& what, int64_t, const at::Tensor&) {
  DSCPP_FAIL(Error, "internal: '", what, "' is in memory, not on disk");
}

void PartStore::write(const std::string& what, int64_t, const at::Tensor&) {
  DSCPP_FAIL(Error, "internal: '", what, "' is in memory, not on disk");
}

std::unique_ptr<PartStore> make_part_store(const PartStoreOptions& options) {
  if (options.nvme) return std::make_unique<SwapStore>(options);
  if (options.dtype != at::kFloat)
    return std::make_unique<MasterStore>(options.dtype, options.device);
  return std::make_unique<ParamsStore>();
}

}  // namespace dscpp::precision
