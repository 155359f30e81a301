// A checkpoint's manifest (docs/checkpoint.md, "The manifest"): what was saved, by which world
// size and stage, where every parameter lies in its group's flat buffer, and the size and CRC-32C
// of each rank's file. The manifest alone tells a loader which byte ranges of which files hold
// any element it needs, whatever world size and stage it loads at (reads_for). No libtorch here:
// shapes are integers and dtypes names.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace dscpp::checkpoint {

// The manifest format this dscpp writes and the newest it reads.
inline constexpr int kFormatVersion = 1;

// One parameter of a flat group: elements [offset, offset + numel()) of the group's buffer.
struct ParamEntry {
  std::string name;  // named_parameters() name
  std::vector<int64_t> shape;
  int64_t offset = 0;
  int64_t numel() const;
};

// A flat group (NOTE [flat partition] in src/zero/partition.h): its parameters in buffer order,
// `numel` elements padded to `padded`, a multiple of the world size it was saved at.
struct Group {
  std::string name;
  int64_t numel = 0;
  int64_t padded = 0;
  std::vector<ParamEntry> parameters;
};

// A rank's file: every group's slice [rank * S, (rank + 1) * S) of every state.
struct FileEntry {
  std::string path;  // relative to the tag's folder
  int rank = 0;
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};

// A frozen parameter or buffer of the module: whole, in rank 0's file as "module/<name>", in the
// dtype the model held it (replicated_tensor_name).
struct ReplicatedEntry {
  std::string name;
  std::vector<int64_t> shape;
};

struct Manifest {
  std::string tag;
  int world_size = 1;  // what it was saved with
  int stage = 0;
  std::string dtype;      // "fp32", "bf16", "fp16"
  std::string optimizer;  // the config's optimizer.type
  std::vector<Group> groups;
  std::vector<std::string> states;  // per-element states in each rank file: "fp32", "exp_avg", ...
  std::vector<FileEntry> files;     // one per rank, in rank order
  std::vector<ReplicatedEntry> replicated;
  // Small state, kept as JSON: counters, LR schedule, loss scaler, RNG, data position, the
  // user's client_state, the resolved config.
  nlohmann::json counters = nlohmann::json::object();
  nlohmann::json lr_scheduler = nlohmann::json::object();
  nlohmann::json loss_scaler = nlohmann::json::object();
  nlohmann::json rng = nlohmann::json::object();
  nlohmann::json data = nlohmann::json::object();
  nlohmann::json client_state = nlohmann::json::object();
  nlohmann::json config = nlohmann::json::object();

  // Elements of `g` each rank's file holds.
  int64_t shard(const Group& g) const { return g.padded / world_size; }

  std::string to_json() const;
  // Parses and validates (see the .cpp's checks); `source` names the file in errors. Throws
  // CheckpointError naming the source and what is wrong, including a format version newer than
  // kFormatVersion.
  static Manifest parse(const std::string& text, const std::string& source);

  // Group and parameter index of `name`, or {-1, -1}.
  std::pair<int, int> find(const std::string& name) const;
};

// A CRC-32C as the manifest spells it: 8 lowercase hex digits.
std::string crc32c_hex(uint32_t crc);

// The file name of `rank`'s slice: "rank00001-of-00004.safetensors".
std::string rank_file_name(int rank, int world_size);

// The tensor that holds `state` of group `group` in every rank file: "<group>/<state>".
std::string slice_tensor_name(const std::string& group, const std::string& state);

// The tensor that holds frozen parameter or buffer `name` in rank 0's file: "module/<name>".
std::string replicated_tensor_name(const std::string& name);

// One contiguous read: `numel` elements starting at element `position` of a state's slice in
// `rank`'s file, landing at element `dst` of the requested range.
struct SliceRead {
  int rank = 0;
  int64_t position = 0;
  int64_t dst = 0;
  int64_t numel = 0;
  bool operator==(const SliceRead& o) const {
    return rank == o.rank && position == o.position && dst == o.dst && numel == o.numel;
  }
};

// The reads that fetch elements [begin, end) of parameter `name` (counted within the parameter,
// row-major), in order: the resharding arithmetic of docs/checkpoint.md. Throws CheckpointError
// when the checkpoint has no such parameter or the range lies outside it.
std::vector<SliceRead> reads_for(const Manifest& m, const std::string& name, int64_t begin,
                                 int64_t end);

}  // namespace dscpp::checkpoint
