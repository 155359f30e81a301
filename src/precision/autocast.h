// torch_autocast's pieces below the engine: libtorch's autocast settings of a thread as a value
// (a checkpointed unit recomputes under the settings its forward ran with), a scope that sets them,
// and which parameters' gradients travel in the autocast dtype.
//
// NOTE [autocast]: torch_autocast (DeepSpeed 0.17.2+, runtime/torch_autocast.py) keeps the
// parameters, their gradients and the optimizer in fp32 and runs the forward under
// torch.autocast: matrix products and convolutions in the autocast dtype, the rest as libtorch's
// autocast lists say. DeepSpeed's engine wraps its own forward; a dscpp program calls its model
// itself, so it runs the forward inside Engine::autocast(), and backward() refuses a loss whose
// forward did not (the gradients would be fp32 ones, silently). Backward runs outside the
// scope, as in PyTorch: each op's backward follows the dtypes its forward recorded.
// - Gradients at ZeRO stages 1-3: a parameter of a "lower precision safe" module (Linear,
//   Conv1d/2d/3d unless the config names others) is reduced over ranks in the autocast dtype (a
//   bucket's copy, NOTE [wire dtype] in src/zero/reducer.h), every other one in fp32;
//   communication_data_type is not read (DeepSpeed's get_param_comm_dtype ignores it once
//   autocast is on). At stage 0 every gradient is reduced in communication_data_type (unset:
//   the training dtype), as DeepSpeed 0.19.8's engine all-reduce does: it never asks autocast.
// - The cast cache is off in the scope: libtorch would keep each weight's 16-bit copy until the
//   scope ends, all of them at once (at stage 3 a whole model's worth, gathered shards included);
//   without it a copy lives as long as autograd keeps it. Values are the same.
// - fp16 is refused: it needs a gradient scaler (DeepSpeed's torch.amp.GradScaler) dscpp's
//   fp32 path does not have.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <set>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace dscpp::precision {

// libtorch's autocast settings of this thread, for the CPU and CUDA.
struct AutocastState {
  bool cpu = false;
  bool cuda = false;
  at::ScalarType cpu_dtype = at::kBFloat16;
  at::ScalarType cuda_dtype = at::kHalf;
  bool cache = true;
  static AutocastState current();
  bool any() const { return cpu || cuda; }
};

// Sets `state` on this thread until destroyed, then restores what was in force.
class AutocastScope {
 public:
  explicit AutocastScope(const AutocastState& state);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  AutocastState before_;
};

// The autocast settings torch_autocast asks for on `device`: on in `dtype`, the cache off.
AutocastState autocast_on(c10::DeviceType device, at::ScalarType dtype);

// torch_autocast.lower_precision_safe_modules' default: DeepSpeed's list, in Python's names.
const std::vector<std::string>& default_lower_precision_modules();

// The names (as named_parameters() gives them) of the parameters that `model`'s modules of the
// classes `modules` hold themselves (DeepSpeed's module.parameters(recurse=False)). A Python
// torch.nn name (torch.nn.Linear, torch.nn.modules.linear.Linear) names libtorch's module; any
// other is a C++ class as Module::name() spells it, its "Impl" suffix optional. Throws ConfigError
// naming every entry that matches no module of the model, with the classes the model has. With
// `warnings`, adds one for each entry whose modules hold no parameters themselves (their
// submodules' are not covered, as in DeepSpeed).
std::set<std::string> lower_precision_parameters(const torch::nn::Module& model,
                                                 const std::vector<std::string>& modules,
                                                 std::vector<std::string>* warnings = nullptr);

}  // namespace dscpp::precision
