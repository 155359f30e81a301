// Implements AsyncIo (async_io.h): requests split into pieces on one shared queue, drained by
// workers that each own an io_uring (or, in the fallback, issue pread/pwrite themselves).
#include "dscpp/async_io.h"

#include <errno.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "dscpp/config.h"
#include "dscpp/error.h"
#include "util/fault_inject.h"
#include "util/log.h"

#ifdef DSCPP_HAVE_URING
#include <liburing.h>
#endif

namespace dscpp::io {

AlignedBuffer::AlignedBuffer(size_t bytes) : size_(align_up(bytes)) {
  if (size_ == 0) return;
  if (posix_memalign(&data_, kDirectAlignment, size_) != 0) {
    data_ = nullptr;
    DSCPP_FAIL(IoError, "could not allocate ", size_,
               " bytes of aligned I/O buffer: ", strerror(ENOMEM));
  }
  memset(data_, 0, size_);
}

AlignedBuffer::~AlignedBuffer() { free(data_); }

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    free(data_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

AioOptions AioOptions::from_config(const AioConfig& c) {
  AioOptions o;
  o.block_size = c.block_size;
  o.queue_depth = static_cast<int>(c.queue_depth);
  o.thread_count = static_cast<int>(c.thread_count);
  o.single_submit = c.single_submit;
  o.overlap_events = c.overlap_events;
  return o;
}

namespace {

// An open file descriptor, shared by the file and its pieces in flight.
struct Fd {
  int fd = -1;
  std::string path;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// One read() or write(): counts its pieces down and keeps the first failure.
class Request final : public IoWork {
 public:
  Request(std::string what, int64_t pieces) : what_(std::move(what)), pending_(pieces) {}

  void piece_done(const std::string& error) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error.empty() && error_.empty()) error_ = error;
    if (--pending_ == 0) cv_.notify_all();
  }
  void wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return pending_ == 0; });
    DSCPP_CHECK(error_.empty(), IoError, what_, " failed: ", error_);
  }
  bool done() override {
    std::lock_guard<std::mutex> lock(mu_);
    return pending_ == 0;
  }

 private:
  std::string what_;
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t pending_;
  std::string error_;
};

// A piece of a request: at most block_size bytes. A short transfer leaves the rest for another
// round (done counts what has been moved).
struct Piece {
  std::shared_ptr<Request> request;
  std::shared_ptr<Fd> fd;
  bool write = false;
  uint64_t offset = 0;
  char* buf = nullptr;
  size_t n = 0;
  size_t done = 0;
};

// What one transfer of `piece` returned: "" when the piece is finished, kAgain when bytes remain
// (a short transfer), else the reason it failed.
const std::string kAgain = "\x01";
std::string account(Piece& p, int64_t res) {
  if (res < 0) return strerror(static_cast<int>(-res));
  if (res == 0) {
    return p.write ? std::string(strerror(ENOSPC)) + " (the write made no progress)"
                   : fmt::format("the file ends before byte {}", p.offset + p.n);
  }
  p.done += static_cast<size_t>(res);
  return p.done == p.n ? "" : kAgain;
}

class Workers final : public AsyncIo {
 public:
  Workers(const AioOptions& o, bool uring) : options_(o), uring_(uring) {
    DSCPP_CHECK(o.block_size > 0 && o.block_size % kDirectAlignment == 0, IoError,
                "aio.block_size ", o.block_size, " must be a positive multiple of ",
                kDirectAlignment, " bytes for direct I/O");
    DSCPP_CHECK(o.queue_depth > 0 && o.thread_count > 0, IoError,
                "aio.queue_depth and aio.thread_count must be > 0");
    for (int i = 0; i < o.thread_count; ++i) {
      threads_.emplace_back([this] {
#ifdef DSCPP_HAVE_URING
        if (uring_) return run_uring();
#endif
        run_sync();
      });
    }
  }
  ~Workers() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  std::unique_ptr<AsyncFile> open(const std::string& path) override;
  std::string describe() const override {
    return fmt::format("{}, {} thread(s), queue depth {}, {} KiB blocks{}{}",
                       uring_ ? "io_uring" : "pread/pwrite threads", options_.thread_count,
                       uring_ ? options_.queue_depth : 1, options_.block_size / 1024,
                       uring_ && options_.single_submit ? ", single submit" : "",
                       uring_ && !options_.overlap_events ? ", no overlap of events" : "");
  }

