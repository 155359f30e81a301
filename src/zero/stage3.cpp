// ZeRO stage 3 (stage3.h): set-up (units, shards, the resident group), the units' gather and
// release, and the step's part.
#include "zero/stage3.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "dscpp/error.h"
#include "dscpp/safetensors.h"
#include "util/log.h"
#include "util/memory.h"
#include "zero/gather.h"
#include "zero/presharded.h"
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

// One 52-bit hash of a sequence of unit indices (exact in a double).
double order_hash(const std::vector<int>& order) {
  uint64_t h = 1469598103934665603ull;
  for (int u : order) {
    h ^= static_cast<uint64_t>(u) + 0x9e3779b97f4a7c15ull;
    h *= 1099511628211ull;
  }
  return static_cast<double>(h >> 12);
}

}  // namespace

// ----- set-up ---------------------------------------------------------------------------------

Stage3::Stage3(torch::nn::Module& model, NamedParams np, comm::Communicator& comm,
               const StrategyOptions& options, const Stage3Options& s3,
               const PartTapFactory& make_tap)
    : comm_(comm), s3_(s3), fetcher_(comm, s3.debug), model_(&model) {
  DSCPP_CHECK(!np.params.empty(), ConfigError,
              "the model has no trainable parameters (requires_grad). HINT: nothing to train");
  const int world = comm_.world_size(), rank = comm_.rank();
  const auto device = np.params[0].device();
  options_ = np.params[0].options().dtype(options.reduce.dtype).requires_grad(false);
  allgather_bucket_size_ = options.allgather_bucket_size;
  find_units(model, s3.units);

  // Each trainable parameter's unit (the first unit whose subtree holds it), or none.
  // A parameter shared by two units would be released by one while the other runs: refused.
  std::unordered_map<const void*, int> owner;
  for (size_t u = 0; u < units_.size(); ++u) {
    for (const auto& item : units_[u].module->named_parameters(/*recurse=*/true)) {
      auto [it, fresh] = owner.emplace(item.value().unsafeGetTensorImpl(), static_cast<int>(u));
      DSCPP_CHECK(fresh || it->second == static_cast<int>(u) || !item.value().requires_grad(),
                  ConfigError, "parameter '", item.key(), "' of stage-3 unit '",
                  units_[u].storage.name, "' also belongs to unit '",
                  units_[it->second].storage.name,
                  "' (a tied parameter). HINT: make one unit "
                  "of the module that owns it and call it for every use (as the GPT does with "
                  "wte), or leave the modules that share it out of InitOptions::zero_units");
    }
  }
  NamedParams resident;
  std::vector<NamedParams> sharded(units_.size());
  for (size_t i = 0; i < np.params.size(); ++i) {
    const at::Tensor& p = np.params[i];
    DSCPP_CHECK(p.scalar_type() == at::kFloat && p.device() == device, ConfigError, "parameter '",
                np.names[i], "' is ", p.scalar_type(), " on ", p.device(),
                "; dscpp keeps the model in fp32 on one device and casts for mixed precision "
                "itself. HINT: build the model in fp32 on one device");
    numel_ += p.numel();
    auto it = owner.find(p.unsafeGetTensorImpl());
    const bool shard_it = it != owner.end() && p.numel() >= s3_.persistence_threshold;
    DSCPP_CHECK(shard_it || !is_presharded(p), ConfigError, "parameter '", np.names[i],
                "' was sharded by zero::Init but is in no unit of InitOptions::zero_units (or "
                "below its stage3_param_persistence_threshold), so its values are gone. HINT: give "
                "zero::Init and initialize() the same unit policy and config");
    NamedParams& dst = shard_it ? sharded[it->second] : resident;
    dst.params.push_back(p);
    dst.names.push_back(np.names[i]);
  }

  // This rank's part: its shard of the resident group, then its shard of each unit.
  resident_layout_ = FlatLayout::of(resident.params, world);
  const int64_t resident_shard = resident_layout_.shard;
  int64_t shard_total = 0;
  for (size_t u = 0; u < units_.size(); ++u) {
    units_[u].layout = FlatLayout::of(sharded[u].params, world);
    units_[u].part_offset = resident_shard + shard_total;
    shard_total += units_[u].layout.shard;
  }
  part_numel_ = resident_shard + shard_total;
  // offload_param nvme (NOTE [stage 3 parameter offload]): the shards past the first max_in_cpu
  // elements go to disk, so the ones in memory are a prefix of the units and the ones on disk the
  // rest of the part.
  int64_t in_memory = shard_total;
  if (s3.make_param_swapper) {
    std::vector<int64_t> disk_numels;
    int64_t kept = 0;
    for (auto& unit : units_) {
      const int64_t n = unit.layout.shard;
      if (n == 0) continue;
      if (disk_numels.empty() && kept + n <= s3.max_in_cpu) {
        kept += n;
        continue;
      }
      unit.disk = static_cast<int>(disk_numels.size());
      disk_numels.push_back(n);
    }
    in_memory = kept;
    if (!disk_numels.empty()) {
      param_swap_ = s3.make_param_swapper(disk_numels, options_.dtype().toScalarType());
    } else if (rank == 0) {
      DSCPP_LOG_INFO(
          "offload_param nvme: this rank's {} shard elements fit zero_optimization.offload_param."
          "max_in_cpu ({}), so every shard stays in memory and nothing goes to disk (as in "
          "DeepSpeed); a lower max_in_cpu (0: none) puts the rest on disk",
          kept, s3.max_in_cpu);
    }
  }
  tap_ = make_tap ? make_tap(part_numel_) : PartTap();
  const PartTap& tap = tap_;
  resident_params_ = resident.params;
  resident_names_ = resident.names;

  // The resident group: whole on every rank (stage 2's path), first in the flat space.
  if (resident.params.empty()) {
    resident_flat_ = at::zeros({0}, options_);
  } else {
    const int64_t begin = resident_layout_.shard_offset(rank);
    FlattenTap rtap;
    if (tap) {
      rtap = [&](int64_t off, const at::Tensor& values) {
        take_shard(off, values, begin, resident_shard, at::Tensor(), 0, tap);
      };
    }
    resident_flat_ = flatten_parameters(resident.params, resident.names, resident_layout_,
                                        options.reduce.dtype, rtap);
  }

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
        unit.storage.shard.copy_(pre->fp32_shard);
        if (tap) tap(unit.part_offset, pre->fp32_shard);
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

  // A module zero::Init sharded that is no unit here lost its values: refused.
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
    std::optional<PreSharded> left = take_presharded(*item.value());
    DSCPP_CHECK(!left, ConfigError, "module '", item.key(),
                "' was sharded by zero::Init but is "
                "no unit of InitOptions::zero_units, so its parameters cannot be gathered. HINT: "
                "give zero::Init and initialize() the same unit policy");
  }

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
  reducer_ = std::make_unique<SlotReducer>(std::move(params), std::move(names), std::move(segments),
                                           std::move(groups), std::move(param_group), comm_,
                                           options.reduce, /*resident_group=*/0,
                                           [this](int group) { on_group_complete(group); });
  register_units();
  if (whole_model_unit_) {
    if (rank == 0) {
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
    gather(0);
    fetcher_.wait(units_[0].storage);
  }
  if (rank == 0) {
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
  // NOTE [released reads]; debug mode's released units hold NaN, and its own check walks the
  // graph at every backward.
  if (!whole_model_unit_ && !s3_.debug) start_watching();
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

void Stage3::find_units(torch::nn::Module& model, const UnitPolicy& policy) {
  std::vector<std::string> taken;  // paths of units found so far (their subtrees are theirs)
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
    const std::string& path = item.key();
    bool inside = false;
    for (const auto& t : taken) inside = inside || t.empty() || path.rfind(t + ".", 0) == 0;
    if (inside) continue;
    if (!matches(policy, path, item.value()->name())) continue;
    taken.push_back(path);
    units_.emplace_back();
    units_.back().module = item.value().get();
    units_.back().storage.name = path.empty() ? "(root)" : path;
  }
  // initialize() checked that every pattern matches a module (check_each_matches), so no unit
  // means no policy and no module of a marked type (DSCPP_ZERO_UNIT).
  if (units_.empty()) {
    whole_model_unit_ = true;
    units_.emplace_back();
    units_.back().module = &model;
    units_.back().storage.name = "(the whole model)";
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

// ----- running a unit -------------------------------------------------------------------------

template <typename Fn>
bool Stage3::thread_through(std::vector<at::Tensor>& tensors, int64_t owner, int u) {
  std::vector<size_t> diff;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].defined() && tensors[i].requires_grad()) diff.push_back(i);
  }
  if (diff.empty()) return false;
  torch::autograd::variable_list xs;
  for (size_t i : diff) xs.push_back(tensors[i]);
  xs = Fn::apply(at::TensorList(xs), owner, static_cast<int64_t>(u));
  for (size_t k = 0; k < diff.size(); ++k) tensors[diff[k]] = xs[k];
  return true;
}

