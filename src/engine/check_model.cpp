// Implements check_model and model_fits (check_supported.h) and dscpp::check (dscpp/engine.h):
// the engine's decisions that need the model, made before anything is built.
#include <torch/nn/module.h>

#include <algorithm>

#include "dscpp/device_link.h"
#include "dscpp/engine.h"
#include "dscpp/error.h"
#include "dscpp/process_env.h"
#include "engine/check_supported.h"
#include "engine/estimate.h"
#include "precision/autocast.h"
#include "zero/partition.h"
#include "zero/presharded.h"
#include "zero/stage3_plan.h"
#include "zero/unit_policy.h"

namespace dscpp::engine {

std::vector<std::string> check_model(const Config& config, torch::nn::Module& model,
                                     const zero::UnitPolicy& zero_units, int world) {
  std::vector<std::string> warnings;
  const auto& z = config.zero_optimization;
  const zero::NamedParams np = zero::trainable_parameters(model);
  zero::check_fp32_on_one_device(np.params, np.names);
  if (z.stage != 3) {
    for (size_t i = 0; i < np.params.size(); ++i) {
      DSCPP_CHECK(!zero::is_presharded(np.params[i]), ConfigError, "parameter '", np.names[i],
                  "' was sharded by zero::Init, which needs ZeRO stage 3, but "
                  "zero_optimization.stage is ",
                  z.stage, ". HINT: build the model without zero::Init, or train at stage 3");
    }
  }
  // torch_autocast: every lower_precision_safe_modules entry names a module class of the model
  // (NOTE [autocast] in src/precision/autocast.h).
  if (config.torch_autocast.enabled) {
    const auto& modules = config.torch_autocast.lower_precision_safe_modules;
    precision::lower_precision_parameters(
        model, modules ? *modules : precision::default_lower_precision_modules(), &warnings);
  }
  if (z.stage != 3) return warnings;
  // Stage 3's plan (src/zero/stage3_plan.h): every unit named matches a module, no trainable
  // parameter is in two units, and with offload_param nvme each shard on disk fits one of its
  // buffers (DeepSpeed asserts a partition fits one buffer too).
  zero::check_each_matches(model, zero_units, z.leaf_module);
  bool whole_model = false;
  const std::vector<zero::UnitRoot> units =
      zero::find_units(model, zero::with_leaf_modules(zero_units, z.leaf_module), &whole_model);
  const zero::UnitAssignment a =
      zero::assign_to_units(units, np, z.stage3_param_persistence_threshold);
  if (z.offload_param.device != "nvme") return warnings;
  std::vector<int64_t> shards;
  for (const auto& unit : a.sharded)
    shards.push_back(zero::FlatLayout::of(unit.params, world).shard);
  const std::vector<int> slots = zero::disk_slots(shards, z.offload_param.max_in_cpu);
  int64_t largest = 0;
  for (size_t u = 0; u < shards.size(); ++u) {
    if (slots[u] >= 0) largest = std::max(largest, shards[u]);
  }
  DSCPP_CHECK(largest <= z.offload_param.buffer_size, ConfigError,
              "zero_optimization.offload_param.buffer_size ", z.offload_param.buffer_size,
              " elements is smaller than the largest stage-3 unit shard a rank puts on disk (",
              largest, " elements over ", world,
              " ranks), which must fit one buffer. HINT: set buffer_size to at least ", largest,
              ", or use smaller units");
  return warnings;
}

void check_optimizer_sources(const Config& config, bool client_optimizer,
                             bool client_lr_scheduler) {
  // Before anything is built: the optimizer's swap file would otherwise ask the config's
  // optimizer first, with other words.
  if (client_optimizer) {
    DSCPP_CHECK(config.optimizer.type.empty(), ConfigError, "both the config's optimizer section (",
                config.optimizer.type,
                ") and a client optimizer were given. HINT: remove one of them");
  } else {
    DSCPP_CHECK(!config.optimizer.type.empty(), ConfigError,
                "the config has no optimizer section and no optimizer was passed to "
                "initialize(). HINT: add {\"optimizer\": {\"type\": \"AdamW\", \"params\": "
                "{\"lr\": 1e-3}}}");
  }
  if (client_lr_scheduler) {
    DSCPP_CHECK(config.scheduler.type.empty(), ConfigError, "both the config's scheduler section (",
                config.scheduler.type,
                ") and a client LR scheduler were given. HINT: remove one of them");
  } else if (client_optimizer) {
    DSCPP_CHECK(config.scheduler.type.empty(), ConfigError,
                "a scheduler section needs the config's optimizer; with a client optimizer pass "
                "a client LR scheduler too");
  }
}

void check_device_link(const c10::Device& link, const c10::Device& model) {
  DSCPP_CHECK(link == model, ConfigError, "InitOptions::device_link copies to and from ", link,
              " but the model is on ", model,
              ". HINT: pass a link for the model's device, or none (dscpp makes one)");
}

void model_fits(const Config& config, torch::nn::Module& model, const ModelFit& fit) {
  // NOTE [pre-flight]: before anything is allocated, the memory this config asks for (the
  // activations only when they are known) against the memory this host has left (check_fits,
  // estimate.h), and for a model on a GPU (or the tests' stand-in for one) the GPU part against
  // what the GPU has free. A model built for its shapes only holds nothing yet.
  const zero::NamedParams np = zero::trainable_parameters(model);
  if (np.params.empty()) return;
  const at::Device device = np.params[0].device();
  EstimateInput in;
  in.world = fit.world;
  in.local = fit.local;
  in.on_gpu = !device.is_cpu() || fit.device_link;
  int64_t held = 0;  // what the model's trainable parameters hold already (the engine reuses it)
  for (const auto& p : np.params) {
    in.params += p.numel();
    if (!zero::is_presharded(p) && !zero::is_shapes_only(p))
      held += p.numel() * static_cast<int64_t>(p.element_size());
  }
  in.activations = fit.activation_bytes;
  in.spilled = zero::presharded_bytes_spilled();  // on disk already (NOTE [spilled shards])
  // zero::Init's fp32 shards in memory are held already too (the available memory is without
  // them): counting them again refused a 1.5B GPT at stage 3 that dscpp train's check, made
  // before the build, had let start.
  if (!in.on_gpu) held += zero::presharded_bytes_in_memory();
  check_fits(in, config, held, fit.local, offload::gpu_free_memory(device));
}

}  // namespace dscpp::engine

