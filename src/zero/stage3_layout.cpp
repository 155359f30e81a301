// ZeRO stage 3 (stage3.h), its layout: the units found in the model, each unit's flat group and
// this rank's shard of it, the resident group, and the part the optimizer steps on
// (parts(), checkpoint_groups()). The fetch schedule is stage3_schedule.cpp, GatheredParameters
// and zero::load_weights stage3_scopes.cpp.
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <unordered_map>

#include "dscpp/error.h"
#include "util/log.h"
#include "util/memory.h"
#include "zero/presharded.h"
#include "zero/stage3.h"
#include "zero/stage3_plan.h"
#include "zero/unit_functions.h"
#include "zero/unit_policy.h"

namespace dscpp::zero {
namespace {

// Copies the piece of `values` (a parameter at `offset` of a flat buffer) that falls in this
// rank's shard [shard_begin, shard_begin + shard_len) into `shard` (and the part tap at
// part_base + its place in the shard).
void take_shard(int64_t offset, const at::Tensor& values, int64_t shard_begin, int64_t shard_len,
                const at::Tensor& shard, int64_t part_base, const PartTap& tap) {
  const int64_t lo = std::max(offset, shard_begin);
  const int64_t hi = std::min(offset + values.numel(), shard_begin + shard_len);
  if (lo >= hi) return;
  at::Tensor piece = values.narrow(0, lo - offset, hi - lo);
  if (shard.defined()) shard.narrow(0, lo - shard_begin, hi - lo).copy_(piece);
  if (tap) tap(part_base + lo - shard_begin, piece);
}

}  // namespace

// ----- the plan (stage3_plan.h) -------------------------------------------------------------

std::vector<UnitRoot> find_units(torch::nn::Module& model, const UnitPolicy& policy,
                                 bool* whole_model) {
  std::vector<UnitRoot> units;
  std::vector<std::string> taken;  // paths of units found so far (their subtrees are theirs)
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
    const std::string& path = item.key();
    bool inside = false;
    for (const auto& t : taken) inside = inside || t.empty() || path.rfind(t + ".", 0) == 0;
    if (inside) continue;
    if (!matches(policy, path, item.value()->name())) continue;
    taken.push_back(path);
    units.push_back({item.value().get(), path.empty() ? "(root)" : path});
  }
  // The engine checked that every pattern matches a module (check_each_matches), so no unit
  // means no policy and no module of a marked type (DSCPP_ZERO_UNIT).
  *whole_model = units.empty();
  if (units.empty()) units.push_back({&model, "(the whole model)"});
  return units;
}

UnitAssignment assign_to_units(const std::vector<UnitRoot>& units, const NamedParams& np,
                               int64_t persistence_threshold) {
  check_fp32_on_one_device(np.params, np.names);
  // Each trainable parameter's unit (the first unit whose subtree holds it), or none.
  // A parameter shared by two units would be released by one while the other runs: refused.
  std::unordered_map<const void*, int> owner;
  for (size_t u = 0; u < units.size(); ++u) {
    for (const auto& item : units[u].module->named_parameters(/*recurse=*/true)) {
      auto [it, fresh] = owner.emplace(item.value().unsafeGetTensorImpl(), static_cast<int>(u));
      DSCPP_CHECK(fresh || it->second == static_cast<int>(u) || !item.value().requires_grad(),
                  ConfigError, "parameter '", item.key(), "' of stage-3 unit '", units[u].name,
                  "' also belongs to unit '", units[it->second].name,
                  "' (a tied parameter). HINT: make one unit "
                  "of the module that owns it and call it for every use (as the GPT does with "
                  "wte), or leave the modules that share it out of InitOptions::zero_units");
    }
  }
  UnitAssignment a;
  a.sharded.resize(units.size());
  for (size_t i = 0; i < np.params.size(); ++i) {
    const at::Tensor& p = np.params[i];
    auto it = owner.find(p.unsafeGetTensorImpl());
    const bool shard_it = it != owner.end() && p.numel() >= persistence_threshold;
    DSCPP_CHECK(shard_it || !is_presharded(p), ConfigError, "parameter '", np.names[i],
                "' was sharded by zero::Init but is in no unit of InitOptions::zero_units (or "
                "below its stage3_param_persistence_threshold), so its values are gone. HINT: give "
                "zero::Init and initialize() the same unit policy and config");
    NamedParams& dst = shard_it ? a.sharded[it->second] : a.resident;
    dst.params.push_back(p);
    dst.names.push_back(np.names[i]);
  }
  return a;
}

