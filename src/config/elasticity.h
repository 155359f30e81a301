// DeepSpeed's elasticity (the config's `elasticity` section): one train_batch_size that many
// world sizes can train, each through its own micro batch size and gradient accumulation, so a
// job restarted on fewer or more ranks trains the same batches.
//
// NOTE [elastic batch]: as DeepSpeed 0.19 computes it (deepspeed/elasticity/elasticity.py):
//   version 0.1: bases are each micro batch size and their least common multiple; each base is
//     scaled by the largest highly composite number that keeps it within max_train_batch_size;
//     the candidate valid at the most world sizes in [min_gpus, max_gpus] wins (a world size W is
//     valid when some micro batch m divides the batch and W divides batch / m), ties going to the
//     larger batch (prefer_larger_batch) or the smaller.
//   version 0.2: the same at node granularity (num_gpus_per_node ranks per node). A world size
//     outside the valid list still trains: its batch is the largest (or smallest) multiple of
//     m * W within max_train_batch_size over the micro batch sizes m, so that world size trains
//     another train_batch_size than the valid ones.
// The engine then runs the largest micro batch size that divides batch / W, and
// gradient_accumulation_steps = batch / (micro * W).
#pragma once

#include <cstdint>
#include <vector>

#include "dscpp/config.h"

namespace dscpp::config {

struct ElasticBatch {
  int64_t train_batch_size = 0;
  std::vector<int64_t> valid_world_sizes;  // ascending
  int64_t micro_batch = 0;                 // at the world size asked for
  int64_t gradient_accumulation_steps = 0;
};

// Version 0.1's heuristic: the batch size and the world sizes in [min_world, max_world] it is
// valid at (max_world 0: max_batch / the smallest micro batch).
ElasticBatch compatible_world_sizes(const std::vector<int64_t>& micro_batches, int64_t max_batch,
                                    int64_t min_world, int64_t max_world, bool prefer_larger);

// The batch triple of an enabled `elasticity` section at `world_size` ranks. Throws ConfigError
// when the section cannot give one (a world size outside the valid list at version 0.1).
ElasticBatch elastic_batch(const ElasticityConfig& e, int64_t world_size);

}  // namespace dscpp::config
