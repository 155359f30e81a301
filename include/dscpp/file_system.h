// FileSystem: the one seam through which dscpp reads and writes files (LevelDB's Env). The POSIX
// implementation is the default; a program may pass its own (InitOptions::file_system, the
// safetensors functions' `fs`). The tests wrap it (FaultFileSystem, tests/support/) to fail the
// Nth write, tear a file or fill the disk. Reads are positional (pread), so one open file may be
// read from several threads at once; a WritableFile belongs to the thread that opened it. Every
// failure is an IoError naming the path and the system's reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dscpp::io {

// An open file read at explicit offsets. Thread-safe: pread does not move a shared position.
class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  // Reads exactly n bytes at `offset` into dst. Throws IoError naming the file when the read
  // fails or the file ends before offset + n.
  virtual void pread(uint64_t offset, void* dst, size_t n) const = 0;
  // Size in bytes when the file was opened.
  virtual uint64_t size() const = 0;
  virtual const std::string& path() const = 0;
};

// A file being written front to back. Not thread-safe.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Appends n bytes. Throws IoError (disk full, I/O error) naming the file.
  virtual void append(const void* data, size_t n) = 0;
  // Flushes written data to stable storage (fsync). Throws IoError.
  virtual void sync() = 0;
  // Closes the file; further calls are errors. Throws IoError when close reports a failure.
  virtual void close() = 0;
  virtual const std::string& path() const = 0;
};

// A piece of a file to write: `size` bytes at `data` (not owned).
struct ConstBuffer {
  const void* data = nullptr;
  size_t size = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // Opens an existing file for reading. Throws IoError when it does not exist or cannot be read.
  virtual std::unique_ptr<RandomAccessFile> open_for_read(const std::string& path) = 0;
  // Creates (or truncates) a file for writing. Throws IoError.
  virtual std::unique_ptr<WritableFile> open_for_write(const std::string& path) = 0;
  // Creates (or truncates) a file that is written once, front to back, then synced and closed
  // (write_file_atomically's temporary file): the file system may write it around the page
  // cache (the POSIX one uses O_DIRECT where the file system allows it). Default:
  // open_for_write. Throws IoError.
  virtual std::unique_ptr<WritableFile> open_for_write_once(const std::string& path) {
    return open_for_write(path);
  }
  // Opens a file for appending, creating it when missing; size() of a fresh
  // open_for_read tells how much was there. Throws IoError.
  virtual std::unique_ptr<WritableFile> open_for_append(const std::string& path) = 0;
  // Atomically replaces `to` with `from` (rename(2)). Throws IoError.
  virtual void rename_file(const std::string& from, const std::string& to) = 0;
  // Removes a file; a file that does not exist is not an error. Throws IoError otherwise.
  virtual void remove_file(const std::string& path) = 0;
  // fsync of a directory, so that a rename in it survives a crash. Throws IoError.
  virtual void sync_dir(const std::string& dir) = 0;
  // Creates a directory and its missing parents (mkdir -p); an existing directory is not an
  // error. Throws IoError.
  virtual void create_dirs(const std::string& dir) = 0;
  virtual bool exists(const std::string& path) = 0;
  // Size in bytes. Throws IoError when the file does not exist.
  virtual uint64_t file_size(const std::string& path) = 0;
  // The names in a directory (not "." and ".."); empty when it does not exist or cannot be read.
  virtual std::vector<std::string> list_dir(const std::string& dir);

  // Writes `pieces` one after another as the whole content of `path`, atomically: into a
  // temporary file beside it (after removing the ones earlier writers of `path` left when they
  // were killed: each path has one writer), fsync, rename over `path`, fsync of the directory.
  // On success the file holds exactly the pieces; on failure (IoError, rethrown) the temporary
  // file is removed and `path` is untouched: either its old content or, if it did not exist, no
  // file.
  void write_file_atomically(const std::string& path, const std::vector<ConstBuffer>& pieces);
  // The same, with the content appended by `produce` (streamed from elsewhere).
  void write_file_atomically(const std::string& path,
                             const std::function<void(WritableFile&)>& produce);
};

// The process-wide POSIX file system.
FileSystem& default_file_system();

// `fs` when not null, else default_file_system(). Public functions take `io::FileSystem* fs =
// nullptr` and resolve it with this.
inline FileSystem& resolve(FileSystem* fs) { return fs ? *fs : default_file_system(); }

// The directory part of a path ("a/b/c" -> "a/b", "c" -> ".").
std::string dir_name(const std::string& path);

}  // namespace dscpp::io
