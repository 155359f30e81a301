// JsonReader: strict, path-aware reading of one JSON object of a DeepSpeed config, and the
// ParseNotes where a parse leaves its warnings and the origin of values it did not read verbatim.
//
// NOTE [strict config reading]: every key a section parser asks about (get, require, child,
// not_honoured, deprecated, raw) is recorded as known; finish() reports every key of the object
// nobody asked about as a ConfigError naming its path and the nearest known key. So the set of
// known keys IS the set of reads; there is no second list to keep in sync. Other rules, in one
// place:
//   - "auto" (the HF Trainer convention) on a key with a default keeps the default and notes it
//     (info log, Config::warnings, Config::origins); on a key without one (require) it is an
//     error; on the batch keys it means "not given" (get_batch).
//   - A wrong JSON type is an error naming the path, the expected type and the value found.
//     Integers may be written as integral floats (5e8), as DeepSpeed reads them as int.
//   - null is accepted only where the field is optional (std::optional), meaning "unset", and
//     for the sections DeepSpeed reads null as absent (NOTE [lax values]).
//
// NOTE [lax values]: the sections DeepSpeed validates with pydantic (zero_optimization and what
// is inside it, fp16, bf16, the monitors, comms_logger, compile, tensor_parallel, hybrid_engine,
// timers, weight_quantization: kLaxSections in json_reader.cpp) accept what pydantic 2's lax
// mode coerces, and so does dscpp there, each coercion noted: for a boolean 0 / 1 (or 0.0 / 1.0)
// and the strings true/false, t/f, yes/no, y/n, on/off, 1/0 in any case; for an integer a string
// of one ("2", " 3 ", "1_000", "2.0") and true / false; for a number a string of one and true /
// false; null for an optional sub-section (offload_param, offload_optimizer, leaf_module) means
// absent. Everything else stays an error, and so does every coercion outside those sections:
// DeepSpeed reads those keys without validation, where the string "false" is true.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dscpp::config {

// Where one parse records what it says besides values. Both pointers outlive the readers.
struct ParseNotes {
  std::vector<std::string>* warnings = nullptr;
  std::map<std::string, std::string>* origins = nullptr;  // JSON path -> how it was chosen
  std::vector<std::string>* read = nullptr;  // when set, every path a reader asks about

  // Appends to warnings and logs at warning level.
  void warn(const std::string& message) const;
  // Appends to warnings and logs at info level (for expected, benign resolutions like "auto").
  void note(const std::string& message) const;
  void set_origin(const std::string& path, const std::string& origin) const;
};

// A short rendering of a JSON value for messages: `string "2"`, `number 1.5`, `boolean true`,
// `null`, `array [1,2]`, `object {...}` (long values are cut).
std::string describe_json(const nlohmann::json& v);

// Shortest round-trip text of a double ("0.001", "1e-08", "500000000").
std::string format_double(double v);

class JsonReader {
 public:
  // Reads `object`, found at JSON path `path` ("" for the config root). `object` must outlive
  // the reader. A non-object is a ConfigError ("<path>: expected an object, got ...").
  JsonReader(const nlohmann::json& object, std::string path, ParseNotes notes);

  // Optional keys with a default. When the key is absent or "auto", *out keeps its value (the
  // default) and false is returned; "auto" is noted. When present, the value is type-checked
  // and stored, and true is returned. A wrong type throws ConfigError.
  bool get(std::string_view key, bool* out);
  bool get(std::string_view key, int* out);
  bool get(std::string_view key, int64_t* out);
  bool get(std::string_view key, double* out);
  bool get(std::string_view key, std::string* out);
  bool get(std::string_view key, std::array<double, 2>* out);
  bool get(std::string_view key, std::vector<std::string>* out);
  bool get(std::string_view key, std::vector<int64_t>* out);
  // Optional fields: null means unset; "auto" means the default, unset.
  bool get(std::string_view key, std::optional<int64_t>* out);
  bool get(std::string_view key, std::optional<double>* out);
  bool get(std::string_view key, std::optional<std::string>* out);