std::vector<int> disk_slots(const std::vector<int64_t>& shard_numels, int64_t max_in_cpu) {
  std::vector<int> slots(shard_numels.size(), -1);
  int next = 0;
  int64_t kept = 0;
  for (size_t u = 0; u < shard_numels.size(); ++u) {
    const int64_t n = shard_numels[u];
    if (n == 0) continue;
    if (next == 0 && kept + n <= max_in_cpu) {
      kept += n;
      continue;
    }
    slots[u] = next++;
  }
  return slots;
}

// ----- set-up ---------------------------------------------------------------------------------

Stage3::Stage3(torch::nn::Module& model, NamedParams np, comm::Communicator& comm,
               const StrategyOptions& options, const Stage3Options& s3,
               const PartTapFactory& make_tap)
    : comm_(comm),
      s3_(s3),
      fetcher_(comm, s3.debug, s3.quantize_weights, s3.secondary_group),
      model_(&model) {
  check_fp32_on_one_device(np.params, np.names);
  options_ = np.params[0].options().dtype(options.reduce.dtype).requires_grad(false);
  allgather_bucket_size_ = options.allgather_bucket_size;
  const std::vector<UnitRoot> roots = find_units(model, s3.units, &whole_model_unit_);
  for (const UnitRoot& root : roots) {
    units_.emplace_back();
    units_.back().module = root.module;
    units_.back().storage.name = root.name;
  }
  const UnitAssignment a = assign_to_units(roots, np, s3.persistence_threshold);
  for (const auto& p : np.params) numel_ += p.numel();
  const int64_t in_memory = lay_out(a);
  tap_ = make_tap ? make_tap(part_numel_) : PartTap();
  resident_params_ = a.resident.params;
  resident_names_ = a.resident.names;
  flatten_resident(a.resident);
  shard_units(a.sharded, in_memory);
  check_no_presharded_left(model);
  build_reducer(a, options.reduce);
  register_units();
  if (whole_model_unit_) {
    if (comm_.rank() == 0) {
      DSCPP_LOG_WARN(
          "ZeRO stage 3 without units: the whole model is one unit, kept gathered between "
          "steps, so stage 3 saves no parameter memory while the model runs. HINT: mark units "
          "(the repeated blocks, usually): declare a block's holder with DSCPP_ZERO_UNIT(Block) "
          "instead of TORCH_MODULE(Block) and call it as block(x) (include/dscpp/zero_unit.h); "
          "or name them in the config's zero_optimization.leaf_module (\"classes\" or "
          "\"names\") or InitOptions::zero_units and run each one's forward through "
          "dscpp::zero::call (docs/zero.md, \"Stage 3\"). This model's top-level modules: {}",
          top_level_modules(model));
    }
    gather(0, Gather::kPlain);
    fetcher_.wait(units_[0].storage);
  }
  if (comm_.rank() == 0) report_layout();
  // NOTE [released reads]; debug mode's released units hold NaN, and its own check walks the
  // graph at every backward.
  if (!whole_model_unit_ && !s3_.debug) start_watching();
}

