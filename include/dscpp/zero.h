// ZeRO stage 3 in a model's own code: where its units run, and how to touch whole parameters.
//
// At stage 3 a model's parameters are sharded over the ranks and a unit's full parameters exist
// only while the unit runs. libtorch's modules have no forward hooks, so the model marks where a
// unit runs:
//
//   x = dscpp::zero::call(*block, [&](const at::Tensor& h) { return block->forward(h); }, x);
//
// At stage 3 call() gathers the unit's parameters (or waits for the prefetch already under way),
// runs fn, releases them, and arranges for backward to gather them again before the unit's
// gradients are computed and to reduce-scatter those gradients into this rank's shard. Below
// stage 3, before the engine exists and after it is gone, call() is just fn(inputs...), so one
// model source serves every stage. docs/zero.md ("Stage 3") describes the design.
//
// Which submodules are units is a UnitPolicy: module paths as named_modules() spells them
// ("h.0"), matched by globs ("h.*"). It is given to dscpp::initialize through
// InitOptions::zero_units, the config's zero_optimization.leaf_module (DeepSpeed's) adds to it,
// and so do types marked by DSCPP_ZERO_UNIT (zero_unit.h); a model with no unit is one unit.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace dscpp {
struct Config;
namespace comm {
class Communicator;
}
}  // namespace dscpp

namespace dscpp::zero {

// Which submodules are stage-3 units: those whose module path matches one of `paths`, or whose
// type name (torch::nn::Module::name(), e.g. "dscpp::models::BlockImpl") matches one of `types`;
// both are globs ('*' matches any run of characters, '?' one character). A unit holds every
// parameter of its subtree that no earlier unit claimed; modules inside a unit are not units
// themselves.
struct UnitPolicy {
  std::vector<std::string> paths;
  std::vector<std::string> types;
  bool empty() const { return paths.empty() && types.empty(); }
};

namespace detail {
using UnitFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;
// Runs `fn` as unit `unit` (see call()); `recompute`: checkpoint().
std::vector<at::Tensor> run_unit(torch::nn::Module& unit, const UnitFn& fn,
                                 const std::vector<at::Tensor>& inputs, bool recompute);
// checkpoint()'s autograd function over `inputs` (owner, index: the stage-3 unit, or 0, -1).
std::vector<at::Tensor> checkpoint_apply(torch::nn::Module& unit, const UnitFn& fn,
                                         const std::vector<at::Tensor>& inputs, int64_t owner,
                                         int64_t index);

template <typename Fn, std::size_t... I>
at::Tensor invoke_unpacked(Fn& fn, const std::vector<at::Tensor>& in, std::index_sequence<I...>) {
  return fn(in[I]...);
}

template <typename Fn, typename... Ts>
at::Tensor run_one(torch::nn::Module& unit, Fn& fn, bool recompute, const Ts&... inputs) {
  static_assert((std::is_convertible_v<const Ts&, const at::Tensor&> && ...),
                "dscpp::zero::call takes tensors after fn; capture other arguments in fn");
  UnitFn f;
  if (recompute) {  // kept until backward: a copy of fn
    f = [fn](const std::vector<at::Tensor>& in) mutable {
      return std::vector<at::Tensor>{invoke_unpacked(fn, in, std::index_sequence_for<Ts...>{})};
    };
  } else {
    f = [&fn](const std::vector<at::Tensor>& in) {
      return std::vector<at::Tensor>{invoke_unpacked(fn, in, std::index_sequence_for<Ts...>{})};
    };
  }
  return run_unit(unit, f, std::vector<at::Tensor>{inputs...}, recompute)[0];
}
}  // namespace detail

// Runs fn(inputs...) as unit `unit` and returns its result (see the top of this file). Throws
// dscpp::Error naming the module when `unit` lies inside a unit (call the unit itself) or when
// units are nested.
template <typename Fn, typename... Ts>
at::Tensor call(torch::nn::Module& unit, Fn&& fn, const Ts&... inputs) {
  return detail::run_one(unit, fn, /*recompute=*/false, inputs...);
}

// As call(), but keeps no activations inside the unit: backward gathers the unit again, runs fn a
// second time with autograd on, and backpropagates through that (DeepSpeed's activation
// checkpointing). fn must compute the same thing both times, and is kept (copied) until
// backward: capture by value what it needs. Below stage 3 it still recomputes.
template <typename Fn, typename... Ts>
at::Tensor checkpoint(torch::nn::Module& unit, Fn&& fn, const Ts&... inputs) {
  return detail::run_one(unit, fn, /*recompute=*/true, inputs...);
}

// RAII scope in which every parameter of `module` (its subtree) is whole on every rank
// (DeepSpeed's GatheredParameters): at stage 3 it gathers the units holding them. A collective:
// every rank opens and closes the scope at the same point. With `modifier_rank`, the values that
// rank holds when the scope closes are written back into every rank's shards (and fp32 master
// weights), so a change made there (an initialisation, a surgery) is what trains on. Below stage
// 3 it does nothing, as in DeepSpeed: the parameters are whole already, and a change made on one
// rank stays on that rank. Scopes nest; one cannot be opened while a unit runs (dscpp::Error
// naming the unit), and they must close in reverse order of opening (a scope closed out of order
// writes nothing back, and the next zero::call, scope or backward throws dscpp::Error saying so).
class GatheredParameters {
 public:
  explicit GatheredParameters(torch::nn::Module& module,
                              std::optional<int> modifier_rank = std::nullopt);
  ~GatheredParameters() noexcept(false);
  GatheredParameters(const GatheredParameters&) = delete;
  GatheredParameters& operator=(const GatheredParameters&) = delete;

