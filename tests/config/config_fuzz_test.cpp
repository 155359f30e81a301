// Config fuzzing (issue 14): configs generated from a seed over DeepSpeed's schema, wrong in every
// way a user or a tool can make them (wrong types, huge and negative numbers, NaN and Inf written
// as numbers, unknown and duplicate keys, deep nesting, invalid UTF-8, truncated text), each given
// to Config::parse. The only outcomes allowed are a Config (then also resolved against world
// sizes 1-4 and described) or a ConfigError; any other exception fails the test with the seed and
// the text that caused it, and a crash or a hang fails the run. DSCPP_FUZZ_CONFIGS sets how many
// (default 20000, about 5 s), DSCPP_FUZZ_SEED the seed. The generator (config_generator.h) also
// feeds the sanitizer run of the parsers in the fault suite (tests/faults/parsers_fuzz.cpp).
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <typeinfo>

#include "config_generator.h"
#include "dscpp/config.h"
#include "dscpp/error.h"
#include "dscpp/log.h"

namespace dscpp {
namespace {

using fuzz::Generator;

TEST(ConfigFuzz, EveryGeneratedConfigIsAConfigOrAConfigError) {
  int64_t count = 20000;
  if (const char* env = std::getenv("DSCPP_FUZZ_CONFIGS")) count = std::atoll(env);
  uint64_t seed = 20261202;
  if (const char* env = std::getenv("DSCPP_FUZZ_SEED")) seed = std::strtoull(env, nullptr, 10);
  const LogLevel level = log_level();
  set_log_level(LogLevel::error);  // the warnings of 20000 configs are not the test
  Generator gen(seed);
  int64_t valid = 0, refused = 0;
  for (int64_t i = 0; i < count; ++i) {
    const std::string text = gen.next();
    try {
      Config c = Config::parse(text);
      for (int world = 1; world <= 4; ++world) {
        try {
          c.resolve_batch(world, "the fuzz test");
        } catch (const ConfigError&) {
        }
      }
      (void)c.describe();
      ++valid;
    } catch (const ConfigError&) {
      ++refused;
    } catch (const std::exception& e) {
      FAIL() << "config " << i << " of seed " << seed << " threw " << typeid(e).name() << ": "
             << e.what() << "\ntext (first 2000 bytes): " << text.substr(0, 2000);
    }
  }
  set_log_level(level);
  std::cout << count << " configs from seed " << seed << ": " << valid << " valid, " << refused
            << " refused with a ConfigError\n";
  // The generator must reach both outcomes, or it tests nothing.
  EXPECT_GT(valid, count / 50) << valid << " valid of " << count;
  EXPECT_GT(refused, count / 2) << refused << " refused of " << count;
}

}  // namespace
}  // namespace dscpp
