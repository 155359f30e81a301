// GPT-2 forward pass, loss and initialisation. Every operation here has a line-for-line twin in
// tests/golden/gpt_reference.py; the Golden tests hold the two to 1e-5 (logits, loss, gradients),
// so a change to one must be made to the other.
#include "dscpp/models/gpt.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/record_function.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/functional/loss.h>

#include <cmath>
#include <limits>
#include <mutex>

#include "dscpp/error.h"
#include "dscpp/zero.h"
#include "models/fused_ops.h"
#include "util/fault_inject.h"

namespace dscpp::models {
namespace {

constexpr double kInitStd = 0.02;
constexpr double kLayerNormEps = 1e-5;

torch::nn::LayerNorm make_layer_norm(int64_t n) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({n}).eps(kLayerNormEps));
}

// Restores the global CPU generator on destruction. libtorch's module constructors draw their
// default initialisation from it; GPT overwrites those values with its own seeded draws, and this
// guard makes the construction invisible to the caller's random stream.
class GlobalGeneratorGuard {
 public:
  GlobalGeneratorGuard() : gen_(at::detail::getDefaultCPUGenerator()) {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    state_ = gen_.get_state();
  }
  ~GlobalGeneratorGuard() {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    gen_.set_state(state_);
  }

 private:
  at::Generator gen_;
  at::Tensor state_;
};

// NOTE [GPT kernels]: where libtorch's CPU kernels in bf16 cost a multiple of the same math in
// another form, the GPT uses that form, with the same values in fp32 (the Golden tests hold it
// to the plain PyTorch twin). Measured on the benchmark GPT (docs/benchmarks.md, issue 15):
// - layer norm: libtorch 1.13's bf16 layer norm on the CPU is not vectorized, 3.4 ms per
//   [4, 256, 384] call, 10% of a bf16 step; normalising in fp32 and rounding the result once
//   (what torch.autocast does on a CPU) takes a sixth of that, and is more accurate;
// - the causal mask: added (0 or -inf) instead of masked_fill_, see CausalSelfAttention.
// Where the fused bf16 kernels run (NOTE [GPT fused kernels] in fused_ops.h), they replace both.
at::Tensor layer_norm(torch::nn::LayerNormImpl& ln, const at::Tensor& x) {
  if (use_fused_kernels(x) && use_fused_kernels(ln.weight) && use_fused_kernels(ln.bias)) {
    return fused_layer_norm(x, ln.weight, ln.bias, ln.options.eps());
  }
  const auto dtype = x.scalar_type();
  if (dtype == at::kFloat || dtype == at::kDouble || !x.is_cpu()) return ln.forward(x);
  return at::layer_norm(x.to(at::kFloat), ln.options.normalized_shape(), ln.weight.to(at::kFloat),
                        ln.bias.to(at::kFloat), ln.options.eps())
      .to(dtype);
}