 private:
  int64_t owner_ = 0;  // the stage-3 engine's registry id; 0 below stage 3
  int scope_ = -1;
};

// A scope in which a model is built already sharded (DeepSpeed's zero.Init), so that no rank
// ever holds more than about one unit's full parameters plus its shards. Inside it, a model that
// calls zero::built(module, path) once it has built and initialised a submodule has that
// submodule moved to `device` and, when `units` makes it a unit, its parameters sharded at once:
// rank 0's values are broadcast, each rank keeps its shard, and the full parameters are freed.
// dscpp::initialize at ZeRO stage 3 with the same policy adopts the shards. The scope needs the
// job's communicator and the config the engine will get (its stage3_param_persistence_threshold
// and training dtype). Scopes do not nest; one belongs to the thread that opened it.
class Init {
 public:
  Init(std::shared_ptr<comm::Communicator> comm, UnitPolicy units, const Config& config,
       c10::Device device = c10::Device(c10::kCPU));
  ~Init();
  Init(const Init&) = delete;
  Init& operator=(const Init&) = delete;

  struct State;

 private:
  std::unique_ptr<State> state_;
};

// A scope in which a model is built for its shapes only: a model that calls zero::built(module,
// path) once it has built and initialised a submodule has that submodule's parameters and buffers
// replaced at once by one element broadcast to their shapes (names, shapes and dtypes stay, the
// values go), so no more than one submodule's values ever exist. dscpp::check (dscpp/engine.h)
// judges such a model as the one it describes: `dscpp check --model gpt` checks a GPT larger than
// this host's memory that way. initialize() refuses it. Does not nest with itself or zero::Init;
// belongs to the thread that opened it.
class ShapesOnly {
 public:
  ShapesOnly();
  ~ShapesOnly();
  ShapesOnly(const ShapesOnly&) = delete;
  ShapesOnly& operator=(const ShapesOnly&) = delete;
};

// Reads safetensors weights (named as the model's named_parameters()) into a model that a ZeRO
// stage-3 engine holds: each rank reads only the byte ranges of its own shards (and the whole of
// the parameters that stay whole on every rank), into its shards and fp32 master weights. Below
// stage 3 (no stage-3 engine holds the model) it is safetensors::load_into on this rank. Not a
// collective. Throws CheckpointError naming every missing, extra or mis-shaped tensor at once (the
// model is then unchanged), IoError for an unreadable file. Returns the file's metadata.
std::map<std::string, std::string> load_weights(torch::nn::Module& model, const std::string& path);

// Called by a model's constructor after building and initialising the submodule at `path` (its
// named_modules() path in the finished model, "h.0"). Inside a zero::Init scope: moves it to the
// scope's device and shards it if it is a unit (a collective: every rank builds the same model).
// Inside a ShapesOnly scope: drops its values. Outside both: nothing.
void built(torch::nn::Module& module, const std::string& path);

}  // namespace dscpp::zero
