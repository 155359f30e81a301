// Implements autocast.h (NOTE [autocast]).
#include "precision/autocast.h"

#include <ATen/autocast_mode.h>
#include <torch/nn/module.h>

#include <map>

#include "dscpp/error.h"
#include "util/strings.h"

namespace dscpp::precision {

AutocastState AutocastState::current() {
  AutocastState s;
  s.cpu = at::autocast::is_autocast_enabled(c10::DeviceType::CPU);
  s.cuda = at::autocast::is_autocast_enabled(c10::DeviceType::CUDA);
  s.cpu_dtype = at::autocast::get_autocast_dtype(c10::DeviceType::CPU);
  s.cuda_dtype = at::autocast::get_autocast_dtype(c10::DeviceType::CUDA);
  s.cache = at::autocast::is_autocast_cache_enabled();
  return s;
}

namespace {

void apply(const AutocastState& s) {
  at::autocast::set_autocast_enabled(c10::DeviceType::CPU, s.cpu);
  at::autocast::set_autocast_enabled(c10::DeviceType::CUDA, s.cuda);
  at::autocast::set_autocast_dtype(c10::DeviceType::CPU, s.cpu_dtype);
  at::autocast::set_autocast_dtype(c10::DeviceType::CUDA, s.cuda_dtype);
  at::autocast::set_autocast_cache_enabled(s.cache);
}

}  // namespace

AutocastScope::AutocastScope(const AutocastState& state) : before_(AutocastState::current()) {
  apply(state);
}

AutocastScope::~AutocastScope() { apply(before_); }

AutocastState autocast_on(c10::DeviceType device, at::ScalarType dtype) {
  AutocastState s = AutocastState::current();
  s.cpu = device == c10::DeviceType::CPU;
  s.cuda = device == c10::DeviceType::CUDA;
  (device == c10::DeviceType::CPU ? s.cpu_dtype : s.cuda_dtype) = dtype;
  s.cache = false;  // NOTE [autocast]
  return s;
}

const std::vector<std::string>& default_lower_precision_modules() {
  static const std::vector<std::string> kDefault = {
      "torch.nn.modules.linear.Linear", "torch.nn.modules.conv.Conv1d",
      "torch.nn.modules.conv.Conv2d", "torch.nn.modules.conv.Conv3d"};
  return kDefault;
}

namespace {

// libtorch's class name (Module::name()) for a Python torch.nn name, or "" for none.
std::string libtorch_name(const std::string& python) {
  static const std::map<std::string, std::string> kClasses = {
      {"Linear", "torch::nn::LinearImpl"},
      {"Conv1d", "torch::nn::Conv1dImpl"},
      {"Conv2d", "torch::nn::Conv2dImpl"},
      {"Conv3d", "torch::nn::Conv3dImpl"},
      {"Bilinear", "torch::nn::BilinearImpl"},
      {"Embedding", "torch::nn::EmbeddingImpl"},
      {"LayerNorm", "torch::nn::LayerNormImpl"},
      {"ConvTranspose1d", "torch::nn::ConvTranspose1dImpl"},
      {"ConvTranspose2d", "torch::nn::ConvTranspose2dImpl"},
      {"ConvTranspose3d", "torch::nn::ConvTranspose3dImpl"}};
  if (python.rfind("torch.nn.", 0) != 0) return "";
  const auto it = kClasses.find(python.substr(python.rfind('.') + 1));
  return it == kClasses.end() ? "" : it->second;
}

std::string without_impl(const std::string& name) {
  const std::string impl = "Impl";
  return name.size() > impl.size() &&
                 name.compare(name.size() - impl.size(), impl.size(), impl) == 0
             ? name.substr(0, name.size() - impl.size())
             : name;
}

// Whether `entry` (without "Impl") names the class `cls` (Module::name() without "Impl"): the
// same name, or, for an entry without a namespace, cls's last component.
bool names_class(const std::string& entry, const std::string& cls) {
  if (entry == cls) return true;
  const auto at = cls.rfind("::");
  return entry.find("::") == std::string::npos && at != std::string::npos &&
         cls.compare(at + 2, std::string::npos, entry) == 0;
}

// An entry as a class name without "Impl": libtorch's for a Python torch.nn name.
std::string entry_class(const std::string& entry) {
  const std::string torch_class = libtorch_name(entry);
  return without_impl(torch_class.empty() ? entry : torch_class);
}

}  // namespace

std::set<std::string> lower_precision_parameters(const torch::nn::Module& model,
                                                 const std::vector<std::string>& modules,
                                                 std::vector<std::string>* warnings) {
  std::set<std::string> params, matched, present;
  std::map<std::string, int64_t> held;  // per entry, the parameters its modules hold themselves
  for (const auto& item : model.named_modules()) {
    const std::string& name = item.value()->name();
    present.insert(name);
    bool safe = false;
    const auto own = item.value()->named_parameters(/*recurse=*/false);
    for (const std::string& m : modules) {
      if (!names_class(entry_class(m), without_impl(name))) continue;
      safe = true;
      matched.insert(m);
      held[m] += static_cast<int64_t>(own.size());
    }
    if (!safe) continue;
    for (const auto& p : own)
      params.insert(item.key().empty() ? p.key() : item.key() + "." + p.key());
  }
  // DeepSpeed's default list names classes a model need not have; a list the config gives must
  // name modules the model has.
  if (modules == default_lower_precision_modules()) return params;
  std::vector<std::string> missing;
  for (const std::string& m : modules) {
    if (!matched.count(m))
      missing.push_back("\"" + m + "\" (read as the C++ class " + entry_class(m) + ")");
  }
  DSCPP_CHECK(missing.empty(), ConfigError,
              "torch_autocast.lower_precision_safe_modules: ", join(missing, ", "),
              missing.size() == 1 ? " names" : " name",
              " no module of the model; its module classes are: ",
              join(std::vector<std::string>(present.begin(), present.end()), ", "),
              ". HINT: name a class as Module::name() gives it (namespace and \"Impl\" "
              "optional), or a torch.nn module by its Python name (torch.nn.Linear)");
  for (const std::string& m : modules) {
    if (warnings && held[m] == 0) {
      warnings->push_back(
          "torch_autocast.lower_precision_safe_modules: \"" + m +
          "\" names modules that hold no parameters themselves; as in DeepSpeed only a named "
          "module's own parameters (not its submodules') have their gradients reduced in the "
          "autocast dtype, so this entry changes nothing. HINT: name the classes that hold the "
          "parameters (e.g. torch.nn.Linear)");
    }
  }
  return params;
}

}  // namespace dscpp::precision
