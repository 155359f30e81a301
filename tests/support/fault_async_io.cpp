// FaultAsyncIo's file: counts requests and applies the configured fault (fault_async_io.h).
#include "support/fault_async_io.h"

#include <fmt/format.h>

#include <chrono>
#include <thread>

#include "dscpp/error.h"

namespace dscpp::io {
namespace {

// A request that failed: wait() waits for what did reach the disk, then throws.
class FailedWork final : public IoWork {
 public:
  FailedWork(IoHandle inner, std::string error)
      : inner_(std::move(inner)), error_(std::move(error)) {}
  void wait() override {
    if (inner_) inner_->wait();
    DSCPP_FAIL(IoError, error_);
  }
  bool done() override { return !inner_ || inner_->done(); }

 private:
  IoHandle inner_;
  std::string error_;
};

// A request that completes `delay` after it was issued.
class SlowWork final : public IoWork {
 public:
  SlowWork(IoHandle inner, std::chrono::milliseconds delay)
      : inner_(std::move(inner)), ready_(std::chrono::steady_clock::now() + delay) {}
  void wait() override {
    std::this_thread::sleep_until(ready_);
    inner_->wait();
  }
  bool done() override { return std::chrono::steady_clock::now() >= ready_ && inner_->done(); }

 private:
  IoHandle inner_;
  std::chrono::steady_clock::time_point ready_;
};

}  // namespace

class FaultAsyncFile final : public AsyncFile {
 public:
  FaultAsyncFile(FaultAsyncIo& io, std::unique_ptr<AsyncFile> inner)
      : io_(io), inner_(std::move(inner)) {}

  IoHandle read(uint64_t offset, void* dst, size_t n) override {
    const AioFault& f = io_.fault_;
    const int64_t nth = ++io_.reads_;
    if (f.kind == AioFault::Kind::fail_read && nth == f.nth) {
      ++io_.injected_;
      return std::make_shared<FailedWork>(
          nullptr, what("reading", offset, n) + "Input/output error (injected fault)");
    }
    return slowed(inner_->read(offset, dst, n));
  }

  IoHandle write(uint64_t offset, const void* src, size_t n) override {
    const AioFault& f = io_.fault_;
    const int64_t nth = ++io_.writes_;
    if (f.kind == AioFault::Kind::fail_write && nth == f.nth) {
      ++io_.injected_;
      return std::make_shared<FailedWork>(
          nullptr, what("writing", offset, n) + "Input/output error (injected fault)");
    }
    if (f.kind == AioFault::Kind::short_write && nth == f.nth) {
      ++io_.injected_;
      const size_t half = n / 2 / kDirectAlignment * kDirectAlignment;  // stays aligned
      return std::make_shared<FailedWork>(
          inner_->write(offset, src, half),
          what("writing", offset, n) +
              fmt::format("only {} bytes were written (injected short write)", half));
    }
    if (f.kind == AioFault::Kind::disk_full) {
      const uint64_t before = io_.bytes_written_.fetch_add(n);
      if (before + n > f.bytes) {
        ++io_.injected_;
        return std::make_shared<FailedWork>(
            nullptr, what("writing", offset, n) + "No space left on device (injected after " +
                         std::to_string(f.bytes) + " bytes)");
      }
    }
    return slowed(inner_->write(offset, src, n));
  }

  void reserve(uint64_t bytes) override { inner_->reserve(bytes); }
  const std::string& path() const override { return inner_->path(); }

 private:
  std::string what(const char* verb, uint64_t offset, size_t n) const {
    return fmt::format("{} {} bytes at offset {} of '{}' failed: ", verb, n, offset, path());
  }
  IoHandle slowed(IoHandle h) {
    if (io_.fault_.kind != AioFault::Kind::slow) return h;
    return std::make_shared<SlowWork>(std::move(h), std::chrono::milliseconds(io_.fault_.delay_ms));
  }

  FaultAsyncIo& io_;
  std::unique_ptr<AsyncFile> inner_;
};

std::unique_ptr<AsyncFile> FaultAsyncIo::open(const std::string& path) {
  if (!fault_.only_path.empty() && path.find(fault_.only_path) == std::string::npos)
    return inner_->open(path);
  return std::make_unique<FaultAsyncFile>(*this, inner_->open(path));
}

}  // namespace dscpp::io
