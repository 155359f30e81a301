// Implements JsonReader and ParseNotes (see NOTE [strict config reading] in json_reader.h):
// typed reads with path-aware errors, "auto" handling, and the unknown-key check.
#include "config/json_reader.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "config/key_verdicts.h"
#include "dscpp/error.h"
#include "util/log.h"
#include "util/strings.h"

namespace dscpp::config {

void ParseNotes::warn(const std::string& message) const {
  if (warnings) warnings->push_back(message);
  DSCPP_LOG_WARN("config: {}", message);
}

void ParseNotes::note(const std::string& message) const {
  if (warnings) warnings->push_back(message);
  DSCPP_LOG_INFO("config: {}", message);
}

void ParseNotes::set_origin(const std::string& path, const std::string& origin) const {
  if (origins) (*origins)[path] = origin;
}

std::string format_double(double v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, res.ptr);
}

std::string describe_json(const nlohmann::json& v) {
  auto cut = [](std::string s) {
    if (s.size() > 60) s = s.substr(0, 57) + "...";
    return s;
  };
  switch (v.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::boolean:
      return std::string("boolean ") + v.dump();
    case nlohmann::json::value_t::string:
      return "string " + cut(v.dump());
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return "number " + v.dump();
    case nlohmann::json::value_t::number_float:
      return "number " + format_double(v.get<double>());
    case nlohmann::json::value_t::array:
      return "array " + cut(v.dump());
    case nlohmann::json::value_t::object:
      return "object " + cut(v.dump());
    default:
      return cut(v.dump());
  }
}

namespace {

const nlohmann::json& empty_object() {
  static const nlohmann::json kEmpty = nlohmann::json::object();
  return kEmpty;
}

// NOTE [lax values]: the root's sections DeepSpeed validates with pydantic (their sub-sections
// inherit).
constexpr std::string_view kLaxSections[] = {"zero_optimization",
                                             "fp16",
                                             "bf16",
                                             "bfloat16",
                                             "comms_logger",
                                             "tensorboard",
                                             "wandb",
                                             "csv_monitor",
                                             "comet",
                                             "compile",
                                             "tensor_parallel",
                                             "timers",
                                             "hybrid_engine",
                                             "weight_quantization"};
// Keys whose DeepSpeed validator refuses a boolean where pydantic alone would coerce it.
constexpr std::string_view kNoBoolAsNumber[] = {"fp16.loss_scale", "fp16.loss_scale_window",
                                                "fp16.min_loss_scale"};

// Whether a reader at `parent` (a path) opening `key` opens one of kLaxSections.
bool lax_section(const std::string& parent, std::string_view key) {
  if (!parent.empty()) return false;
  for (std::string_view s : kLaxSections)
    if (key == s) return true;
  return false;
}

bool refuses_bool_as_number(const std::string& path) {
  for (std::string_view k : kNoBoolAsNumber)
    if (path == k) return true;
  return false;
}

// The table's spelling of a path: bf16 for DeepSpeed's old section name bfloat16.
std::string verdict_path(const std::string& path) {
  return path.rfind("bfloat16", 0) == 0 ? "bf16" + path.substr(8) : path;
}

bool is_auto(const nlohmann::json& v) {
  return v.is_string() && v.get_ref<const std::string&>() == "auto";
}

// For a string that holds a number or a boolean ("2", "true"), a hint to drop the quotes.
std::string quote_hint(const nlohmann::json& v) {
  if (!v.is_string()) return "";
  const std::string& s = v.get_ref<const std::string&>();
  if (s == "true" || s == "false") return ". HINT: write " + s + " without quotes";
  double d = 0;
  auto res = std::from_chars(s.data(), s.data() + s.size(), d);
  if (!s.empty() && res.ec == std::errc() && res.ptr == s.data() + s.size())
    return ". HINT: write " + s + " without quotes";
  return "";
}

// What pydantic's lax mode reads as a boolean besides true and false.
std::optional<bool> coerced_bool(const nlohmann::json& v) {
  if (v.is_number() && (v.get<double>() == 0.0 || v.get<double>() == 1.0))
    return v.get<double>() != 0;
  if (!v.is_string()) return std::nullopt;
  const std::string w = to_lower(v.get<std::string>());
  for (const char* t : {"true", "t", "yes", "y", "on", "1"})
    if (w == t) return true;
  for (const char* f : {"false", "f", "no", "n", "off", "0"})
    if (w == f) return false;
  return std::nullopt;
}

}  // namespace

