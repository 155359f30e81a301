// Matching a module against a zero::UnitPolicy (include/dscpp/zero.h).
#pragma once

#include <string>

#include "dscpp/config.h"
#include "dscpp/zero.h"
#include "dscpp/zero_unit.h"

namespace dscpp::zero {

// '*' matches any run of characters, '?' one.
bool glob_match(const char* pattern, const char* text);
// Whether a type was marked a unit type (mark_unit_type, include/dscpp/zero_unit.h).
bool is_marked_unit_type(const std::string& type_name);
// Whether the module at `path` (named_modules() key) with type name `type` is a unit: `policy`
// names it, or its type is marked.
bool matches(const UnitPolicy& policy, const std::string& path, const std::string& type);

// `given` (InitOptions::zero_units, zero::Init's policy) with the config's
// zero_optimization.leaf_module entries added: names as exact paths, name_suffixes as "*suffix",
// classes as the whole type name or the part after its last "::".
UnitPolicy with_leaf_modules(UnitPolicy given, const ZeroLeafModuleConfig& leaf);

// Throws ConfigError naming every pattern of `given` and every leaf_module entry that matches no
// module of `model`: a unit named but never found is a typo, not a choice.
void check_each_matches(torch::nn::Module& model, const UnitPolicy& given,
                        const ZeroLeafModuleConfig& leaf);

// The model's top-level modules as a user would name units: "'head' (torch::nn::LinearImpl)",
// and a container of several modules (ModuleList, Sequential, ModuleDict) as its children,
// "'blocks.*' (3 x BlockImpl)". For messages that tell a user how to mark units.
std::string top_level_modules(torch::nn::Module& model);

}  // namespace dscpp::zero
