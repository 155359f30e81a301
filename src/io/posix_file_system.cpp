// The POSIX FileSystem (open/pread/write/fsync/rename) and write_file_atomically, which is built
// only on the FileSystem primitives so that a wrapping FaultFileSystem sees every step of it.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "dscpp/error.h"
#include "dscpp/file_system.h"

namespace dscpp::io {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

class PosixRandomAccessFile final : public RandomAccessFile {
 public:
  PosixRandomAccessFile(std::string path, int fd, uint64_t size)
      : path_(std::move(path)), fd_(fd), size_(size) {}
  ~PosixRandomAccessFile() override { ::close(fd_); }

  void pread(uint64_t offset, void* dst, size_t n) const override {
    auto* p = static_cast<char*>(dst);
    size_t done = 0;
    while (done < n) {
      ssize_t r = ::pread(fd_, p + done, n - done, static_cast<off_t>(offset + done));
      if (r < 0 && errno == EINTR) continue;
      DSCPP_CHECK(r >= 0, IoError, "reading ", n, " bytes at offset ", offset, " of '", path_,
                  "' failed: ", errno_text(errno));
      DSCPP_CHECK(r > 0, IoError, "'", path_, "' ended at byte ", offset + done, " while reading ",
                  n, " bytes at offset ", offset, " (file size ", size_,
                  "). HINT: the file was truncated or is being rewritten.");
      done += static_cast<size_t>(r);
    }
  }
  uint64_t size() const override { return size_; }
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  int fd_;
  uint64_t size_;
};

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  // NOTE [early writeback]: a large file is written in pieces, and after each piece the kernel
  // is asked to start writing it to disk (sync_file_range, asynchronous), so the disk works while
  // the next pieces are copied into the page cache and the final fsync has little left to wait
  // for (RocksDB's bytes_per_sync). A checkpoint's save time then approaches the disk's
  // sequential bandwidth instead of copy time plus disk time (docs/checkpoint.md, "Save speed").
  static constexpr size_t kWritebackPiece = size_t{8} << 20;

  void append(const void* data, size_t n) override {
    DSCPP_CHECK(fd_ >= 0, IoError, "append to closed file '", path_, "'");
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
      ssize_t w = ::write(fd_, p, std::min(n, kWritebackPiece));
      if (w < 0 && errno == EINTR) continue;
      if (w == 0) errno = ENOSPC;  // no progress: never loop forever
      DSCPP_CHECK(w > 0, IoError, "writing ", n, " bytes to '", path_,
                  "' failed: ", errno_text(errno), ". HINT: is the disk full?");
      p += w;
      n -= static_cast<size_t>(w);
      written_ += static_cast<uint64_t>(w);
      if (written_ - flushed_ >= kWritebackPiece) start_writeback();
    }
  }
  void sync() override {
    DSCPP_CHECK(fd_ >= 0, IoError, "sync of closed file '", path_, "'");
    DSCPP_CHECK(writeback_errno_ == 0, IoError, "writing '", path_,
                "' to disk failed: ", errno_text(writeback_errno_),
                ". HINT: is the disk full or failing?");
    DSCPP_CHECK(::fsync(fd_) == 0, IoError, "fsync of '", path_, "' failed: ", errno_text(errno));
  }
  void close() override {
    DSCPP_CHECK(fd_ >= 0, IoError, "'", path_, "' closed twice");
    int fd = fd_;
    fd_ = -1;
    DSCPP_CHECK(::close(fd) == 0, IoError, "closing '", path_, "' failed: ", errno_text(errno));
  }
  const std::string& path() const override { return path_; }

 private:
  void start_writeback() {
#if defined(__linux__)
    // Starting write-back is a hint; waiting for it is not: the kernel reports a write-back
    // error once per file description, to whichever call waits first, so an error seen here is
    // kept and thrown by sync() (which every durable write ends with), never lost to a later
    // fsync that would then succeed.
    ::sync_file_range(fd_, static_cast<off_t>(flushed_), static_cast<off_t>(written_ - flushed_),
                      SYNC_FILE_RANGE_WRITE);
    // The piece before last is on its way to disk by now: wait for it and drop its pages, so
    // the next pieces reuse them and the page cache holds a few pieces of the file, not all.
    if (flushed_ >= kWritebackPiece) {
      const off_t begin = static_cast<off_t>(dropped_);
      const off_t len = static_cast<off_t>(flushed_ - dropped_);
      if (::sync_file_range(fd_, begin, len,
                            SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                                SYNC_FILE_RANGE_WAIT_AFTER) != 0 &&
          writeback_errno_ == 0) {
        writeback_errno_ = errno;
      }
      if (writeback_errno_ == 0) ::posix_fadvise(fd_, begin, len, POSIX_FADV_DONTNEED);
      dropped_ = flushed_;
    }
#endif
    flushed_ = written_;
  }

  std::string path_;
  int fd_;
  // Bytes appended; bytes handed to early writeback; bytes written back and dropped.
  uint64_t written_ = 0, flushed_ = 0, dropped_ = 0;
  int writeback_errno_ = 0;  // the first error early write-back reported (NOTE [early writeback])
};