std::optional<bool> JsonReader::lax_bool(std::string_view key, const nlohmann::json& v) const {
  if (!lax_) return std::nullopt;
  const std::optional<bool> b = coerced_bool(v);
  if (b) note_coercion(key, v, *b ? "true" : "false");
  return b;
}

std::optional<int64_t> JsonReader::lax_int(std::string_view key, const nlohmann::json& v) const {
  if (!lax_) return std::nullopt;
  std::optional<int64_t> x;
  if (v.is_boolean()) {
    if (refuses_bool_as_number(path(key))) return std::nullopt;
    x = v.get<bool>() ? 1 : 0;
  }
  if (v.is_string()) {
    // Python's int() of the text: a sign, digits with single underscores between them; pydantic
    // also takes a fraction of zeros ("2.0").
    std::string t = trim(v.get<std::string>());
    if (const auto dot = t.find('.'); dot != std::string::npos) {
      if (t.find_first_not_of('0', dot + 1) != std::string::npos) return std::nullopt;
      t.resize(dot);
    }
    std::string digits;
    for (size_t i = 0; i < t.size(); ++i) {
      const char c = t[i];
      if ((c == '+' || c == '-') && i == 0) {
        digits += c;
      } else if (c == '_' && i > 0 && std::isdigit(static_cast<unsigned char>(t[i - 1])) &&
                 i + 1 < t.size() && std::isdigit(static_cast<unsigned char>(t[i + 1]))) {
        continue;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        digits += c;
      } else {
        return std::nullopt;
      }
    }
    int64_t parsed = 0;
    const char* begin = digits.data() + (!digits.empty() && digits[0] == '+');
    auto res = std::from_chars(begin, digits.data() + digits.size(), parsed);
    if (res.ec != std::errc() || res.ptr != digits.data() + digits.size()) return std::nullopt;
    x = parsed;
  }
  if (x) note_coercion(key, v, std::to_string(*x));
  return x;
}

std::optional<double> JsonReader::lax_double(std::string_view key, const nlohmann::json& v) const {
  if (!lax_) return std::nullopt;
  std::optional<double> x;
  if (v.is_boolean()) {
    if (refuses_bool_as_number(path(key))) return std::nullopt;
    x = v.get<bool>() ? 1.0 : 0.0;
  }
  if (v.is_string()) {
    const std::string t = trim(v.get<std::string>());
    char* end = nullptr;
    const double d = std::strtod(t.c_str(), &end);
    if (t.empty() || end != t.c_str() + t.size() || !std::isfinite(d)) return std::nullopt;
    x = d;
  }
  if (x) note_coercion(key, v, format_double(*x));
  return x;
}

void JsonReader::note_coercion(std::string_view key, const nlohmann::json& v,
                               const std::string& as) const {
  const std::string p = path(key);
  notes_.note(p + ": " + describe_json(v) + " read as " + as +
              ", as DeepSpeed's validation (pydantic, lax) reads it");
  notes_.set_origin(p, describe_json(v) + " -> " + as);
}

JsonReader::JsonReader(const nlohmann::json& object, std::string path, ParseNotes notes)
    : object_(&object), path_(std::move(path)), notes_(notes) {
  if (!object.is_object()) {
    DSCPP_FAIL(ConfigError, path_.empty() ? std::string("config root") : path_,
               ": expected an object, got ", describe_json(object));
  }
}

