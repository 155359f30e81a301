// The flops profiler (NOTE [flops profiler] in flops_profiler.h): RecordFunction callbacks that
// count matmul-like FLOPs by phase and module scope, and the report.
#include "profiling/flops_profiler.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <unordered_map>

#include "dscpp/error.h"
#include "util/system_info.h"

namespace dscpp::profiling {
namespace {

std::atomic<FlopsProfiler*> g_active{nullptr};
// The profiled model's modules by address, for zero::call's scope names (filled while g_active
// is set; other rank threads of a test process may look names up meanwhile).
std::mutex g_names_mu;
std::unordered_map<const torch::nn::Module*, std::string> g_module_names;

std::unique_ptr<at::ObserverContext> start_callback(const at::RecordFunction& fn) {
  FlopsProfiler* p = g_active.load();
  return p ? p->on_start(fn) : nullptr;
}

void end_callback(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  FlopsProfiler* p = g_active.load();
  if (p && ctx) p->on_end(fn, ctx);
}

// What on_start hands on_end.
struct Context : at::ObserverContext {
  std::chrono::steady_clock::time_point start;
  std::string path;    // a module scope: its path
  int64_t flops = -1;  // a counted op: its FLOPs
};

std::vector<int64_t> sizes_of(c10::ArrayRef<const c10::IValue> in, size_t i) {
  if (i >= in.size() || !in[i].isTensor()) return {};
  return in[i].toTensor().sizes().vec();
}

int64_t product(const std::vector<int64_t>& v, size_t from = 0, size_t to = SIZE_MAX) {
  int64_t p = 1;
  for (size_t i = from; i < std::min(to, v.size()); ++i) p *= v[i];
  return p;
}

// 2 x multiply-adds of a [.., n, k] x [.., k, m] product with `batch` matrices.
int64_t matmul_flops(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  if (a.size() < 2 || b.size() < 2) return 0;
  const int64_t n = a[a.size() - 2], k = a.back(), m = b.back();
  return 2 * product(a, 0, a.size() - 2) * n * k * m;
}

// Convolution multiply-adds: batch x the spatial size of the side each weight element meets
// once (the output for a convolution, the input for a transposed one) x the weight's elements.
int64_t conv_macs(const std::vector<int64_t>& weight, const std::vector<int64_t>& side) {
  if (side.size() < 3) return 0;
  return side[0] * product(side, 2) * product(weight);
}

// A convolution's output spatial sizes from its input, weight, stride, padding and dilation.
std::vector<int64_t> conv_output(const std::vector<int64_t>& in, const std::vector<int64_t>& w,
                                 c10::ArrayRef<const c10::IValue> args) {
  std::vector<int64_t> out = {in[0], w[0]};
  const auto stride = args[3].toIntVector(), pad = args[4].toIntVector(),
             dil = args[5].toIntVector();
  for (size_t d = 2; d < in.size(); ++d) {
    const size_t j = d - 2;
    const int64_t s = stride.size() > j ? stride[j] : stride[0];
    const int64_t p = pad.size() > j ? pad[j] : pad[0];
    const int64_t dl = dil.size() > j ? dil[j] : dil[0];
    out.push_back((in[d] + 2 * p - dl * (w[d] - 1) - 1) / s + 1);
  }
  return out;
}

// scaled_dot_product_attention forward is counted at its public op (whatever kernel it picks
// runs inside it, uncounted); its backward at each fused kernel's backward op (a math fallback's
// backward is bmm's, counted as such). All take (grad_out, query, key, value, ...).
constexpr const char* kAttention = "aten::scaled_dot_product_attention";
constexpr const char* kAttentionBackward[] = {
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
    "aten::_scaled_dot_product_flash_attention_backward",
    "aten::_scaled_dot_product_efficient_attention_backward",
    "aten::_scaled_dot_product_cudnn_attention_backward"};

bool is_attention_backward(const std::string& name) {
  for (const char* op : kAttentionBackward)
    if (name == op) return true;
  return false;
}

// softmax(q k^T) v: two matmuls, [.., Tq, d] x [.., d, Tk] and [.., Tq, Tk] x [.., Tk, dv], the
// causal mask not discounted (as the scores' matmuls count it).
int64_t attention_flops(const std::vector<int64_t>& q, const std::vector<int64_t>& k,
                        const std::vector<int64_t>& v) {
  if (q.size() < 2 || k.size() != q.size() || v.size() != q.size()) return 0;
  int64_t batch = 1;
  for (size_t i = 0; i + 2 < q.size(); ++i) batch *= q[i];
  const int64_t tq = q[q.size() - 2], d = q.back(), tk = k[k.size() - 2], dv = v.back();
  return 2 * batch * tq * tk * d + 2 * batch * tq * tk * dv;
}

bool is_counted(const char* name) {
  static const char* const kOps[] = {"aten::mm",
                                     "aten::addmm",
                                     "aten::bmm",
                                     "aten::baddbmm",
                                     "aten::addbmm",
                                     "aten::convolution",
                                     "aten::convolution_backward",
                                     kAttention};
  for (const char* op : kOps)
    if (!std::strcmp(name, op)) return true;
  return is_attention_backward(name);
}

std::string si(double v, const char* unit) {
  const char* prefix[] = {"", "K", "M", "G", "T", "P"};
  int i = 0;
  while (std::abs(v) >= 1000 && i < 5) {
    v /= 1000;
    ++i;
  }
  return fmt::format("{:.2f} {}{}", v, prefix[i], unit);
}

}  // namespace

int64_t op_flops(const std::string& name, c10::ArrayRef<const c10::IValue> in) {
  if (name == "aten::mm" || name == "aten::bmm")
    return matmul_flops(sizes_of(in, 0), sizes_of(in, 1));
  if (name == "aten::addmm" || name == "aten::baddbmm" || name == "aten::addbmm")
    return matmul_flops(sizes_of(in, 1), sizes_of(in, 2));
  if (name == kAttention) return attention_flops(sizes_of(in, 0), sizes_of(in, 1), sizes_of(in, 2));
  // The gradients of q, k and v: twice the forward's matmuls, as the math path's four bmm.
  if (is_attention_backward(name))
    return 2 * attention_flops(sizes_of(in, 1), sizes_of(in, 2), sizes_of(in, 3));
  if (name == "aten::convolution" && in.size() >= 9) {
    // (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    const auto x = sizes_of(in, 0), w = sizes_of(in, 1);
    if (x.size() < 3 || w.size() != x.size()) return 0;
    const bool transposed = in[6].toBool();
    return 2 * conv_macs(w, transposed ? x : conv_output(x, w, in));
  }
  if (name == "aten::convolution_backward" && in.size() >= 11) {
    // (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
    //  output_padding, groups, output_mask): one convolution's worth per gradient of the input
    //  and of the weight asked for.
    const auto g = sizes_of(in, 0), x = sizes_of(in, 1), w = sizes_of(in, 2);
    const bool transposed = in[7].toBool();
    const auto mask = in[10].toBoolList();
    const int64_t grads = (mask.size() > 0 && mask.get(0)) + (mask.size() > 1 && mask.get(1));
    return 2 * grads * conv_macs(w, transposed ? x : g);
  }
  return 0;
}

FlopsProfiler::FlopsProfiler(const torch::nn::Module& model, FlopsProfilerConfig config)
    : model_(model), config_(std::move(config)) {
  FlopsProfiler* none = nullptr;
  DSCPP_CHECK(g_active.compare_exchange_strong(none, this), Error,
              "flops_profiler: another engine in this process is profiling already (one profiled "
              "window at a time per process)");
  {
    std::lock_guard<std::mutex> g(g_names_mu);
    g_module_names.clear();
    for (const auto& item : model_.named_modules("", /*include_self=*/false))
      g_module_names[item.value().get()] = item.key();
  }
  handle_ = at::addThreadLocalCallback(
      at::RecordFunctionCallback(start_callback, end_callback)
          .needsInputs(true)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::USER_SCOPE}));
}