  IoHandle submit(const std::shared_ptr<Fd>& fd, bool write, uint64_t offset, char* buf, size_t n) {
    DSCPP_CHECK(offset % kDirectAlignment == 0 && n % kDirectAlignment == 0 &&
                    reinterpret_cast<uintptr_t>(buf) % kDirectAlignment == 0,
                IoError, write ? "writing " : "reading ", n, " bytes at offset ", offset, " of '",
                fd->path, "': direct I/O needs the buffer, offset and length aligned to ",
                kDirectAlignment, " bytes (internal error: use AlignedBuffer)");
    const size_t block = static_cast<size_t>(options_.block_size);
    const int64_t pieces = n == 0 ? 0 : static_cast<int64_t>((n + block - 1) / block);
    auto request =
        std::make_shared<Request>(fmt::format("{} {} bytes at offset {} of '{}'",
                                              write ? "writing" : "reading", n, offset, fd->path),
                                  pieces);
    if (fault::point(fault::Phase::offload_io)) {  // DSCPP_FAULT_INJECT=eio: the device fails
      for (int64_t i = 0; i < pieces; ++i) request->piece_done(std::string(strerror(EIO)));
      return request;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t at = 0; at < n; at += block) {
        queue_.push_back(Piece{request, fd, write, offset + at, buf + at, std::min(block, n - at)});
      }
    }
    cv_.notify_all();
    return request;
  }

 private:
  // Takes up to `most` pieces; blocks for the first one only when `block` is set. Returns false
  // when the workers are stopping and nothing is left.
  bool take(std::vector<Piece>& out, size_t most, bool block) {
    std::unique_lock<std::mutex> lock(mu_);
    if (block) cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    while (out.size() < most && !queue_.empty()) {
      out.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    return !(stop_ && queue_.empty() && out.empty());
  }
  void requeue(Piece p) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_front(std::move(p));
    }
    cv_.notify_one();
  }
  // Finishes a transfer of `p` that returned `res`.
  void complete(Piece& p, int64_t res) {
    const std::string r = account(p, res);
    if (r == kAgain) return requeue(std::move(p));
    p.request->piece_done(r);
  }

  void run_sync() {
    std::vector<Piece> got;
    while (true) {
      got.clear();
      if (!take(got, 1, true)) return;
      if (got.empty()) continue;
      Piece& p = got[0];
      char* at = p.buf + p.done;
      const size_t left = p.n - p.done;
      const uint64_t off = p.offset + p.done;
      const ssize_t res = p.write ? ::pwrite(p.fd->fd, at, left, static_cast<off_t>(off))
                                  : ::pread(p.fd->fd, at, left, static_cast<off_t>(off));
      complete(p, res < 0 ? -errno : res);
    }
  }

#ifdef DSCPP_HAVE_URING
  void run_uring() {
    io_uring ring;
    const int err = io_uring_queue_init(static_cast<unsigned>(options_.queue_depth), &ring, 0);
    if (err < 0) {  // probed in make_async_io; fail every piece rather than hang
      std::vector<Piece> got;
      while (take(got, 1, true)) {
        for (auto& p : got) p.request->piece_done(std::string("io_uring: ") + strerror(-err));
        got.clear();
      }
      return;
    }
    const size_t depth = static_cast<size_t>(options_.queue_depth);
    size_t inflight = 0;
    std::vector<Piece> got;
    while (true) {
      got.clear();
      // Without overlap_events a batch completes entirely before the next is submitted.
      const bool may_take = inflight == 0 || (options_.overlap_events && inflight < depth);
      if (may_take && !take(got, depth - inflight, inflight == 0) && inflight == 0) break;
      for (auto& p : got) {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring);
        auto* held = new Piece(std::move(p));
        if (held->write) {
          io_uring_prep_write(sqe, held->fd->fd, held->buf + held->done,
                              static_cast<unsigned>(held->n - held->done),
                              held->offset + held->done);
        } else {
          io_uring_prep_read(sqe, held->fd->fd, held->buf + held->done,
                             static_cast<unsigned>(held->n - held->done),
                             held->offset + held->done);
        }
        io_uring_sqe_set_data(sqe, held);
        ++inflight;
        if (options_.single_submit) io_uring_submit(&ring);
      }
      if (!got.empty() && !options_.single_submit) io_uring_submit(&ring);
      if (inflight == 0) continue;
      // At least one completion, then whatever else is ready (all of the batch without
      // overlap_events).
      const size_t want = options_.overlap_events ? 1 : inflight;
      for (size_t reaped = 0; inflight > 0;) {
        io_uring_cqe* cqe = nullptr;
        int rc = reaped < want ? io_uring_wait_cqe(&ring, &cqe) : io_uring_peek_cqe(&ring, &cqe);
        if (rc == -EINTR) continue;
        if (rc < 0 || cqe == nullptr) break;
        std::unique_ptr<Piece> p(static_cast<Piece*>(io_uring_cqe_get_data(cqe)));
        const int64_t res = cqe->res;
        io_uring_cqe_seen(&ring, cqe);
        --inflight;
        ++reaped;
        complete(*p, res);
      }
    }
    io_uring_queue_exit(&ring);
  }
