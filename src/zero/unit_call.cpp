// zero::call and zero::checkpoint (include/dscpp/zero.h): the registry of stage-3 units, and the
// autograd functions threaded through a unit (unit_functions.h, NOTE [stage 3 backward]).
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/module.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "dscpp/error.h"
#include "dscpp/safetensors.h"
#include "precision/autocast.h"
#include "profiling/flops_profiler.h"
#include "zero/stage3.h"
#include "zero/unit_functions.h"

namespace dscpp::zero {

// ----- the registry ---------------------------------------------------------------------------

namespace registry {
namespace {

struct State {
  std::mutex mu;
  int64_t next_id = 1;
  std::unordered_map<int64_t, Stage3*> owners;
  std::unordered_map<const torch::nn::Module*, UnitEntry> modules;
};

State& state() {
  static State s;
  return s;
}

}  // namespace

int64_t add(Stage3* owner,
            const std::vector<std::pair<const torch::nn::Module*, UnitEntry>>& modules) {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  const int64_t id = s.next_id++;
  s.owners[id] = owner;
  for (const auto& [m, e] : modules) {
    UnitEntry entry = e;
    entry.owner = id;
    auto [it, fresh] = s.modules.emplace(m, entry);
    DSCPP_CHECK(fresh || s.owners.count(it->second.owner) == 0, ConfigError,
                "a module of this model is already a stage-3 unit of another live engine. HINT: "
                "give each engine its own model");
    it->second = entry;
  }
  return id;
}

void remove(int64_t owner) {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  s.owners.erase(owner);
  for (auto it = s.modules.begin(); it != s.modules.end();) {
    if (it->second.owner == owner)
      it = s.modules.erase(it);
    else
      ++it;
  }
}

bool find(const torch::nn::Module* module, UnitEntry* entry) {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  auto it = s.modules.find(module);
  if (it == s.modules.end()) return false;
  *entry = it->second;
  return true;
}

Stage3* owner(int64_t id) {
  State& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  auto it = s.owners.find(id);
  return it == s.owners.end() ? nullptr : it->second;
}

}  // namespace registry

namespace {

Stage3& owner_or_fail(int64_t id, int64_t unit) {
  Stage3* s = registry::owner(id);
  DSCPP_CHECK(s, Error, "backward reached stage-3 unit ", unit,
              " of an engine that no longer "
              "exists. HINT: keep the engine alive until backward has run");
  return *s;
}

}  // namespace

// ----- the autograd functions -----------------------------------------------------------------

template <UnitSide kSide>
torch::autograd::variable_list UnitBoundary<kSide>::forward(torch::autograd::AutogradContext* ctx,
                                                            at::TensorList tensors, int64_t owner,
                                                            int64_t unit) {
  ctx->saved_data["owner"] = owner;
  ctx->saved_data["unit"] = unit;
  return tensors.vec();
}

template <UnitSide kSide>
torch::autograd::variable_list UnitBoundary<kSide>::backward(torch::autograd::AutogradContext* ctx,
                                                             torch::autograd::variable_list grads) {
  const int64_t unit = ctx->saved_data["unit"].toInt();
  Stage3& s = owner_or_fail(ctx->saved_data["owner"].toInt(), unit);
  if (kSide == UnitSide::kOutputs)
    s.enter_backward(static_cast<int>(unit));
  else
    s.inputs_done(static_cast<int>(unit));
  grads.resize(grads.size() + 2);  // none for owner and unit
  return grads;
}

template struct UnitBoundary<UnitSide::kOutputs>;
template struct UnitBoundary<UnitSide::kInputs>;

namespace {

std::atomic<bool> g_cpu_checkpointing{false};

}  // namespace

void set_cpu_checkpointing(bool on) { g_cpu_checkpointing = on; }
bool cpu_checkpointing() { return g_cpu_checkpointing; }

namespace {

// Keeps a checkpointed unit's fn (and module) alive in its autograd node until backward.
struct FnHolder : torch::CustomClassHolder {
  std::shared_ptr<detail::UnitFn> fn;
  torch::nn::Module* module = nullptr;
};

}  // namespace

torch::autograd::variable_list CheckpointFn::forward(torch::autograd::AutogradContext* ctx,
                                                     at::TensorList inputs,
                                                     std::shared_ptr<detail::UnitFn> fn,
                                                     torch::nn::Module* module, int64_t owner,
                                                     int64_t unit) {
  auto holder = c10::make_intrusive<FnHolder>();
  holder->fn = fn;
  holder->module = module;
  ctx->saved_data["fn"] = c10::IValue::make_capsule(holder);
  ctx->saved_data["owner"] = owner;
  ctx->saved_data["unit"] = unit;
  // The last input is a scalar that requires grad, so the node exists even when no real input
  // does (a unit fed token ids): its parameters' gradients come from the recomputation.
  torch::autograd::variable_list in = inputs.slice(0, inputs.size() - 1).vec();
  // cpu_checkpointing: an input on a device is kept as a copy in pinned host memory (the copy
  // is ordered on the device's stream before anything that could reuse the input's memory).
  torch::autograd::variable_list kept;
  c10::List<bool> requires_grad;
  c10::List<std::string> device;  // where each input goes back to; "" for one kept as it was
  const bool to_host = cpu_checkpointing();
  for (const auto& t : in) {
    requires_grad.push_back(t.defined() && t.requires_grad());
    if (to_host && t.defined() && !t.is_cpu()) {
      at::Tensor host = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
      host.copy_(t.detach(), /*non_blocking=*/true);
      kept.push_back(host);
      device.push_back(t.device().str());
    } else {
      kept.push_back(t);
      device.push_back("");
    }
  }
  ctx->save_for_backward(kept);
  ctx->saved_data["requires_grad"] = requires_grad;
  ctx->saved_data["device"] = device;
  // The recomputation in backward runs under the autocast settings of this forward (NOTE
  // [autocast] in src/precision/autocast.h), as PyTorch's checkpoint does.
  const precision::AutocastState ac = precision::AutocastState::current();
  ctx->saved_data["autocast"] =
      c10::List<int64_t>({ac.cpu, ac.cuda, static_cast<int64_t>(ac.cpu_dtype),
                          static_cast<int64_t>(ac.cuda_dtype), ac.cache});
  at::NoGradGuard no_grad;  // forward keeps no activations (Function::apply runs us without grad)
  return (*fn)(in);
}

torch::autograd::variable_list CheckpointFn::backward(torch::autograd::AutogradContext* ctx,
                                                      torch::autograd::variable_list grads) {
  auto holder = c10::static_intrusive_pointer_cast<FnHolder>(ctx->saved_data["fn"].toCapsule());
  const int64_t owner = ctx->saved_data["owner"].toInt();
  const int unit = static_cast<int>(ctx->saved_data["unit"].toInt());
  Stage3* stage3 = owner ? &owner_or_fail(owner, unit) : nullptr;
  if (stage3) stage3->enter_backward(unit);
  // Recompute with autograd on, from detached copies of the inputs, then backpropagate through
  // the recomputation: the parameters' gradients accumulate as usual, the inputs' are returned.
  torch::autograd::variable_list saved = ctx->get_saved_variables();
  const c10::List<bool> requires_grad = ctx->saved_data["requires_grad"].toBoolList();
  const auto device = ctx->saved_data["device"].toList();
  torch::autograd::variable_list inputs;
  for (size_t i = 0; i < saved.size(); ++i) {
    at::Tensor d = saved[i].detach();
    const std::string where = device.get(i).toStringRef();
    if (!where.empty()) d = d.to(c10::Device(where), /*non_blocking=*/true);
    if (requires_grad.get(i)) d.requires_grad_(true);
    inputs.push_back(d);
  }
  const c10::List<int64_t> ac = ctx->saved_data["autocast"].toIntList();
  precision::AutocastState forward_autocast;
  forward_autocast.cpu = ac.get(0) != 0;
  forward_autocast.cuda = ac.get(1) != 0;
  forward_autocast.cpu_dtype = static_cast<at::ScalarType>(ac.get(2));
  forward_autocast.cuda_dtype = static_cast<at::ScalarType>(ac.get(3));
  forward_autocast.cache = ac.get(4) != 0;
  torch::autograd::variable_list outputs;
  {
    at::AutoGradMode enable(true);
    precision::AutocastScope autocast(forward_autocast);
    outputs = (*holder->fn)(inputs);
  }
  torch::autograd::variable_list outs, out_grads;
  for (size_t i = 0; i < outputs.size() && i < grads.size(); ++i) {
    if (outputs[i].requires_grad() && grads[i].defined()) {
      outs.push_back(outputs[i]);
      out_grads.push_back(grads[i]);
    }
  }
  if (!outs.empty()) torch::autograd::backward(outs, out_grads);
  torch::autograd::variable_list in_grads;
  for (const auto& t : inputs) in_grads.push_back(t.requires_grad() ? t.grad() : at::Tensor());
  in_grads.push_back(at::Tensor());      // the scalar that made the node exist
  in_grads.resize(in_grads.size() + 4);  // none for fn, module, owner and unit
  if (stage3) stage3->inputs_done(unit);
  return in_grads;
}

namespace {

template <typename Fn>
bool is_call_of(torch::autograd::Node* node, int64_t owner, int unit) {
  auto* cn = dynamic_cast<torch::autograd::CppNode<Fn>*>(node);
  if (!cn) return false;
  const auto& d = cn->ctx_.saved_data;
  auto o = d.find("owner"), u = d.find("unit");
  return o != d.end() && u != d.end() && o->second.toInt() == owner && u->second.toInt() == unit;
}

}  // namespace

UnitNode unit_node(torch::autograd::Node* node, int64_t owner, int unit) {
  if (is_call_of<UnitOutputs>(node, owner, unit)) return UnitNode::kOutputs;
  if (is_call_of<UnitInputs>(node, owner, unit)) return UnitNode::kInputs;
  if (is_call_of<CheckpointFn>(node, owner, unit)) return UnitNode::kCheckpoint;
  return UnitNode::kNone;
}

std::vector<at::Tensor> parameters_behind(torch::autograd::Node* node) {
  auto* cn = dynamic_cast<torch::autograd::CppNode<CheckpointFn>*>(node);
  if (!cn) return {};
  auto it = cn->ctx_.saved_data.find("fn");
  if (it == cn->ctx_.saved_data.end()) return {};
  auto holder = c10::static_intrusive_pointer_cast<FnHolder>(it->second.toCapsule());
  if (!holder->module) return {};
  return holder->module->parameters(/*recurse=*/true);
}

// ----- GatheredParameters ---------------------------------------------------------------------

GatheredParameters::GatheredParameters(torch::nn::Module& module,
                                       std::optional<int> modifier_rank) {
  UnitEntry e;
  if (!registry::find(&module, &e)) return;  // not a stage-3 model: whole already
  Stage3* s = registry::owner(e.owner);
  if (!s) return;
  owner_ = e.owner;
  scope_ = s->open_scope(module, modifier_rank);
}

GatheredParameters::~GatheredParameters() noexcept(false) {
  if (!owner_) return;
  Stage3* s = registry::owner(owner_);
  DSCPP_CHECK(s, Error,
              "a GatheredParameters scope outlived its stage-3 engine. HINT: close it "
              "before the engine is destroyed");
  if (std::uncaught_exceptions() > 0) {
    s->abandon_scope(scope_);  // unwinding: no collectives, no second exception
    return;
  }
  s->close_scope(scope_);
}

// ----- zero::load_weights ---------------------------------------------------------------------

std::map<std::string, std::string> load_weights(torch::nn::Module& model, const std::string& path) {
  UnitEntry e;
  Stage3* s = registry::find(&model, &e) ? registry::owner(e.owner) : nullptr;
  if (!s) return safetensors::load_into(model, path);
  return s->load_weights(path);
}

// ----- zero::call / zero::checkpoint ----------------------------------------------------------

namespace detail {

std::vector<at::Tensor> checkpoint_apply(torch::nn::Module& unit, const UnitFn& fn,
                                         const std::vector<at::Tensor>& inputs, int64_t owner,
                                         int64_t index) {
  std::vector<at::Tensor> in = inputs;
  in.push_back(at::zeros({}).requires_grad_(true));  // see CheckpointFn::forward
  return CheckpointFn::apply(at::TensorList(in), std::make_shared<UnitFn>(fn), &unit, owner, index);
}

namespace {
std::vector<at::Tensor> run_unit_in_scope(torch::nn::Module& unit, const UnitFn& fn,
                                          const std::vector<at::Tensor>& inputs, bool recompute) {
  UnitEntry e;
  if (registry::find(&unit, &e)) {
    Stage3* s = registry::owner(e.owner);
    DSCPP_CHECK(s, Error, "internal: a stage-3 unit without its engine");
    if (e.unit < 0) return fn(inputs);  // a module of the model that is not a unit
    DSCPP_CHECK(!e.inside, Error, "zero::call on module '", unit.name(),
                "', which lies inside "
                "stage-3 unit '",
                s->unit_name(e.unit),
                "': its parameters are only gathered "
                "when the whole unit runs. HINT: call the unit itself, or make this module a "
                "unit of its own (InitOptions::zero_units)");
    return s->run_unit(e.unit, fn, inputs, recompute);
  }
  if (!recompute || !at::GradMode::is_enabled()) return fn(inputs);
  // Below stage 3: activation checkpointing alone.
  return checkpoint_apply(unit, fn, inputs, 0, -1);
}
}  // namespace

std::vector<at::Tensor> run_unit(torch::nn::Module& unit, const UnitFn& fn,
                                 const std::vector<at::Tensor>& inputs, bool recompute) {
  // A unit is a module scope of the flops profiler (NOTE [flops profiler]), named by its path.
  const std::string scope = profiling::unit_scope_name(unit);
  if (scope.empty()) return run_unit_in_scope(unit, fn, inputs, recompute);
  RECORD_USER_SCOPE(scope);
  return run_unit_in_scope(unit, fn, inputs, recompute);
}

}  // namespace detail
}  // namespace dscpp::zero