std::string JsonReader::path(std::string_view key) const {
  return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

void JsonReader::fail(std::string_view key, const std::string& message) const {
  DSCPP_FAIL(ConfigError, path(key), ": ", message);
}

void JsonReader::type_error(std::string_view key, std::string_view expected,
                            const nlohmann::json& got) const {
  std::string hint = quote_hint(got);
  if (!hint.empty() && !lax_) {
    const std::string& text = got.get_ref<const std::string&>();
    hint += text == "true" || text == "false"
                ? " (DeepSpeed reads this key without validation, where any non-empty string, "
                  "\"false\" too, is true)"
                : " (DeepSpeed reads this key without validation and would keep the string)";
  }
  if (is_auto(got)) hint = ". HINT: \"auto\" is accepted only on keys that have a default";
  fail(key, "expected " + std::string(expected) + ", got " + describe_json(got) + hint);
}

void JsonReader::mark_known(std::string_view key) {
  known_.emplace_back(key);
  if (notes_.read) notes_.read->push_back(path(key));
}

const nlohmann::json* JsonReader::lookup(std::string_view key) {
  mark_known(key);
  auto it = object_->find(std::string(key));
  return it == object_->end() ? nullptr : &*it;
}

bool JsonReader::has(std::string_view key) const { return object_->contains(std::string(key)); }

const nlohmann::json* JsonReader::raw(std::string_view key) { return lookup(key); }

bool JsonReader::take_auto(std::string_view key, const nlohmann::json& v,
                           const std::string& default_text) {
  if (!is_auto(v)) return false;
  const std::string p = path(key);
  notes_.note(p + " is \"auto\": using the default " + default_text);
  notes_.set_origin(p, "auto -> default");
  return true;
}

int64_t JsonReader::to_int64(std::string_view key, const nlohmann::json& v) const {
  if (auto x = lax_int(key, v)) return *x;
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() &&
        v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail(key, "value " + v.dump() + " is too large");
    return v.get<int64_t>();
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    // 2^63 is exactly representable; anything at or beyond it does not fit.
    if (std::isfinite(d) && std::floor(d) == d && d >= -9.2233720368547758e18 &&
        d < 9.2233720368547758e18)
      return static_cast<int64_t>(d);
  }
  type_error(key, "an integer", v);
}

double JsonReader::to_double(std::string_view key, const nlohmann::json& v) const {
  if (auto x = lax_double(key, v)) return *x;
  if (!v.is_number()) type_error(key, "a number", v);
  return v.get<double>();
}

bool JsonReader::get(std::string_view key, bool* out) {
  const nlohmann::json* v = lookup(key);
  if (!v || take_auto(key, *v, *out ? "true" : "false")) return false;
  if (auto b = lax_bool(key, *v)) {
    *out = *b;
    return true;
  }
  if (!v->is_boolean()) type_error(key, "true or false", *v);
  *out = v->get<bool>();
  return true;
}

bool JsonReader::get(std::string_view key, int* out) {
  const nlohmann::json* v = lookup(key);
  if (!v || take_auto(key, *v, std::to_string(*out))) return false;
  const int64_t x = to_int64(key, *v);
  if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max())
    fail(key, "value " + std::to_string(x) + " does not fit in a 32-bit integer");
  *out = static_cast<int>(x);
  return true;
}

bool JsonReader::get(std::string_view key, int64_t* out) {
  const nlohmann::json* v = lookup(key);
  if (!v || take_auto(key, *v, std::to_string(*out))) return false;
  *out = to_int64(key, *v);
  return true;
}

bool JsonReader::get(std::string_view key, double* out) {
  const nlohmann::json* v = lookup(key);
  if (!v || take_auto(key, *v, format_double(*out))) return false;
  *out = to_double(key, *v);
  return true;
}

bool JsonReader::get(std::string_view key, std::string* out) {
  const nlohmann::json* v = lookup(key);
  if (!v || take_auto(key, *v, "\"" + *out + "\"")) return false;
  if (!v->is_string()) type_error(key, "a string", *v);
  *out = v->get<std::string>();
  return true;
}

bool JsonReader::get(std::string_view key, std::array<double, 2>* out) {
  const nlohmann::json* v = lookup(key);
  if (!v ||
      take_auto(key, *v, "[" + format_double((*out)[0]) + ", " + format_double((*out)[1]) + "]"))
    return false;
  if (!v->is_array() || v->size() != 2 || !(*v)[0].is_number() || !(*v)[1].is_number())
    type_error(key, "an array of two numbers", *v);
  *out = {(*v)[0].get<double>(), (*v)[1].get<double>()};
  return true;
}

bool JsonReader::get(std::string_view key, std::vector<std::string>* out) {
  const nlohmann::json* v = lookup(key);
  if (!v || take_auto(key, *v, "[]")) return false;
  if (!v->is_array()) type_error(key, "an array of strings", *v);
  std::vector<std::string> items;
  for (const auto& item : *v) {
    if (!item.is_string()) type_error(key, "an array of strings", *v);
    items.push_back(item.get<std::string>());
  }
  *out = std::move(items);
  return true;
}

