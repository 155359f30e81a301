// ZeRO stage 3 for a module type in one line: declare the holder with DSCPP_ZERO_UNIT instead of
// TORCH_MODULE, and every module of that type is a stage-3 unit whose forward, called through
// the holder, goes through dscpp::zero::call (include/dscpp/zero.h):
//
//   struct BlockImpl : torch::nn::Module {
//     BlockImpl(int64_t width) { ... }
//     at::Tensor forward(const at::Tensor& x) { ... }
//   };
//   DSCPP_ZERO_UNIT(Block);          // instead of TORCH_MODULE(Block)
//   ...
//   Block block{nullptr};            // a member, registered as usual
//   block = register_module("block", Block(1024));
//   x = block(x);                    // a stage-3 unit at stage 3, a plain call below it
//
// No unit policy is needed (InitOptions::zero_units and the config's leaf_module add to the
// types marked here). The holder routes `block(x)`; `block->forward(x)`, torch::nn::Sequential
// and AnyModule reach the module past its holder, and so past zero::call: at stage 3 the first
// forward names such a unit (NOTE [released reads] in src/zero/stage3.h). Tensor arguments are
// the unit's inputs (autograd threads them, NOTE [stage 3 backward]); other arguments are passed
// as they are. The module's forward must return one tensor.
#pragma once

#include <c10/util/Type.h>
#include <torch/nn/pimpl.h>

#include <cstddef>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "dscpp/zero.h"

namespace dscpp::zero {

// Marks every module whose Module::name() is `type_name` as a stage-3 unit, process-wide (what
// DSCPP_ZERO_UNIT's holders do for their module type). Idempotent, thread-safe.
void mark_unit_type(const std::string& type_name);

namespace detail {

template <typename T>
constexpr bool is_tensor_v = std::is_same_v<std::decay_t<T>, at::Tensor>;

inline void collect_tensor(std::vector<at::Tensor>& inputs, const at::Tensor& t) {
  inputs.push_back(t);
}
template <typename T>
void collect_tensor(std::vector<at::Tensor>&, const T&) {}

// Runs m.forward(args...) as unit m: the tensor arguments are the unit's inputs, in order.
template <typename Impl, typename... Args>
at::Tensor forward_as_unit(Impl& m, Args&... args) {
  using Out = decltype(m.forward(args...));
  static_assert(std::is_same_v<std::decay_t<Out>, at::Tensor>,
                "DSCPP_ZERO_UNIT: the module's forward must return one at::Tensor; run a module "
                "with other outputs through dscpp::zero::call in its parent's forward");
  std::vector<at::Tensor> inputs;
  (collect_tensor(inputs, args), ...);
  UnitFn fn = [&](const std::vector<at::Tensor>& in) {
    size_t next = 0;
    // Each tensor argument is replaced by its input (threaded through autograd), left to right:
    // a braced list evaluates in order.
    auto pick = [&](auto& a) -> decltype(auto) {
      if constexpr (is_tensor_v<decltype(a)>) {
        return static_cast<const at::Tensor&>(in[next++]);
      } else {
        return (a);
      }
    };
    std::tuple<decltype(pick(args))...> picked{pick(args)...};
    return std::vector<at::Tensor>{
        std::apply([&](auto&&... a) { return m.forward(a...); }, picked)};
  };
  return run_unit(m, fn, inputs, /*recompute=*/false)[0];
}

}  // namespace detail

// The holder DSCPP_ZERO_UNIT declares: torch::nn::ModuleHolder<Impl> whose call runs the module
// as a stage-3 unit, and whose construction marks Impl's type.
template <typename Impl>
class UnitHolder : public torch::nn::ModuleHolder<Impl> {
  using Base = torch::nn::ModuleHolder<Impl>;

 public:
  UnitHolder() : Base() { mark(); }
  /* implicit */ UnitHolder(std::nullptr_t) : Base(nullptr) {}  // NOLINT
  template <typename Head, typename... Tail,
            typename = std::enable_if_t<!(std::is_base_of_v<UnitHolder, std::decay_t<Head>> &&
                                          sizeof...(Tail) == 0)>>
  explicit UnitHolder(Head&& head, Tail&&... tail)
      : Base(std::forward<Head>(head), std::forward<Tail>(tail)...) {
    mark();
  }
  /* implicit */ UnitHolder(std::shared_ptr<Impl> module) : Base(std::move(module)) {  // NOLINT
    mark();
  }

  template <typename... Args>
  at::Tensor operator()(Args&&... args) {
    return detail::forward_as_unit(*this->get(), args...);
  }

 private:
  static void mark() {
    static const bool marked = [] {
      mark_unit_type(c10::demangle(typeid(Impl).name()));
      return true;
    }();
    (void)marked;
  }
};

}  // namespace dscpp::zero

// Declares the holder `Name` of `Name##Impl` (as TORCH_MODULE does) as a stage-3 unit type.
#define DSCPP_ZERO_UNIT(Name)                                        \
  class Name : public ::dscpp::zero::UnitHolder<Name##Impl> {        \
   public:                                                           \
    using ::dscpp::zero::UnitHolder<Name##Impl>::UnitHolder;         \
    using Impl = Name##Impl;                                         \
  }
