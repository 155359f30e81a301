// Finding a checkpoint on disk and proving it whole before a byte of state is read
// (docs/checkpoint.md, "Atomic and durable"): the tag `latest` names, its manifest, and every
// file's size and CRC-32C against the manifest. `dscpp checkpoint verify` runs the same checks
// offline. All access goes through io::FileSystem.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "checkpoint/manifest.h"

namespace dscpp::io {
class FileSystem;
}

namespace dscpp::checkpoint {

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

// Checks every file `m` lists in DIR/TAG: present, of its size, with its CRC-32C. Throws
// CheckpointError naming the tag and every file that fails, with what was expected and found.
void verify_files(const std::string& dir, const Manifest& m, io::FileSystem* fs = nullptr);

// resolve_tag, read_manifest and verify_files; returns the manifest. Never falls back to another
// tag: a damaged checkpoint is an error, whatever else the folder holds.
Manifest verify(const std::string& dir, const std::string& tag = "", io::FileSystem* fs = nullptr);

}  // namespace dscpp::checkpoint
