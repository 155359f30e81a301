// The autograd functions zero::call and zero::checkpoint thread through a unit (NOTE [stage 3
// backward] in stage3.h), and the registry that maps a module to the stage-3 unit it is. Their
// apply() takes the tensors as an at::TensorList: libtorch counts a std::vector argument as no
// tensor at all, and the function would then not take part in backward.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dscpp/zero.h"

namespace torch::nn {
class Module;
}

namespace dscpp::zero {

class Stage3;

// Which stage-3 engine a module belongs to, and how.
struct UnitEntry {
  int64_t owner = 0;    // the Stage3's registry id
  int unit = -1;        // the unit, or -1: a module of the model in no unit
  bool inside = false;  // the module lies inside the unit (it is not the unit itself)
};

namespace registry {
// Registers a Stage3 and its modules; returns its id.
int64_t add(Stage3* owner,
            const std::vector<std::pair<const torch::nn::Module*, UnitEntry>>& modules);
void remove(int64_t owner);
// The entry of `module`, if a live stage-3 engine holds it.
bool find(const torch::nn::Module* module, UnitEntry* entry);
// The Stage3 with id `owner`, or null when it is gone.
Stage3* owner(int64_t id);
}  // namespace registry

// Identity in forward, threaded through a unit's outputs (kOutputs: its backward runs before the
// unit's own and gathers the unit) or inputs (kInputs: its backward runs after the unit's own).
enum class UnitSide { kOutputs, kInputs };
template <UnitSide kSide>
struct UnitBoundary : public torch::autograd::Function<UnitBoundary<kSide>> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::TensorList tensors, int64_t owner,
                                                int64_t unit);
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads);
};
using UnitOutputs = UnitBoundary<UnitSide::kOutputs>;
using UnitInputs = UnitBoundary<UnitSide::kInputs>;

// activation_checkpointing.cpu_checkpointing, process-wide as DeepSpeed's checkpointing module
// (its engine configures it; dscpp's engine calls this at initialize()): checkpointed units'
// inputs on a device are kept in host memory until backward.
void set_cpu_checkpointing(bool on);
bool cpu_checkpointing();

// zero::checkpoint: forward runs fn without keeping activations; backward (gathers the unit at
// stage 3 and) runs fn again with autograd on and backpropagates through it. With
// cpu_checkpointing the inputs it keeps for that are copied to pinned host memory in forward
// and back to their device in backward.
struct CheckpointFn : public torch::autograd::Function<CheckpointFn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::TensorList inputs,
                                                std::shared_ptr<detail::UnitFn> fn,
                                                torch::nn::Module* module, int64_t owner,
                                                int64_t unit);
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads);
};

// What `node` is to stage-3 unit `unit` of engine `owner`: the backward of one of its calls'
// UnitOutputs (where backward enters the call), UnitInputs (where it leaves) or checkpoint
// (whose edges are the call's inputs), or none of these.
enum class UnitNode { kNone, kOutputs, kInputs, kCheckpoint };
UnitNode unit_node(torch::autograd::Node* node, int64_t owner, int unit);

// For the reducers' walk of the loss's graph: the trainable parameters that `node` reaches
// through a backward of its own (a CheckpointFn's module's), or none.
std::vector<at::Tensor> parameters_behind(torch::autograd::Node* node);

}  // namespace dscpp::zero