bool JsonReader::get(std::string_view key, std::vector<int64_t>* out) {
  const nlohmann::json* v = lookup(key);
  if (!v || take_auto(key, *v, "[]")) return false;
  if (!v->is_array()) type_error(key, "an array of integers", *v);
  std::vector<int64_t> items;
  for (const auto& item : *v) {
    if (!item.is_number()) type_error(key, "an array of integers", *v);
    items.push_back(to_int64(key, item));
  }
  *out = std::move(items);
  return true;
}

template <typename T, typename Convert>
bool JsonReader::get_optional(std::string_view key, std::optional<T>* out, Convert convert) {
  const nlohmann::json* v = lookup(key);
  if (!v) return false;
  if (v->is_null() || take_auto(key, *v, "(unset)")) {
    out->reset();
    return v->is_null();
  }
  *out = convert(key, *v);
  return true;
}

bool JsonReader::get(std::string_view key, std::optional<int64_t>* out) {
  return get_optional(
      key, out, [this](std::string_view k, const nlohmann::json& v) { return to_int64(k, v); });
}

bool JsonReader::get(std::string_view key, std::optional<double>* out) {
  return get_optional(
      key, out, [this](std::string_view k, const nlohmann::json& v) { return to_double(k, v); });
}

bool JsonReader::get(std::string_view key, std::optional<std::string>* out) {
  const nlohmann::json* v = lookup(key);
  if (!v) return false;
  if (v->is_null() || take_auto(key, *v, "(unset)")) {
    out->reset();
    return v->is_null();
  }
  if (!v->is_string()) type_error(key, "a string or null", *v);
  *out = v->get<std::string>();
  return true;
}

void JsonReader::get_batch(std::string_view key, std::optional<int>* out) {
  const nlohmann::json* v = lookup(key);
  out->reset();
  if (!v || v->is_null()) return;  // null: DeepSpeed's default (None), not given
  const std::string p = path(key);
  if (is_auto(*v)) {
    notes_.note(p + " is \"auto\": treated as not given; the batch triangle derives it");
    notes_.set_origin(p, "auto -> derived");
    return;
  }
  const int64_t x = to_int64(key, *v);
  if (x <= 0 || x > std::numeric_limits<int>::max())
    fail(key, "must be an integer > 0, got " + std::to_string(x));
  *out = static_cast<int>(x);
}

void JsonReader::require(std::string_view key, std::string* out, std::string_view why) {
  const nlohmann::json* v = lookup(key);
  if (!v) fail(key, "is required: " + std::string(why));
  if (is_auto(*v))
    fail(key, "\"auto\" is not allowed: the key has no default (" + std::string(why) +
                  "). HINT: write the value itself");
  if (!v->is_string()) type_error(key, "a string", *v);
  *out = v->get<std::string>();
}

void JsonReader::require(std::string_view key, double* out, std::string_view why) {
  const nlohmann::json* v = lookup(key);
  if (!v) fail(key, "is required: " + std::string(why));
  if (is_auto(*v))
    fail(key, "\"auto\" is not allowed: the key has no default (" + std::string(why) +
                  "). HINT: write the value itself");
  *out = to_double(key, *v);
}

void JsonReader::require(std::string_view key, int64_t* out, std::string_view why) {
  const nlohmann::json* v = lookup(key);
  if (!v) fail(key, "is required: " + std::string(why));
  if (is_auto(*v))
    fail(key, "\"auto\" is not allowed: the key has no default (" + std::string(why) +
                  "). HINT: write the value itself");
  *out = to_int64(key, *v);
}

JsonReader JsonReader::child(std::string_view key, bool null_is_absent) {
  const nlohmann::json* v = lookup(key);
  const bool lax = lax_ || lax_section(path_, key);
  auto over = [&](const nlohmann::json& object) {
    JsonReader r(object, path(key), notes_);
    r.lax_ = lax;
    return r;
  };
  if (!v) return over(empty_object());
  if (is_auto(*v)) {
    take_auto(key, *v, "(all defaults)");
    return over(empty_object());
  }
  if (v->is_null() && (lax_ || null_is_absent)) {
    notes_.note(path(key) + " is null: read as absent, as DeepSpeed reads it");
    return over(empty_object());
  }
  if (!v->is_object()) type_error(key, "an object", *v);
  return over(*v);
}

