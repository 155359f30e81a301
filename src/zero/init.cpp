// zero::Init and zero::built (include/dscpp/zero.h): a model built already sharded, and the
// registry of its units waiting for the engine (presharded.h).
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "dscpp/comm.h"
#include "dscpp/config.h"
#include "dscpp/error.h"
#include "dscpp/zero.h"
#include "util/memory.h"
#include "zero/fetcher.h"
#include "zero/presharded.h"
#include "zero/unit_policy.h"

namespace dscpp::zero {

struct Init::State {
  std::shared_ptr<comm::Communicator> comm;
  UnitPolicy units;
  int64_t persistence_threshold = 0;
  c10::Device device = c10::Device(c10::kCPU);
};

namespace {

thread_local Init::State* current_scope = nullptr;

struct Registry {
  std::mutex mu;
  std::unordered_map<const torch::nn::Module*, PreSharded> units;
  std::unordered_set<const void*> params;  // TensorImpls
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

Init::Init(std::shared_ptr<comm::Communicator> comm, UnitPolicy units, const Config& config,
           c10::Device device)
    : state_(std::make_unique<State>()) {
  DSCPP_CHECK(comm, ConfigError, "zero::Init needs the job's communicator");
  DSCPP_CHECK(!current_scope, Error, "zero::Init scopes do not nest");
  units = with_leaf_modules(std::move(units), config.zero_optimization.leaf_module);
  DSCPP_CHECK(!units.empty(), ConfigError,
              "zero::Init without a unit policy would shard nothing. HINT: pass the policy "
              "InitOptions::zero_units will get (e.g. {\"h.*\"}), or name units in the config's "
              "zero_optimization.leaf_module");
  state_->comm = std::move(comm);
  state_->units = std::move(units);
  state_->persistence_threshold = config.zero_optimization.stage3_param_persistence_threshold;
  state_->device = device;
  current_scope = state_.get();
}

Init::~Init() {
  if (current_scope == state_.get()) current_scope = nullptr;
}

void built(torch::nn::Module& module, const std::string& path) {
  Init::State* st = current_scope;
  if (!st) return;
  module.to(st->device);
  if (!matches(st->units, path, module.name())) return;
  comm::Communicator& comm = *st->comm;
  // The unit's trainable parameters that will be sharded (those at the persistence threshold or
  // above), each once, as the engine will choose them.
  std::vector<at::Tensor> params;
  std::unordered_set<const void*> seen;
  for (const auto& p : module.parameters(/*recurse=*/true)) {
    if (!p.requires_grad() || p.numel() < st->persistence_threshold) continue;
    if (!seen.insert(p.unsafeGetTensorImpl()).second || is_presharded(p)) continue;
    params.push_back(p);
  }
  if (params.empty()) return;
  // Rank 0's values are every rank's; then this rank keeps its fp32 shard and frees the rest.
  std::vector<comm::WorkHandle> works;
  for (auto& p : params) works.push_back(comm.broadcast(p.detach(), 0));
  for (auto& w : works) w->wait();
  PreSharded ps;
  ps.path = path;
  ps.layout = FlatLayout::of(params, comm.world_size());
  const int64_t begin = ps.layout.shard_offset(comm.rank()), len = ps.layout.shard;
  ps.fp32_shard = at::zeros({len}, params[0].options().dtype(at::kFloat).requires_grad(false));
  FetchUnit storage;
  storage.full = at::empty({ps.layout.padded}, ps.fp32_shard.options());
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor p = params[i];
    auto [off, n] = ps.layout.segments[i];
    const int64_t lo = std::max(off, begin), hi = std::min(off + n, begin + len);
    if (lo < hi) {
      ps.fp32_shard.narrow(0, lo - begin, hi - lo)
          .copy_(p.detach().reshape({-1}).narrow(0, lo - off, hi - lo));
    }
    p.set_data(storage.full.narrow(0, off, n).view(p.sizes()));
  }
  ParamFetcher::swap_out(storage);
  return_freed_memory();  // the unit's full parameters
  ps.params = std::move(params);
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  for (const auto& p : ps.params) r.params.insert(p.unsafeGetTensorImpl());
  r.units[&module] = std::move(ps);
}

std::optional<PreSharded> take_presharded(const torch::nn::Module& module) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  auto it = r.units.find(&module);
  if (it == r.units.end()) return std::nullopt;
  PreSharded ps = std::move(it->second);
  r.units.erase(it);
  for (const auto& p : ps.params) r.params.erase(p.unsafeGetTensorImpl());
  // A stale entry (a module that died and whose address was reused) holds other parameters.
  std::unordered_set<const void*> now;
  for (const auto& p : module.parameters(/*recurse=*/true)) now.insert(p.unsafeGetTensorImpl());
  for (const auto& p : ps.params) {
    if (!now.count(p.unsafeGetTensorImpl())) return std::nullopt;
  }
  return ps;
}

bool is_presharded(const at::Tensor& param) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  return r.params.count(param.unsafeGetTensorImpl()) > 0;
}

}  // namespace dscpp::zero
