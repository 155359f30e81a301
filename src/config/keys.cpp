// The rules of the key tables and the Describer's lines (keys.h).
#include "config/keys.h"

#include "util/strings.h"

namespace dscpp::config {
namespace {

template <typename T>
std::string text(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    return format_double(v);
  } else {
    return std::to_string(v);
  }
}

}  // namespace

void Describer::line(const std::string& path, const std::string& value) {
  os_ << "  " << path << " = " << value;
  if (auto it = c_.origins.find(path); it != c_.origins.end()) os_ << "  (" << it->second << ")";
  os_ << "\n";
}

void Describer::line(const std::string& path, const std::vector<std::string>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", \"" : "\"") + v[i] + "\"";
  line(path, s + "]");
}

void Describer::line(const std::string& path, const std::vector<int64_t>& v) {
  std::vector<std::string> parts;
  for (int64_t x : v) parts.push_back(std::to_string(x));
  line(path, "[" + join(parts, ", ") + "]");
}

template <typename T>
Rule<T> above(T min) {
  return {[min](const JsonReader& r, std::string_view key, const T& v) {
    if (!(v > min)) r.fail(key, "must be > " + text(min) + ", got " + text(v));
  }};
}

template <typename T>
Rule<T> at_least(T min) {
  return {[min](const JsonReader& r, std::string_view key, const T& v) {
    if (!(v >= min)) r.fail(key, "must be >= " + text(min) + ", got " + text(v));
  }};
}

template Rule<int> above(int);
template Rule<int64_t> above(int64_t);
template Rule<double> above(double);
template Rule<int> at_least(int);
template Rule<int64_t> at_least(int64_t);
template Rule<double> at_least(double);

Rule<double> fraction() {
  return {[](const JsonReader& r, std::string_view key, const double& v) {
    if (!(v >= 0.0 && v <= 1.0)) r.fail(key, "must be in [0, 1], got " + format_double(v));
  }};
}

Rule<double> beta() {
  return {[](const JsonReader& r, std::string_view key, const double& v) {
    if (!(v >= 0.0 && v < 1.0)) r.fail(key, "must be in [0, 1), got " + format_double(v));
  }};
}

Rule<std::array<double, 2>> betas() {
  return {[](const JsonReader& r, std::string_view key, const std::array<double, 2>& b) {
    for (double x : b) {
      if (!(x >= 0.0 && x < 1.0))
        r.fail(key, "each beta must be in [0, 1), got [" + format_double(b[0]) + ", " +
                        format_double(b[1]) + "]");
    }
  }};
}

Rule<int64_t> even_above_zero() {
  return {[](const JsonReader& r, std::string_view key, const int64_t& v) {
    above<int64_t>(0).check(r, key, v);
    if (v % 2 != 0)
      r.fail(key, "must be a multiple of 2 (DeepSpeed asserts this), got " + std::to_string(v));
  }};
}

Rule<std::string> one_of(std::vector<std::string> allowed) {
  return {[allowed = std::move(allowed)](const JsonReader& r, std::string_view key,
                                         const std::string& v) {
    for (const std::string& a : allowed)
      if (v == a) return;
    std::string msg = "must be one of " + join(allowed, ", ") + ", got \"" + v + "\"";
    const std::string near = nearest_match(v, allowed);
    if (!near.empty()) msg += "; did you mean '" + near + "'?";
    r.fail(key, msg);
  }};
}

}  // namespace dscpp::config