void Stage3::raise_deferred() {
  if (deferred_error_.empty()) return;
  std::string msg = std::move(deferred_error_);
  deferred_error_.clear();
  DSCPP_FAIL(Error, msg);
}

std::vector<at::Tensor> Stage3::run_unit(int u, const detail::UnitFn& fn,
                                         const std::vector<at::Tensor>& inputs, bool recompute) {
  raise_deferred();
  DSCPP_CHECK(running_ < 0, Error, "stage-3 unit '", unit_name(u), "' was called while unit '",
              unit_name(running_),
              "' runs: units do not nest. HINT: make only one of them a "
              "unit (InitOptions::zero_units), or call the inner one after the outer returns");
  struct Running {
    int& r;
    ~Running() { r = -1; }
  } running{running_};
  if (!at::GradMode::is_enabled()) {
    // No backward will follow (evaluation): gather, run, release; the record is not touched.
    {
      OwnOps own;
      request(u, /*record=*/false);
    }
    running_ = u;
    std::vector<at::Tensor> out = fn(inputs);
    OwnOps own;
    if (!whole_model_unit_ && units_[u].held == 0) fetcher_.release(units_[u].storage);
    return out;
  }
  {
    OwnOps own;
    request(u, /*record=*/true);
  }
  running_ = u;
  std::vector<at::Tensor> out;
  if (recompute) {
    ++units_[u].pending_inputs;  // the checkpoint's backward says when it is done
    out = detail::checkpoint_apply(*units_[u].module, fn, inputs, registry_id_, u);
  } else {
    // Inputs that require grad go through UnitInputs, outputs through UnitOutputs (NOTE [stage 3
    // backward]).
    std::vector<at::Tensor> in = inputs;
    if (thread_through<UnitInputs>(in, registry_id_, u)) ++units_[u].pending_inputs;
    out = fn(in);
    thread_through<UnitOutputs>(out, registry_id_, u);
  }
  OwnOps own;
  maybe_release(u);
  return out;
}