#endif

  AioOptions options_;
  bool uring_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Piece> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

class DirectFile final : public AsyncFile {
 public:
  DirectFile(Workers& workers, std::shared_ptr<Fd> fd) : workers_(workers), fd_(std::move(fd)) {}
  IoHandle read(uint64_t offset, void* dst, size_t n) override {
    return workers_.submit(fd_, false, offset, static_cast<char*>(dst), n);
  }
  IoHandle write(uint64_t offset, const void* src, size_t n) override {
    return workers_.submit(fd_, true, offset, static_cast<char*>(const_cast<void*>(src)), n);
  }
  void reserve(uint64_t bytes) override {
    if (bytes == 0) return;
    int rc = ::fallocate(fd_->fd, 0, 0, static_cast<off_t>(bytes));
    if (rc != 0 && errno == EOPNOTSUPP) rc = ::ftruncate(fd_->fd, static_cast<off_t>(bytes));
    if (rc == 0) return;
    const int err = errno;
    struct statvfs fs {};
    std::string room;
    if (::fstatvfs(fd_->fd, &fs) == 0) {
      room = fmt::format(" ({} bytes available there)",
                         static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize);
    }
    DSCPP_FAIL(IoError, "reserving ", bytes, " bytes for '", fd_->path, "' failed: ", strerror(err),
               room,
               err == ENOSPC ? ". HINT: free space there, point nvme_path at a larger disk, or "
                               "use more ranks (each holds 1/world of the state)"
                             : "");
  }
  const std::string& path() const override { return fd_->path; }

 private:
  Workers& workers_;
  std::shared_ptr<Fd> fd_;
};

std::unique_ptr<AsyncFile> Workers::open(const std::string& path) {
  auto fd = std::make_shared<Fd>();
  fd->path = path;
  fd->fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
  if (fd->fd < 0 && errno == EINVAL) {
    DSCPP_FAIL(IoError, "opening '", path,
               "' for direct I/O failed: its file system does not support O_DIRECT (tmpfs "
               "before Linux 6.6, some network and FUSE file systems). HINT: put the swap "
               "folder (nvme_path) on a local disk");
  }
  DSCPP_CHECK(fd->fd >= 0, IoError, "opening '", path,
              "' for direct I/O failed: ", strerror(errno));
  return std::make_unique<DirectFile>(*this, std::move(fd));
}

// Whether io_uring works here; the reason when it does not.
std::string uring_unavailable() {
#ifdef DSCPP_HAVE_URING
  io_uring ring;
  const int err = io_uring_queue_init(1, &ring, 0);
  if (err == 0) {
    io_uring_queue_exit(&ring);
    return "";
  }
  return std::string("the kernel refused io_uring: ") + strerror(-err);
#else
  return "this build of dscpp has no liburing";
#endif
}

}  // namespace

std::unique_ptr<AsyncIo> make_async_io(const AioOptions& options, AioBackend backend) {
  if (backend == AioBackend::threads) return std::make_unique<Workers>(options, false);
  const std::string why = uring_unavailable();
  if (why.empty()) return std::make_unique<Workers>(options, true);
  DSCPP_CHECK(backend == AioBackend::automatic, IoError, "io_uring is unavailable: ", why);
  static std::once_flag said;
  std::call_once(said, [&] {
    DSCPP_LOG_WARN(
        "asynchronous disk I/O uses a pool of pread/pwrite threads: {} (swap I/O still "
        "overlaps with compute, with one request per thread in flight)",
        why);
  });
  return std::make_unique<Workers>(options, false);
}

}  // namespace dscpp::io
