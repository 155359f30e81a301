// Implements the model-state estimates (estimate.h).
#include "engine/estimate.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>

#include "dscpp/async_io.h"
#include "dscpp/comm.h"
#include "dscpp/error.h"
#include "dscpp/models/gpt.h"
#include "dscpp/optim.h"
#include "engine/step_time.h"
#include "offload/grad_swapper.h"
#include "util/log.h"
#include "util/memory.h"
#include "zero/reducer.h"

namespace dscpp::engine {

std::string Estimate::describe() const {
  const std::string& o = offload_optimizer;
  const std::string& p = offload_param;
  if (o != "none" && o == p)
    return fmt::format("stage {}, optimizer and parameters on {}", stage, o);
  return fmt::format("stage {}{}{}", stage, o != "none" ? ", optimizer on " + o : "",
                     p != "none" ? ", parameters on " + p : "");
}

int64_t gathered_peak(const StageThreeUnits& units, const ZeroConfig& z) {
  const std::vector<int64_t>& size = units.sizes;
  std::vector<int> record(units.forward);
  record.insert(record.end(), units.forward.rbegin(), units.forward.rend());
  std::vector<bool> gathered(size.size(), false), pending(size.size(), false);
  std::vector<size_t> last(size.size(), 0);
  for (size_t i = 0; i < record.size(); ++i) last[record[i]] = i;
  int64_t live = 0, peak = 0;
  auto gather = [&](int u) {
    gathered[u] = true;
    live += size[u];
    peak = std::max(peak, live);
  };
  for (size_t i = 0; i < record.size(); ++i) {
    const int u = record[i];
    if (!gathered[u]) gather(u);
    pending[u] = false;
    // Ahead, from the next request (Stage3::gather_ahead).
    int64_t in_flight = 0;
    for (size_t j = i + 1; j < record.size() && z.stage3_prefetch_bucket_size > 0; ++j) {
      if (in_flight >= z.stage3_prefetch_bucket_size) break;
      const int v = record[j];
      if (gathered[v]) {
        if (pending[v]) in_flight += size[v];
        continue;
      }
      if (live + size[v] > z.stage3_max_live_parameters) break;
      gather(v);
      pending[v] = true;
      in_flight += size[v];
    }
    // In backward a unit stays until its gradients are all in: past its last request (the GPT's
    // wte, from the output projection's backward to the embedding's). Otherwise released
    // unless requested again within the reuse distance (Stage3::reused_soon).
    if (i >= units.forward.size() && i < last[u]) continue;
    int64_t distance = 0;
    bool soon = false;
    for (size_t j = i + 1; j < record.size(); ++j) {
      if (record[j] == u) {
        soon = distance <= z.stage3_max_reuse_distance;
        break;
      }
      distance += size[record[j]];
    }
    if (!soon) {
      gathered[u] = false;
      live -= size[u];
    }
  }
  return peak;
}

at::ScalarType training_dtype(const Config& config) {
  return config.bf16.enabled ? at::kBFloat16 : config.fp16.enabled ? at::kHalf : at::kFloat;
}

at::ScalarType communication_dtype(const Config& config, int stage) {
  // torch_autocast at stages 1-3 (accepted in bf16 only): its dtype, that of the safe modules'
  // gradients.
  if (config.torch_autocast.enabled && stage > 0) return at::kBFloat16;
  if (!config.communication_data_type) return training_dtype(config);
  const std::string& t = *config.communication_data_type;  // the parser allows these three
  return t == "fp32" ? at::kFloat : t == "bf16" ? at::kBFloat16 : at::kHalf;
}

at::ScalarType gradient_dtype(const Config& config, int stage) {
  const bool fp32_accumulation = stage == 1 && config.bf16.enabled &&
                                 config.data_types.grad_accum_dtype == "fp32" &&
                                 config.zero_optimization.offload_optimizer.device == "none";
  return fp32_accumulation ? at::kFloat : training_dtype(config);
}

at::ScalarType autocast_dtype(const Config& config, c10::DeviceType device) {
  const auto& d = config.torch_autocast.dtype;
  if (!d) return device == c10::DeviceType::CPU ? at::kBFloat16 : at::kHalf;
  return *d == "fp32" ? at::kFloat : *d == "bf16" ? at::kBFloat16 : at::kHalf;
}

ConfiguredBatch configured_batch(const Config& config, int world) {
  if (!config.train_batch_size && !config.train_micro_batch_size_per_gpu &&
      !config.gradient_accumulation_steps && !config.elasticity.enabled) {
    return {};
  }
  Config resolved = config;
  if (config.elasticity.enabled) {
    resolved.resolve_elastic_batch(world, "the world size");
  } else {
    resolved.resolve_batch(world, "the world size");
  }
  return {resolved.batch.train_micro_batch_size_per_gpu,
          resolved.batch.gradient_accumulation_steps};
}

EstimateInput gpt_estimate_input(const models::GPTConfig& gpt, const Config& config, int world,
                                 bool on_gpu, bool checkpointing) {
  EstimateInput in;
  in.params = gpt.num_parameters();
  in.largest_unit = gpt.block_parameters();
  in.units = gpt_units(gpt, config.zero_optimization.stage3_param_persistence_threshold);
  in.world = world;
  in.on_gpu = on_gpu;
  in.spill_coming = true;  // at stage 3 dscpp train builds it under zero::Init
  in.activations = gpt.activation_bytes(configured_batch(config, world).micro,
                                        training_dtype(config), checkpointing,
                                        on_gpu ? c10::DeviceType::CUDA : c10::DeviceType::CPU);
  // torch_autocast: the 16-bit copy of each weight autograd keeps for backward (NOTE [autocast]),
  // of every unit, or of one being recomputed under checkpointing. (The activations are
  // counted in fp32, more than autocast keeps.)
  if (config.torch_autocast.enabled)
    in.activations += (checkpointing ? gpt.block_parameters() : gpt.num_parameters()) * 2;
  return in;
}

Estimate estimate(const EstimateInput& in, const Config& c, int stage,
                  const std::string& offload_optimizer, const std::string& offload_param) {
  Estimate e;
  e.stage = stage;
  e.on_gpu = in.on_gpu;
  // "cpu" offload of a model on the CPU moves nothing: as without.
  auto effective = [&](const std::string& d) { return d == "cpu" && !in.on_gpu ? "none" : d; };
  e.offload_optimizer = stage > 0 ? effective(offload_optimizer) : "none";
  e.offload_param = stage == 3 ? effective(offload_param) : "none";
  const bool mixed = c.bf16.enabled || c.fp16.enabled;
  const int64_t b = mixed ? 2 : 4;  // bytes per element in the training dtype
  const int64_t psi = in.params;
  const int64_t part = stage == 0 ? psi : (psi + in.world - 1) / in.world;
  // fp32 numbers per element of the part beside the parameters: the master weight (mixed
  // precision) and each optimizer state. A fresh optimizer of one element shows how many.
  const std::unique_ptr<optim::Optimizer> probe =
      c.optimizer.type.empty() ? nullptr : optim::make_optimizer(c.optimizer, 1, at::kFloat);
  // Muon holds exp_avg_sq for its Adam elements only, but in the step each matrix element's
  // Newton-Schulz input or update and a gathered copy (NOTE [Muon across ranks]): counted as
  // its two states and one more.
  const int64_t states = (probe ? static_cast<int64_t>(probe->state_names().size()) : 0) +
                         (c.optimizer.type == "Muon" ? 1 : 0);
  e.params = (stage == 3 ? part : psi) * b;
  e.grads = (stage >= 2 ? part : psi) *
            static_cast<int64_t>(c10::elementSize(gradient_dtype(c, stage)));
  const auto& op = c.zero_optimization.offload_param;
  const int64_t shard = (in.largest_unit + in.world - 1) / in.world;
  // A GPU model's shards off the device go up for their gathers, buffer_count at most ahead
  // (NOTE [shards off the device]).
  auto in_transit = [&](int64_t units) {
    return in.on_gpu ? std::min(units, std::max<int64_t>(1, op.buffer_count)) * shard * b : 0;
  };
  if (e.offload_param == "nvme") {
    // NOTE [stage 3 parameter offload]: the shards past max_in_cpu on disk, one aligned run per
    // unit. In forward and backward the pool holds the shards read ahead (buffer_count), those
    // of the units whose all-gathers are in flight (as many as stage3_prefetch_bucket_size
    // reaches, and one more) and the two being taken (the request's, and the one before it whose
    // all-gather's input is not yet dropped: the 3B GPT's rank 0 held 7 + 1); in the step, which
    // reads nothing ahead, the writes in flight (buffer_count) and the one being filled.
    const int64_t kept = std::min(part, op.max_in_cpu);
    e.params = kept * b;
    e.param_disk = (part - kept) * b;
    if (in.spill_coming) e.spill_disk = part * 4;  // every unit's fp32 shard, until adopted
    if (shard > 0) {
      const int64_t units = (part - kept + shard - 1) / shard;
      e.param_disk = units * static_cast<int64_t>(io::align_up(shard * b));
      const int64_t gathering =
          c.zero_optimization.stage3_prefetch_bucket_size / std::max<int64_t>(1, in.largest_unit) +
          1;
      const int64_t pool = std::min(units, op.buffer_count + gathering + 2) *
                           static_cast<int64_t>(io::align_up(shard * b));
      e.swap_buffers += pool + in_transit(units);
      if (in.on_gpu) e.host_part += pool;
    }
  } else if (e.offload_param == "cpu") {
    e.host_part += e.params;  // every shard in host memory
    if (shard > 0) e.swap_buffers += in_transit((part + shard - 1) / shard);
  }
  const int64_t sub = std::min<int64_t>(c.zero_optimization.sub_group_size, part);
  const int64_t groups = sub > 0 ? (part + sub - 1) / sub : 0;
  const auto& oo = c.zero_optimization.offload_optimizer;
  if (e.offload_optimizer == "nvme") {
    // The fp32 weights are swapped with the states under mixed precision or with the
    // parameters on disk.
    const int64_t T = states + (mixed || e.offload_param == "nvme" ? 1 : 0);
    const int64_t wanted = 1 + (oo.pipeline_read ? 1 : 0) + (oo.pipeline_write ? 1 : 0);
    const int64_t slots =
        std::min<int64_t>({std::max<int64_t>(oo.buffer_count, 1), wanted, groups});
    int64_t buffers = slots * T * static_cast<int64_t>(io::align_up(4 * sub));
    if (in.on_gpu) {
      // The gradients' host buffer and the sub-groups going up (NOTE [host step]).
      buffers +=
          part * b + std::min<int64_t>(std::max<int64_t>(2, oo.buffer_count), groups) * sub * b;
      e.host_part += buffers;
    }
    e.swap_buffers += buffers;
    for (int64_t g = 0; g < groups; ++g) {
      e.disk += T * static_cast<int64_t>(io::align_up(4 * std::min(sub, part - g * sub)));
    }
  } else if (e.offload_optimizer == "cpu") {
    // NOTE [host step]: the fp32 values (fp32 too) and the states in host memory, with the
    // gradients' host buffer and, under mixed precision, buffer_count sub-groups going up.
    e.master = part * 4;
    e.optimizer_state = states * part * 4;
    const int64_t buffers =
        part * b +
        (mixed ? std::min<int64_t>(std::max<int64_t>(2, oo.buffer_count), groups) * sub * b : 0);
    e.swap_buffers += buffers;
    e.host_part += e.master + e.optimizer_state + buffers;
  } else {
    e.master = mixed ? part * 4 : 0;
    e.optimizer_state = states * part * 4;
  }
  // bf16.bf16_master_weights_and_grads: the bf16 parameters are the values (check_supported
  // allows it in memory only); the step widens a piece of them beside a piece of gradients.
  const bool bf16_master = c.bf16.bf16_master_weights_and_grads && stage > 0;
  // bf16.bf16_optimizer_states: the states in bf16 too, held by the same store.
  const bool bf16_states = bf16_master && c.bf16.bf16_optimizer_states;
  if (bf16_master) {
    if (e.offload_optimizer == "cpu") e.host_part -= e.master;
    e.master = 0;
  }
  if (bf16_states) {
    // Every state in bf16; Muon's exp_avg alone (its Newton-Schulz inputs, updates and their
    // gathered copies, counted above as states, stay fp32).
    const int64_t saved = c.optimizer.type == "Muon" ? part * 2 : e.optimizer_state / 2;
    if (e.offload_optimizer == "cpu") e.host_part -= saved;
    e.optimizer_state -= saved;
  }
  if (mixed) {
    // The fp32 gradients the optimizer reads (precision/part_store.cpp's Fp32Grads): one
    // sub-group through the swap file, a piece of 2^22 in memory; none when a bf16 step fuses.
    const bool fuses = c.bf16.enabled && probe && probe->fuses_bf16();
    if (bf16_master) {
      // A piece of the parameters, of the gradients and of each bf16 state, widened.
      e.step_scratch =
          (2 + (bf16_states ? states : 0)) * std::min<int64_t>(int64_t{1} << 20, part) * 4;
    } else if (e.offload_optimizer == "nvme" || e.offload_optimizer == "cpu") {
      e.step_scratch = std::max<int64_t>(1, sub) * 4;
    } else if (!fuses) {
      e.step_scratch = std::min<int64_t>(int64_t{1} << 22, part) * 4;
    }
    if (in.on_gpu && e.offload_optimizer != "none") e.host_part += e.step_scratch;
  }
  if (stage == 3 && e.offload_optimizer == "nvme" && e.offload_param == "nvme" && !in.on_gpu) {
    // NOTE [gradients on disk]: the shard in a swap file of its own, beside the optimizer's.
    const at::ScalarType dtype = training_dtype(c);
    e.grads = 0;
    e.grad_disk = offload::GradSwapper::file_bytes_for(part, dtype);
    e.swap_buffers += offload::GradSwapper::buffer_bytes_for(part, dtype, sub);
  }
  if (stage == 3) {
    e.gathered = (in.units.forward.empty() ? in.largest_unit
                                           : gathered_peak(in.units, c.zero_optimization)) *
                 b;
  }
  e.activations_known = in.activations >= 0;
  e.activations = std::max<int64_t>(0, in.activations);
  e.process = in.process;
  e.runtime = kRuntimeBytes;
  const int local = in.local > 0 ? std::min(in.local, in.world) : in.world;
  if (local > 1 && !in.on_gpu) {
    // The segment, and the sums (widened to fp32 for 16-bit) of a slot with the tree's partial
    // sums, one slot per level (ShmGroup::reduce).
    const int64_t slot = comm::CommOptions().shm_slot_bytes;
    const int64_t depth = static_cast<int64_t>(std::ceil(std::log2(static_cast<double>(local))));
    e.comm_buffers = 2 * local * slot + (1 + depth) * (slot / b) * 4;
  }
  // A bucket of the flat gradient space never crosses a group (the model at stages 0-2, a unit
  // at stage 3; NOTE [bucket cap] in src/zero/reducer.h). (A parameter larger than the bucket
  // size makes a larger bucket of its own; not counted.)
  const auto& z = c.zero_optimization;
  int64_t bucket = std::min(zero::capped_bucket_size(z.reduce_bucket_size, psi), psi);
  if (stage == 3 && in.largest_unit > 0) bucket = std::min(bucket, in.largest_unit);
  if (stage >= 2) {
    // The slots hold a bucket each; overlap_comm defaults to stage 3 (DeepSpeed's). Without
    // contiguous_gradients a bucket's slot is allocated when it fills and freed once reduced:
    // the same peak.
    const bool overlap = stage == z.stage ? z.overlap_comm : stage == 3;
    e.staging = (overlap ? 2 : 1) * bucket * b;
  }
  // A communication dtype of its own: the copies of the buckets in flight (NOTE [wire dtype]).
  if (communication_dtype(c, stage) != gradient_dtype(c, stage)) {
    e.staging += zero::kWireCopiesInFlight * bucket *
                 static_cast<int64_t>(c10::elementSize(communication_dtype(c, stage)));
  }
  // The allocator's share (NOTE [a bound on the peak]) of host memory: for a model on a GPU of
  // its host part (the caching allocator's slack on the device is not counted).
  if (in.on_gpu) {
    e.slack = (e.host_part + e.runtime) * kSlackPercent / 100;
    e.host_part += e.slack;
  } else {
    e.slack = (e.memory() + e.runtime) * kSlackPercent / 100;
  }
  return e;
}

Estimate estimate(const EstimateInput& in, const Config& c) {
  const auto& z = c.zero_optimization;
  return estimate(in, c, z.stage, z.offload_optimizer.device, z.offload_param.device);
}

std::vector<Estimate> estimate_all(const EstimateInput& in, const Config& c) {
  std::vector<Estimate> out;
  for (int stage = 0; stage <= 3; ++stage) {
    out.push_back(estimate(in, c, stage, "none"));
    if (stage > 0 && in.on_gpu) out.push_back(estimate(in, c, stage, "cpu"));
    if (stage > 0 && !in.on_gpu) out.push_back(estimate(in, c, stage, "nvme"));
  }
  if (in.on_gpu) {
    out.push_back(estimate(in, c, 3, "cpu", "cpu"));
    out.push_back(estimate(in, c, 3, "cpu", "nvme"));
    out.push_back(estimate(in, c, 3, "nvme", "nvme"));
  } else {
    out.push_back(estimate(in, c, 3, "nvme", "nvme"));
  }
  return out;
}

namespace {

// A value of /proc/meminfo in bytes ("MemAvailable"), or -1.
int64_t meminfo(const std::string& key) {
  std::ifstream f("/proc/meminfo");
  std::string name, unit;
  int64_t kib = 0;
  while (f >> name >> kib) {
    std::getline(f, unit);
    if (name == key + ":") return kib * 1024;
  }
  return -1;
}

// A number in a cgroup v2 file ("max" or missing: -1).
int64_t cgroup_value(const std::string& file) {
  std::ifstream f("/sys/fs/cgroup/" + file);
  std::string v;
  if (!(f >> v) || v == "max") return -1;
  return std::strtoll(v.c_str(), nullptr, 10);
}

int64_t parse_bytes(const std::string& text, const char* variable = "DSCPP_MEMORY_LIMIT") {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  int shift = 0;
  switch (end && *end ? std::toupper(*end) : 0) {
    case 0:
      break;
    case 'K':
      shift = 10;
      break;
    case 'M':
      shift = 20;
      break;
    case 'G':
      shift = 30;
      break;
    case 'T':
      shift = 40;
      break;
    default:
      shift = -1;
  }
  DSCPP_CHECK(v > 0 && shift >= 0 &&
                  (!*end || !end[1] || std::toupper(end[1]) == 'B' || std::toupper(end[1]) == 'I'),
              ConfigError, variable, "='", text,
              "' is not a number of bytes. HINT: for example 3G, 512M or 3221225472");
  return static_cast<int64_t>(v * static_cast<double>(int64_t{1} << shift));
}

}  // namespace

int64_t available_memory(std::string* source) {
  if (const char* env = std::getenv("DSCPP_MEMORY_LIMIT"); env && *env) {
    if (source) *source = std::string("DSCPP_MEMORY_LIMIT=") + env;
    return parse_bytes(env);
  }
  int64_t avail = meminfo("MemAvailable");
  if (source) *source = "MemAvailable";
  const int64_t max = cgroup_value("memory.max"), current = cgroup_value("memory.current");
  if (max > 0 && current >= 0 && (avail < 0 || max - current < avail)) {
    avail = std::max<int64_t>(0, max - current);
    if (source) *source = "the cgroup's memory.max";
  }
  return avail;
}

int64_t available_gpu_memory(int64_t free, std::string* source) {
  if (const char* env = std::getenv("DSCPP_GPU_MEMORY_LIMIT"); env && *env) {
    if (source) *source = std::string("DSCPP_GPU_MEMORY_LIMIT=") + env;
    return parse_bytes(env, "DSCPP_GPU_MEMORY_LIMIT");
  }
  if (source) *source = "free on the device";
  return free;
}

void check_fits(const EstimateInput& in, const Config& config, int64_t held, int local,
                int64_t gpu_available) {
  if (const char* skip = std::getenv("DSCPP_SKIP_MEMORY_CHECK"); skip && std::string(skip) == "1") {
    static std::once_flag said;
    std::call_once(said, [] {
      DSCPP_LOG_WARN("DSCPP_SKIP_MEMORY_CHECK=1: the pre-flight memory check is off");
    });
    return;
  }
  const Estimate e = estimate(in, config);
  std::string source, gpu_source;
  const int64_t avail = available_memory(&source);
  const int64_t gpu_avail = in.on_gpu ? available_gpu_memory(gpu_available, &gpu_source) : -1;
  // What the model's parameters hold already is on the GPU for a GPU model, in host memory
  // otherwise. The GPU's part is per rank (a GPU each), host memory is shared by `local` ranks.
  auto host_need = [&](const Estimate& o) {
    return std::max<int64_t>(0, o.host() - (in.on_gpu ? 0 : held)) * local;
  };
  auto gpu_need = [&](const Estimate& o) { return std::max<int64_t>(0, o.gpu() - held); };
  auto fit = [&](const Estimate& o) {
    return (avail < 0 || host_need(o) <= avail) && (gpu_avail < 0 || gpu_need(o) <= gpu_avail);
  };
  if (!fit(e)) {
    std::string fits;
    // Offload with the config's sub-groups, or else with small pipelined ones (the default
    // sub_group_size makes one buffer as large as the state it replaces).
    Config small = config;
    small.zero_optimization.sub_group_size = 10000000;
    small.zero_optimization.offload_optimizer.pipeline_read = true;
    small.zero_optimization.offload_optimizer.pipeline_write = true;
    auto per_rank = [&](const Estimate& o) {
      return in.on_gpu ? fmt::format("{} per GPU, {} host memory per rank", format_bytes(o.gpu()),
                                     format_bytes(o.host()))
                       : format_bytes(o.host()) + " per rank";
    };
    for (const Estimate& o : estimate_all(in, config)) {
      if (fit(o)) {
        fits += fmt::format("\n  {}: {}", o.describe(), per_rank(o));
      } else if (o.offload_optimizer != "none") {
        const Estimate sm = estimate(in, small, o.stage, o.offload_optimizer, o.offload_param);
        if (fit(sm)) {
          fits +=
              fmt::format("\n  {} with sub_group_size 10000000{}: {}", sm.describe(),
                          o.offload_optimizer == "nvme" ? ", pipeline_read and pipeline_write" : "",
                          per_rank(sm));
        }
      }
    }
    const bool gpu_short = gpu_avail >= 0 && gpu_need(e) > gpu_avail;
    const std::string where =
        gpu_short ? fmt::format("{} on the GPU{}, but {} is available there ({})",
                                format_bytes(gpu_need(e)),
                                held ? " beyond what the model holds already" : "",
                                format_bytes(gpu_avail), gpu_source)
                  : fmt::format(
                        "{} of host memory with {} rank(s) on this host{}, but {} is "
                        "available ({})",
                        format_bytes(host_need(e)), local,
                        !in.on_gpu && held ? " beyond what the model holds already" : "",
                        format_bytes(avail), source);
    DSCPP_FAIL(
        ConfigError, "training ", in.params, " trainable parameters at ", e.describe(), " needs ",
        format_bytes(e.gpu() + e.host()), " per rank beyond the program itself (parameters ",
        format_bytes(e.params), ", gradients ", format_bytes(e.grads), ", fp32 master weights ",
        format_bytes(e.master), ", optimizer state ", format_bytes(e.optimizer_state),
        e.swap_buffers ? ", swap and copy buffers " + format_bytes(e.swap_buffers) : "",
        e.gathered ? ", gathered units " + format_bytes(e.gathered) : "",
        e.staging ? ", gradient staging " + format_bytes(e.staging) : "",
        e.step_scratch + e.comm_buffers
            ? ", step and collective buffers " + format_bytes(e.step_scratch + e.comm_buffers)
            : "",
        e.activations_known ? ", activations " + format_bytes(e.activations)
                            : ", activations not counted: unknown for this model",
        ", runtime ", format_bytes(e.runtime), ", the allocator's share ", format_bytes(e.slack),
        ")",
        in.on_gpu ? fmt::format(", {} of it on the GPU and {} in host memory",
                                format_bytes(e.gpu()), format_bytes(e.host()))
                  : "",
        "; that is ", where,
        ". Settings that fit:", fits.empty() ? std::string("\n  none on this many ranks") : fits,
        "\nHINT: choose one of those (docs/offload.md), add ranks or hosts, or set "
        "DSCPP_SKIP_MEMORY_CHECK=1 to start anyway (dscpp estimate prints the table)");
  }
  // The swap files against the free space of their folders (both in one folder: together).
  const auto& z = config.zero_optimization;
  const std::string odir = z.offload_optimizer.nvme_path.value_or("");
  const std::string pdir = z.offload_param.nvme_path.value_or("");
  const bool together = e.disk > 0 && e.param_disk > 0 && odir == pdir;
  // zero::Init's spill file lives beside the parameters' swap file during set-up; in the
  // optimizer's folder it empties as that file fills (NOTE [spilled shards]). A spill on disk
  // already (in.spilled) is out of the free space measured now and is given back as it empties.
  const int64_t param_folder = e.param_disk + e.spill_disk;
  const int64_t one_folder =
      e.param_disk + e.grad_disk + std::max(e.disk - in.spilled, e.spill_disk);
  auto check_disk = [&](int64_t bytes, const std::string& dir, const std::string& what,
                        const char* key) {
    struct statvfs fs {};
    if (bytes <= 0 || ::statvfs(dir.c_str(), &fs) != 0) return;
    const int64_t free = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
    DSCPP_CHECK(bytes * local <= free, ConfigError, what, " need ", format_bytes(bytes),
                " per rank x ", local, " rank(s) on this host = ", format_bytes(bytes * local),
                " in '", dir, "', which has ", format_bytes(free),
                " free. HINT: free space there, point ", key,
                " at a larger disk, or add ranks on other hosts");
  };
  if (together) {
    check_disk(one_folder, odir,
               "the optimizer's, gradients' and parameters' swap files (with zero::Init's spill "
               "file)",
               "nvme_path");
  } else {
    check_disk(e.disk + e.grad_disk, odir, "the optimizer's (and gradients') swap files",
               "offload_optimizer.nvme_path");
    check_disk(param_folder, pdir, "the parameters' swap files (with zero::Init's spill file)",
               "offload_param.nvme_path");
  }
}

void check_gpt_fits(EstimateInput in, const Config& config, int local, int64_t gpu_available) {
  in.process = current_rss_bytes();  // libtorch, the data, the runtime's threads
  in.local = local;
  const Estimate e = estimate(in, config);
  DSCPP_LOG_INFO(
      "estimated peak RSS per rank {} (NOTE [a bound on the peak]): model states {}, gathered "
      "units {}, gradient staging {}, swap buffers {}, the step's fp32 gradients {}, the "
      "collectives' buffers {}, activations {}, the program {}, its runtime {} and the "
      "allocator's share {}",
      format_bytes(e.peak()), format_bytes(e.model_states()), format_bytes(e.gathered),
      format_bytes(e.staging), format_bytes(e.swap_buffers), format_bytes(e.step_scratch),
      format_bytes(e.comm_buffers), format_bytes(e.activations), format_bytes(e.process),
      format_bytes(e.runtime), format_bytes(e.slack));
  check_fits(in, config, /*held=*/0, in.local, gpu_available);
}

std::string format_bytes(int64_t bytes) {
  if (bytes < (int64_t{1} << 30)) return fmt::format("{:.1f} MiB", bytes / double(1 << 20));
  return fmt::format("{:.2f} GiB", bytes / double(int64_t{1} << 30));
}

}  // namespace dscpp::engine
