// The rank files of a checkpoint, each opened (its safetensors header read) the first time a read
// needs it: a load or a consolidation opens only the files its byte ranges lie in.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "checkpoint/manifest.h"
#include "dscpp/safetensors.h"

namespace dscpp::checkpoint {

class RankFiles {
 public:
  // The files of `m` in DIR/m.tag, through `fs` (null: POSIX).
  RankFiles(const std::string& dir, const Manifest& m, io::FileSystem* fs = nullptr)
      : folder_(dir + "/" + m.tag), m_(m), fs_(fs) {}

  // Rank `rank`'s file. Throws IoError naming it when it cannot be opened or its header is bad.
  safetensors::Reader& operator[](int rank) {
    auto& r = readers_[rank];
    if (!r) r = std::make_unique<safetensors::Reader>(folder_ + "/" + m_.files.at(rank).path, fs_);
    return *r;
  }
  // Bytes of tensor data read so far from all of them.
  uint64_t bytes_read() const {
    uint64_t n = 0;
    for (const auto& [rank, r] : readers_) n += r->bytes_read();
    return n;
  }

 private:
  std::string folder_;
  const Manifest& m_;
  io::FileSystem* fs_;
  std::map<int, std::unique_ptr<safetensors::Reader>> readers_;
};

}  // namespace dscpp::checkpoint
