// Implements unit-policy matching (unit_policy.h).
#include "zero/unit_policy.h"

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

bool matches(const UnitPolicy& policy, const std::string& path, const std::string& type) {
  for (const auto& g : policy.paths) {
    if (glob_match(g.c_str(), path.c_str())) return true;
  }
  for (const auto& g : policy.types) {
    if (glob_match(g.c_str(), type.c_str())) return true;
  }
  return false;
}

}  // namespace dscpp::zero