void Stage3::check_unchanged(int u) const {
  const Unit& unit = units_[u];
  const c10::StorageImpl* storage = unit.storage.full.storage().unsafeGetStorageImpl();
  for (size_t i = 0; i < unit.params.size(); ++i) {
    const at::Tensor& p = unit.params[i];
    const bool moved = p.storage().unsafeGetStorageImpl() != storage;
    DSCPP_CHECK(!moved && p.sizes() == c10::IntArrayRef(unit.shapes[i]), Error, "parameter '",
                unit.names[i], "' of stage-3 unit '", unit_name(u),
                "' changed after the model "
                "was sharded (",
                moved ? "it was given storage of its own" : "its shape is now ",
                moved ? std::string() : c10::str(p.sizes()),
                "); stage 3 can no longer gather "
                "it. HINT: change parameters before initialize(), or change their values inside "
                "dscpp::zero::GatheredParameters with a modifier rank");
  }
}

void Stage3::request(int u, bool record) {
  try {
    request_gathered(u, record);
  } catch (const CommError& e) {
    // Every forward and backward at stage 3 is a collective; the communicator's message names
    // the collectives, this names the unit and the usual cause.
    const std::string context = fmt::format(
        "\n(stage 3: this rank was gathering unit '{}' for {}. Every forward and backward at "
        "stage 3 is a collective: if a forward ran on some ranks only, an evaluation on rank 0 "
        "say, run it on every rank, or open dscpp::zero::GatheredParameters on every rank and "
        "then evaluate on one)",
        unit_name(u),
        at::GradMode::is_enabled() ? "a forward or backward" : "an evaluation forward (no_grad)");
    if (dynamic_cast<const CommTimeout*>(&e)) throw CommTimeout(e.what() + context);
    throw CommError(e.what() + context);
  }
}