namespace dscpp {

std::vector<std::string> check(std::shared_ptr<torch::nn::Module> model,
                               const std::string& config_path_or_json, int world,
                               const InitOptions& options, int local_ranks) {
  DSCPP_CHECK(model, ConfigError, "check() was given a null model");
  const ProcessEnv env = detect_process_env();
  if (world == 0) world = env.world_size;  // this process's job
  if (local_ranks == 0) local_ranks = std::min(world, env.local_world_size);
  DSCPP_CHECK(world > 0, ConfigError, "check(): the world size must be > 0, got ", world);
  DSCPP_CHECK(local_ranks > 0 && local_ranks <= world, ConfigError, "check(): local_ranks ",
              local_ranks, " is not in [1, world ", world, "]");
  Config config = Config::parse(config_path_or_json);
  at::Device model_device(at::kCPU);
  for (const auto& p : model->parameters()) model_device = p.device();
  const std::string device = model_device.is_cpu() ? "cpu" : model_device.str();
  engine::SupportContext support{options.optimizer != nullptr, options.lr_scheduler != nullptr,
                                 device != "cpu" || options.device_link != nullptr, device,
                                 options.device_link != nullptr};
  support.world = world;
  // The ranks that will share memory, as initialize()'s communicator will find them for a model
  // in host memory (every host with local_ranks; shared memory and the hierarchy not turned off).
  support.host_group = device == "cpu" ? local_ranks : 1;
  support.collectives = device == "cpu" ? "Gloo over TCP" : "NCCL";
  std::vector<std::string> warnings =
      engine::check_config(config, support, "the world size given to dscpp::check()");
  engine::check_optimizer_sources(config, options.optimizer != nullptr,
                                  options.lr_scheduler != nullptr);
  if (options.device_link) engine::check_device_link(options.device_link->device(), model_device);
  const std::vector<std::string> model_warnings =
      engine::check_model(config, *model, options.zero_units, world);
  warnings.insert(warnings.end(), model_warnings.begin(), model_warnings.end());
  engine::ModelFit fit;
  fit.world = world;
  fit.local = local_ranks;
  fit.device_link = options.device_link != nullptr;
  fit.activation_bytes = options.activation_bytes;
  engine::model_fits(config, *model, fit);
  return warnings;
}

}  // namespace dscpp
