// Finding and verifying a checkpoint on disk (src/checkpoint/verify.h), over rank files written as
// safetensors with the digest save() reports: a whole one passes, and
// every kind of damage (a flipped byte, a truncated or missing rank file, a torn write the file
// system did not report, a tag folder whose manifest never arrived, a `latest` that names
// nothing) is an error naming the files and the tag, through the library and `dscpp checkpoint
// verify`.
#include "checkpoint/verify.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/publish.h"
#include "dscpp/error.h"
#include "dscpp/file_system.h"
#include "dscpp/safetensors.h"
#include "support/errors.h"
#include "support/fault_file_system.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"
#include "util/crc32c.h"

namespace dscpp::checkpoint {
namespace {

using testing::error_of;

// Saves a checkpoint as the engine will: begin_save, then each rank's slice of a group of
// 40 * world elements (the fp32 values and Adam's two states) written as safetensors through
// `rank_fs` with the digests save() reports going into the manifest, then publish through
// `publish_fs` (manifest, then latest).
Manifest write_checkpoint(const std::string& dir, const std::string& tag, int world,
                          io::FileSystem* rank_fs = nullptr, io::FileSystem* publish_fs = nullptr) {
  const std::string folder = begin_save(dir, tag, publish_fs).path;
  Manifest m;
  m.tag = tag;
  m.world_size = world;
  m.stage = 2;
  m.dtype = "fp32";
  m.optimizer = "AdamW";
  const int64_t numel = 40 * world;
  m.groups.push_back(Group{"model", numel, numel, {{"w", {numel}, 0}}});
  m.states = {"fp32", "exp_avg", "exp_avg_sq"};
  for (int r = 0; r < world; ++r) {
    safetensors::TensorList slices;
    for (size_t k = 0; k < m.states.size(); ++k) {
      slices.emplace_back(
          slice_tensor_name("model", m.states[k]),
          at::arange(40 * r, 40 * (r + 1), at::kFloat) * static_cast<double>(k + 1));
    }
    const std::string name = rank_file_name(r, world);
    const safetensors::FileDigest d = safetensors::save(folder + "/" + name, slices, {}, rank_fs);
    m.files.push_back(FileEntry{name, r, d.bytes, d.crc32c});
  }
  publish(dir, m, publish_fs);
  return m;
}

TEST(CheckpointVerify, AWholeCheckpointPassesAndLatestNamesTheTag) {
  testing::TempDir tmp("dscpp_ckpt");
  write_checkpoint(tmp.path(), "global_step10", 3);
  const Manifest m = verify(tmp.path());
  EXPECT_EQ(m.tag, "global_step10");
  EXPECT_EQ(m.files.size(), 3u);
  // What save() reported is what is on disk, and the slices read back.
  const std::string file1 = tmp.path() + "/global_step10/" + rank_file_name(1, 3);
  const auto [size, crc] = checksum_file(file1);
  EXPECT_EQ(size, m.files[1].bytes);
  EXPECT_EQ(crc, m.files[1].crc32c);
  const safetensors::Contents c = safetensors::load(file1);
  ASSERT_EQ(c.tensors.size(), 3u);
  EXPECT_EQ(c.tensors[1].first, "model/exp_avg");
  EXPECT_TRUE(at::equal(c.tensors[1].second, at::arange(40, 80, at::kFloat) * 2.0));
  // An explicit tag wins over latest.
  write_checkpoint(tmp.path(), "global_step20", 2);
  EXPECT_EQ(verify(tmp.path(), "global_step10").world_size, 3);
  EXPECT_EQ(verify(tmp.path()).world_size, 2);
}

TEST(CheckpointVerify, DamageIsNamedFileByFile) {
  testing::TempDir tmp("dscpp_ckpt");
  const Manifest m = write_checkpoint(tmp.path(), "t", 3);
  const std::string d = tmp.path() + "/t/";
  {  // flip one byte of rank 0's file
    std::fstream f(d + rank_file_name(0, 3), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(500);
    f.put('X');
  }
  std::filesystem::resize_file(d + rank_file_name(1, 3), 10);
  std::filesystem::remove(d + rank_file_name(2, 3));
  const std::string msg = error_of<CheckpointError>([&] { verify(tmp.path()); });
  EXPECT_NE(msg.find("checkpoint '" + tmp.path() + "/t' is damaged; nothing was loaded"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find(rank_file_name(0, 3) + ": CRC-32C"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(corrupted)"), std::string::npos) << msg;
  EXPECT_NE(msg.find(rank_file_name(1, 3) + ": 10 bytes, the manifest says " +
                     std::to_string(m.files[1].bytes) + " (torn or truncated)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find(rank_file_name(2, 3) + ": missing"), std::string::npos) << msg;
}

// A write the file system tore without reporting it (FaultFileSystem::tear) is caught by the
// manifest's sizes.
TEST(CheckpointVerify, ASilentlyTornWriteIsCaught) {
  testing::TempDir tmp("dscpp_ckpt");
  io::FaultFileSystem torn(io::FileFault{io::FileFault::Kind::tear, 1, 100});
  const Manifest m = write_checkpoint(tmp.path(), "t", 2, &torn);
  EXPECT_GT(torn.injected(), 0);
  const std::string msg = error_of<CheckpointError>([&] { verify(tmp.path()); });
  EXPECT_NE(msg.find(": 100 bytes, the manifest says " + std::to_string(m.files[0].bytes) +
                     " (torn or truncated)"),
            std::string::npos)
      << msg;
}

TEST(CheckpointVerify, MissingPiecesAreClearErrors) {
  testing::TempDir tmp("dscpp_ckpt");
  const std::string dir = tmp.path();
  EXPECT_NE(error_of<CheckpointError>([&] { verify(dir + "/nope"); }).find("does not exist"),
            std::string::npos);
  EXPECT_NE(error_of<CheckpointError>([&] { verify(dir); }).find("has no 'latest' file"),
            std::string::npos);
  write_checkpoint(dir, "t", 1);
  std::ofstream(dir + "/latest") << "gone\n";
  EXPECT_NE(error_of<CheckpointError>([&] {
              verify(dir);
            }).find("'" + dir + "/latest' names tag 'gone', but '" + dir + "/gone' does not exist"),
            std::string::npos);
  EXPECT_NE(error_of<CheckpointError>([&] { verify(dir, "other"); }).find("does not exist"),
            std::string::npos);
  // A save that never finished: rank files, no manifest. No fallback to another tag.
  std::filesystem::remove(dir + "/t/manifest.json");
  EXPECT_NE(error_of<CheckpointError>([&] {
              verify(dir, "t");
            }).find("has no manifest.json: its save did not finish"),
            std::string::npos);
}

TEST(CheckpointVerify, TheCommandLineSaysWholeOrNamesTheDamage) {
  testing::TempDir tmp("dscpp_ckpt");
  const Manifest m = write_checkpoint(tmp.path(), "global_step5", 2);
  auto r = testing::run_command(std::string(DSCPP_CLI_PATH) + " checkpoint verify " + tmp.path());
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("checkpoint " + tmp.path() + "/global_step5: whole (2 files"),
            std::string::npos)
      << r.output;
  std::filesystem::resize_file(tmp.path() + "/global_step5/" + rank_file_name(1, 2), 3);
  r = testing::run_command(std::string(DSCPP_CLI_PATH) + " checkpoint verify " + tmp.path() +
                           " --tag global_step5");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("3 bytes, the manifest says " + std::to_string(m.files[1].bytes)),
            std::string::npos)
      << r.output;
}

// A save that fails at any of its renames leaves `latest` on the previous checkpoint, which still
// verifies; a tag folder without its manifest is refused by name and can be saved again.
TEST(CheckpointPublish, AFailedSaveLeavesLatestOnTheWholePreviousCheckpoint) {
  testing::TempDir tmp("dscpp_ckpt");
  const std::string dir = tmp.path() + "/run";  // created by begin_save, parents included
  write_checkpoint(dir, "a", 2);
  // Renames of a 2-rank save: the two rank files, the manifest, latest.
  for (int nth = 1; nth <= 4; ++nth) {
    io::FaultFileSystem fail(io::FileFault{io::FileFault::Kind::fail_rename, nth});
    EXPECT_NE(error_of<IoError>([&] { write_checkpoint(dir, "b", 2, &fail, &fail); }), "")
        << "rename " << nth;
    EXPECT_EQ(verify(dir).tag, "a") << "rename " << nth;
    if (nth < 4) {
      EXPECT_NE(error_of<CheckpointError>([&] { verify(dir, "b"); }).find("did not finish"),
                std::string::npos);
    } else {  // only latest failed: b is complete, just not latest
      EXPECT_EQ(verify(dir, "b").tag, "b");
      std::filesystem::remove_all(dir + "/b");
    }
  }
  // A full disk while writing a rank file: same.
  io::FaultFileSystem full(io::FileFault{io::FileFault::Kind::disk_full, 1, 500});
  EXPECT_NE(error_of<IoError>([&] { write_checkpoint(dir, "b", 2, &full, &full); }), "");
  EXPECT_EQ(verify(dir).tag, "a");
  // The unfinished folder is saved over; then latest moves.
  write_checkpoint(dir, "b", 2);
  EXPECT_EQ(verify(dir).tag, "b");
  EXPECT_EQ(verify(dir, "a").tag, "a");
}

TEST(CheckpointPublish, TagsAreFolderNamesAndTheCompleteOneLatestNamesIsNeverOverwritten) {
  testing::TempDir tmp("dscpp_ckpt");
  write_checkpoint(tmp.path(), "a", 1);
  EXPECT_NE(error_of<CheckpointError>([&] {
              begin_save(tmp.path(), "a");
            }).find("already holds a complete checkpoint, the one 'latest' names"),
            std::string::npos);
  // A complete tag that latest does not name is replaced: un-published first.
  write_checkpoint(tmp.path(), "b", 1);
  SaveFolder again = begin_save(tmp.path(), "a");
  EXPECT_TRUE(again.replaced);
  EXPECT_FALSE(std::filesystem::exists(tmp.path() + "/a/manifest.json"));
  EXPECT_EQ(verify(tmp.path()).tag, "b");
  write_checkpoint(tmp.path(), "a", 1);
  EXPECT_EQ(verify(tmp.path()).tag, "a");
  EXPECT_FALSE(begin_save(tmp.path(), "c").replaced);
  for (const char* bad : {"", "x/y", "latest", ".hidden"}) {
    EXPECT_NE(error_of<CheckpointError>([&] { begin_save(tmp.path(), bad); }), "") << bad;
  }
  std::ofstream(tmp.path() + "/file") << "x";
  EXPECT_NE(error_of<IoError>([&] { begin_save(tmp.path() + "/file", "t"); }), "");
}

TEST(CheckpointPublish, ASaveAtANewWorldSizeClearsTheOldWorldSizesFilesOnly) {
  // A job restarted on fewer hosts saves global_step14 again: the files of the 2-rank save (one
  // of them a killed writer's temporary file) go; this world size's and anything else stay.
  testing::TempDir tmp("dscpp_ckpt");
  const std::string folder = begin_save(tmp.path(), "global_step14").path;
  const std::vector<std::string> gone = {"rank00000-of-00002.safetensors.tmp.15028.18",
                                         "rank00001-of-00002.safetensors"};
  const std::vector<std::string> kept = {"rank00000-of-00001.safetensors.tmp.77.0",
                                         "rank00000-of-00001.safetensors", "notes.txt",
                                         "rank00001-of-00002.safetensors.bak", "rank1-of-2.safetensors"};
  for (const auto& name : gone) std::ofstream(folder + "/" + name) << "x";
  for (const auto& name : kept) std::ofstream(folder + "/" + name) << "x";
  clear_other_world_sizes(folder, 1);
  for (const auto& name : gone) EXPECT_FALSE(std::filesystem::exists(folder + "/" + name)) << name;
  for (const auto& name : kept) EXPECT_TRUE(std::filesystem::exists(folder + "/" + name)) << name;
}

}  // namespace
}  // namespace dscpp::checkpoint