FlopsProfiler::~FlopsProfiler() {
  if (!finished_) at::removeCallback(handle_);
  FlopsProfiler* self = this;
  if (g_active.compare_exchange_strong(self, nullptr)) {
    std::lock_guard<std::mutex> g(g_names_mu);
    g_module_names.clear();
  }
}

void FlopsProfiler::set_phase(Phase phase) {
  std::lock_guard<std::mutex> g(mu_);
  phase_ = phase;
}

std::unique_ptr<at::ObserverContext> FlopsProfiler::on_start(const at::RecordFunction& fn) {
  std::lock_guard<std::mutex> g(mu_);
  if (fn.scope() == at::RecordScope::USER_SCOPE) {
    const std::string name = fn.name();
    auto ctx = std::make_unique<Context>();
    // "/h.3": a path from the model's root (zero::call); "attn": a child of the open scope.
    ctx->path = name[0] == '/'    ? name.substr(1)
                : scopes_.empty() ? name
                                  : scopes_.back() + "." + name;
    scopes_.push_back(ctx->path);
    if (phase_ == Phase::forward && !modules_.count(ctx->path)) module_order_.push_back(ctx->path);
    if (phase_ == Phase::forward) modules_[ctx->path].calls++;
    ctx->start = Clock::now();
    return ctx;
  }
  if (counted_depth_ > 0 || !is_counted(fn.name())) return nullptr;
  auto ctx = std::make_unique<Context>();
  ctx->flops = op_flops(fn.name(), fn.inputs());
  ++counted_depth_;
  ctx->start = Clock::now();
  return ctx;
}

