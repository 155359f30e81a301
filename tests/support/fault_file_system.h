// FaultFileSystem: a FileSystem wrapper for tests that injects one kind of failure into the
// writes that go through it (the Nth append fails after writing part of its bytes, a sync or a
// rename fails, the disk fills up after a byte budget, or a file is silently torn: only its first
// bytes reach the disk and no error is reported) and forwards everything else to the inner file
// system. Counters are atomic; one FaultFileSystem may be shared by threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "dscpp/file_system.h"

namespace dscpp::io {

struct FileFault {
  enum class Kind {
    none,
    fail_append,  // the nth append (1-based, all files together) writes half, then throws
    fail_sync,    // the nth sync throws
    fail_rename,  // the nth rename throws
    disk_full,    // appends throw ENOSPC-style once `bytes` bytes have been written in total
    tear,         // every written file keeps only its first `bytes` bytes; no error is raised
  };
  Kind kind = Kind::none;
  int64_t nth = 1;
  uint64_t bytes = 0;
};

class FaultFileSystem final : public FileSystem {
 public:
  explicit FaultFileSystem(FileFault fault, FileSystem* inner = nullptr)
      : inner_(resolve(inner)), fault_(fault) {}

  std::unique_ptr<RandomAccessFile> open_for_read(const std::string& path) override {
    return inner_.open_for_read(path);
  }
  std::unique_ptr<WritableFile> open_for_write(const std::string& path) override;
  std::unique_ptr<WritableFile> open_for_append(const std::string& path) override;
  void rename_file(const std::string& from, const std::string& to) override;
  void remove_file(const std::string& path) override { inner_.remove_file(path); }
  void sync_dir(const std::string& dir) override { inner_.sync_dir(dir); }
  void create_dirs(const std::string& dir) override { inner_.create_dirs(dir); }
  bool exists(const std::string& path) override { return inner_.exists(path); }
  uint64_t file_size(const std::string& path) override { return inner_.file_size(path); }

  // How many faults were injected so far.
  int64_t injected() const { return injected_.load(); }

 private:
  friend class FaultWritableFile;
  FileSystem& inner_;
  FileFault fault_;
  std::atomic<int64_t> appends_{0};
  std::atomic<int64_t> syncs_{0};
  std::atomic<int64_t> renames_{0};
  std::atomic<uint64_t> bytes_written_{0};
  std::atomic<int64_t> injected_{0};
};

}  // namespace dscpp::io
