// AsyncIo: asynchronous direct (O_DIRECT) reads and writes of large, aligned ranges of files, for
// the offload swap files (src/offload/). A request is split into `block_size` pieces; each of
// `thread_count` workers keeps up to `queue_depth` pieces in flight through its own io_uring, or
// issues them one by one with pread/pwrite where io_uring is unavailable (the thread-pool
// fallback, said once at start-up). read()/write() return at once with an IoHandle whose wait()
// blocks until every piece is done and rethrows the first failure as an IoError naming the file,
// the range and the system's reason (like comm::Work). A program may pass its own
// (InitOptions::async_io); the tests wrap the interface (FaultAsyncIo,
// tests/support/fault_async_io.h) to inject a full disk, a short write, an EIO or a slow device.
//
// Direct I/O bypasses the page cache, so a swap file neither doubles its data in memory nor
// evicts the training's pages; it needs buffer addresses, offsets and lengths that are multiples
// of kDirectAlignment (AlignedBuffer provides such memory).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace dscpp {
struct AioConfig;
}

namespace dscpp::io {

// Alignment of direct I/O: buffer address, file offset and length (the largest logical block
// size of common disks).
constexpr size_t kDirectAlignment = 4096;

// n rounded up to a multiple of kDirectAlignment.
constexpr uint64_t align_up(uint64_t n) {
  return (n + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
}

// Host memory aligned for direct I/O, zero-filled, freed with the object.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& o) noexcept : data_(o.data_), size_(o.size_) {
    o.data_ = nullptr;
    o.size_ = 0;
  }
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// One request in flight.
class IoWork {
 public:
  virtual ~IoWork() = default;
  // Blocks until the request is complete; throws IoError when any piece of it failed. May be
  // called again (it rethrows the same error).
  virtual void wait() = 0;
  // Whether the request is complete (successfully or not); never blocks.
  virtual bool done() = 0;
};
using IoHandle = std::shared_ptr<IoWork>;

// A file open for direct reads and writes. Requests may be issued from any thread; the buffer
// must stay alive and untouched until the request's wait() returns.
class AsyncFile {
 public:
  virtual ~AsyncFile() = default;
  // Reads n bytes at `offset` into dst. dst, offset and n must be multiples of kDirectAlignment
  // (else IoError at once). Reading past the end of the file fails.
  virtual IoHandle read(uint64_t offset, void* dst, size_t n) = 0;
  // Writes n bytes from src at `offset` (same alignment rules), extending the file as needed.
  virtual IoHandle write(uint64_t offset, const void* src, size_t n) = 0;
  // Gives the file `bytes` bytes with its blocks allocated (fallocate; ftruncate where the file
  // system cannot), so that later writes inside them cannot fail for want of space. Throws
  // IoError naming the path, and the bytes needed and available when the disk is too small.
  virtual void reserve(uint64_t bytes) = 0;
  virtual const std::string& path() const = 0;
};

// The aio section's settings (config.h: AioConfig).
struct AioOptions {
  int64_t block_size = 1 << 20;  // bytes per piece, a multiple of kDirectAlignment
  int queue_depth = 8;           // pieces in flight per worker (io_uring)
  int thread_count = 1;          // workers
  bool single_submit = false;    // submit pieces one at a time instead of in batches
  bool overlap_events = true;    // submit new pieces while earlier ones complete
  static AioOptions from_config(const AioConfig& c);
};

class AsyncIo {
 public:
  virtual ~AsyncIo() = default;
  // Opens `path` for direct I/O, creating it (mode 0600) when missing. Throws IoError naming the
  // path, and saying so when its file system does not support O_DIRECT.
  virtual std::unique_ptr<AsyncFile> open(const std::string& path) = 0;
  // "io_uring, 1 thread(s), queue depth 8, 1 MiB blocks", or "pread/pwrite threads, ...".
  virtual std::string describe() const = 0;
};

enum class AioBackend { automatic, io_uring, threads };

// The workers. automatic: io_uring where this build and kernel have it, else the thread pool
// (with a warning, once per process); io_uring: throws IoError when it is unavailable.
std::unique_ptr<AsyncIo> make_async_io(const AioOptions& options,
                                       AioBackend backend = AioBackend::automatic);

}  // namespace dscpp::io