void FlopsProfiler::on_end(const at::RecordFunction& fn, at::ObserverContext* base) {
  const auto end = Clock::now();
  auto* ctx = static_cast<Context*>(base);
  const double dt = std::chrono::duration<double>(end - ctx->start).count();
  std::lock_guard<std::mutex> g(mu_);
  if (ctx->flops < 0) {  // a module scope
    auto it = std::find(scopes_.rbegin(), scopes_.rend(), ctx->path);
    if (it != scopes_.rend()) scopes_.erase(std::next(it).base());
    if (phase_ == Phase::forward) modules_[ctx->path].seconds += dt;
    return;
  }
  --counted_depth_;
  OpStats& ph = phase_stats_[static_cast<int>(phase_)];
  ph.calls++;
  ph.flops += ctx->flops;
  ph.seconds += dt;
  OpStats& op = ops_[fn.name()];
  op.calls++;
  op.flops += ctx->flops;
  op.seconds += dt;
  if (phase_ == Phase::forward) {
    for (const std::string& s : scopes_) modules_[s].flops += ctx->flops;
  }
}

int64_t FlopsProfiler::flops(Phase phase) const {
  std::lock_guard<std::mutex> g(mu_);
  return phase_stats_[static_cast<int>(phase)].flops;
}

int64_t FlopsProfiler::module_flops(const std::string& path) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = modules_.find(path);
  return it == modules_.end() ? 0 : it->second.flops;
}

