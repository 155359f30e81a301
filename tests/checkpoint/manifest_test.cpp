// The checkpoint manifest: a round trip through JSON, the resharding arithmetic of
// docs/checkpoint.md (its worked example, and every element of random layouts), and a clear
// error for each kind of bad manifest.
#include "checkpoint/manifest.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "dscpp/error.h"
#include "support/errors.h"

namespace dscpp::checkpoint {
namespace {

// A manifest of one group holding parameters of the given element counts, saved at `world`.
Manifest make_manifest(const std::vector<int64_t>& sizes, int world) {
  Manifest m;
  m.tag = "global_step7";
  m.world_size = world;
  m.stage = 2;
  m.dtype = "bf16";
  m.optimizer = "AdamW";
  Group g;
  g.name = "model";
  for (size_t i = 0; i < sizes.size(); ++i) {
    g.parameters.push_back(ParamEntry{"p" + std::to_string(i), {sizes[i]}, g.numel});
    g.numel += sizes[i];
  }
  g.padded = (g.numel + world - 1) / world * world;
  m.groups.push_back(g);
  m.states = {"fp32", "exp_avg", "exp_avg_sq"};
  for (int r = 0; r < world; ++r)
    m.files.push_back(FileEntry{rank_file_name(r, world), r, 1000u + r, 0xdeadbeefu + r});
  m.counters = {{"global_steps", 7}};
  m.client_state = {{"epoch", 3}};
  return m;
}

TEST(CheckpointManifest, RoundTripsThroughJson) {
  Manifest m = make_manifest({6, 4}, 4);
  m.groups[0].parameters[0].shape = {2, 3};
  Manifest back = Manifest::parse(m.to_json(), "manifest.json");
  EXPECT_EQ(back.to_json(), m.to_json());
  EXPECT_EQ(back.files[3].crc32c, 0xdeadbeefu + 3);
  EXPECT_EQ(back.files[1].path, "rank00001-of-00004.safetensors");
  EXPECT_EQ(back.client_state["epoch"], 3);
  EXPECT_EQ(back.shard(back.groups[0]), 3);
  EXPECT_EQ(slice_tensor_name("model", "exp_avg"), "model/exp_avg");
}

// docs/checkpoint.md's worked example: `a` (6 elements) and `b` (4) saved at N = 4 (S = 3); at
// M = 3 (S' = 4) new rank 1 owns [4, 8): a's [4, 6) and b's [0, 2).
TEST(CheckpointManifest, TheWorkedExampleOfTheDesign) {
  Manifest m = make_manifest({6, 4}, 4);
  EXPECT_EQ(reads_for(m, "p0", 4, 6), (std::vector<SliceRead>{{1, 1, 0, 2}}));
  EXPECT_EQ(reads_for(m, "p1", 0, 2), (std::vector<SliceRead>{{2, 0, 0, 2}}));
  // The whole of b straddles ranks 2 and 3.
  EXPECT_EQ(reads_for(m, "p1", 0, 4), (std::vector<SliceRead>{{2, 0, 0, 3}, {3, 0, 3, 1}}));
  EXPECT_TRUE(reads_for(m, "p1", 2, 2).empty());
}

// Every element of every parameter of random layouts is read exactly once, from rank
// (offset + i) / S at position (offset + i) % S, in order.
TEST(CheckpointManifest, ReadsCoverEveryElementOnceAtAnyWorldSize) {
  std::mt19937 gen(11);
  for (int world = 1; world <= 4; ++world) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<int64_t> sizes;
      for (int k = 0, n = 1 + static_cast<int>(gen() % 5); k < n; ++k) sizes.push_back(gen() % 9);
      Manifest m = make_manifest(sizes, world);
      const int64_t S = m.shard(m.groups[0]);
      for (const auto& p : m.groups[0].parameters) {
        const int64_t n = p.numel();
        const int64_t begin = n ? static_cast<int64_t>(gen() % n) : 0;
        const int64_t end = begin + static_cast<int64_t>(gen() % (n - begin + 1));
        int64_t next = 0;
        for (const auto& r : reads_for(m, p.name, begin, end)) {
          ASSERT_EQ(r.dst, next);
          ASSERT_GT(r.numel, 0);
          ASSERT_LE(r.position + r.numel, S);
          for (int64_t e = 0; e < r.numel; ++e) {
            const int64_t flat = p.offset + begin + r.dst + e;
            ASSERT_EQ(r.rank, flat / S);
            ASSERT_EQ(r.position + e, flat % S);
          }
          next += r.numel;
        }
        ASSERT_EQ(next, end - begin) << "world " << world << " " << p.name;
      }
    }
  }
}

