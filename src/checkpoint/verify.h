// Finding a checkpoint on disk and proving it whole before a byte of state is read
// (docs/checkpoint.md, "Atomic and durable"): the tag `latest` names, its manifest, and every
// file's size and CRC-32C against the manifest. `dscpp checkpoint verify` runs the same checks
// offline. All access goes through io::FileSystem.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "checkpoint/manifest.h"

namespace dscpp::io {
class FileSystem;
}

namespace dscpp::checkpoint {

// The tag DIR/latest names (its first line), or "" when there is no `latest`. Throws IoError
// when it exists but cannot be read.
std::string read_latest(const std::string& dir, io::FileSystem* fs = nullptr);

// `tag` itself, or, when it is empty, the tag that DIR/latest names (its first line). Throws
// CheckpointError naming the path when DIR does not exist, or `latest` is missing, empty or names
// no folder.
std::string resolve_tag(const std::string& dir, const std::string& tag,
                        io::FileSystem* fs = nullptr);

// Reads and parses DIR/TAG/manifest.json. Throws CheckpointError naming the folder when it has no
// manifest (a save that never finished: the manifest is written last), or one that is invalid.
Manifest read_manifest(const std::string& dir, const std::string& tag,
                       io::FileSystem* fs = nullptr);

// The size and CRC-32C of a file, read in 4 MiB pieces. Throws IoError naming it.
std::pair<uint64_t, uint32_t> checksum_file(const std::string& path, io::FileSystem* fs = nullptr);

// What a file's check found: whole, or what is wrong with it and the details.
struct FileCheck {
  enum class Problem { none, missing, wrong_size, wrong_crc };
  Problem problem = Problem::none;
  std::string detail;  // "missing", "12 bytes, the manifest says 16 (torn or truncated)", ...
  // The problem in words without the details (what another rank can be told).
  static const char* describe(Problem p);
};

// Checks file `index` of `m` in DIR/TAG against the manifest: present, of its size, with its
// CRC-32C. Reads the whole file.
FileCheck check_file(const std::string& dir, const Manifest& m, size_t index,
                     io::FileSystem* fs = nullptr);

// Checks every file `m` lists in DIR/TAG: present, of its size, with its CRC-32C. Throws
// CheckpointError naming the tag and every file that fails, with what was expected and found.
void verify_files(const std::string& dir, const Manifest& m, io::FileSystem* fs = nullptr);

// resolve_tag, read_manifest and verify_files; returns the manifest. Never falls back to another
// tag: a damaged checkpoint is an error, whatever else the folder holds.
Manifest verify(const std::string& dir, const std::string& tag = "", io::FileSystem* fs = nullptr);

}  // namespace dscpp::checkpoint