// NOTE [direct writes]: a file written once (write_file_atomically: checkpoints, manifests) is
// opened with O_DIRECT where the file system allows it. Appends are copied into an aligned
// buffer whose full pieces go to the disk by DMA, without a copy into the page cache; sync()
// writes the last partial block padded with zeros, cuts the file to its length and fsyncs. On
// this VM a copy into page-cache pages costs a hypervisor fault per fresh page (3.1 s of system
// time for 868 MiB through `dd`, against 0.07 s with O_DIRECT), and that CPU time is taken from
// training when a checkpoint is written in the background. A file system that refuses O_DIRECT
// (tmpfs, some FUSE and network mounts) gets the buffered file of NOTE [early writeback], and a
// device whose blocks exceed 4096 bytes has O_DIRECT cleared at the first refused write: the
// same bytes, only slower.
class DirectWritableFile final : public WritableFile {
 public:
  static constexpr size_t kAlign = 4096;
  static constexpr size_t kPiece = size_t{8} << 20;

  DirectWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {
    void* p = nullptr;
    DSCPP_CHECK(::posix_memalign(&p, kAlign, kPiece) == 0, IoError,
                "cannot allocate a write buffer for '", path_, "'");
    buffer_.reset(static_cast<char*>(p));
  }
  ~DirectWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  void append(const void* data, size_t n) override {
    DSCPP_CHECK(fd_ >= 0 && !finished_, IoError, "append to closed file '", path_, "'");
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
      const size_t take = std::min(n, kPiece - filled_);
      std::memcpy(buffer_.get() + filled_, p, take);
      filled_ += take;
      p += take;
      n -= take;
      if (filled_ == kPiece) write_buffer(kPiece);
    }
  }
  void sync() override {
    DSCPP_CHECK(fd_ >= 0, IoError, "sync of closed file '", path_, "'");
    finish();
    DSCPP_CHECK(::fsync(fd_) == 0, IoError, "fsync of '", path_, "' failed: ", errno_text(errno));
  }
  void close() override {
    DSCPP_CHECK(fd_ >= 0, IoError, "'", path_, "' closed twice");
    finish();
    int fd = fd_;
    fd_ = -1;
    DSCPP_CHECK(::close(fd) == 0, IoError, "closing '", path_, "' failed: ", errno_text(errno));
  }
  const std::string& path() const override { return path_; }

 private:
  // Writes buffer_[0, n) at the file's end; n is a multiple of kAlign.
  void write_buffer(size_t n) {
    size_t done = 0;
    while (done < n) {
      ssize_t w =
          ::pwrite(fd_, buffer_.get() + done, n - done, static_cast<off_t>(written_ + done));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && errno == EINVAL && direct_) {
        // A device whose blocks are larger than kAlign: the rest of this file goes through the
        // page cache (the same bytes; NOTE [direct writes]).
        const int flags = ::fcntl(fd_, F_GETFL);
        if (flags >= 0 && ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT) == 0) {
          direct_ = false;
          continue;
        }
      }
      if (w == 0) errno = ENOSPC;  // no progress: never loop forever
      DSCPP_CHECK(w > 0, IoError, "writing ", n - done, " bytes to '", path_,
                  "' failed: ", errno_text(errno), ". HINT: is the disk full?");
      done += static_cast<size_t>(w);
    }
    written_ += n;
    filled_ = 0;
  }
  // The last partial block, padded to kAlign, then the file cut to the bytes appended.
  void finish() {
    if (finished_) return;
    finished_ = true;
    const uint64_t length = written_ + filled_;
    if (filled_ > 0) {
      const size_t padded = (filled_ + kAlign - 1) / kAlign * kAlign;
      std::memset(buffer_.get() + filled_, 0, padded - filled_);
      write_buffer(padded);
    }
    DSCPP_CHECK(::ftruncate(fd_, static_cast<off_t>(length)) == 0, IoError, "truncating '", path_,
                "' to ", length, " bytes failed: ", errno_text(errno));
  }

  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::string path_;
  int fd_;
  std::unique_ptr<char, Free> buffer_;
  size_t filled_ = 0;     // bytes in buffer_ not written yet
  uint64_t written_ = 0;  // bytes written to the file (a multiple of kAlign until finish)
  bool finished_ = false;
  bool direct_ = true;  // O_DIRECT still set on fd_
};