std::string FlopsProfiler::finish(const WindowInfo& info) {
  if (!finished_) at::removeCallback(handle_);
  finished_ = true;
  std::lock_guard<std::mutex> g(mu_);
  const auto& fwd = phase_stats_[0];
  const auto& bwd = phase_stats_[1];
  const auto& opt = phase_stats_[2];
  const int64_t total = fwd.flops + bwd.flops + opt.flops;
  const double matmul_s = fwd.seconds + bwd.seconds + opt.seconds;
  // The machine's matmul peak in the training dtype on this process's threads, measured now
  // that the window is over (the figure `dscpp report` measures in fp32). CPU models only.
  const bool timed = info.device.is_cpu();
  double peak = 0;
  std::string no_peak;
  if (timed) {
    try {
      peak = measure_matmul_gflops(1024, 5, info.dtype) * 1e9;
    } catch (const std::exception& e) {  // no CPU matmul in this dtype (fp16 on libtorch 1.13)
      no_peak = fmt::format("not measurable in {} on this CPU", c10::toString(info.dtype));
    }
  }
  int64_t params = 0;
  for (const auto& p : model_.parameters()) params += p.numel();
  auto module_params = [&](const std::string& path) -> int64_t {
    for (const auto& item : model_.named_modules("", false)) {
      if (item.key() != path) continue;
      int64_t n = 0;
      for (const auto& p : item.value()->parameters()) n += p.numel();
      return n;
    }
    return -1;  // a user scope that is not a module
  };

  std::string r;
  auto line = [&r](const std::string& s) { r += s + "\n"; };
  line(fmt::format(
      "-------------------- dscpp flops profiler: optimizer step {} --------------------",
      info.step));
  line(fmt::format("rank 0 of {}; {} micro-step(s) in the window; training dtype {}", info.world,
                   info.micro_steps, c10::toString(info.dtype)));
  line(fmt::format("parameters of the model:                {}", si(params, "")));
  line(fmt::format(
      "matmul-like FLOPs on this rank:         forward {}, backward {} (with any "
      "recomputed forward), optimizer {}; total {}",
      si(fwd.flops, "FLOP"), si(bwd.flops, "FLOP"), si(opt.flops, "FLOP"), si(total, "FLOP")));
  if (info.tokens > 0)
    line(fmt::format("tokens on this rank:                    {} ({} FLOP per token)", info.tokens,
                     si(double(total) / info.tokens, "")));
  line(
      fmt::format("window latency:                         {:.1f} ms (forward and data {:.1f}, "
                  "backward {:.1f} of which waiting for gradient reductions {:.1f}, optimizer "
                  "{:.1f})",
                  info.seconds * 1e3, (info.seconds - info.backward_s - info.optimizer_s) * 1e3,
                  info.backward_s * 1e3, info.reduce_wait_s * 1e3, info.optimizer_s * 1e3));
  line(fmt::format(
      "time in matmul-like ops:                {:.1f} ms ({:.0f}% of the window) at {}/s",
      matmul_s * 1e3, info.seconds > 0 ? 100 * matmul_s / info.seconds : 0.0,
      si(matmul_s > 0 ? total / matmul_s : 0, "FLOP")));
  const double achieved = info.seconds > 0 ? total / info.seconds : 0;
  line(fmt::format("achieved over the window:               {}/s", si(achieved, "FLOP")));
  line(fmt::format("matmul peak ({} 1024x1024, this process's {} thread(s)): {}/s",
                   c10::toString(info.dtype), at::get_num_threads(), si(peak, "FLOP")));
  line(fmt::format(
      "FLOPs utilization:                      {:.1f}% (counted FLOPs / window / peak; "
      "model FLOPs = 3 x forward: {:.1f}%)",
      peak > 0 ? 100 * achieved / peak : 0.0,
      peak > 0 && info.seconds > 0 ? 100 * 3.0 * fwd.flops / info.seconds / peak : 0.0));

  // Per module scope, forward, at depths below module_depth as DeepSpeed counts them: depth 0 is
  // the model (the lines above), 1 its children ("wte", "h"), 2 theirs ("h.3").
  auto depth = [](const std::string& path) {
    return 1 + static_cast<int64_t>(std::count(path.begin(), path.end(), '.'));
  };
  std::vector<std::string> shown;
  for (const auto& path : module_order_) {
    if (config_.module_depth < 0 || depth(path) < config_.module_depth) shown.push_back(path);
  }
  if (!shown.empty()) {
    line("");
    line(fmt::format(
        "forward, per module scope (depth <= {}):",
        config_.module_depth < 0 ? std::string("all") : std::to_string(config_.module_depth)));
    line(fmt::format("  {:<28} {:>10} {:>14} {:>7} {:>12} {:>14}", "module", "params", "FLOPs",
                     "% fwd", timed ? "latency ms" : "", timed ? "FLOP/s" : ""));
    for (const auto& path : shown) {
      const ModuleStats& m = modules_[path];
      const int64_t np = module_params(path);
      line(fmt::format("  {:<28} {:>10} {:>14} {:>6.1f}% {:>12} {:>14}",
                       std::string(2 * (depth(path) - 1), ' ') + path,
                       np < 0 ? std::string("-") : si(np, ""), si(m.flops, ""),
                       fwd.flops > 0 ? 100.0 * m.flops / fwd.flops : 0.0,
                       timed ? fmt::format("{:.2f}", m.seconds * 1e3) : std::string(),
                       timed ? si(m.seconds > 0 ? m.flops / m.seconds : 0, "") : std::string()));
    }
  }
  if (config_.top_modules > 0 && !modules_.empty()) {
    // The top modules by forward FLOPs at each depth shown, as DeepSpeed's summary does.
    std::map<int64_t, std::vector<std::string>> by_depth;
    for (const auto& path : shown) by_depth[depth(path)].push_back(path);
    line("");
    line(fmt::format("top {} module(s) by forward FLOPs, per depth:", config_.top_modules));
    for (auto& [d, paths] : by_depth) {
      std::stable_sort(paths.begin(), paths.end(), [&](const std::string& a, const std::string& b) {
        return modules_[a].flops > modules_[b].flops;
      });
      std::string top;
      for (size_t i = 0; i < paths.size() && int64_t(i) < config_.top_modules; ++i)
        top += (i ? ", " : "") + paths[i] + " " + si(modules_[paths[i]].flops, "FLOP");
      line(fmt::format("  depth {}: {}", d, top));
    }
  }
  if (config_.detailed) {
    line("");
    line("matmul-like ops over the window (forward, backward and optimizer):");
    line(fmt::format("  {:<28} {:>8} {:>14} {:>12} {:>14}", "op", "calls", "FLOPs", "time ms",
                     "FLOP/s"));
    for (const auto& [name, op] : ops_) {
      line(fmt::format("  {:<28} {:>8} {:>14} {:>12.2f} {:>14}", name, op.calls, si(op.flops, ""),
                       op.seconds * 1e3, si(op.seconds > 0 ? op.flops / op.seconds : 0, "")));
    }
  }
  line("------------------------------------------------------------------------------------");
  return r;
}

std::string unit_scope_name(const torch::nn::Module& unit) {
  if (!g_active.load()) return "";
  std::lock_guard<std::mutex> g(g_names_mu);
  auto it = g_module_names.find(&unit);
  return it == g_module_names.end() ? "" : "/" + it->second;
}

}  // namespace dscpp::profiling
