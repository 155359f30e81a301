// KeyVerdict: what dscpp does with each key of DeepSpeed's config that it does not act on.
//
// NOTE [key verdicts]: every key of DeepSpeed 0.19.8's config is known to dscpp's parser. The keys
// it honours are the reads of its section parsers (NOTE [strict config reading]); every other one
// is one line of kKeyVerdicts (key_verdicts.cpp): its path, its class, the values that ask for
// nothing (`inert`), and why. Reading the key applies the line (JsonReader::not_honoured):
//   - refused: a value other than the inert ones asks for behaviour dscpp does not have (or that
//     DeepSpeed 0.19.8 itself removed): a ConfigError naming the key, the value and what to do.
//     The same key at an inert value (its default, or disabled) is accepted without a word.
//   - observes: the key only logs, profiles or times; a non-inert value is a warning saying
//     nothing is observed, training unchanged.
//   - no_effect: the key changes nothing in dscpp (a Python or GPU mechanism, a hint for a
//     feature dscpp has not); a non-inert value is a warning saying why.
//   - unused: DeepSpeed 0.19.8 reads the key and uses it nowhere; accepted silently.
// `inert` is JSON text: an array lists the inert values of a key; an object is the condition on a
// section (every key it names absent or equal, an object recursively), so {"enabled": false}
// makes a section with "enabled" false or absent inert whatever else it holds; empty means no
// value is inert (refused or warned whenever present). docs/config.md's key list is generated from
// this table and the parser's reads (config_key_reference()).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dscpp::config {

enum class KeyClass { honoured, refused, observes, no_effect, unused };

struct KeyVerdict {
  std::string_view path;  // "zero_optimization.zenflow", "compile"
  KeyClass cls;
  std::string_view inert;  // JSON: [values] or {section condition}; "" none
  std::string_view why;    // what it asks for and what dscpp does instead
  std::string_view hint;   // what to do, for a refusal ("" none)
};

// Every verdict, in the order docs/config.md lists them.
const std::vector<KeyVerdict>& key_verdicts();

// The verdict for `path`, or nullptr.
const KeyVerdict* find_key_verdict(std::string_view path);

// "honoured", "refused unless inert", ...: the class as docs/config.md names it.
const char* class_name(KeyClass cls);

// docs/config.md's key list (markdown): every key the parser reads and every verdict, sorted by
// path, with its class and what dscpp does, after the count per class. `dscpp check --keys`
// prints it; scripts/config_keys.sh writes it into docs/config.md.
std::string config_key_reference();

}  // namespace dscpp::config
