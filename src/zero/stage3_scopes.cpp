// ZeRO stage 3 (stage3.h), values in and out of the shards outside the step: GatheredParameters
// scopes (gather units whole for the program, write a modifier rank's changes back into every
// rank's shard) and zero::load_weights (a safetensors file read straight into the shards).
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <optional>
#include <unordered_map>

#include "dscpp/error.h"
#include "dscpp/safetensors.h"
#include "util/log.h"
#include "zero/stage3.h"
#include "zero/unit_functions.h"

namespace dscpp::zero {

// ----- zero::load_weights ---------------------------------------------------------------------

std::map<std::string, std::string> Stage3::load_weights(const std::string& path) {
  OwnOps own;  // NOTE [released reads]
  safetensors::Reader reader(path);
  auto named = model_->named_parameters(/*recurse=*/true);
  std::vector<std::pair<std::string, std::vector<int64_t>>> wanted;
  for (const auto& item : named) wanted.emplace_back(item.key(), item.value().sizes().vec());
  safetensors::check_matches(wanted, reader.shapes(), path);
  before_values_change();
  drop_secondaries();
  // Where each parameter lives: a unit's (unit, index) or the resident group's (-1, index).
  std::unordered_map<const void*, std::pair<int, int>> place;
  for (size_t u = 0; u < units_.size(); ++u) {
    for (size_t i = 0; i < units_[u].params.size(); ++i) {
      place[units_[u].params[i].unsafeGetTensorImpl()] = {static_cast<int>(u), static_cast<int>(i)};
    }
  }
  for (size_t i = 0; i < resident_params_.size(); ++i) {
    place[resident_params_[i].unsafeGetTensorImpl()] = {-1, static_cast<int>(i)};
  }
  const int rank = comm_.rank();
  at::NoGradGuard no_grad;
  auto fp32 = at::TensorOptions().dtype(at::kFloat);
  // A unit's shard on disk is read once, changed for each of its parameters, and written back
  // when the next unit's turn comes.
  int open_unit = -1;
  at::Tensor open_shard;
  auto close_shard = [&] {
    if (open_unit >= 0) param_swap_->store(units_[open_unit].disk, open_shard);
    open_unit = -1;
    open_shard = at::Tensor();
  };
  auto shard_of = [&](int u) -> at::Tensor {
    if (units_[u].disk < 0) return units_[u].storage.shard;
    if (open_unit != u) {
      close_shard();
      open_shard = param_swap_->take(units_[u].disk);
      open_unit = u;
    }
    return open_shard;
  };
  for (auto& item : named) {
    at::Tensor& p = item.value();
    auto it = place.find(p.unsafeGetTensorImpl());
    if (it == place.end() || it->second.first < 0) {
      // Whole on every rank (resident, or frozen): read all of it.
      at::Tensor values = at::empty({p.numel()}, fp32);
      reader.read(item.key(), 0, values);
      p.copy_(values.view(p.sizes()));
      if (it == place.end() || !tap_) continue;
      const auto [off, n] = resident_layout_.segments[it->second.second];
      const int64_t begin = resident_layout_.shard_offset(rank), len = resident_layout_.shard;
      const int64_t lo = std::max(off, begin), hi = std::min(off + n, begin + len);
      if (lo < hi) tap_(lo - begin, values.narrow(0, lo - off, hi - lo));
      continue;
    }
    Unit& unit = units_[it->second.first];
    const auto [off, n] = unit.layout.segments[it->second.second];
    if (unit.storage.gathered && !unit.storage.work) {
      // A gathered unit (the whole-model unit between steps, a GatheredParameters scope) gets
      // the whole parameter too, so what runs next sees the new values.
      at::Tensor values = at::empty({n}, fp32);
      reader.read(item.key(), 0, values);
      p.copy_(values.view(p.sizes()));
    }
    const int64_t begin = unit.layout.shard_offset(rank), len = unit.layout.shard;
    const int64_t lo = std::max(off, begin), hi = std::min(off + n, begin + len);
    if (lo >= hi) continue;
    at::Tensor values = at::empty({hi - lo}, fp32);
    reader.read(item.key(), lo - off, values);
    shard_of(it->second.first).narrow(0, lo - begin, hi - lo).copy_(values);
    if (tap_) tap_(unit.part_offset + lo - begin, values);
  }
  close_shard();
  last_load_bytes_ = reader.bytes_read();
  return reader.metadata();
}

// ----- GatheredParameters ---------------------------------------------------------------------

int Stage3::open_scope(torch::nn::Module& module, std::optional<int> modifier) {
  OwnOps own;  // NOTE [released reads]
  raise_deferred();
  DSCPP_CHECK(running_ < 0, Error, "GatheredParameters opened while stage-3 unit '",
              unit_name(running_),
              "' runs: its parameters are gathered already there. HINT: "
              "open the scope outside zero::call");
  if (modifier) {
    DSCPP_CHECK(*modifier >= 0 && *modifier < comm_.world_size(), Error,
                "GatheredParameters modifier_rank ", *modifier, " is not a rank of this job (",
                comm_.world_size(), " ranks)");
    for (const auto& outer : scopes_) {
      DSCPP_CHECK(!outer.modifier || *outer.modifier == *modifier, Error,
                  "GatheredParameters with modifier_rank ", *modifier,
                  " nested inside one with "
                  "modifier_rank ",
                  *outer.modifier,
                  ": the inner changes would be overwritten "
                  "when the outer scope closes. HINT: use one modifier rank for nested scopes");
    }
  }
  std::unordered_set<const void*> mine;
  for (const auto& p : module.parameters(/*recurse=*/true)) mine.insert(p.unsafeGetTensorImpl());
  Scope scope;
  scope.id = next_scope_++;
  scope.modifier = modifier;
  for (const auto& p : resident_params_)
    scope.resident = scope.resident || mine.count(p.unsafeGetTensorImpl());
  for (size_t u = 0; u < units_.size(); ++u) {
    bool any = false;
    for (const auto& p : units_[u].module->parameters(/*recurse=*/true)) {
      any = any || mine.count(p.unsafeGetTensorImpl());
    }
    if (!any) continue;
    scope.units.push_back(static_cast<int>(u));
    FetchUnit& storage = units_[u].storage;
    // A unit gathered for forward or backward under zero_quantized_weights holds dequantized
    // values: the scope reads, and may write back, the shards' own (NOTE [block-wise quantization]).
    if (storage.gathered && storage.quantized && units_[u].held == 0) fetcher_.release(storage);
    ++units_[u].held;
    if (!storage.gathered) gather(static_cast<int>(u), Gather::kExact);
  }
  for (int u : scope.units) fetcher_.wait(units_[u].storage);
  scopes_.push_back(scope);
  return scope.id;
}

void Stage3::close_scope(int id) {
  OwnOps own;  // NOTE [released reads]
  if (scopes_.empty() || scopes_.back().id != id) {
    // Said at the next zero::call, scope or backward: a destructor had better not throw.
    abandon_scope(id);
    deferred_error_ =
        "GatheredParameters scopes were closed out of order: a scope must close "
        "before the one it was opened in (the out-of-order scope's changes were not "
        "written back). HINT: keep scopes as nested blocks";
    return;
  }
  Scope scope = scopes_.back();
  scopes_.pop_back();
  if (scope.modifier) {
    before_values_change();
    if (scope.resident) write_back(-1, *scope.modifier);
    for (int u : scope.units) write_back(u, *scope.modifier);
  }
  for (int u : scope.units) {
    if (--units_[u].held == 0 && !whole_model_unit_ && running_ < 0)
      fetcher_.release(units_[u].storage);
  }
}

void Stage3::abandon_scope(int id) {
  OwnOps own;  // NOTE [released reads]
  for (size_t i = scopes_.size(); i-- > 0;) {
    if (scopes_[i].id != id) continue;
    for (int u : scopes_[i].units) --units_[u].held;
    scopes_.erase(scopes_.begin() + static_cast<std::ptrdiff_t>(i));
    return;
  }
}

void Stage3::write_back(int u, int root) {
  at::NoGradGuard no_grad;
  const int rank = comm_.rank();
  // Broadcast in fp32: Gloo cannot broadcast every training dtype.
  if (u < 0) {
    at::Tensor f = resident_flat_.to(at::kFloat);
    comm_.broadcast(f, root)->wait();
    resident_flat_.copy_(f);
    const int64_t s = resident_layout_.shard;
    if (tap_ && s > 0) tap_(0, f.narrow(0, resident_layout_.shard_offset(rank), s));
    return;
  }
  Unit& unit = units_[u];
  fetcher_.drop_secondary(unit.storage);  // NOTE [secondary partition]: its values change
  at::Tensor f = unit.storage.full.to(at::kFloat);
  comm_.broadcast(f, root)->wait();
  unit.storage.full.copy_(f);
  const int64_t s = unit.layout.shard;
  at::Tensor mine = f.narrow(0, unit.layout.shard_offset(rank), s);
  if (unit.disk >= 0) {
    param_swap_->store(unit.disk, mine);
  } else {
    unit.storage.shard.copy_(mine);
  }
  if (tap_) tap_(unit.part_offset, mine);
}

}  // namespace dscpp::zero