std::string parse_error(const std::string& text) {
  return testing::error_of<CheckpointError>([&] { Manifest::parse(text, "ck/manifest.json"); });
}

TEST(CheckpointManifest, BadManifestsAreClearErrors) {
  const std::string good = make_manifest({6, 4}, 2).to_json();
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  EXPECT_NE(parse_error(good.substr(0, good.size() / 2)).find("ck/manifest.json is not valid JSON"),
            std::string::npos);
  EXPECT_NE(parse_error(with("\"version\": 1", "\"version\": 2"))
                .find("version: is 2, but this dscpp reads versions 1..1"),
            std::string::npos);
  EXPECT_NE(parse_error(with("\"dscpp-checkpoint\"", "\"other\"")).find("format"),
            std::string::npos);
  EXPECT_NE(parse_error(with("\"padded\": 10", "\"padded\": 9"))
                .find("padded 9 is not numel 10 rounded up to a multiple of world size 2"),
            std::string::npos);
  EXPECT_NE(parse_error(with("\"name\": \"p1\"", "\"name\": \"p0\"")).find("'p0' appears twice"),
            std::string::npos);
  // Over-padding would move every shard boundary: only numel rounded up to the world size.
  EXPECT_NE(parse_error(with("\"padded\": 10", "\"padded\": 12"))
                .find("padded 12 is not numel 10 rounded up"),
            std::string::npos);
  // Integers are integers: no truncated floats, no booleans, no wrapped negatives.
  EXPECT_NE(parse_error(with("\"world_size\": 2", "\"world_size\": 2.5"))
                .find("saved_with.world_size: must be an integer, got 2.5"),
            std::string::npos);
  EXPECT_NE(parse_error(with("\"stage\": 2", "\"stage\": true")).find("must be an integer"),
            std::string::npos);
  EXPECT_NE(
      parse_error(with("\"bytes\": 1000", "\"bytes\": -1")).find("files[0].bytes: is -1, outside"),
      std::string::npos);
  Manifest huge = make_manifest({6, 4}, 2);
  huge.groups[0].parameters[0].shape = {4294967296, 4294967296};
  EXPECT_NE(parse_error(huge.to_json()).find("'p0' has more than 2^63 elements"),
            std::string::npos);
  Manifest twice = make_manifest({6, 4}, 2);
  twice.groups.push_back(twice.groups[0]);
  for (auto& p : twice.groups[1].parameters) p.name += "x";
  EXPECT_NE(parse_error(twice.to_json()).find("group name 'model' is empty or appears twice"),
            std::string::npos);
  EXPECT_NE(parse_error(with("\"exp_avg\"", "\"fp32\"")).find("state name 'fp32'"),
            std::string::npos);
  EXPECT_NE(
      parse_error(with("\"offset\": 6", "\"offset\": 5")).find("'p1' starts at 5, expected 6"),
      std::string::npos);
  EXPECT_NE(parse_error(with("rank00001-of-00002", "rank00001-of-00003"))
                .find("files[1]: expected rank 1's file rank00001-of-00002.safetensors"),
            std::string::npos);
  EXPECT_NE(parse_error(with("\"deadbeef\"", "\"xyz\"")).find("crc32c: must be 8 lowercase hex"),
            std::string::npos);
  EXPECT_NE(parse_error(with("\"tag\"", "\"tog\"")).find("missing \"tag\""), std::string::npos);
  const Manifest m = make_manifest({6, 4}, 2);
  EXPECT_NE(testing::error_of<CheckpointError>([&] {
              reads_for(m, "nope", 0, 0);
            }).find("checkpoint 'global_step7' has no parameter 'nope'"),
            std::string::npos);
  EXPECT_NE(testing::error_of<CheckpointError>([&] {
              reads_for(m, "p1", 0, 5);
            }).find("elements [0, 5) lie outside parameter 'p1' (4 elements)"),
            std::string::npos);
}

}  // namespace
}  // namespace dscpp::checkpoint