int64_t Stage3::lay_out(const UnitAssignment& a) {
  const int world = comm_.world_size();
  // This rank's part: its shard of the resident group, then its shard of each unit.
  resident_layout_ = FlatLayout::of(a.resident.params, world);
  const int64_t resident_shard = resident_layout_.shard;
  int64_t shard_total = 0;
  for (size_t u = 0; u < units_.size(); ++u) {
    units_[u].layout = FlatLayout::of(a.sharded[u].params, world);
    units_[u].part_offset = resident_shard + shard_total;
    shard_total += units_[u].layout.shard;
  }
  part_numel_ = resident_shard + shard_total;
  // offload_param nvme (NOTE [stage 3 parameter offload]): the shards past the first max_in_cpu
  // elements go to disk, so the ones in memory are a prefix of the units and the ones on disk the
  // rest of the part.
  int64_t in_memory = shard_total;
  if (s3_.make_param_swapper) {
    std::vector<int64_t> shards;
    for (const auto& unit : units_) shards.push_back(unit.layout.shard);
    const std::vector<int> slots = disk_slots(shards, s3_.max_in_cpu);
    std::vector<int64_t> disk_numels;
    int64_t kept = 0;
    for (size_t u = 0; u < units_.size(); ++u) {
      units_[u].disk = slots[u];
      if (slots[u] >= 0)
        disk_numels.push_back(shards[u]);
      else
        kept += shards[u];
    }
    in_memory = kept;
    if (!disk_numels.empty()) {
      param_swap_ = s3_.make_param_swapper(disk_numels, options_.dtype().toScalarType());
    } else if (comm_.rank() == 0) {
      DSCPP_LOG_INFO(
          "offload_param nvme: this rank's {} shard elements fit zero_optimization.offload_param."
          "max_in_cpu ({}), so every shard stays in memory and nothing goes to disk (as in "
          "DeepSpeed); a lower max_in_cpu (0: none) puts the rest on disk",
          kept, s3_.max_in_cpu);
    }
  }
  return in_memory;
}

void Stage3::flatten_resident(const NamedParams& resident) {
  const int64_t resident_shard = resident_layout_.shard;
  const PartTap& tap = tap_;
  // The resident group: whole on every rank (stage 2's path), first in the flat space.
  if (resident.params.empty()) {
    resident_flat_ = at::zeros({0}, options_);
  } else {
    const int64_t begin = resident_layout_.shard_offset(comm_.rank());
    FlattenTap rtap;
    if (tap) {
      rtap = [&](int64_t off, const at::Tensor& values) {
        take_shard(off, values, begin, resident_shard, at::Tensor(), 0, tap);
      };
    }
    resident_flat_ = flatten_parameters(resident.params, resident.names, resident_layout_,
                                        options_.dtype().toScalarType(), rtap);
  }
}

void Stage3::shard_units(const std::vector<NamedParams>& sharded, int64_t in_memory) {
  const int rank = comm_.rank();
  const int64_t resident_shard = resident_layout_.shard;
  const PartTap& tap = tap_;
  // The units: each one's large parameters sharded; this rank keeps its shards in shards_.
  shards_ = at::zeros({in_memory}, options_);
  {
    at::NoGradGuard no_grad;
    for (size_t u = 0; u < units_.size(); ++u) {
      Unit& unit = units_[u];
      const FlatLayout& l = unit.layout;
      unit.storage.full = at::empty({l.padded}, options_);
      // A shard on disk is built here, written, and dropped.
      unit.storage.shard = unit.disk >= 0 || l.shard == 0
                               ? at::zeros({l.shard}, options_)
                               : shards_.narrow(0, unit.part_offset - resident_shard, l.shard);
      // A unit zero::Init sharded as the model was built brings its shard; the others are whole.
      std::optional<PreSharded> pre = take_presharded(*unit.module);
      if (pre) {
        bool same = pre->params.size() == sharded[u].params.size() && pre->layout.shard == l.shard;
        for (size_t i = 0; same && i < pre->params.size(); ++i) {
          same = pre->params[i].unsafeGetTensorImpl() == sharded[u].params[i].unsafeGetTensorImpl();
        }
        DSCPP_CHECK(same, ConfigError, "zero::Init sharded module '", pre->path,
                    "' otherwise than "
                    "the engine would (",
                    pre->params.size(), " parameters there, ", sharded[u].params.size(),
                    " here). HINT: give zero::Init the config and world "
                    "size the engine gets");
        const at::Tensor fp32 = pre->take_fp32();  // NOTE [spilled shards]: read back
        unit.storage.shard.copy_(fp32);
        if (tap) tap(unit.part_offset, fp32);
      }
      for (size_t i = 0; i < sharded[u].params.size(); ++i) {
        at::Tensor p = sharded[u].params[i];
        auto [off, n] = l.segments[i];
        if (!pre) {
          take_shard(off, p.detach().reshape({-1}), l.shard_offset(rank), l.shard,
                     unit.storage.shard, unit.part_offset, tap);
        }
        // The parameter becomes a view of the unit's storage; its fp32 original is freed.
        p.set_data(unit.storage.full.narrow(0, off, n).view(p.sizes()));
        unit.params.push_back(p);
        unit.names.push_back(sharded[u].names[i]);
        unit.shapes.push_back(p.sizes().vec());
      }
      if (unit.disk >= 0) {
        param_swap_->store(unit.disk, unit.storage.shard);
        unit.storage.shard = at::Tensor();
        unit.storage.shard_on_disk = true;
      }
      fetcher_.park(unit.storage);
    }
  }
  return_freed_memory();  // the units' fp32 originals
}

