// Keys<S>: a config section's plain keys, each declared once.
//
// NOTE [config keys]: a key of a DeepSpeed config section is one line of its section's table:
// the JSON name (and DeepSpeed's alias, if any), the member of the section's struct it fills
// (whose initializer in include/dscpp/config.h is the default), the rule its value must satisfy,
// and when Config::describe() shows it. Reading, checking and describing all come from that line,
// in the table's order: adding a plain key is the struct member and one line here. What needs
// more than a line (a deprecated spelling, a default that depends on another key, a value of two
// shapes, a rule over two keys) stays code beside the table, in the section's parse function.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "config/json_reader.h"
#include "dscpp/config.h"

namespace dscpp::config {

// Config::describe()'s lines: "  <path> = <value>", with how the value was chosen when it was
// not read verbatim ("auto -> ...", a stage's default).
class Describer {
 public:
  explicit Describer(const Config& c) : c_(c) {}

  void line(const std::string& path, const std::string& value);
  void line(const std::string& path, bool v) { line(path, std::string(v ? "true" : "false")); }
  void line(const std::string& path, int v) { line(path, std::to_string(v)); }
  void line(const std::string& path, int64_t v) { line(path, std::to_string(v)); }
  void line(const std::string& path, double v) { line(path, format_double(v)); }
  void line(const std::string& path, const char* v) { line(path, std::string(v)); }
  void line(const std::string& path, const std::optional<int64_t>& v) {
    line(path, v ? std::to_string(*v) : std::string("(unset)"));
  }
  void line(const std::string& path, const std::optional<double>& v) {
    line(path, v ? format_double(*v) : std::string("(unset)"));
  }
  void line(const std::string& path, const std::array<double, 2>& v) {
    line(path, "[" + format_double(v[0]) + ", " + format_double(v[1]) + "]");
  }
  void line(const std::string& path, const std::vector<std::string>& v);
  void line(const std::string& path, const std::vector<int64_t>& v);
  // Strings are shown quoted.
  void str(const std::string& path, const std::string& v) { line(path, "\"" + v + "\""); }
  void str(const std::string& path, const std::optional<std::string>& v) {
    line(path, v ? "\"" + *v + "\"" : std::string("(unset)"));
  }
  void raw(const std::string& text) { os_ << text << "\n"; }
  std::string text() const { return os_.str(); }

  // A value of any field type, strings quoted.
  template <typename T>
  void value(const std::string& path, const T& v) {
    if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, std::optional<std::string>>) {
      str(path, v);
    } else {
      line(path, v);
    }
  }

 private:
  const Config& c_;
  std::ostringstream os_;
};

template <typename T>
inline constexpr bool kOptional = false;
template <typename T>
inline constexpr bool kOptional<std::optional<T>> = true;

// What a key's value must satisfy; the check throws ConfigError naming the key's path.
template <typename T>
struct Rule {
  std::function<void(const JsonReader& r, std::string_view key, const T& v)> check;
};

// The rules the tables use ("must be > 0, got -1", ...).
template <typename T>
Rule<T> above(T min);
template <typename T>
Rule<T> at_least(T min);
Rule<double> fraction();                                     // in [0, 1]
Rule<double> beta();                                         // in [0, 1)
Rule<std::array<double, 2>> betas();                         // each in [0, 1)
Rule<int64_t> even_above_zero();                             // > 0 and a multiple of 2
Rule<std::string> one_of(std::vector<std::string> allowed);  // exactly one of them

template <typename S>
class Keys {
 public:
  using Shown = bool (*)(const S&);

  // A key filling `member`; `rule` checks the value read (or the default); `shown` (null:
  // always) says when describe() lists it; `alias` is DeepSpeed's other spelling.
  template <typename T>
  Keys& key(std::string_view name, T S::*member, Rule<T> rule = {}, Shown shown = nullptr,
            std::string_view alias = {}) {
    Entry e;
    e.name = std::string(name);
    e.read = [name = e.name, alias = std::string(alias), member, rule](JsonReader& r, S& s) {
      T& field = s.*member;
      if (alias.empty()) {
        r.get(name, &field);
      } else {
        r.get_aliased(name, alias, &field);
      }
      if (rule.check) rule.check(r, name, field);
    };
    e.describe = [member](Describer& d, const std::string& path, const S& s,
                          const std::string& unset) {
      if constexpr (kOptional<T>) {
        if (!(s.*member) && !unset.empty()) return d.line(path, "(unset: " + unset + ")");
      }
      d.value(path, s.*member);
    };
    e.shown = shown;
    entries_.push_back(std::move(e));
    return *this;
  }

  // What the last key, an optional one, means when unset ("the optimizer's lr"), for describe().
  Keys& unset_means(std::string_view text) {
    entries_.back().unset = std::string(text);
    return *this;
  }

  // A key without a default (JsonReader::require): absent or "auto" is an error saying `why`.
  template <typename T>
  Keys& required(std::string_view name, T S::*member, std::string_view why, Rule<T> rule = {}) {
    Entry e;
    e.name = std::string(name);
    e.read = [name = e.name, why = std::string(why), member, rule](JsonReader& r, S& s) {
      r.require(name, &(s.*member), why);
      if (rule.check) rule.check(r, name, s.*member);
    };
    e.describe = [member](Describer& d, const std::string& path, const S& s, const std::string&) {
      d.value(path, s.*member);
    };
    entries_.push_back(std::move(e));
    return *this;
  }

  // The table's keys, in order.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const Entry& e : entries_) out.push_back(e.name);
    return out;
  }

  // Reads and checks every key of the table, in order, from `r` into `s`.
  void read(JsonReader& r, S& s) const {
    for (const Entry& e : entries_) e.read(r, s);
  }
  // Describes the keys `s` shows, in order, as `prefix` + name.
  void describe(Describer& d, const std::string& prefix, const S& s) const {
    for (const Entry& e : entries_) {
      if (!e.shown || e.shown(s)) e.describe(d, prefix + e.name, s, e.unset);
    }
  }

 private:
  struct Entry {
    std::string name;
    std::function<void(JsonReader&, S&)> read;
    std::function<void(Describer&, const std::string&, const S&, const std::string& unset)>
        describe;
    Shown shown = nullptr;
    std::string unset;  // unset_means()
  };
  std::vector<Entry> entries_;
};

// Every key of every section's table as its JSON path ("zero_optimization.reduce_bucket_size",
// "optimizer.params.lr" once per optimizer type), for the test that docs/config.md lists them.
std::vector<std::string> table_key_paths();

// A rule on an optional value: checked when the value is set.
template <typename T>
Rule<std::optional<T>> when_set(Rule<T> rule) {
  return {[rule](const JsonReader& r, std::string_view key, const std::optional<T>& v) {
    if (v) rule.check(r, key, *v);
  }};
}

}  // namespace dscpp::config