void Stage3::request_gathered(int u, bool record) {
  Unit& unit = units_[u];
  check_unchanged(u);
  if (record) {
    if (!following_ && !whole_model_unit_) check_request_across_ranks(u);
    current_.push_back(u);
    if (following_) {
      if (cursor_ < record_.size() && record_[cursor_] == u) {
        ++cursor_;
      } else {
        DSCPP_LOG_DEBUG(
            "stage 3: unit '{}' was requested where the recorded order has '{}'; "
            "prefetching stops for this pass and the next pass records again",
            unit_name(u), cursor_ < record_.size() ? unit_name(record_[cursor_]) : "nothing");
        following_ = false;
        dropped_ = true;
      }
    }
  }
  if (!unit.storage.gathered) {
    gather(u);
    ++stats_.gathers;
  }
  if (unit.storage.work) {
    const auto t0 = std::chrono::steady_clock::now();
    fetcher_.wait(unit.storage);
    stats_.wait_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (record && following_) prefetch();
}

void Stage3::gather(int u) {
  Unit& unit = units_[u];
  if (unit.disk >= 0 && !unit.storage.shard.defined() && !unit.storage.gathered) {
    unit.storage.shard = param_swap_->take(unit.disk);
  }
  fetcher_.gather(unit.storage);
}

void Stage3::read_ahead() {
  // NOTE [stage 3 parameter offload]: the shards of the next requests' units, in record order,
  // as far as the swapper has buffers for; units gathered now need none.
  for (size_t j = cursor_; j < record_.size(); ++j) {
    const Unit& v = units_[record_[j]];
    if (v.disk < 0 || v.storage.gathered) continue;
    if (!param_swap_->read_ahead(v.disk)) break;
  }
}

Strategy::FetchStats Stage3::take_fetch_stats() {
  FetchStats s = stats_;
  stats_ = FetchStats();
  if (param_swap_) {
    const offload::ParamSwapStats d = param_swap_->take_stats();
    s.disk_reads = d.reads;
    s.disk_reads_ahead = d.reads_ahead;
    s.disk_bytes_read = d.bytes_read;
    s.disk_bytes_written = d.bytes_written;
    s.disk_wait_seconds = d.wait_seconds;
  }
  return s;
}

void Stage3::prefetch() {
  // NOTE [stage 3 prefetch order]: the next requests' units, within the prefetch and live budgets.
  // Shards on disk are read ahead first, so the gathers below find theirs read (or reading), and
  // again after them, into the buffers the gathers took theirs from (NOTE [stage 3 parameter
  // offload]).
  if (param_swap_) read_ahead();
  gather_ahead();
  if (param_swap_) read_ahead();
}

void Stage3::gather_ahead() {
  if (s3_.prefetch_bucket_size <= 0) return;
  const int64_t item = static_cast<int64_t>(c10::elementSize(options_.dtype().toScalarType()));
  int64_t in_flight = 0;
  for (size_t j = cursor_; j < record_.size(); ++j) {
    if (in_flight >= s3_.prefetch_bucket_size) break;
    Unit& v = units_[record_[j]];
    const int64_t n = v.layout.padded;
    if (v.storage.gathered) {
      if (v.storage.work) in_flight += n;
      continue;
    }
    if (fetcher_.live_bytes() / item + n > s3_.max_live_parameters) break;
    gather(record_[j]);
    ++stats_.gathers;
    ++stats_.prefetched;
    in_flight += n;
  }
}

bool Stage3::reused_soon(int u) const {
  // Following the record: u's next request comes within stage3_max_reuse_distance elements.
  if (!following_) return false;
  int64_t distance = 0;
  for (size_t j = cursor_; j < record_.size(); ++j) {
    if (record_[j] == u) return distance <= s3_.max_reuse_distance;
    distance += units_[record_[j]].layout.padded;
  }
  return false;
}

void Stage3::maybe_release(int u) {
  Unit& unit = units_[u];
  if (whole_model_unit_ || !unit.storage.gathered) return;
  // In backward a unit goes once its gradients are in and its inputs passed (NOTE [stage 3
  // backward]); in forward once its fn returned.
  if (unit.in_backward && (!unit.grads_done || unit.pending_inputs > 0)) return;
  if (unit.held > 0 || reused_soon(u)) return;
  fetcher_.release(unit.storage);
}

void Stage3::enter_backward(int u) {
  Unit& unit = units_[u];
  unit.in_backward = true;
  request(u, /*record=*/true);
}

void Stage3::inputs_done(int u) {
  Unit& unit = units_[u];
  if (unit.pending_inputs > 0) --unit.pending_inputs;
  if (unit.grads_done && unit.pending_inputs == 0) maybe_release(u);
}

void Stage3::on_group_complete(int group) {
  // Under the reducer's lock (reduce_scatter.h): every gradient of the group has arrived.
  for (size_t u = 0; u < units_.size(); ++u) {
    if (units_[u].group != group) continue;
    units_[u].grads_done = true;
    if (units_[u].pending_inputs == 0) maybe_release(static_cast<int>(u));
  }
}

// ----- around the step ------------------------------------------------------------------------

void Stage3::before_backward(const at::Tensor& loss) {
  raise_deferred();
  watch_paused_ = true;
  if (s3_.debug && !whole_model_unit_) check_used_inside_units(loss);
}

void Stage3::check_used_inside_units(const at::Tensor& loss) const {
  // For each unit, walk the loss's graph knowing whether the walk is inside one of the unit's
  // calls: its UnitOutputs' backward enters a call, its UnitInputs' leaves it, and a checkpoint's
  // backward has the call's inputs as its edges (outside). Reaching one of the unit's parameters
  // from outside means forward used it outside zero::call, where its storage is released
  // (NaN-filled in debug mode).
  using torch::autograd::Node;
  const auto& root = loss.grad_fn();
  if (!root) return;
  for (size_t u = 0; u < units_.size(); ++u) {
    const int unit = static_cast<int>(u);
    std::unordered_map<const Node*, int> param_of;
    for (size_t i = 0; i < units_[u].params.size(); ++i) {
      auto acc = torch::autograd::impl::try_get_grad_accumulator(units_[u].params[i]);
      if (acc) param_of.emplace(acc.get(), static_cast<int>(i));
    }
    if (param_of.empty()) continue;
    std::unordered_set<const Node*> seen[2];  // [inside]
    seen[0].insert(root.get());
    std::vector<std::pair<Node*, bool>> todo{{root.get(), false}};
    while (!todo.empty()) {
      auto [node, inside] = todo.back();
      todo.pop_back();
      const UnitNode kind = unit_node(node, registry_id_, unit);
      if (kind == UnitNode::kOutputs) inside = true;
      if (kind == UnitNode::kInputs || kind == UnitNode::kCheckpoint) inside = false;
      for (const auto& edge : node->next_edges()) {
        Node* next = edge.function.get();
        if (!next) continue;
        if (auto it = param_of.find(next); it != param_of.end()) {
          DSCPP_CHECK(inside, Error, "parameter '", units_[u].names[it->second],
                      "' of stage-3 unit '", unit_name(unit),
                      "' is used outside zero::call of its unit, where its storage is released "
                      "(debug mode fills it with NaN). HINT: run every use of the parameter "
                      "inside the unit's call");
          continue;
        }
        if (seen[inside].insert(next).second) todo.push_back({next, inside});
      }
    }
  }
}

void Stage3::after_backward() {
  raise_deferred();
  // Every unit is released at the end of a pass (kept ones too), and the pass's order becomes the
  // record when it was recorded (NOTE [stage 3 prefetch order]).
  for (auto& u : units_) {
    if (!whole_model_unit_ && u.held == 0) fetcher_.release(u.storage);
    u.pending_inputs = 0;
    u.in_backward = false;
    u.grads_done = false;
  }
  if (!following_ || dropped_) {
    if (!current_.empty() && !whole_model_unit_) check_order_across_ranks();
    record_ = current_;
    following_ = !record_.empty();
  }
  dropped_ = false;
  current_.clear();
  stop_watching();  // NOTE [released reads]: the first pass is over
  cursor_ = 0;
}

void Stage3::check_request_across_ranks(int u) {
  // While recording (NOTE [stage 3 prefetch order]) every rank must request the same unit: one
  // all-reduce of (u, -u) with max says which units the ranks asked for.
  at::Tensor t = at::tensor({static_cast<double>(u), -static_cast<double>(u)}, at::kDouble)
                     .to(options_.device());
  comm_.all_reduce(t, comm::ReduceOp::max)->wait();
  t = t.to(at::kCPU);
  const int hi = static_cast<int>(t[0].item<double>()), lo = static_cast<int>(-t[1].item<double>());
  if (hi == lo) return;
  DSCPP_FAIL(Error, "the ranks ran different stage-3 units at the same point: this rank (",
             comm_.rank(), ") ran '", unit_name(u), "' while another ran '",
             unit_name(u == hi ? lo : hi), "' (request ", current_.size() + 1,
             " of this forward "
             "and backward); every rank must run the same units in the same order, since each "
             "gathers its parameters from all ranks. HINT: make data-dependent branches take the "
             "same path on every rank");
}

void Stage3::check_order_across_ranks() {
  // One all-reduce of (hash, -hash) with max: every rank ran the same units in the same order
  // exactly when max and -max(-hash) agree.
  const double h = order_hash(current_);
  at::Tensor t = at::tensor({h, -h}, at::kDouble).to(options_.device());
  comm_.all_reduce(t, comm::ReduceOp::max)->wait();
  t = t.to(at::kCPU);
  const double hi = t[0].item<double>(), lo = -t[1].item<double>();
  if (hi == lo) return;
  std::string order;
  for (size_t i = 0; i < current_.size() && i < 12; ++i) {
    order += (i ? ", " : "") + unit_name(current_[i]);
  }
  if (current_.size() > 12) order += ", ...";
  DSCPP_FAIL(Error,
             "the stage-3 units ran in a different order on different ranks in this "
             "forward and backward (rank ",
             comm_.rank(), ": ", order,
             "); every rank must run "
             "the same units in the same order, since each gathers its parameters from all ranks. "
             "HINT: make data-dependent branches take the same path on every rank");
}

// ----- zero::load_weights ---------------------------------------------------------------------

std::map<std::string, std::string> Stage3::load_weights(const std::string& path) {
  OwnOps own;  // NOTE [released reads]
  safetensors::Reader reader(path);
  auto named = model_->named_parameters(/*recurse=*/true);
  std::vector<std::pair<std::string, std::vector<int64_t>>> wanted;
  for (const auto& item : named) wanted.emplace_back(item.key(), item.value().sizes().vec());
  safetensors::check_matches(wanted, reader.shapes(), path);
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
    ++units_[u].held;
    if (!units_[u].storage.gathered) gather(static_cast<int>(u));
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

void Stage3::before_update() {
  OwnOps own;  // NOTE [released reads]
  if (whole_model_unit_) fetcher_.release(units_[0].storage);  // the step runs on the shards
}

void Stage3::reduce_accumulated() {
  DSCPP_FAIL(Error, "internal: stage 3 reduces in every backward");
}

std::vector<Part> Stage3::parts() {
  std::vector<Part> out;
  const at::Tensor g = reducer_->grad_shard();
  const int64_t rs = resident_layout_.shard;
  if (rs > 0) {
    out.push_back(Part{resident_flat_.narrow(0, resident_layout_.shard_offset(comm_.rank()), rs),
                       g.narrow(0, 0, rs), 0});
  }
  if (shards_.numel() > 0) out.push_back(Part{shards_, g.narrow(0, rs, shards_.numel()), rs});
  if (param_swap_) {  // the rest of the part, on disk (NOTE [stage 3 parameter offload])
    const int64_t at_ = rs + shards_.numel();
    out.push_back(
        Part{at::Tensor(), g.narrow(0, at_, param_swap_->numel()), at_, param_swap_.get()});
  }
  return out;
}

void Stage3::publish_params() {
  OwnOps own;  // NOTE [released reads]
  // The resident group is all-gathered as at stage 2; units keep only their (updated) shards.
  if (resident_layout_.padded > 0) {
    gather_in_place(comm_, resident_flat_, resident_layout_.shard, allgather_bucket_size_);
  }
  if (whole_model_unit_) {
    gather(0);
    fetcher_.wait(units_[0].storage);
  }
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