void Stage3::check_no_presharded_left(torch::nn::Module& model) {
  // A module zero::Init sharded that is no unit here lost its values: refused.
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
    std::optional<PreSharded> left = take_presharded(*item.value());
    DSCPP_CHECK(!left, ConfigError, "module '", item.key(),
                "' was sharded by zero::Init but is "
                "no unit of InitOptions::zero_units, so its parameters cannot be gathered. HINT: "
                "give zero::Init and initialize() the same unit policy");
  }
}

void Stage3::build_reducer(const UnitAssignment& a, const ReduceOptions& reduce) {
  const NamedParams& resident = a.resident;
  const std::vector<NamedParams>& sharded = a.sharded;
  const int64_t resident_shard = resident_layout_.shard;
  // The reducer: the resident group (group 0, its buckets last), then the units in order.
  std::vector<at::Tensor> params = resident.params;
  std::vector<std::string> names = resident.names;
  std::vector<std::pair<int64_t, int64_t>> segments = resident_layout_.segments;
  std::vector<int> param_group(resident.params.size(), 0);
  std::vector<GroupGeometry> groups{{0, resident_layout_.padded, resident_shard, 0}};
  int64_t base = resident_layout_.padded;
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = units_[u];
    unit.group = static_cast<int>(groups.size());
    groups.push_back({base, unit.layout.padded, unit.layout.shard, unit.part_offset});
    for (size_t i = 0; i < sharded[u].params.size(); ++i) {
      params.push_back(sharded[u].params[i]);
      names.push_back(sharded[u].names[i]);
      segments.emplace_back(base + unit.layout.segments[i].first, unit.layout.segments[i].second);
      param_group.push_back(unit.group);
    }
    base += unit.layout.padded;
  }
  std::unique_ptr<GradShard> grad_shard;
  if (s3_.make_grad_shard) {
    int64_t shard_total = 0;
    for (const auto& g : groups) shard_total += g.shard;
    grad_shard = s3_.make_grad_shard(shard_total, options_.dtype().toScalarType());
  }
  reducer_ = std::make_unique<SlotReducer>(
      std::move(params), std::move(names), std::move(segments), std::move(groups),
      std::move(param_group), comm_, reduce,
      /*resident_group=*/0, [this](int group) { on_group_complete(group); }, std::move(grad_shard));
}

void Stage3::report_layout() const {
  int64_t sharded_numel = 0, padded = 0;
  for (const auto& u : units_) {
    sharded_numel += u.layout.numel;
    padded += u.layout.padded;
  }
  // NOTE [stage 3 prefetch order]: unit u's next request after its forward is its backward,
  // the other units' requests in between; from the first unit that is nearly twice the units'
  // elements, so a reuse distance that large keeps every unit from forward to backward.
  if (!whole_model_unit_ && units_.size() > 1 && padded > 0 && s3_.max_reuse_distance >= padded) {
    const int64_t item = static_cast<int64_t>(c10::elementSize(options_.dtype().toScalarType()));
    DSCPP_LOG_WARN(
        "ZeRO stage 3: zero_optimization.stage3_max_reuse_distance {} is at least the {} "
        "elements of the model's {} units, so units are kept gathered from their forward to "
        "their backward instead of released after use (DeepSpeed's default, 1e9, does the same "
        "for any model under 1e9 parameters): up to {:.1f} MiB of whole parameters per rank "
        "beside the shards, more than stage 2 holds. HINT: to release each unit after use, "
        "set stage3_max_reuse_distance below the largest unit's elements (0 always releases); "
        "stage3_max_live_parameters ({}) caps the elements gathered ahead",
        s3_.max_reuse_distance, padded, units_.size(),
        static_cast<double>(padded * item) / (1 << 20), s3_.max_live_parameters);
  }
  DSCPP_LOG_INFO(
      "ZeRO stage 3: {} units, {} of {} parameter elements sharded, {} resident "
      "(whole on every rank: below stage3_param_persistence_threshold {} or in no "
      "unit)",
      units_.size(), sharded_numel, numel_, resident_layout_.numel, s3_.persistence_threshold);
}

