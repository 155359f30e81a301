// The elastic batch (elasticity.h, NOTE [elastic batch]).
#include "config/elasticity.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <set>
#include <string>

#include "dscpp/error.h"
#include "util/strings.h"

namespace dscpp::config {
namespace {

// The 38 smallest highly composite numbers (DeepSpeed's list: batch sizes up to 720K).
constexpr int64_t kHighlyComposite[] = {
    1,      2,      4,      6,      12,     24,     36,     48,    60,    120,
    180,    240,    360,    720,    840,    1260,   1680,   2520,  5040,  7560,
    10080,  15120,  20160,  25200,  27720,  45360,  50400,  55440, 83160, 110880,
    166320, 221760, 277200, 332640, 498960, 554400, 665280, 720720};

// Each base scaled by the largest highly composite number that keeps it within `max_batch`
// (a base above it is dropped; one that equals it is kept as is).
std::set<int64_t> candidate_batches(const std::vector<int64_t>& bases, int64_t max_batch) {
  std::set<int64_t> out;
  for (int64_t base : bases) {
    if (base > max_batch) continue;
    if (base == max_batch) {
      out.insert(base);
      continue;
    }
    const int64_t limit = max_batch / base;
    // The last number <= limit; DeepSpeed's argmax wraps to the last one past the list.
    const int64_t* first_above =
        std::upper_bound(std::begin(kHighlyComposite), std::end(kHighlyComposite), limit);
    const int64_t hcn =
        first_above == std::begin(kHighlyComposite) || first_above == std::end(kHighlyComposite)
            ? kHighlyComposite[std::size(kHighlyComposite) - 1]
            : *(first_above - 1);
    out.insert(hcn * base);
  }
  return out;
}

// The world sizes in [min_world, max_world] at which `batch` splits into whole micro batches.
std::vector<int64_t> valid_world_sizes(int64_t batch, const std::vector<int64_t>& micro_batches,
                                       int64_t min_world, int64_t max_world) {
  std::set<int64_t> valid;
  for (int64_t m : micro_batches) {
    if (batch % m != 0) continue;
    const int64_t most = batch / m;
    if (min_world <= most && most <= max_world) valid.insert(most);
    for (int64_t w = 1; w <= most / 2 && w <= max_world; ++w) {
      if (w >= min_world && most % w == 0) valid.insert(w);
    }
  }
  return {valid.begin(), valid.end()};
}

std::string list(const std::vector<int64_t>& v) {
  std::vector<std::string> parts;
  for (int64_t x : v) parts.push_back(std::to_string(x));
  return "[" + join(parts, ", ") + "]";
}

}  // namespace

ElasticBatch compatible_world_sizes(const std::vector<int64_t>& micro_batches, int64_t max_batch,
                                    int64_t min_world, int64_t max_world, bool prefer_larger) {
  const int64_t smallest = *std::min_element(micro_batches.begin(), micro_batches.end());
  if (min_world <= 0) min_world = 1;
  if (max_world <= 0) max_world = max_batch / smallest;
  int64_t lcm = 1;
  for (int64_t m : micro_batches) lcm = std::lcm(lcm, m);
  std::vector<int64_t> bases = micro_batches;
  bases.push_back(lcm);
  // The candidate valid at the most world sizes; ties to the larger (or smaller) batch. The
  // start, the smallest micro batch valid nowhere, is what an empty candidate list leaves.
  ElasticBatch best;
  best.train_batch_size = smallest;
  size_t best_count = 0;
  for (int64_t batch : candidate_batches(bases, max_batch)) {
    std::vector<int64_t> valid = valid_world_sizes(batch, micro_batches, min_world, max_world);
    const bool better =
        valid.size() > best_count ||
        (valid.size() == best_count &&
         (prefer_larger ? batch > best.train_batch_size : batch < best.train_batch_size));
    if (!better) continue;
    best_count = valid.size();
    best.train_batch_size = batch;
    best.valid_world_sizes = std::move(valid);
  }
  return best;
}

ElasticBatch elastic_batch(const ElasticityConfig& e, int64_t world_size) {
  const std::vector<int64_t>& mb = e.micro_batch_sizes;
  for (int64_t m : mb) {
    DSCPP_CHECK(m <= e.max_train_batch_size, ConfigError, "elasticity.micro_batch_sizes ", list(mb),
                ": every micro batch size must be at most max_train_batch_size ",
                e.max_train_batch_size, ". HINT: raise max_train_batch_size or drop ", m);
  }
  ElasticBatch b;
  if (e.version == 0.1) {
    b = compatible_world_sizes(mb, e.max_train_batch_size, e.min_gpus, e.max_gpus,
                               e.prefer_larger_batch);
  } else {
    // Version 0.2: whole nodes of num_gpus_per_node ranks.
    const int64_t per_node = e.num_gpus_per_node;
    for (int64_t m : mb) {
      DSCPP_CHECK(m <= e.max_train_batch_size / per_node, ConfigError,
                  "elasticity.micro_batch_sizes ", list(mb),
                  ": at version 0.2 every micro batch size must be at most max_train_batch_size "
                  "/ num_gpus_per_node = ",
                  e.max_train_batch_size / per_node, ". HINT: raise max_train_batch_size");
    }
    b = compatible_world_sizes(mb, e.max_train_batch_size / per_node, e.min_gpus / per_node,
                               e.max_gpus / per_node, e.prefer_larger_batch);
    b.train_batch_size *= per_node;
    for (int64_t& w : b.valid_world_sizes) w *= per_node;
    const bool valid = std::find(b.valid_world_sizes.begin(), b.valid_world_sizes.end(),
                                 world_size) != b.valid_world_sizes.end();
    if (!valid) {
      const std::vector<int64_t> valid_list_before_fallback = b.valid_world_sizes;
      // A batch of this world size's own: the largest (or smallest) multiple of m * W within
      // the maximum, over the micro batch sizes m.
      std::optional<int64_t> pick;
      for (int64_t m : mb) {
        const int64_t unit = m * world_size;
        const int64_t candidate = e.max_train_batch_size / unit * unit;
        if (!pick || (e.prefer_larger_batch ? candidate > *pick : candidate < *pick))
          pick = candidate;
      }
      b.train_batch_size = *pick;
      // DeepSpeed's assertion that the batch is positive, as an error that says why.
      DSCPP_CHECK(b.train_batch_size > 0, ConfigError, "elasticity (version 0.2): world size ",
                  world_size, " is not in the valid list ", list(valid_list_before_fallback),
                  ", and its own batch, a multiple of a micro batch size x ", world_size,
                  " within max_train_batch_size ", e.max_train_batch_size, ", is ",
                  b.train_batch_size,
                  ". HINT: run at a world size from the list, or raise max_train_batch_size to "
                  "at least ",
                  *std::min_element(mb.begin(), mb.end()) * world_size);
      b.valid_world_sizes = {world_size};
    }
  }
  DSCPP_CHECK(std::find(b.valid_world_sizes.begin(), b.valid_world_sizes.end(), world_size) !=
                  b.valid_world_sizes.end(),
              ConfigError, "elasticity: world size ", world_size,
              " is not one of the world sizes train_batch_size ", b.train_batch_size,
              " splits into (", list(b.valid_world_sizes), "; version ", e.version,
              "). HINT: run at one of them, or widen min_gpus/max_gpus or micro_batch_sizes");
  // The largest micro batch size that divides this world size's share.
  std::vector<int64_t> sizes = mb;
  std::sort(sizes.rbegin(), sizes.rend());
  for (int64_t m : sizes) {
    if (b.train_batch_size / world_size % m == 0) {
      b.micro_batch = m;
      break;
    }
  }
  DSCPP_CHECK(b.micro_batch > 0, ConfigError, "elasticity: no micro batch size of ", list(mb),
              " divides train_batch_size ", b.train_batch_size, " / world size ", world_size,
              ". HINT: add a micro batch size that divides it");
  b.gradient_accumulation_steps = b.train_batch_size / (b.micro_batch * world_size);
  return b;
}

}  // namespace dscpp::config