// x @ weight^T + bias through at::linear, as PyTorch's F.linear: for [B, T, C] input it adds the
// bias inside the matmul (addmm), where libtorch's C++ torch::nn::Linear::forward (its own
// functional::linear) runs the matmul and then a pass of its own for the bias, 5% of a bf16 step
// of the benchmark GPT.
at::Tensor linear(const torch::nn::LinearImpl& l, const at::Tensor& x) {
  return at::linear(x, l.weight, l.bias);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

int64_t parse_int(const std::map<std::string, std::string>& m, const std::string& key) {
  auto it = m.find(key);
  DSCPP_CHECK(it != m.end(), ConfigError, "GPT metadata has no \"", key,
              "\". HINT: the weights were not saved by dscpp's GPT; pass the config explicitly.");
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(it->second, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  DSCPP_CHECK(used > 0 && used == it->second.size(), ConfigError, "GPT metadata \"", key, "\" = \"",
              it->second, "\" is not an integer");
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
void GPTConfig::validate() const {
  DSCPP_CHECK(vocab_size > 0, ConfigError, "GPT vocab_size must be > 0, got ", vocab_size);
  DSCPP_CHECK(block_size > 0, ConfigError, "GPT block_size must be > 0, got ", block_size);
  DSCPP_CHECK(n_layer > 0, ConfigError, "GPT n_layer must be > 0, got ", n_layer);
  DSCPP_CHECK(n_head > 0, ConfigError, "GPT n_head must be > 0, got ", n_head);
  DSCPP_CHECK(n_embd > 0, ConfigError, "GPT n_embd must be > 0, got ", n_embd);
  DSCPP_CHECK(n_embd % n_head == 0, ConfigError, "GPT n_embd (", n_embd,
              ") is not divisible by n_head (", n_head,
              "). HINT: n_embd must be n_head times the head size, e.g. n_embd=",
              (n_embd / n_head + 1) * n_head, " for ", n_head, " heads.");
}

int64_t GPTConfig::num_parameters() const {
  const int64_t c = n_embd;
  return vocab_size * c + block_size * c + n_layer * block_parameters() + 2 * c;
}

int64_t GPTConfig::block_parameters() const { return 12 * n_embd * n_embd + 13 * n_embd; }

int64_t GPTConfig::activation_bytes(int64_t micro, c10::ScalarType dtype, bool checkpointing,
                                    c10::DeviceType device) const {
  // NOTE [GPT activations]: per token, a block's ops keep for backward ln_1's input and output
  // (2 C), q, k and v (3 C), the attention's output and its contiguous copy (2 C), ln_2's input
  // and output (2 C), the MLP's hidden state before and after GELU (8 C): 17 C, and with the
  // math attention the [nh, T] scores' softmax per token too. Measured (peak RSS over
  // micro-batches 1, 2 and 4, the benchmark GPT and the 150M GPT, fp32 and bf16, 2026-12-05,
  // docs/offload.md) a block costs 17-22 C per token with the allocator's slack: 20 C is
  // counted, and two blocks more for backward's gradients in flight. With checkpointing a block
  // keeps its input (C) and backward recomputes one block at a time: three blocks' worth
  // measured. The head: the logits in the training dtype and fp32, log-softmax and their
  // gradients, 16 bytes per logit; the final LayerNorm's input and output.
  const int64_t b = static_cast<int64_t>(c10::elementSize(dtype));
  const int64_t tokens = micro * block_size;
  const int64_t scores =
      active_gpt_attention(device, dtype) == GptAttention::kMath ? n_head * block_size : 0;
  const int64_t block = 20 * n_embd + scores;  // elements per token
  const int64_t blocks = checkpointing ? n_layer * n_embd + 3 * block : (n_layer + 2) * block;
  return tokens * (blocks * b + 16 * vocab_size + 8 * n_embd);
}

std::string GPTConfig::to_string() const {
  return detail::str_cat("n_layer=", n_layer, " n_head=", n_head, " n_embd=", n_embd,
                         " vocab_size=", vocab_size, " block_size=", block_size);
}

std::map<std::string, std::string> GPTConfig::to_metadata() const {
  return {{"vocab_size", std::to_string(vocab_size)},
          {"block_size", std::to_string(block_size)},
          {"n_layer", std::to_string(n_layer)},
          {"n_head", std::to_string(n_head)},
          {"n_embd", std::to_string(n_embd)}};
}

GPTConfig GPTConfig::from_metadata(const std::map<std::string, std::string>& metadata) {
  GPTConfig c;
  c.vocab_size = parse_int(metadata, "vocab_size");
  c.block_size = parse_int(metadata, "block_size");
  c.n_layer = parse_int(metadata, "n_layer");
  c.n_head = parse_int(metadata, "n_head");
  c.n_embd = parse_int(metadata, "n_embd");
  c.validate();
  return c;
}

// ---------------------------------------------------------------------------------------------
CausalSelfAttentionImpl::CausalSelfAttentionImpl(int64_t n_embd, int64_t n_head)
    : n_embd_(n_embd), n_head_(n_head) {
  c_attn = register_module("c_attn", torch::nn::Linear(n_embd, 3 * n_embd));
  c_proj = register_module("c_proj", torch::nn::Linear(n_embd, n_embd));
}

at::Tensor CausalSelfAttentionImpl::forward(const at::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), c = n_embd_, hs = n_embd_ / n_head_;
  auto qkv = linear(*c_attn, x).split(c, /*dim=*/2);          // 3 x [B, T, C]
  auto q = qkv[0].view({b, t, n_head_, hs}).transpose(1, 2);  // [B, nh, T, hs]
  auto k = qkv[1].view({b, t, n_head_, hs}).transpose(1, 2);  // [B, nh, T, hs]
  auto v = qkv[2].view({b, t, n_head_, hs}).transpose(1, 2);  // [B, nh, T, hs]
  at::Tensor y;
  if (active_gpt_attention(q) == GptAttention::kSdpa) {  // NOTE [GPT attention] in fused_ops.h
    y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                         /*is_causal=*/true);  // [B, nh, T, hs]
  } else {
    // Scale and mask in place: the matmul's backward needs q and k, not its output, and the
    // backward of a scalar multiply or of adding a constant needs nothing, so autograd allows
    // it; the same values as PyTorch's `att * scale` and `masked_fill` (x + 0 is x, x + -inf is
    // -inf), without two [B, nh, T, T] copies. Adding the mask costs a quarter of masked_fill_
    // in bf16 and nothing in backward, where masked_fill_ is masked again (NOTE [GPT kernels]).
    auto att = at::matmul(q, k.transpose(-2, -1));
    const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
    if (use_fused_kernels(att)) {
      att = fused_causal_softmax(att, scale);  // the same, one pass each way
    } else {
      att.mul_(scale);
      // [T, T]: -inf above the diagonal (position i may not attend to j > i), 0 elsewhere.
      att.add_(at::full({t, t}, -std::numeric_limits<double>::infinity(), att.options()).triu(1));
      att = at::softmax(att, -1);  // [B, nh, T, T]
    }
    y = at::matmul(att, v);  // [B, nh, T, hs]
  }
  y = y.transpose(1, 2).contiguous().view({b, t, c});  // [B, T, C]
  return linear(*c_proj, y);
}

MLPImpl::MLPImpl(int64_t n_embd) {
  c_fc = register_module("c_fc", torch::nn::Linear(n_embd, 4 * n_embd));
  c_proj = register_module("c_proj", torch::nn::Linear(4 * n_embd, n_embd));
}

at::Tensor MLPImpl::forward(const at::Tensor& x) {
  const at::Tensor h = linear(*c_fc, x);
  return linear(*c_proj, use_fused_kernels(h) ? fused_gelu(h) : at::gelu(h, "none"));  // erf GELU
}

BlockImpl::BlockImpl(int64_t n_embd, int64_t n_head) {
  ln_1 = register_module("ln_1", make_layer_norm(n_embd));
  attn = register_module("attn", CausalSelfAttention(n_embd, n_head));
  ln_2 = register_module("ln_2", make_layer_norm(n_embd));
  mlp = register_module("mlp", MLP(n_embd));
}

at::Tensor BlockImpl::forward(const at::Tensor& x) {
  // Named scopes for the flops profiler (NOTE [flops profiler]); free when nothing profiles.
  at::Tensor y;
  {
    RECORD_USER_SCOPE("attn");
    y = x + attn->forward(layer_norm(*ln_1, x));
  }
  RECORD_USER_SCOPE("mlp");
  return y + mlp->forward(layer_norm(*ln_2, y));
}

// ---------------------------------------------------------------------------------------------
GPTImpl::GPTImpl(const GPTConfig& config, uint64_t seed) : config_(config) {
  config_.validate();
  // A bad DSCPP_GPT_KERNELS or DSCPP_GPT_ATTENTION is an error now, not at the first forward.
  active_gpt_kernels();
  active_gpt_attention(at::Tensor());
  // Each top-level module is initialised as soon as it is built, drawing from one generator in
  // named_parameters() order (so the values are init_weights(seed)'s), then handed to
  // zero::built: inside a zero::Init scope a unit is sharded before the next one exists.
  GlobalGeneratorGuard guard;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t c = config_.n_embd;
  wte = register_module("wte", torch::nn::Embedding(config_.vocab_size, c));
  init_module(*wte, "wte.", gen);
  zero::built(*wte, "wte");
  wpe = register_module("wpe", torch::nn::Embedding(config_.block_size, c));
  init_module(*wpe, "wpe.", gen);
  zero::built(*wpe, "wpe");
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < config_.n_layer; ++i) {
    Block block(c, config_.n_head);
    h->push_back(block);
    const std::string path = "h." + std::to_string(i);
    init_module(*block, path + ".", gen);
    zero::built(*block, path);
  }
  ln_f = register_module("ln_f", make_layer_norm(c));
  init_module(*ln_f, "ln_f.", gen);
  zero::built(*ln_f, "ln_f");
}

