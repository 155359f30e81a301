// Safetensors: dscpp's weights interchange format, written and read by dscpp itself. A file is
// an 8-byte little-endian header length N, N bytes of JSON header
//   {"__metadata__": {"k": "v", ...}, "name": {"dtype": "F32", "shape": [2, 3],
//    "data_offsets": [begin, end]}, ...}
// padded with spaces to a multiple of 8 bytes (as the reference Rust implementation does), then
// the tensors' raw little-endian bytes, offsets relative to the end of the header. Tensors keep
// the order they were given in, in the header and in the data. Reading validates everything
// (JSON, dtypes, shapes against byte sizes, offsets in range, no overlap and no holes) and
// throws IoError naming the file and, where one is at fault, the tensor. Writing is atomic
// (temporary file, fsync, rename): a failed save leaves no partial file behind.
//
// All disk I/O goes through an io::FileSystem (include/dscpp/file_system.h); pass nullptr for the
// POSIX one. Tests pass a FaultFileSystem (tests/support/) to tear files or fail writes.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace dscpp::io {
class FileSystem;
}

namespace dscpp::safetensors {

// Named tensors in file order.
using TensorList = std::vector<std::pair<std::string, at::Tensor>>;

struct Contents {
  TensorList tensors;                           // CPU, contiguous, in file order
  std::map<std::string, std::string> metadata;  // "__metadata__", empty when absent
};

// Dtype names of the format and their libtorch types: BOOL, U8, I8, I16, I32, I64, F16, BF16,
// F32, F64. The format's U16, U32, U64 and F8_* are rejected with a message.
std::string dtype_name(at::ScalarType type);

// Serialises to the bytes of a file (header and data). Tensors may live on any device and have
// any strides; they are copied to contiguous CPU memory. Throws IoError for a dtype the format
// cannot hold, an empty or duplicate name, or a name "__metadata__".
std::string serialize(const TensorList& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Parses the bytes of a file; `source` names it in errors. Throws IoError on anything invalid.
Contents deserialize(const std::string& bytes, const std::string& source);

// What save() handed to the file system: the file's size and CRC-32C (Castagnoli), as a
// checkpoint's manifest records them (docs/checkpoint.md).
struct FileDigest {
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};

// Writes a file atomically. Large tensors are written from their own memory (no copy into one
// buffer) when already contiguous on the CPU. Throws IoError; `path` is then untouched. Returns
// the size and CRC-32C of the bytes written.
FileDigest save(const std::string& path, const TensorList& tensors,
                const std::map<std::string, std::string>& metadata = {},
                io::FileSystem* fs = nullptr);

// A tensor whose bytes are produced while the file is written: `tensor` when it is in memory,
// else a vector of `numel` elements of `dtype` that `fill(offset, dst)` writes piece by piece
// (elements [offset, offset + dst.numel()) into the contiguous CPU tensor dst of that dtype).
// Offloaded optimizer state is saved this way, never held in memory whole, and so is what a
// background save reads from the training state (src/checkpoint/live_snapshot.h).
// Instead of fill, `visit(offset, n, put)` may hand the elements [offset, offset + n) to
// `put` where they lie (no copy); put has consumed them when visit returns.
struct StreamedTensor {
  using Put = std::function<void(const void* data, size_t bytes)>;
  std::string name;
  at::Tensor tensor;
  int64_t numel = 0;
  std::function<void(int64_t offset, const at::Tensor& dst)> fill;
  at::ScalarType dtype = at::kFloat;
  std::function<void(int64_t offset, int64_t n, const Put& put)> visit;
};

// save() of tensors some of which are streamed; at most `piece_bytes` of a streamed tensor is
// held at once.
FileDigest save_streamed(const std::string& path, const std::vector<StreamedTensor>& tensors,
                         const std::map<std::string, std::string>& metadata = {},
                         io::FileSystem* fs = nullptr, int64_t piece_bytes = int64_t{16} << 20);

// Reads and validates a whole file. Throws IoError naming the file (and tensor) on any problem.
Contents load(const std::string& path, io::FileSystem* fs = nullptr);

// Writes every parameter of `module` under its named_parameters() name (the module path, e.g.
// "h.0.attn.c_attn.weight"), converted to fp32 on the CPU. Throws IoError.
void save(const torch::nn::Module& module, const std::string& path,
          const std::map<std::string, std::string>& metadata = {}, io::FileSystem* fs = nullptr);

// Copies the tensors of a file into the parameters of `module` by name, converting the dtype
// and device to the parameter's. The file must hold exactly the module's parameters with the
// same shapes; otherwise throws CheckpointError listing every missing name, every extra name and
// every shape mismatch at once, and leaves the module unchanged. Throws IoError for an unreadable
// or corrupt file. Returns the file's metadata.
std::map<std::string, std::string> load_into(torch::nn::Module& module, const std::string& path,
                                             io::FileSystem* fs = nullptr);

// A file's header, read and validated without its data, for reading tensors piece by piece (ZeRO
// stage 3 reads only this rank's shard of each parameter). Not thread-safe.
class Reader {
 public:
  // Opens and validates `path` as load() does, reading only its header. Throws IoError.
  explicit Reader(const std::string& path, io::FileSystem* fs = nullptr);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  const std::map<std::string, std::string>& metadata() const;
  // The tensors' names and shapes, in file order.
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes() const;
  // The dtype tensor `name` is stored in. Throws IoError for an unknown name.
  at::ScalarType dtype(const std::string& name) const;
  // Reads elements [offset, offset + dst.numel()) of tensor `name` (in row-major order) into
  // `dst` (contiguous, any dtype and device: converted through a buffer of at most 16 MiB; a
  // CPU tensor of the stored dtype is read into directly). Throws IoError for an unknown name or
  // a range outside the tensor.
  void read(const std::string& name, int64_t offset, at::Tensor dst);
  // Bytes of tensor data read so far.
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  uint64_t bytes_read_ = 0;
};

// Throws CheckpointError listing every parameter of `wanted` (name, shape) missing from `file`,
// every tensor of the file no parameter wants and every shape mismatch, at once; `path` names the
// file.
void check_matches(const std::vector<std::pair<std::string, std::vector<int64_t>>>& wanted,
                   const std::vector<std::pair<std::string, std::vector<int64_t>>>& file,
                   const std::string& path);

}  // namespace dscpp::safetensors
