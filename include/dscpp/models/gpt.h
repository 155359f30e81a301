// The built-in GPT: the GPT-2 architecture exactly (pre-LayerNorm blocks, fused q/k/v
// projection, exact erf GELU, tied token embedding and output projection, no dropout), as a
// torch::nn::Module whose named_parameters() are the module paths of Hugging Face's / nanoGPT's
// GPT-2 ("wte.weight", "h.0.attn.c_attn.weight", ..., "ln_f.bias"), so weights move to and from
// PyTorch through safetensors unchanged. tests/golden/gpt_reference.py is its PyTorch twin.
// Note Linear weights are stored [out, in] as torch.nn.Linear (not GPT-2's Conv1D [in, out]).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <map>
#include <string>

#include "dscpp/zero.h"

namespace dscpp::models {

struct GPTConfig {
  // Number of token ids; inputs and targets must lie in [0, vocab_size). > 0.
  int64_t vocab_size = 50257;
  // Longest sequence (rows of the position embedding). > 0.
  int64_t block_size = 1024;
  // Transformer blocks. > 0.
  int64_t n_layer = 12;
  // Attention heads; must divide n_embd. > 0.
  int64_t n_head = 12;
  // Width of the residual stream (C). > 0.
  int64_t n_embd = 768;

  // GPT-2 small (124M): the defaults above.
  static GPTConfig gpt2_small() { return {}; }
  // Throws ConfigError naming the field when a value is out of range or n_embd % n_head != 0.
  void validate() const;
  // Parameters of the model, counted from the config (the tied wte is counted once):
  // V*C + T*C + L*(12*C*C + 13*C) + 2*C. GPT-2 small: 124,439,808.
  int64_t num_parameters() const;
  // Parameters of one block, 12*C*C + 13*C: the unit ZeRO stage 3 gathers whole.
  int64_t block_parameters() const;
  // NOTE [GPT activations]: the most bytes a rank's forward and backward hold for activations
  // at micro-batch `micro` of block_size tokens in `dtype` (the training dtype) on `device`, with
  // or without activation checkpointing: what the memory estimate counts (src/engine/estimate.h).
  int64_t activation_bytes(int64_t micro, c10::ScalarType dtype, bool checkpointing,
                           c10::DeviceType device = c10::DeviceType::CPU) const;
  // "n_layer=2 n_head=4 n_embd=128 vocab_size=12 block_size=16"
  std::string to_string() const;
  // As safetensors metadata ({"n_layer": "2", ...}) and back; from_metadata throws ConfigError
  // for a missing or malformed key.
  std::map<std::string, std::string> to_metadata() const;
  static GPTConfig from_metadata(const std::map<std::string, std::string>& metadata);
};

// Causal self-attention: c_attn (C -> 3C, split into q, k, v in that order), n_head heads,
// softmax(q k^T / sqrt(C / n_head)) with future positions masked, c_proj (C -> C).
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  CausalSelfAttentionImpl(int64_t n_embd, int64_t n_head);
  at::Tensor forward(const at::Tensor& x);  // [B, T, C] -> [B, T, C]

  torch::nn::Linear c_attn{nullptr};  // weight [3C, C], bias [3C]
  torch::nn::Linear c_proj{nullptr};  // weight [C, C], bias [C]

 private:
  int64_t n_embd_;
  int64_t n_head_;
};
TORCH_MODULE(CausalSelfAttention);

// c_fc (C -> 4C), exact GELU, c_proj (4C -> C).
class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(int64_t n_embd);
  at::Tensor forward(const at::Tensor& x);  // [B, T, C] -> [B, T, C]

  torch::nn::Linear c_fc{nullptr};    // weight [4C, C], bias [4C]
  torch::nn::Linear c_proj{nullptr};  // weight [C, 4C], bias [C]
};
TORCH_MODULE(MLP);

// x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)).
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(int64_t n_embd, int64_t n_head);
  at::Tensor forward(const at::Tensor& x);  // [B, T, C] -> [B, T, C]

  torch::nn::LayerNorm ln_1{nullptr};  // eps 1e-5
  CausalSelfAttention attn{nullptr};
  torch::nn::LayerNorm ln_2{nullptr};
  MLP mlp{nullptr};
};
TORCH_MODULE(Block);

class GPTImpl : public torch::nn::Module {
 public:
  // Builds the model on the CPU in fp32 and initialises it as init_weights(seed) does, module by
  // module as each is built: inside a dscpp::zero::Init scope each unit (GPTImpl::zero_units())
  // is sharded as soon as it exists, so the whole model never does. Throws ConfigError when
  // config.validate() does. The process's global random generator is left exactly as it was (see
  // init_weights), so building a model does not change what the caller's own torch::randn calls
  // return.
  explicit GPTImpl(const GPTConfig& config, uint64_t seed = 0);

  // GPT-2 initialisation from `seed`, deterministic and independent of the global generator:
  // every Linear and Embedding weight ~ N(0, 0.02), except each c_proj weight ~ N(0,
  // 0.02 / sqrt(2 * n_layer)); biases 0; LayerNorm weight 1, bias 0. Draws come from a private
  // CPU generator seeded with `seed`, in named_parameters() order, then are copied to the
  // parameters' device and dtype: the same seed gives the same weights on every device.
  void init_weights(uint64_t seed);

  // idx [B, T] int64 token ids -> logits [B, T, V] fp32 (computed in the parameters' dtype,
  // returned as fp32). Throws ConfigError when T > block_size or an id is outside
  // [0, vocab_size) (checked on the input: one reduction per call).
  at::Tensor forward(const at::Tensor& idx);

  // Mean cross-entropy over all B*T target tokens, a 0-d fp32 tensor. targets [B, T] int64,
  // each in [0, vocab_size) (ConfigError otherwise).
  at::Tensor loss(const at::Tensor& idx, const at::Tensor& targets);

  // The same loss from logits already computed: logits [B, T, V], targets [B, T].
  static at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& targets);

  const GPTConfig& config() const { return config_; }

  // ZeRO stage-3 units: the token embedding (used twice: by the embedding and by the tied output
  // projection) and each block. forward() runs them through dscpp::zero::call, a plain call
  // below stage 3.
  static zero::UnitPolicy zero_units() { return zero::UnitPolicy{{"wte", "h.*"}}; }
  // Recompute each block in backward instead of keeping its activations (dscpp::zero::checkpoint;
  // DeepSpeed's activation checkpointing). Off by default.
  void set_activation_checkpointing(bool on) { checkpoint_blocks_ = on; }

  torch::nn::Embedding wte{nullptr};  // [V, C], also the output projection (tied)
  torch::nn::Embedding wpe{nullptr};  // [block_size, C]
  torch::nn::ModuleList h{nullptr};   // n_layer Blocks, "h.0" ... "h.{L-1}"
  torch::nn::LayerNorm ln_f{nullptr};

 private:
  // Initialises `module`'s parameters (named prefix + their local names) from `gen`.
  void init_module(torch::nn::Module& module, const std::string& prefix, at::Generator& gen);

  GPTConfig config_;
  bool checkpoint_blocks_ = false;
};
TORCH_MODULE(GPT);

}  // namespace dscpp::models