void GPTImpl::init_weights(uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  init_module(*this, "", gen);
}

void GPTImpl::init_module(torch::nn::Module& module, const std::string& prefix,
                          at::Generator& gen) {
  const double proj_std = kInitStd / std::sqrt(2.0 * static_cast<double>(config_.n_layer));
  at::NoGradGuard no_grad;
  for (auto& item : module.named_parameters(/*recurse=*/true)) {
    const std::string name = prefix + item.key();
    at::Tensor& p = item.value();
    const bool is_layer_norm = name.find("ln_") != std::string::npos;
    // In place: a temporary per parameter would be a model's worth of freed chunks, which raise
    // glibc's mmap threshold so that the parameters land on the heap, where the memory the
    // engine frees when it flattens them is not returned to the system.
    if (ends_with(name, ".bias")) {
      p.zero_();
    } else if (is_layer_norm) {
      p.fill_(1.0);
    } else {
      const double std = ends_with(name, "c_proj.weight") ? proj_std : kInitStd;
      p.normal_(0.0, std, gen);
    }
  }
}

at::Tensor GPTImpl::forward(const at::Tensor& idx) {
  DSCPP_CHECK(idx.dim() == 2, ConfigError, "GPT input must be [B, T] token ids, got shape ",
              idx.sizes());
  DSCPP_CHECK(idx.scalar_type() == at::kLong, ConfigError,
              "GPT input must be int64 token ids, got ", idx.scalar_type());
  const int64_t t = idx.size(1);
  DSCPP_CHECK(t <= config_.block_size, ConfigError, "GPT input has sequence length ", t,
              ", longer than block_size ", config_.block_size,
              ". HINT: build the model with a larger block_size or feed shorter sequences.");
  if (idx.numel() > 0) {
    const int64_t lo = idx.min().item<int64_t>(), hi = idx.max().item<int64_t>();
    DSCPP_CHECK(lo >= 0 && hi < config_.vocab_size, ConfigError, "GPT input has token ids in [", lo,
                ", ", hi, "], outside [0, vocab_size=", config_.vocab_size,
                "). HINT: the data's vocabulary is larger than the model's vocab_size.");
  }
  // Each unit runs through zero::call (a plain call below ZeRO stage 3): wte twice, as the
  // embedding and as the tied output projection, and each block.
  auto pos = at::arange(t, idx.options());  // [T]
  auto embed = zero::call(
      *wte, [this](const at::Tensor& i) { return wte->forward(i); }, idx);
  auto x = embed + wpe->forward(pos);  // [B, T, C]
  for (const auto& block : *h) {
    fault::point(fault::Phase::forward);
    // The holder is captured by value: zero::checkpoint keeps fn until backward.
    auto b = std::dynamic_pointer_cast<BlockImpl>(block);
    auto run = [b](const at::Tensor& y) { return b->forward(y); };
    x = checkpoint_blocks_ ? zero::checkpoint(*b, run, x) : zero::call(*b, run, x);
  }
  x = layer_norm(*ln_f, x);
  // Tied output projection: logits = x @ wte^T.
  auto logits = zero::call(
      *wte, [this](const at::Tensor& y) { return torch::nn::functional::linear(y, wte->weight); },
      x);  // [B, T, V]
  return logits.to(at::kFloat);
}

at::Tensor GPTImpl::cross_entropy(const at::Tensor& logits, const at::Tensor& targets) {
  const int64_t v = logits.size(-1);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, v}).to(at::kFloat),
                                              targets.reshape({-1}));
}

at::Tensor GPTImpl::loss(const at::Tensor& idx, const at::Tensor& targets) {
  DSCPP_CHECK(targets.sizes() == idx.sizes(), ConfigError, "GPT targets have shape ",
              targets.sizes(), " but inputs have shape ", idx.sizes());
  DSCPP_CHECK(targets.scalar_type() == at::kLong, ConfigError,
              "GPT targets must be int64 token ids, got ", targets.scalar_type());
  if (targets.numel() > 0) {
    const int64_t lo = targets.min().item<int64_t>(), hi = targets.max().item<int64_t>();
    DSCPP_CHECK(lo >= 0 && hi < config_.vocab_size, ConfigError, "GPT targets have token ids in [",
                lo, ", ", hi, "], outside [0, vocab_size=", config_.vocab_size, ")");
  }
  return cross_entropy(forward(idx), targets);
}

}  // namespace dscpp::models
