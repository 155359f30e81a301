// Implements finding and verifying a checkpoint (verify.h).
#include "checkpoint/verify.h"

#include <algorithm>
#include <vector>

#include "dscpp/error.h"
#include "dscpp/file_system.h"
#include "util/crc32c.h"

namespace dscpp::checkpoint {
namespace {

constexpr size_t kPiece = size_t{4} << 20;

std::string read_small_file(io::FileSystem& fs, const std::string& path) {
  auto f = fs.open_for_read(path);
  std::string text(f->size(), '\0');
  if (!text.empty()) f->pread(0, text.data(), text.size());
  return text;
}

}  // namespace

std::string read_latest(const std::string& dir, io::FileSystem* fsp) {
  io::FileSystem& fs = io::resolve(fsp);
  const std::string latest = dir + "/latest";
  if (!fs.exists(latest)) return "";
  std::string t = read_small_file(fs, latest);
  return t.substr(0, t.find('\n'));
}

std::string resolve_tag(const std::string& dir, const std::string& tag, io::FileSystem* fsp) {
  io::FileSystem& fs = io::resolve(fsp);
  DSCPP_CHECK(fs.exists(dir), CheckpointError, "checkpoint folder '", dir, "' does not exist");
  std::string t = tag;
  if (t.empty()) {
    const std::string latest = dir + "/latest";
    DSCPP_CHECK(fs.exists(latest), CheckpointError, "checkpoint folder '", dir,
                "' has no 'latest' file, so no tag to load. HINT: pass the tag to load");
    t = read_latest(dir, &fs);
    DSCPP_CHECK(!t.empty(), CheckpointError, "'", latest, "' is empty");
    DSCPP_CHECK(fs.exists(dir + "/" + t), CheckpointError, "'", latest, "' names tag '", t,
                "', but '", dir, "/", t, "' does not exist");
  } else {
    DSCPP_CHECK(fs.exists(dir + "/" + t), CheckpointError, "checkpoint '", dir, "/", t,
                "' does not exist");
  }
  return t;
}

Manifest read_manifest(const std::string& dir, const std::string& tag, io::FileSystem* fsp) {
  io::FileSystem& fs = io::resolve(fsp);
  const std::string path = dir + "/" + tag + "/manifest.json";
  DSCPP_CHECK(fs.exists(path), CheckpointError, "checkpoint '", dir, "/", tag,
              "' has no manifest.json: its save did not finish (the manifest is written last). "
              "HINT: load an earlier tag; 'latest' only ever names a complete one");
  Manifest m = Manifest::parse(read_small_file(fs, path), path);
  DSCPP_CHECK(m.tag == tag, CheckpointError, "'", path, "' describes tag '", m.tag, "', not '", tag,
              "' (a folder renamed or copied by hand?)");
  return m;
}

std::pair<uint64_t, uint32_t> checksum_file(const std::string& path, io::FileSystem* fsp) {
  auto f = io::resolve(fsp).open_for_read(path);
  const uint64_t size = f->size();
  std::vector<char> buf(static_cast<size_t>(std::min<uint64_t>(size, kPiece)));
  uint32_t crc = 0;
  for (uint64_t at = 0; at < size;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(size - at, kPiece));
    f->pread(at, buf.data(), n);
    crc = crc32c_extend(crc, buf.data(), n);
    at += n;
  }
  return {size, crc};
}

const char* FileCheck::describe(Problem p) {
  switch (p) {
    case Problem::none:
      return "whole";
    case Problem::missing:
      return "missing";
    case Problem::wrong_size:
      return "not of the size the manifest says (torn or truncated)";
    case Problem::wrong_crc:
      return "CRC-32C differs from the manifest's (corrupted)";
  }
  return "?";
}

FileCheck check_file(const std::string& dir, const Manifest& m, size_t index, io::FileSystem* fsp) {
  using P = FileCheck::Problem;
  io::FileSystem& fs = io::resolve(fsp);
  const FileEntry& f = m.files.at(index);
  const std::string path = dir + "/" + m.tag + "/" + f.path;
  if (!fs.exists(path)) return {P::missing, "missing"};
  if (uint64_t size = fs.file_size(path); size != f.bytes) {
    return {P::wrong_size, std::to_string(size) + " bytes, the manifest says " +
                               std::to_string(f.bytes) + " (torn or truncated)"};
  }
  if (uint32_t crc = checksum_file(path, &fs).second; crc != f.crc32c) {
    return {P::wrong_crc, "CRC-32C " + crc32c_hex(crc) + ", the manifest says " +
                              crc32c_hex(f.crc32c) + " (corrupted)"};
  }
  return {};
}

void verify_files(const std::string& dir, const Manifest& m, io::FileSystem* fs) {
  std::string problems;
  for (size_t i = 0; i < m.files.size(); ++i) {
    FileCheck c = check_file(dir, m, i, fs);
    if (c.problem != FileCheck::Problem::none)
      problems += "\n  " + dir + "/" + m.tag + "/" + m.files[i].path + ": " + c.detail;
  }
  DSCPP_CHECK(problems.empty(), CheckpointError, "checkpoint '", dir, "/", m.tag,
              "' is damaged; nothing was loaded:", problems);
}

Manifest verify(const std::string& dir, const std::string& tag, io::FileSystem* fs) {
  const std::string t = resolve_tag(dir, tag, fs);
  Manifest m = read_manifest(dir, t, fs);
  verify_files(dir, m, fs);
  return m;
}

}  // namespace dscpp::checkpoint