class PosixFileSystem final : public FileSystem {
 public:
  std::unique_ptr<RandomAccessFile> open_for_read(const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    DSCPP_CHECK(fd >= 0, IoError, "cannot open '", path, "' for reading: ", errno_text(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      int err = errno;
      ::close(fd);
      DSCPP_FAIL(IoError, "cannot stat '", path, "': ", errno_text(err));
    }
    if (S_ISDIR(st.st_mode)) {
      ::close(fd);
      DSCPP_FAIL(IoError, "'", path, "' is a directory, not a file");
    }
    return std::make_unique<PosixRandomAccessFile>(path, fd, static_cast<uint64_t>(st.st_size));
  }

  std::unique_ptr<WritableFile> open_for_write(const std::string& path) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    DSCPP_CHECK(fd >= 0, IoError, "cannot open '", path, "' for writing: ", errno_text(errno));
    return std::make_unique<PosixWritableFile>(path, fd);
  }

  std::unique_ptr<WritableFile> open_for_write_once(const std::string& path) override {
#if defined(O_DIRECT)
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644);
    if (fd >= 0) return std::make_unique<DirectWritableFile>(path, fd);
    DSCPP_CHECK(errno == EINVAL, IoError, "cannot open '", path,
                "' for writing: ", errno_text(errno));
#endif
    return open_for_write(path);  // NOTE [direct writes]: this file system refuses O_DIRECT
  }

  std::unique_ptr<WritableFile> open_for_append(const std::string& path) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    DSCPP_CHECK(fd >= 0, IoError, "cannot open '", path, "' for appending: ", errno_text(errno));
    return std::make_unique<PosixWritableFile>(path, fd);
  }

  void rename_file(const std::string& from, const std::string& to) override {
    DSCPP_CHECK(::rename(from.c_str(), to.c_str()) == 0, IoError, "renaming '", from, "' to '", to,
                "' failed: ", errno_text(errno));
  }

  void remove_file(const std::string& path) override {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      DSCPP_FAIL(IoError, "removing '", path, "' failed: ", errno_text(errno));
    }
  }

  void create_dirs(const std::string& dir) override {
    for (size_t at = 1; at != std::string::npos;) {
      at = dir.find('/', at);
      const std::string part = dir.substr(0, at);
      if (at != std::string::npos) ++at;
      if (part.empty() || ::mkdir(part.c_str(), 0777) == 0 || errno == EEXIST) continue;
      DSCPP_FAIL(IoError, "cannot create directory '", part, "': ", errno_text(errno));
    }
    struct stat st {};
    DSCPP_CHECK(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), IoError, "'", dir,
                "' exists but is not a directory");
  }

  void sync_dir(const std::string& dir) override {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DSCPP_CHECK(fd >= 0, IoError, "cannot open directory '", dir, "': ", errno_text(errno));
    int rc = ::fsync(fd);
    int err = errno;
    ::close(fd);
    // Some file systems (tmpfs in containers, some FUSE mounts) refuse fsync on a directory;
    // the rename is then as durable as that file system allows.
    DSCPP_CHECK(rc == 0 || err == EINVAL || err == ENOTSUP, IoError, "fsync of directory '", dir,
                "' failed: ", errno_text(err));
  }

  bool exists(const std::string& path) override {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
  }

  uint64_t file_size(const std::string& path) override {
    struct stat st {};
    DSCPP_CHECK(::stat(path.c_str(), &st) == 0, IoError, "cannot stat '", path,
                "': ", errno_text(errno));
    return static_cast<uint64_t>(st.st_size);
  }
};

}  // namespace

void FileSystem::write_file_atomically(const std::string& path,
                                       const std::vector<ConstBuffer>& pieces) {
  write_file_atomically(path, [&](WritableFile& file) {
    for (const auto& piece : pieces) {
      if (piece.size > 0) file.append(piece.data, piece.size);
    }
  });
}

std::vector<std::string> FileSystem::list_dir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return names;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  return names;
}

void FileSystem::write_file_atomically(const std::string& path,
                                       const std::function<void(WritableFile&)>& produce) {
  static std::atomic<uint64_t> counter{0};
  // A writer of `path` killed between open and rename left its temporary file (NAME.tmp.PID.N)
  // behind; this writer is the only one of `path` now, so it clears them.
  const std::string dir = dir_name(path);
  const std::string stale = path.substr(path.find_last_of('/') + 1) + ".tmp.";
  for (const std::string& name : list_dir(dir)) {
    if (name.rfind(stale, 0) == 0) remove_file(dir + "/" + name);
  }
  const std::string tmp = detail::str_cat(path, ".tmp.", ::getpid(), ".", counter++);
  try {
    auto file = open_for_write_once(tmp);
    produce(*file);
    file->sync();
    file->close();
    rename_file(tmp, path);
  } catch (...) {
    try {
      remove_file(tmp);
    } catch (...) {
      // The original failure is the one worth reporting.
    }
    throw;
  }
  sync_dir(dir_name(path));
}

FileSystem& default_file_system() {
  static PosixFileSystem fs;
  return fs;
}

std::string dir_name(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace dscpp::io