bool JsonReader::is_inert(const nlohmann::json& v, const nlohmann::json& inert, bool lax) const {
  if (is_auto(v)) return true;  // the default (pydantic drops "auto")
  if (inert.is_array()) {
    for (const nlohmann::json& want : inert) {
      if (v == want) return true;
      if (want.is_boolean() && lax) {
        if (auto b = coerced_bool(v); b && *b == want.get<bool>()) return true;
      }
    }
    return false;
  }
  if (!inert.is_object()) return false;  // "": no value is inert
  if (v.is_null()) return true;          // a section given null: absent
  if (!v.is_object()) return false;
  for (auto it = inert.begin(); it != inert.end(); ++it) {
    auto got = v.find(it.key());
    if (got == v.end()) continue;
    const bool nested = it->is_object() && !it->empty();
    if (!is_inert(*got, nested ? *it : nlohmann::json::array({*it}), lax)) return false;
  }
  return true;
}

void JsonReader::not_honoured(std::string_view key) {
  const nlohmann::json* v = lookup(key);
  const std::string p = path(key);
  const KeyVerdict* verdict = find_key_verdict(verdict_path(p));
  DSCPP_CHECK(verdict != nullptr, Error, "internal: no verdict for the config key ", p);
  if (!v) return;
  const nlohmann::json inert =
      verdict->inert.empty() ? nlohmann::json() : nlohmann::json::parse(verdict->inert);
  // A whole section DeepSpeed validates with pydantic is lax inside.
  if (is_inert(*v, inert, lax_ || lax_section(path_, key))) return;
  const std::string value = describe_json(*v);
  switch (verdict->cls) {
    case KeyClass::refused:
      fail(key, value + " is not accepted: " + std::string(verdict->why) +
                    (verdict->hint.empty() ? "" : ". HINT: " + std::string(verdict->hint)));
    case KeyClass::observes:
      notes_.warn(p + " " + value + ": " + std::string(verdict->why) +
                  "; nothing more is observed, training is unchanged");
      return;
    case KeyClass::no_effect:
      notes_.warn(p + " " + value + " has no effect in dscpp: " + std::string(verdict->why) +
                  "; training is unchanged");
      return;
    case KeyClass::unused:
    case KeyClass::honoured:
      return;
  }
}

void JsonReader::read_not_honoured() {
  const std::string prefix = path_.empty() ? "" : verdict_path(path_) + ".";
  std::vector<std::string> sections;  // direct children only the table names below
  for (const KeyVerdict& v : key_verdicts()) {
    if (v.path.substr(0, prefix.size()) != prefix) continue;
    const std::string_view rest = v.path.substr(prefix.size());
    const auto dot = rest.find('.');
    if (dot == std::string_view::npos) {
      not_honoured(rest);
    } else {
      const std::string name(rest.substr(0, dot));
      if (std::find(known_.begin(), known_.end(), name) == known_.end() &&
          std::find(sections.begin(), sections.end(), name) == sections.end())
        sections.push_back(name);
    }
  }
  for (const std::string& name : sections) {
    JsonReader r = child(name);
    r.read_not_honoured();
    r.finish();
  }
}

void JsonReader::finish() const {
  std::vector<std::string> errors;
  for (auto it = object_->begin(); it != object_->end(); ++it) {
    const std::string& key = it.key();
    bool known = false;
    for (const std::string& k : known_) {
      if (k == key) {
        known = true;
        break;
      }
    }
    if (known) continue;
    std::string msg = "unknown key '" + key + "' at " + (path_.empty() ? "config root" : path_);
    const std::string suggestion = nearest_match(key, known_);
    if (!suggestion.empty()) {
      msg += "; did you mean '" + suggestion + "'?";
    } else {
      std::vector<std::string> sorted = known_;
      std::sort(sorted.begin(), sorted.end());
      sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
      msg += ". HINT: the keys known here are: " + join(sorted, ", ");
    }
    errors.push_back(msg);
  }
  if (!errors.empty()) DSCPP_FAIL(ConfigError, join(errors, "\n"));
}

}  // namespace dscpp::config
