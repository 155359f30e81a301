// Stage 3's first forward watched for reads of released units (NOTE [released reads] in
// stage3.h): a RecordFunction observer on the engine's thread.
#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <fmt/format.h>
#include <torch/nn/module.h>

#include <string_view>
#include <unordered_set>
#include <vector>

#include "util/log.h"
#include "zero/stage3.h"
#include "zero/unit_functions.h"

namespace dscpp::zero {
namespace {

// The stage-3 engines watching this thread's ops (registry ids: an engine destroyed elsewhere
// is simply not found), and whether a Stage3 is running ops of its own (gathers, releases).
thread_local std::vector<int64_t> tl_watchers;
thread_local int tl_own_ops = 0;

// Ops that look at a tensor's metadata, never its values (set_data's check, detach, views of
// the same storage taken by libtorch itself): a released unit may meet them.
bool reads_no_values(const char* op) {
  static const std::unordered_set<std::string_view> kMetadataOnly = {
      "aten::_has_compatible_shallow_copy_type",
      "aten::set_",
      "aten::detach",
      "aten::alias",
      "aten::size",
      "aten::sym_size",
      "aten::stride",
      "aten::is_same_size"};
  return kMetadataOnly.count(op) > 0;
}

std::unique_ptr<at::ObserverContext> watch_inputs(const at::RecordFunction& fn) {
  if (tl_own_ops > 0 || tl_watchers.empty() || reads_no_values(fn.name())) return nullptr;
  for (const int64_t id : tl_watchers) {
    Stage3* s = registry::owner(id);
    if (!s) continue;
    for (const c10::IValue& v : fn.inputs()) {
      if (v.isTensor()) {
        s->check_read(v.toTensor(), fn.name());
      } else if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorVector()) s->check_read(t, fn.name());
      }
    }
  }
  return nullptr;
}

// A module's holder as a user names it: "BlockImpl" -> "Block", "ns::BlockImpl" -> "Block".
std::string holder_name(std::string type) {
  if (auto colons = type.rfind("::"); colons != std::string::npos) type = type.substr(colons + 2);
  if (type.size() > 4 && type.compare(type.size() - 4, 4, "Impl") == 0)
    type.resize(type.size() - 4);
  return type;
}

}  // namespace

Stage3::OwnOps::OwnOps() { ++tl_own_ops; }
Stage3::OwnOps::~OwnOps() { --tl_own_ops; }

void Stage3::start_watching() {
  for (size_t u = 0; u < units_.size(); ++u) {
    unit_of_storage_[units_[u].storage.full.storage().unsafeGetStorageImpl()] = static_cast<int>(u);
  }
  reported_.assign(units_.size(), 0);
  tl_watchers.push_back(registry_id_);
  watch_handle_ = at::addThreadLocalCallback(at::RecordFunctionCallback(watch_inputs)
                                                 .needsInputs(true)
                                                 .scopes({at::RecordScope::FUNCTION}));
}

void Stage3::stop_watching() {
  if (watch_handle_ == 0) return;
  at::removeCallback(watch_handle_);  // a thread-local callback: on the thread that added it
  watch_handle_ = 0;
  std::erase(tl_watchers, registry_id_);
  unit_of_storage_.clear();
}

void Stage3::check_read(const at::Tensor& t, const char* op) noexcept {
  if (watch_paused_ || !t.defined() || !t.has_storage()) return;
  auto it = unit_of_storage_.find(t.storage().unsafeGetStorageImpl());
  if (it == unit_of_storage_.end()) return;
  const int u = it->second;
  Unit& unit = units_[u];
  if (unit.storage.gathered || running_ == u || unit.held > 0) return;
  // libtorch swallows an observer's exceptions: the error waits for the next zero::call or
  // backward (deferred), and is logged now for a forward that has neither.
  OwnOps own;
  try {
    if (!reported_[u]) {
      reported_[u] = 1;
      const std::string type = unit.module->name();
      const std::string call =
          "run its forward through dscpp::zero::call(*module, fn, inputs...) (docs/zero.md, "
          "\"Stage 3\")";
      const std::string hint =
          type.rfind("torch::nn::", 0) == 0
              ? call
              : fmt::format(
                    "declare its holder with DSCPP_ZERO_UNIT({0}) instead of "
                    "TORCH_MODULE({0}) and call it through the holder, as block(x) "
                    "(include/dscpp/zero_unit.h; ->forward(x), torch::nn::Sequential and "
                    "AnyModule reach the module past its holder), or {1}",
                    holder_name(type), call);
      const std::string msg = fmt::format(
          "stage-3 unit '{}' ({}) ran outside dscpp::zero::call: {} read its parameters while "
          "the unit was released. dscpp gathered it for that read, so this forward's values are "
          "right, but stage 3 must see a unit run to release it and to reduce its gradients. "
          "HINT: {}",
          unit_name(u), type, op, hint);
      if (comm_.rank() == 0) DSCPP_LOG_ERROR("{}", msg);
      if (deferred_error_.empty()) deferred_error_ = msg;
    }
    request(u, /*record=*/false);  // a collective: every rank's forward reads it here too
  } catch (const std::exception& e) {
    DSCPP_LOG_ERROR("stage 3: gathering unit '{}' for a read outside its call failed: {}",
                    unit_name(u), e.what());
  }
}

}  // namespace dscpp::zero
