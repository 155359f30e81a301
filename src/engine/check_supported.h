// check_supported: the engine's decisions about what this dscpp does not do that span several keys
// or depend on the model (a stage with an optimizer, offload combinations, a client optimizer,
// the checkpoint writer, the fp16 loss scaler), in one list, run before the engine builds
// anything and by dscpp check. A single key's value dscpp does not act on is the parser's verdict
// (NOTE [key verdicts] in src/config/key_verdicts.h). A setting that would change what is
// trained or how much memory it takes is a ConfigError that names the key and says what to do;
// one that only observes is a warning logged once at start-up, so nothing is ever accepted in
// silence. docs/config.md lists the decisions.
#pragma once

#include <c10/core/Device.h>

#include <string>
#include <vector>

#include "dscpp/config.h"
#include "dscpp/zero.h"

namespace torch::nn {
class Module;
}

namespace dscpp::engine {

// What the engine was given besides the config.
struct SupportContext {
  bool client_optimizer = false;
  bool client_lr_scheduler = false;
  // The model is on a device other than host memory (a GPU, or the tests' stand-in for one), so
  // offload to "cpu" copies.
  bool model_on_device = false;
  // The device of the model's parameters ("cpu", "cuda:0", "cuda"), and whether
  // InitOptions::device_link was given (then dscpp makes no link of its own).
  std::string device = "cpu";
  bool device_link_given = false;
  // The world size and the ranks of one host that will share memory (1: the collectives go over
  // the network between every pair of ranks); 0: not known yet (initialize() judges what needs
  // them once its communicator exists: secondary_partition_size).
  int world = 0;
  int host_group = 0;
  std::string collectives;  // the backend that case would use, for the error
};

// Throws ConfigError for the first setting that is refused. Returns the warnings (also logged on
// rank 0 by the caller) for settings that are accepted but not acted on.
std::vector<std::string> check_supported(const Config& config, const SupportContext& context);

// What `dscpp check` decides on `config` for a job of context.world ranks (> 0): check_supported,
// then the batch triangle resolved at that world size (`where` names where it came from, for the
// error). Throws ConfigError as initialize() would; returns every warning, the parser's first.
std::vector<std::string> check_config(Config& config, const SupportContext& context,
                                      const std::string& where);

// zero_optimization.zero_hpz_partition_size (NOTE [secondary partition] in src/zero/fetcher.h)
// against `host` ranks sharing memory among `world` (collectives: the backend, for the error):
// the secondary partition's size (1: none). Throws ConfigError; adds the no-effect warning.
int secondary_partition_size(const Config& config, int host, int world,
                             const std::string& collectives, std::vector<std::string>* warnings);

// What the program passed beside the config (InitOptions::optimizer, lr_scheduler) against the
// config's optimizer and scheduler sections: one of each source at most, and an optimizer.
// Throws ConfigError.
void check_optimizer_sources(const Config& config, bool client_optimizer, bool client_lr_scheduler);

// InitOptions::device_link against the model's device. Throws ConfigError.
void check_device_link(const c10::Device& link, const c10::Device& model);

// What the engine decides from the model itself, for a job of `world` ranks, before it builds
// anything: trainable parameters exist, are fp32 and on one device; zero::Init's shards only at
// stage 3; every torch_autocast.lower_precision_safe_modules entry names a module class; at
// stage 3 every unit named (`zero_units`, leaf_module) matches a module, no trainable parameter
// is in two units, and with offload_param nvme each shard on disk fits offload_param.buffer_size
// (stage 3's plan, src/zero/stage3_plan.h). Throws ConfigError; returns the warnings (a safe
// module class that holds no parameters itself). initialize() runs it right after the batch is
// resolved and logs them on rank 0; dscpp::check and `dscpp check --model` run the same.
std::vector<std::string> check_model(const Config& config, torch::nn::Module& model,
                                     const zero::UnitPolicy& zero_units, int world);

// The job a model's memory is judged for.
struct ModelFit {
  int world = 1;
  int local = 1;                  // ranks on this host (they share its memory)
  bool device_link = false;       // InitOptions::device_link given: the model acts as on a device
  int64_t activation_bytes = -1;  // one micro-batch's, when known (InitOptions::activation_bytes)
};

// NOTE [pre-flight] (estimate.h) for `model`: check_fits with its trainable parameters counted
// (those it holds already, in host memory, not counted twice; a model built for its shapes only,
// zero::ShapesOnly, holds none). Throws ConfigError.
void model_fits(const Config& config, torch::nn::Module& model, const ModelFit& fit);

}  // namespace dscpp::engine
