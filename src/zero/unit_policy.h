// Matching a module against a zero::UnitPolicy (include/dscpp/zero.h).
#pragma once

#include <string>

#include "dscpp/zero.h"

namespace dscpp::zero {

// '*' matches any run of characters, '?' one.
bool glob_match(const char* pattern, const char* text);
// Whether the module at `path` (named_modules() key) with type name `type` is a unit.
bool matches(const UnitPolicy& policy, const std::string& path, const std::string& type);

}  // namespace dscpp::zero
