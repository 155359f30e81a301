// FaultFileSystem's writable file: counts appends and syncs and applies the configured fault.
#include "support/fault_file_system.h"

#include <algorithm>

#include "dscpp/error.h"

namespace dscpp::io {

class FaultWritableFile final : public WritableFile {
 public:
  FaultWritableFile(FaultFileSystem& fs, std::unique_ptr<WritableFile> inner)
      : fs_(fs), inner_(std::move(inner)) {}

  void append(const void* data, size_t n) override {
    const FileFault& f = fs_.fault_;
    int64_t nth = ++fs_.appends_;
    if (f.kind == FileFault::Kind::fail_append && nth == f.nth) {
      inner_->append(data, n / 2);
      ++fs_.injected_;
      DSCPP_FAIL(IoError, "writing ", n, " bytes to '", path(),
                 "' failed: injected fault (append #", nth, ")");
    }
    if (f.kind == FileFault::Kind::disk_full) {
      uint64_t before = fs_.bytes_written_.fetch_add(n);
      if (before + n > f.bytes) {
        uint64_t room = before < f.bytes ? f.bytes - before : 0;
        inner_->append(data, static_cast<size_t>(room));
        ++fs_.injected_;
        DSCPP_FAIL(IoError, "writing ", n, " bytes to '", path(),
                   "' failed: No space left on device (injected after ", f.bytes, " bytes)");
      }
    }
    if (f.kind == FileFault::Kind::tear) {
      uint64_t keep = written_ < f.bytes ? std::min<uint64_t>(n, f.bytes - written_) : 0;
      if (keep < n) ++fs_.injected_;
      inner_->append(data, static_cast<size_t>(keep));
      written_ += n;
      return;
    }
    inner_->append(data, n);
    written_ += n;
  }

  void sync() override {
    int64_t nth = ++fs_.syncs_;
    if (fs_.fault_.kind == FileFault::Kind::fail_sync && nth == fs_.fault_.nth) {
      ++fs_.injected_;
      DSCPP_FAIL(IoError, "fsync of '", path(), "' failed: injected fault (sync #", nth, ")");
    }
    inner_->sync();
  }
  void close() override { inner_->close(); }
  const std::string& path() const override { return inner_->path(); }

 private:
  FaultFileSystem& fs_;
  std::unique_ptr<WritableFile> inner_;
  uint64_t written_ = 0;
};

std::unique_ptr<WritableFile> FaultFileSystem::open_for_write(const std::string& path) {
  return std::make_unique<FaultWritableFile>(*this, inner_.open_for_write(path));
}

std::unique_ptr<WritableFile> FaultFileSystem::open_for_append(const std::string& path) {
  return std::make_unique<FaultWritableFile>(*this, inner_.open_for_append(path));
}

void FaultFileSystem::rename_file(const std::string& from, const std::string& to) {
  int64_t nth = ++renames_;
  if (fault_.kind == FileFault::Kind::fail_rename && nth == fault_.nth) {
    ++injected_;
    DSCPP_FAIL(IoError, "renaming '", from, "' to '", to, "' failed: injected fault (rename #", nth,
               ")");
  }
  inner_.rename_file(from, to);
}

}  // namespace dscpp::io