Stage3::~Stage3() {
  // Backward nodes and zero::call must not reach this engine any more; units the engine holds
  // whole (a whole-model unit between steps) keep their memory.
  stop_watching();
  unregister_units();
  for (auto& u : units_) {
    try {
      fetcher_.wait(u.storage);
    } catch (...) {
    }
  }
}

void Stage3::register_units() {
  // Every module of the model: a unit, a module inside one, or a module in none (unit -1; with
  // no policy every module is, so the model's own zero::calls stay plain calls).
  std::vector<std::pair<const torch::nn::Module*, UnitEntry>> modules;
  std::unordered_map<const torch::nn::Module*, UnitEntry> entry;
  if (!whole_model_unit_) {
    for (size_t u = 0; u < units_.size(); ++u) {
      entry[units_[u].module] = UnitEntry{0, static_cast<int>(u), false};
      for (const auto& m : units_[u].module->modules(/*include_self=*/false)) {
        entry.emplace(m.get(), UnitEntry{0, static_cast<int>(u), true});
      }
    }
  }
  for (const auto& m : model_->modules(/*include_self=*/true)) {
    auto it = entry.find(m.get());
    modules.push_back({m.get(), it == entry.end() ? UnitEntry{} : it->second});
  }
  registry_id_ = registry::add(this, modules);
}

void Stage3::unregister_units() { registry::remove(registry_id_); }

// ----- the step's part ------------------------------------------------------------------------

std::vector<Part> Stage3::parts() {
  std::vector<Part> out;
  const at::Tensor g = reducer_->grad_shard();
  // Elements [pos, pos + n) of the gradient shard: a view, or on disk.
  auto part = [&](at::Tensor params, int64_t pos, int64_t n, ParamSink* sink) {
    Part p{std::move(params), g.defined() ? g.narrow(0, pos, n) : at::Tensor(), pos, sink};
    if (!g.defined()) {
      p.grads_on_disk = &reducer_->shard();
      p.length = n;
    }
    out.push_back(std::move(p));
  };
  const int64_t rs = resident_layout_.shard;
  if (rs > 0) {
    part(resident_flat_.narrow(0, resident_layout_.shard_offset(comm_.rank()), rs), 0, rs, nullptr);
  }
  if (shards_.numel() > 0) part(shards_, rs, shards_.numel(), nullptr);
  if (param_swap_) {  // the rest of the part, on disk (NOTE [stage 3 parameter offload])
    part(at::Tensor(), rs + shards_.numel(), param_swap_->numel(), param_swap_.get());
  }
  return out;
}

std::vector<CheckpointGroup> Stage3::checkpoint_groups() const {
  const int rank = comm_.rank();
  std::vector<CheckpointGroup> out;
  if (resident_layout_.numel > 0) {
    out.push_back(checkpoint_group("resident", NamedParams{resident_params_, resident_names_},
                                   resident_layout_, resident_layout_.shard_offset(rank),
                                   resident_layout_.shard, 0));
  }
  for (const Unit& u : units_) {
    if (u.layout.numel == 0) continue;  // every parameter of it is resident
    CheckpointGroup g;
    g.name = "unit:" + u.storage.name;
    g.names = u.names;
    g.shapes = u.shapes;
    g.layout = u.layout;
    g.begin = u.layout.shard_offset(rank);
    g.length = u.layout.shard;
    g.part_offset = u.part_offset;
    out.push_back(std::move(g));
  }
  return out;
}

int64_t Stage3::param_bytes() const {
  // In memory: shards on disk count in param_swap_buffer_bytes() while they are read in.
  return static_cast<int64_t>(resident_flat_.nbytes() + shards_.nbytes());
}

}  // namespace dscpp::zero
