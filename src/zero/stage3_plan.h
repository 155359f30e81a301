// Stage 3's plan, decided from the model alone before anything is sharded: which modules are
// units, which trainable parameters each one shards, and which shards offload_param nvme puts on
// disk. Stage3's set-up lays out what it says, and the engine's model check (check_model,
// src/engine/check_supported.h) judges a config against it without a communicator, so that
// dscpp::check and initialize() refuse the same things with the same text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dscpp/zero.h"
#include "zero/partition.h"

namespace torch::nn {
class Module;
}

namespace dscpp::zero {

// A module stage 3 gathers and releases whole, and its path ("(root)" for the model itself).
struct UnitRoot {
  torch::nn::Module* module = nullptr;
  std::string name;
};

// The units `policy` picks in `model`: the outermost modules it matches, in named_modules()
// order. None: the whole model is one unit (`whole_model` set).
std::vector<UnitRoot> find_units(torch::nn::Module& model, const UnitPolicy& policy,
                                 bool* whole_model);

// The trainable parameters split into the resident group and each unit's sharded ones.
struct UnitAssignment {
  NamedParams resident;
  std::vector<NamedParams> sharded;  // [unit]
};

// Each parameter of `np` goes to the first unit whose subtree holds it when it has at least
// `persistence_threshold` elements, else to the resident group. Throws ConfigError for no
// parameters, one not fp32 on the first one's device (check_fp32_on_one_device), a trainable
// parameter two units share, and one zero::Init sharded that would stay resident.
UnitAssignment assign_to_units(const std::vector<UnitRoot>& units, const NamedParams& np,
                               int64_t persistence_threshold);

// offload_param nvme (NOTE [stage 3 parameter offload] in stage3.h): given each unit's shard
// elements in part order, the shards that stay in memory are the longest prefix of non-empty
// ones within `max_in_cpu` elements; the rest go to disk. Per unit: its slot in the swap file, or
// -1 (in memory, or empty).
std::vector<int> disk_slots(const std::vector<int64_t>& shard_numels, int64_t max_in_cpu);

}  // namespace dscpp::zero
