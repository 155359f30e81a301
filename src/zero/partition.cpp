// Implements the flat partition (NOTE [flat partition] in partition.h).
#include "zero/partition.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <unordered_set>

#include "dscpp/error.h"
#include "util/memory.h"
#include "zero/strategy.h"

namespace dscpp::zero {

FlatLayout FlatLayout::of(const std::vector<at::Tensor>& params, int world) {
  FlatLayout l;
  for (const auto& p : params) {
    l.segments.emplace_back(l.numel, p.numel());
    l.numel += p.numel();
  }
  l.padded = (l.numel + world - 1) / world * world;
  l.shard = l.padded / world;
  return l;
}

CheckpointGroup checkpoint_group(std::string name, const NamedParams& np, const FlatLayout& layout,
                                 int64_t begin, int64_t length, int64_t part_offset) {
  CheckpointGroup g;
  g.name = std::move(name);
  g.names = np.names;
  for (const auto& p : np.params) g.shapes.push_back(p.sizes().vec());
  g.layout = layout;
  g.begin = begin;
  g.length = length;
  g.part_offset = part_offset;
  return g;
}

NamedParams trainable_parameters(torch::nn::Module& model) {
  NamedParams out;
  std::unordered_set<const void*> seen;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    out.params.push_back(item.value());
    out.names.push_back(item.key());
  }
  return out;
}

void check_fp32_on_one_device(const std::vector<at::Tensor>& params,
                              const std::vector<std::string>& names) {
  DSCPP_CHECK(!params.empty(), ConfigError,
              "the model has no trainable parameters (requires_grad). HINT: nothing to train");
  const auto device = params[0].device();
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    DSCPP_CHECK(p.scalar_type() == at::kFloat, ConfigError, "parameter '", names[i], "' is ",
                p.scalar_type(),
                "; dscpp keeps the model in fp32 and casts for mixed precision itself. HINT: "
                "build the model in fp32 and enable bf16/fp16 in the config");
    DSCPP_CHECK(p.device() == device, ConfigError, "parameter '", names[i], "' is on ", p.device(),
                " but '", names[0], "' is on ", device,
                ". HINT: move the whole model to one device before initialize()");
  }
}

at::Tensor flatten_parameters(const std::vector<at::Tensor>& params,
                              const std::vector<std::string>& names, const FlatLayout& layout,
                              at::ScalarType dtype, const FlattenTap& tap) {
  check_fp32_on_one_device(params, names);
  auto opts = params[0].options().dtype(dtype).requires_grad(false);
  // Untouched pages of `empty` are not resident, so filling parameter by parameter while each
  // original is freed (set_data) keeps one copy of the model at a time.
  at::Tensor flat = at::empty({layout.padded}, opts);
  flat.narrow(0, layout.numel, layout.padded - layout.numel).zero_();
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    auto [off, n] = layout.segments[i];
    at::Tensor values = params[i].reshape({-1});
    if (tap) tap(off, values);
    flat.narrow(0, off, n).copy_(values);
    at::Tensor p = params[i];
    p.set_data(flat.narrow(0, off, n).view(params[i].sizes()));
  }
  return_freed_memory();  // the originals, wherever the model's allocations put them
  return flat;
}

}  // namespace dscpp::zero
