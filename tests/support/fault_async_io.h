// FaultAsyncIo: an AsyncIo wrapper for tests that injects one kind of failure into the requests
// that go through it (the Nth write or read fails with EIO, the disk fills after a byte budget,
// the Nth write is short, or every request is slowed down) and forwards everything else to the
// inner AsyncIo. A failure surfaces where a real one would: from the request's wait(). Counters
// are atomic; one FaultAsyncIo may be shared by threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "dscpp/async_io.h"

namespace dscpp::io {

struct AioFault {
  enum class Kind {
    none,
    fail_write,   // the nth write (1-based, all files together) fails with EIO
    fail_read,    // the nth read fails with EIO
    short_write,  // the nth write stores only its first half and reports it
    disk_full,    // writes fail with ENOSPC once `bytes` bytes have been written in total
    slow,         // every request completes `delay_ms` milliseconds late
  };
  Kind kind = Kind::none;
  int64_t nth = 1;
  uint64_t bytes = 0;
  int delay_ms = 0;
  // Non-empty: only the files whose path contains it go through the fault (and are counted).
  std::string only_path;
};

class FaultAsyncIo final : public AsyncIo {
 public:
  FaultAsyncIo(AioFault fault, std::unique_ptr<AsyncIo> inner)
      : inner_(std::move(inner)), fault_(fault) {}
  std::unique_ptr<AsyncFile> open(const std::string& path) override;
  std::string describe() const override { return "fault-injecting " + inner_->describe(); }
  // How many faults were injected so far.
  int64_t injected() const { return injected_.load(); }

 private:
  friend class FaultAsyncFile;
  std::unique_ptr<AsyncIo> inner_;
  AioFault fault_;
  std::atomic<int64_t> writes_{0}, reads_{0};
  std::atomic<uint64_t> bytes_written_{0};
  std::atomic<int64_t> injected_{0};
};

}  // namespace dscpp::io
