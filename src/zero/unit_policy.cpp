// Implements unit-policy matching (unit_policy.h).
#include "zero/unit_policy.h"

#include <torch/nn/module.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <mutex>
#include <set>
#include <vector>

#include "dscpp/error.h"

namespace dscpp::zero {

bool glob_match(const char* pattern, const char* text) {
  if (*pattern == '\0') return *text == '\0';
  if (*pattern == '*') {
    for (const char* t = text;; ++t) {
      if (glob_match(pattern + 1, t)) return true;
      if (*t == '\0') return false;
    }
  }
  if (*text == '\0') return false;
  if (*pattern != '?' && *pattern != *text) return false;
  return glob_match(pattern + 1, text + 1);
}

namespace {

struct MarkedTypes {
  std::mutex mu;
  std::set<std::string> types;
};

MarkedTypes& marked_types() {
  static MarkedTypes m;
  return m;
}

}  // namespace

void mark_unit_type(const std::string& type_name) {
  MarkedTypes& m = marked_types();
  std::lock_guard<std::mutex> g(m.mu);
  m.types.insert(type_name);
}

bool is_marked_unit_type(const std::string& type_name) {
  MarkedTypes& m = marked_types();
  std::lock_guard<std::mutex> g(m.mu);
  return m.types.count(type_name) > 0;
}

bool matches(const UnitPolicy& policy, const std::string& path, const std::string& type) {
  if (is_marked_unit_type(type)) return true;
  for (const auto& g : policy.paths) {
    if (glob_match(g.c_str(), path.c_str())) return true;
  }
  for (const auto& g : policy.types) {
    if (glob_match(g.c_str(), type.c_str())) return true;
  }
  return false;
}

UnitPolicy with_leaf_modules(UnitPolicy given, const ZeroLeafModuleConfig& leaf) {
  for (const auto& n : leaf.names) given.paths.push_back(n);
  for (const auto& s : leaf.name_suffixes) given.paths.push_back("*" + s);
  // A class as DeepSpeed's users name it (a Python class name) or as libtorch's Module::name()
  // gives it: with or without its namespace, and with or without TORCH_MODULE's "Impl".
  for (const auto& c : leaf.classes) {
    for (const std::string& t : {c, c + "Impl"}) {
      given.types.push_back(t);
      given.types.push_back("*::" + t);
    }
  }
  return given;
}

void check_each_matches(torch::nn::Module& model, const UnitPolicy& given,
                        const ZeroLeafModuleConfig& leaf) {
  std::vector<std::pair<std::string, std::string>> modules;  // path, type name
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/true))
    modules.emplace_back(item.key(), item.value()->name());
  auto any = [&](auto&& pred) {
    for (const auto& [path, type] : modules) {
      if (pred(path, type)) return true;
    }
    return false;
  };
  std::string missing;
  auto note = [&](const std::string& where, const std::string& entry) {
    missing += (missing.empty() ? "" : "; ") + where + " \"" + entry + "\"";
  };
  for (const auto& g : given.paths) {
    if (!any([&](const auto& p, const auto&) { return glob_match(g.c_str(), p.c_str()); }))
      note("InitOptions::zero_units path", g);
  }
  for (const auto& g : given.types) {
    if (!any([&](const auto&, const auto& t) { return glob_match(g.c_str(), t.c_str()); }))
      note("InitOptions::zero_units type", g);
  }
  for (const auto& n : leaf.names) {
    if (!any([&](const auto& p, const auto&) { return p == n; }))
      note("zero_optimization.leaf_module.names", n);
  }
  for (const auto& s : leaf.name_suffixes) {
    if (!any([&](const auto& p, const auto&) {
          return p.size() >= s.size() && p.compare(p.size() - s.size(), s.size(), s) == 0;
        }))
      note("zero_optimization.leaf_module.name_suffixes", s);
  }
  for (const auto& c : leaf.classes) {
    // The entry's own patterns only (matches() would also take any DSCPP_ZERO_UNIT type).
    const UnitPolicy as_types = with_leaf_modules({}, ZeroLeafModuleConfig{{c}, {}, {}});
    auto names_type = [&](const std::string& t) {
      for (const auto& g : as_types.types) {
        if (glob_match(g.c_str(), t.c_str())) return true;
      }
      return false;
    };
    if (!any([&](const auto&, const auto& t) { return names_type(t); }))
      note("zero_optimization.leaf_module.classes", c);
  }
  if (missing.empty()) return;
  std::set<std::string> classes;
  for (const auto& [path, type] : modules) classes.insert(type);
  std::string listed;
  for (const auto& c : classes) listed += (listed.empty() ? "" : ", ") + c;
  DSCPP_FAIL(ConfigError, "ZeRO stage 3 units named but matching no module of the model: ", missing,
             ". Its module classes are: ", listed,
             "; its top-level modules: ", top_level_modules(model),
             ". HINT: leaf_module.classes names a class as Module::name() gives it (namespace "
             "and \"Impl\" optional); names and InitOptions::zero_units paths are "
             "named_modules() keys such as \"h.0\" (InitOptions takes globs like \"h.*\")");
}

std::string top_level_modules(torch::nn::Module& model) {
  auto is_container = [](const std::string& type) {
    for (const char* c : {"ModuleListImpl", "SequentialImpl", "ModuleDictImpl"}) {
      if (type.size() >= std::strlen(c) && type.compare(type.size() - std::strlen(c),
                                                        std::string::npos, c) == 0)
        return true;
    }
    return false;
  };
  std::vector<std::string> entries;
  for (const auto& item : model.named_children()) {
    torch::nn::Module& m = *item.value();
    const auto children = m.children();
    if (is_container(m.name()) && children.size() > 1) {
      std::set<std::string> types;
      for (const auto& c : children) types.insert(c->name());
      entries.push_back(fmt::format("'{}.*' ({} x {})", item.key(), children.size(),
                                    fmt::join(types, " | ")));
    } else {
      entries.push_back(fmt::format("'{}' ({})", item.key(), m.name()));
    }
  }
  if (entries.empty()) return "(none: the model has no submodules)";
  return fmt::format("{}", fmt::join(entries, ", "));
}

}  // namespace dscpp::zero