  // A key that may also be spelled `alias` (DeepSpeed's pydantic field names, such as
  // "prefetch_bucket_size" for "stage3_prefetch_bucket_size"). Both present is an error.
  template <typename T>
  bool get_aliased(std::string_view key, std::string_view alias, T* out) {
    if (has(key) && has(alias))
      fail(key, "'" + std::string(key) + "' and its alias '" + std::string(alias) +
                    "' are both given. HINT: keep one of them");
    if (has(alias)) {
      mark_known(key);
      return get(alias, out);
    }
    mark_known(alias);
    return get(key, out);
  }

  // One of the batch keys: absent and "auto" both mean "not given" (the batch triangle
  // derives it). A given value must be an integer > 0.
  void get_batch(std::string_view key, std::optional<int>* out);

  // A key without a default: absent or "auto" is a ConfigError that says `why` it is needed.
  void require(std::string_view key, std::string* out, std::string_view why);
  void require(std::string_view key, double* out, std::string_view why);
  void require(std::string_view key, int64_t* out, std::string_view why);

  // The sub-object `key`: a reader over it, or over an empty object when absent (or "auto", or
  // null in a lax section or with `null_is_absent`). Not an object: ConfigError.
  JsonReader child(std::string_view key, bool null_is_absent = false);

  // NOTE [key verdicts]: applies kKeyVerdicts' line for every key of this object the table
  // names (its sections that no parser read opened, applied and finished too). A section parser
  // calls it after its own reads, before finish().
  void read_not_honoured();

  // The raw value of `key` (nullptr when absent), marking it known; for keys the caller
  // interprets itself (deprecated spellings, polymorphic values).
  const nlohmann::json* raw(std::string_view key);

  // Whether `key` is present. Does not mark it known.
  bool has(std::string_view key) const;

  // The JSON path of `key` in this object: "zero_optimization.stage".
  std::string path(std::string_view key) const;
  // This object's own path ("" for the root).
  const std::string& path() const { return path_; }
  const ParseNotes& notes() const { return notes_; }

  // Throws ConfigError("<path of key>: <message>").
  [[noreturn]] void fail(std::string_view key, const std::string& message) const;

  // Throws ConfigError for every key of the object that no read above asked about, each with
  // the nearest known key, e.g. "unknown key 'pin_memroy' at zero_optimization.offload_optimizer;
  // did you mean 'pin_memory'?".
  void finish() const;

 private:
  // The verdict's line for `key` (key_verdicts.h): nothing when absent or inert, else a
  // ConfigError or a warning by its class.
  void not_honoured(std::string_view key);
  // Whether `v` is one of the verdict's inert values (or meets its section condition); `lax`:
  // with the boolean spellings of NOTE [lax values].
  bool is_inert(const nlohmann::json& v, const nlohmann::json& inert, bool lax) const;
  // Marks `key` known (and read, NOTE [key verdicts]) without looking it up.
  void mark_known(std::string_view key);
  // Marks `key` known; returns its value or nullptr when absent.
  const nlohmann::json* lookup(std::string_view key);
  // True (after noting it) when v is the string "auto".
  bool take_auto(std::string_view key, const nlohmann::json& v, const std::string& default_text);
  [[noreturn]] void type_error(std::string_view key, std::string_view expected,
                               const nlohmann::json& got) const;
  // get() for an optional: absent -> false; null or "auto" -> unset; else convert(key, value).
  template <typename T, typename Convert>
  bool get_optional(std::string_view key, std::optional<T>* out, Convert convert);
  int64_t to_int64(std::string_view key, const nlohmann::json& v) const;
  double to_double(std::string_view key, const nlohmann::json& v) const;
  // NOTE [lax values]: in a lax section, the value a string, number or boolean of another JSON
  // type coerces to (noted), else nullopt.
  std::optional<bool> lax_bool(std::string_view key, const nlohmann::json& v) const;
  std::optional<int64_t> lax_int(std::string_view key, const nlohmann::json& v) const;
  std::optional<double> lax_double(std::string_view key, const nlohmann::json& v) const;
  void note_coercion(std::string_view key, const nlohmann::json& v, const std::string& as) const;

  const nlohmann::json* object_;
  std::string path_;
  ParseNotes notes_;
  std::vector<std::string> known_;
  bool lax_ = false;  // NOTE [lax values]
};

}  // namespace dscpp::config
