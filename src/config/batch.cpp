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
#include <cstdint>
#include <limits>
#include <string>

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

}  // namespace

void Config::resolve_batch(int world_size, const std::string& world_source) {
  const std::string where = "world size " + s(world_size) + " from " + world_source;
  DSCPP_CHECK(world_size >= 1, ConfigError,
              "cannot resolve the batch sizes: the data-parallel world size must be >= 1, got ",
              world_size, " (from ", world_source, ")");
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

}  // namespace dscpp
