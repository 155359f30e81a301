// Implements Config::resolve_batch(): DeepSpeed's batch triangle, resolved against the real
// data-parallel world size, with errors that show the arithmetic and where the world size came
// from.
//
// NOTE [batch triangle]: DeepSpeed (DeepSpeedConfig._set_batch_related_parameters, then
// _batch_assertion) resolves train_batch_size (T), train_micro_batch_size_per_gpu (M) and
// gradient_accumulation_steps (G) at world size W with integer division:
//   T, M, G given -> nothing derived
//   T, M         -> G = T // M // W
//   T, G         -> M = T // W // G
//   M, G         -> T = M * G * W
//   T only       -> G = 1, M = T // W
//   M only       -> G = 1, T = M * W
//   G only, none -> error "Either train_batch_size or train_micro_batch_size_per_gpu needs to be
//                   provided"
// then asserts T > 0, M > 0, G > 0 (in that order) and T == M * G * W. dscpp does exactly this,
// so a config resolves to the same triple in both, and fails in both. "auto" on a batch key
// means "not given" (HF Trainer fills these in; here the triangle does).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "config/elasticity.h"
#include "config/json_reader.h"
#include "dscpp/config.h"
#include "dscpp/error.h"
#include "util/log.h"

namespace dscpp {

namespace {

constexpr const char* kT = "train_batch_size";
constexpr const char* kM = "train_micro_batch_size_per_gpu";
constexpr const char* kG = "gradient_accumulation_steps";

struct Value {
  int64_t v = 0;
  std::string derivation;  // empty when given in the JSON
};

std::string s(int64_t v) { return std::to_string(v); }

// a * b, saturating at the int64 maximum (inputs are >= 0); the range check catches it.
int64_t mul(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? std::numeric_limits<int64_t>::max() : r;
}

// A resource scheduler that scaled the job saw the elastic config in DEEPSPEED_ELASTICITY_CONFIG
// (DeepSpeed's variable): the batch bounds and version the engine uses must be the ones it saw.
void check_scheduler_saw(const ElasticityConfig& e) {
  const char* env = std::getenv("DEEPSPEED_ELASTICITY_CONFIG");
  if (!env) return;
  nlohmann::json seen;
  try {
    seen = nlohmann::json::parse(env);
  } catch (const nlohmann::json::exception& ex) {
    DSCPP_FAIL(ConfigError, "DEEPSPEED_ELASTICITY_CONFIG is not JSON: ", ex.what());
  }
  DSCPP_CHECK(seen.is_object(), ConfigError,
              "DEEPSPEED_ELASTICITY_CONFIG is not a JSON object: ", seen.dump());
  // A key the scheduler's copy leaves out has DeepSpeed's default there.
  const ElasticityConfig defaults;
  auto differs = [&](const char* key, const auto& ours, const auto& fallback) {
    using T = std::decay_t<decltype(ours)>;
    T theirs = fallback;
    try {
      if (seen.contains(key)) theirs = seen[key].get<T>();
    } catch (const nlohmann::json::exception&) {
      DSCPP_FAIL(ConfigError, "DEEPSPEED_ELASTICITY_CONFIG: ", key, " is ", seen[key].dump());
    }
    DSCPP_CHECK(theirs == ours, ConfigError, "elasticity.", key,
                " differs from what the resource scheduler saw in DEEPSPEED_ELASTICITY_CONFIG (",
                seen.contains(key) ? seen[key].dump() : std::string("absent: the default"),
                "), so it may scale the job to a world size this config cannot "
                "train. HINT: give the scheduler and the job the same elasticity section");
  };
  differs("max_train_batch_size", e.max_train_batch_size, defaults.max_train_batch_size);
  differs("micro_batch_sizes", e.micro_batch_sizes, defaults.micro_batch_sizes);
  differs("version", e.version, defaults.version);
}

}  // namespace

void Config::resolve_batch(int world_size, const std::string& world_source) {
  const std::string where = "world size " + s(world_size) + " from " + world_source;
  DSCPP_CHECK(world_size >= 1, ConfigError,
              "cannot resolve the batch sizes: the data-parallel world size must be >= 1, got ",
              world_size, " (from ", world_source, ")");
  if (elasticity.enabled) return resolve_elastic_batch(world_size, world_source);
  const int64_t W = world_size;
  const std::string ws = "world size " + s(W);
  const std::optional<int>& t = train_batch_size;
  const std::optional<int>& m = train_micro_batch_size_per_gpu;
  const std::optional<int>& g = gradient_accumulation_steps;

  Value T, M, G;
  if (t) T.v = *t;
  if (m) M.v = *m;
  if (g) G.v = *g;
  if (t && m && g) {
    // All given: nothing to derive.
  } else if (t && m) {
    G.v = T.v / M.v / W;
    G.derivation =
        "derived: " + std::string(kT) + " " + s(T.v) + " // " + kM + " " + s(M.v) + " // " + ws;
  } else if (t && g) {
    M.v = T.v / W / G.v;
    M.derivation =
        "derived: " + std::string(kT) + " " + s(T.v) + " // " + ws + " // " + kG + " " + s(G.v);
  } else if (m && g) {
    T.v = mul(mul(M.v, G.v), W);
    T.derivation =
        "derived: " + std::string(kM) + " " + s(M.v) + " * " + kG + " " + s(G.v) + " * " + ws;
  } else if (t) {
    G.v = 1;
    G.derivation = "derived: 1 when only train_batch_size is given";
    M.v = T.v / W;
    M.derivation = "derived: " + std::string(kT) + " " + s(T.v) + " // " + ws;
  } else if (m) {
    G.v = 1;
    G.derivation = "derived: 1 when only train_micro_batch_size_per_gpu is given";
    T.v = mul(M.v, W);
    T.derivation = "derived: " + std::string(kM) + " " + s(M.v) + " * " + ws;
  } else {
    DSCPP_FAIL(ConfigError,
               "Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided (",
               g ? "only gradient_accumulation_steps " + s(*g) + " is given"
                 : std::string("none of the three batch keys is given"),
               "; ", where,
               "). HINT: set train_micro_batch_size_per_gpu (samples per rank per step) and "
               "optionally train_batch_size (samples per optimizer step over all ranks)");
  }

  // DeepSpeed's _batch_assertion, in its order.
  auto check_positive = [&](const char* key, const Value& x, const std::string& hint) {
    if (x.v > 0) return;
    DSCPP_FAIL(ConfigError, key, " ", x.v, " has to be greater than 0 (",
               x.derivation.empty() ? std::string("given") : x.derivation, "; ", where,
               "). HINT: ", hint);
  };
  check_positive(kT, T, "train_batch_size must be > 0");
  check_positive(kM, M,
                 g && t ? "train_batch_size " + s(T.v) + " must be at least " + kG + " * " + ws +
                              " = " + s(G.v * W)
                        : "train_batch_size " + s(T.v) + " must be at least the " + ws);
  check_positive(
      kG, G,
      "train_batch_size " + s(T.v) + " must be at least " + kM + " * " + ws + " = " + s(M.v * W));

  if (T.v != mul(mul(M.v, G.v), W)) {
    std::string notes;
    for (const auto& [key, x] : {std::pair<const char*, const Value&>{kT, T}, {kM, M}, {kG, G}})
      if (!x.derivation.empty())
        notes += std::string(key) + " " + s(x.v) + " " + x.derivation + "; ";
    std::string hint;
    if (t && m && g) {
      hint = "give only two of the three keys and let dscpp derive the third, or make " +
             std::string(kT) + " = " + s(M.v) + " * " + s(G.v) + " * " + s(W) + " = " +
             s(M.v * G.v * W);
    } else if (t && m) {
      hint = std::string(kT) + " must be a multiple of " + kM + " * " + ws + " = " + s(M.v * W);
    } else if (t && g) {
      hint = std::string(kT) + " must be a multiple of " + kG + " * " + ws + " = " + s(G.v * W);
    } else {
      hint = std::string(kT) + " must be a multiple of the " + ws;
    }
    DSCPP_FAIL(ConfigError, "batch sizes are inconsistent: ", kT, " ", T.v, " != ", kM, " ", M.v,
               " * ", kG, " ", G.v, " * world size ", W, " (", notes, where, "). HINT: ", hint,
               " (the world size is the number of data-parallel ranks)");
  }
  DSCPP_CHECK(T.v <= std::numeric_limits<int>::max(), ConfigError, kT, " ", T.v, " is too large (",
              T.derivation, "; ", where, ")");

  batch.train_batch_size = static_cast<int>(T.v);
  batch.train_micro_batch_size_per_gpu = static_cast<int>(M.v);
  batch.gradient_accumulation_steps = static_cast<int>(G.v);
  batch.world_size = world_size;
  batch.world_source = world_source;
  for (const auto& [key, x] : {std::pair<const char*, const Value&>{kT, T}, {kM, M}, {kG, G}}) {
    if (x.derivation.empty()) {
      origins.erase(key);
    } else {
      auto it = origins.find(key);
      const bool was_auto = it != origins.end() && it->second.rfind("auto", 0) == 0;
      origins[key] = (was_auto ? "auto -> " : "") + x.derivation;
    }
  }
  DSCPP_LOG_DEBUG("config: batch resolved: {} {} = {} {} * {} {} * world size {} ({})", kT, T.v, kM,
                  M.v, kG, G.v, W, where);
}

void Config::resolve_elastic_batch(int world_size, const std::string& world_source) {
  // NOTE [elastic batch] (src/config/elasticity.h): the section sets all three keys.
  const std::string where = "world size " + s(world_size) + " from " + world_source;
  std::string given;
  for (const auto& [key, v] :
       {std::pair<const char*, const std::optional<int>&>{kT, train_batch_size},
        {kM, train_micro_batch_size_per_gpu},
        {kG, gradient_accumulation_steps}}) {
    if (v) given += (given.empty() ? "" : ", ") + std::string(key) + " " + s(*v);
  }
  DSCPP_CHECK(given.empty() || elasticity.ignore_non_elastic_batch_info, ConfigError,
              "elasticity is enabled, so it sets the batch sizes, but the config also gives ",
              given,
              " (DeepSpeed refuses this too). HINT: remove them, or set "
              "elasticity.ignore_non_elastic_batch_info to true to have them ignored");
  check_scheduler_saw(elasticity);
  const config::ElasticBatch b = config::elastic_batch(elasticity, world_size);
  DSCPP_CHECK(b.train_batch_size <= std::numeric_limits<int>::max(), ConfigError,
              "elasticity: train_batch_size ", b.train_batch_size, " is too large");
  if (!given.empty()) {
    const std::string w = "elasticity sets the batch sizes: " + given + " ignored " +
                          "(elasticity.ignore_non_elastic_batch_info)";
    if (std::find(warnings.begin(), warnings.end(), w) == warnings.end()) {  // once per config
      warnings.push_back(w);
      DSCPP_LOG_WARN("{}", w);
    }
  }
  std::string valid;
  for (int64_t v : b.valid_world_sizes) valid += (valid.empty() ? "" : ", ") + s(v);
  batch.train_batch_size = static_cast<int>(b.train_batch_size);
  batch.train_micro_batch_size_per_gpu = static_cast<int>(b.micro_batch);
  batch.gradient_accumulation_steps = static_cast<int>(b.gradient_accumulation_steps);
  batch.world_size = world_size;
  batch.world_source = world_source;
  origins[kT] = "elasticity: valid at world sizes [" + valid + "]";
  origins[kM] = "elasticity: the largest micro_batch_sizes entry dividing " +
                s(b.train_batch_size) + " / world size " + s(world_size);
  origins[kG] = "elasticity: " + s(b.train_batch_size) + " / (" + s(b.micro_batch) +
                " * world size " + s(world_size) + ")";
  DSCPP_LOG_INFO(
      "elasticity (version {}): train_batch_size {} at world sizes [{}]; at {} ({}): "
      "micro batch {}, gradient accumulation {}",
      config::format_double(elasticity.version), b.train_batch_size, valid, world_size, where,
      b.micro_batch, b.gradient_accumulation_steps);
}

}  // namespace dscpp
