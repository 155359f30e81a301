// dscpp's parsers of untrusted bytes under AddressSanitizer and UndefinedBehaviorSanitizer
// (issue 14): the DeepSpeed config (Config::parse through the strict JsonReader, then
// resolve_batch and describe), the checkpoint manifest (Manifest::parse) and the safetensors
// header (header_length and parse_header). An input's first byte picks the parser, the rest is
// what it reads. The only outcomes allowed are a value or the parser's own error (ConfigError,
// CheckpointError, IoError); any other exception aborts, and the sanitizers abort on any memory
// or undefined-behaviour error, so libFuzzer (or the replay) reports the input.
//
// tests/faults/sanitize_parsers.sh builds this file with clang twice:
//   parsers_fuzzer  with libFuzzer (-fsanitize=fuzzer): a coverage-guided search from the seeds
//   parsers_replay  with the main below: N configs from the seeded generator that base_tests'
//                   ConfigFuzz uses, each given to the config parser, then every file named on
//                   the command line (a corpus, a crash input) given to LLVMFuzzerTestOneInput.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <typeinfo>

#include "checkpoint/manifest.h"
#include "dscpp/config.h"
#include "dscpp/error.h"
#include "dscpp/log.h"
#include "io/safetensors_header.h"

namespace {

using dscpp::Config;

[[noreturn]] void unexpected(const char* parser, const std::exception& e, const std::string& in) {
  std::cerr << "parsers_fuzz: the " << parser << " parser threw " << typeid(e).name() << ": "
            << e.what() << "\ninput (first 2000 bytes): " << in.substr(0, 2000) << "\n";
  std::abort();
}

void parse_config(std::string text) {
  // Text starting with '{' is JSON; anything else would be opened as a file path.
  if (text.empty() || text[0] != '{') text.insert(0, "{");
  try {
    Config c = Config::parse(text);
    for (int world = 1; world <= 4; ++world) {
      try {
        c.resolve_batch(world, "the parser fuzz");
      } catch (const dscpp::ConfigError&) {
      }
    }
    (void)c.describe();
  } catch (const dscpp::ConfigError&) {
  } catch (const std::exception& e) {
    unexpected("config", e, text);
  }
}

void parse_manifest(const std::string& text) {
  try {
    (void)dscpp::checkpoint::Manifest::parse(text, "fuzz/manifest.json");
  } catch (const dscpp::CheckpointError&) {
  } catch (const std::exception& e) {
    unexpected("checkpoint manifest", e, text);
  }
}

// `bytes` as a whole safetensors file, read as safetensors.cpp reads one.
void parse_safetensors(const std::string& bytes) {
  try {
    const uint64_t n =
        dscpp::safetensors::header_length(bytes.data(), bytes.size(), "fuzz.safetensors");
    (void)dscpp::safetensors::parse_header(bytes.substr(8, n), bytes.size() - 8 - n,
                                           "fuzz.safetensors");
  } catch (const dscpp::IoError&) {
  } catch (const std::exception& e) {
    unexpected("safetensors header", e, bytes);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const bool quiet = [] {
    dscpp::set_log_level(dscpp::LogLevel::error);  // warnings of valid configs are not the test
    return true;
  }();
  (void)quiet;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
      parse_config(rest);
      break;
    case 1:
      parse_manifest(rest);
      break;
    default:
      parse_safetensors(rest);
      break;
  }
  return 0;
}

#ifndef DSCPP_LIBFUZZER
#include "../config/config_generator.h"

namespace {

// libFuzzer's starting points: the generator's valid configs and a small safetensors file (the
// suite adds a real checkpoint manifest).
void write_seeds(const std::string& dir) {
  auto put = [&](const std::string& name, char parser, const std::string& bytes) {
    std::ofstream out(dir + "/" + name, std::ios::binary);
    out << parser << bytes;
    if (!out) throw std::runtime_error("cannot write " + dir + "/" + name);
  };
  int i = 0;
  for (const char* config : dscpp::fuzz::kSeeds) put("config" + std::to_string(i++), 0, config);
  std::string header =
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]}})";
  header.resize((header.size() + 7) / 8 * 8, ' ');
  const uint64_t n = header.size();
  put("safetensors", 2,
      std::string(reinterpret_cast<const char*>(&n), 8) + header + std::string(12, '\0'));
}

}  // namespace

// parsers_replay [--configs N] [--seed S] [--write_seeds DIR] [FILE...]
int main(int argc, char** argv) {
  int64_t configs = 0;
  uint64_t seed = 20261202;
  int files = 0;
  dscpp::set_log_level(dscpp::LogLevel::error);
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--configs" && i + 1 < argc) {
      configs = std::strtoll(argv[++i], nullptr, 10);
      continue;
    }
    if (arg == "--write_seeds" && i + 1 < argc) {
      write_seeds(argv[++i]);
      continue;
    }
    if (arg == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
      continue;
    }
    std::ifstream in(arg, std::ios::binary);
    if (!in) {
      std::cerr << "parsers_replay: cannot read '" << arg << "'\n";
      return 2;
    }
    std::ostringstream bytes;
    bytes << in.rdbuf();
    const std::string s = bytes.str();
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
    ++files;
  }
  dscpp::fuzz::Generator gen(seed);
  for (int64_t i = 0; i < configs; ++i) parse_config(gen.next());
  std::cout << "parsers_replay: " << configs << " generated configs (seed " << seed << ") and "
            << files << " files parsed under the sanitizers, no error\n";
  return 0;
}
#endif
