// Safetensors reading and writing (format in include/dscpp/safetensors.h). The header is parsed
// and validated first (parse_header); tensor bytes are then read straight into freshly allocated
// tensors, so loading a file never holds two copies of its data.
#include "dscpp/safetensors.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "dscpp/error.h"
#include "dscpp/file_system.h"
#include "io/safetensors_header.h"
#include "util/crc32c.h"
#include "util/fault_inject.h"

namespace dscpp::safetensors {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; dscpp does not byte-swap");

using ordered_json = nlohmann::ordered_json;

// libtorch's types of the format's dtypes, in kDtypeNames' order.
constexpr at::ScalarType kTypes[] = {at::kBool, at::kByte, at::kChar,     at::kShort, at::kInt,
                                     at::kLong, at::kHalf, at::kBFloat16, at::kFloat, at::kDouble};
static_assert(sizeof(kTypes) / sizeof(kTypes[0]) == kNumDtypes);

at::ScalarType scalar_type(const HeaderEntry& e) { return kTypes[e.dtype]; }

// The header text (padded with spaces to a multiple of 8) for tensors already made contiguous
// on the CPU.
std::string make_header(const TensorList& tensors,
                        const std::map<std::string, std::string>& metadata) {
  ordered_json j = ordered_json::object();
  if (!metadata.empty()) {
    ordered_json m = ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    j[kMetadataKey] = m;
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    DSCPP_CHECK(!name.empty(), IoError, "safetensors: a tensor has an empty name");
    DSCPP_CHECK(name != kMetadataKey, IoError, "safetensors: a tensor may not be named ",
                kMetadataKey);
    DSCPP_CHECK(names.insert(name).second, IoError, "safetensors: tensor name '", name,
                "' given twice");
    DSCPP_CHECK(t.defined(), IoError, "safetensors: tensor '", name, "' is undefined");
    ordered_json e = ordered_json::object();
    e["dtype"] = dtype_name(t.scalar_type());
    e["shape"] = t.sizes().vec();
    uint64_t n = t.numel() * t.element_size();
    e["data_offsets"] = ordered_json::array({offset, offset + n});
    offset += n;
    j[name] = e;
  }
  std::string text = j.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

std::string length_prefix(uint64_t n) {
  std::string s(8, '\0');
  std::memcpy(s.data(), &n, 8);
  return s;
}

TensorList to_cpu_contiguous(const TensorList& tensors) {
  TensorList out;
  out.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    DSCPP_CHECK(t.defined(), IoError, "safetensors: tensor '", name, "' is undefined");
    out.emplace_back(name, t.detach().to(at::kCPU).contiguous());
  }
  return out;
}

}  // namespace

std::string dtype_name(at::ScalarType type) {
  for (size_t i = 0; i < kNumDtypes; ++i) {
    if (kTypes[i] == type) return kDtypeNames[i];
  }
  DSCPP_FAIL(IoError, "safetensors cannot hold dtype ", c10::toString(type));
}

std::string serialize(const TensorList& tensors,
                      const std::map<std::string, std::string>& metadata) {
  TensorList cpu = to_cpu_contiguous(tensors);
  std::string header = make_header(cpu, metadata);
  std::string out = length_prefix(header.size()) + header;
  for (const auto& [name, t] : cpu) {
    out.append(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
  }
  return out;
}

Contents deserialize(const std::string& bytes, const std::string& source) {
  const uint64_t n = header_length(bytes.data(), bytes.size(), source);
  const uint64_t data_start = 8 + n;
  Header h = parse_header(bytes.substr(8, n), bytes.size() - data_start, source);
  Contents c;
  c.metadata = std::move(h.metadata);
  for (const auto& e : h.entries) {
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(scalar_type(e)));
    std::memcpy(t.data_ptr(), bytes.data() + data_start + e.begin, e.end - e.begin);
    c.tensors.emplace_back(e.name, std::move(t));
  }
  return c;
}

FileDigest save(const std::string& path, const TensorList& tensors,
                const std::map<std::string, std::string>& metadata, io::FileSystem* fs) {
  std::vector<StreamedTensor> streamed;
  for (auto& [name, t] : to_cpu_contiguous(tensors)) streamed.push_back({name, t, 0, nullptr});
  return save_streamed(path, streamed, metadata, fs);
}

FileDigest save_streamed(const std::string& path, const std::vector<StreamedTensor>& tensors,
                         const std::map<std::string, std::string>& metadata, io::FileSystem* fs,
                         int64_t piece_bytes) {
  // The header needs only names, dtypes and shapes: a streamed tensor stands in as one element
  // expanded to its length (no memory).
  TensorList shapes;
  for (const auto& t : tensors) {
    shapes.emplace_back(t.name,
                        t.tensor.defined()
                            ? t.tensor
                            : at::zeros({1}, at::TensorOptions().dtype(t.dtype)).expand({t.numel}));
  }
  std::string header;
  try {
    header = make_header(shapes, metadata);
  } catch (const IoError& e) {
    DSCPP_FAIL(IoError, "cannot save '", path, "': ", e.what());
  }
  const std::string prefix = length_prefix(header.size());
  FileDigest digest;
  io::resolve(fs).write_file_atomically(path, [&](io::WritableFile& file) {
    auto put = [&](const void* data, size_t n) {
      if (n == 0) return;
      digest.crc32c = crc32c_extend(digest.crc32c, data, n);
      digest.bytes += n;
      file.append(data, n);
    };
    put(prefix.data(), prefix.size());
    put(header.data(), header.size());
    at::Tensor buffer;  // a streamed tensor's bytes, piece_bytes at a time
    for (const auto& t : tensors) {
      DSCPP_CHECK(!fault::point(fault::Phase::save), IoError, "writing '", path,
                  "' failed: ", std::strerror(EIO));
      if (t.tensor.defined()) {
        DSCPP_CHECK(t.tensor.is_contiguous() && t.tensor.device().is_cpu(), IoError,
                    "internal: streamed save of '", t.name, "' needs contiguous CPU memory");
        put(t.tensor.data_ptr(), static_cast<size_t>(t.tensor.numel() * t.tensor.element_size()));
        continue;
      }
      const int64_t size = c10::elementSize(t.dtype);
      const int64_t piece = std::max<int64_t>(1, piece_bytes / size);
      if (t.visit) {
        const StreamedTensor::Put consume = put;
        for (int64_t off = 0; off < t.numel; off += piece)
          t.visit(off, std::min(piece, t.numel - off), consume);
        continue;
      }
      if (!buffer.defined() || buffer.numel() < std::min(piece, t.numel) * size)
        buffer = at::empty({std::min(piece, t.numel) * size}, at::kByte);
      for (int64_t off = 0; off < t.numel; off += piece) {
        const int64_t n = std::min(piece, t.numel - off);
        at::Tensor dst = buffer.narrow(0, 0, n * size).view(t.dtype);
        t.fill(off, dst);
        put(dst.data_ptr(), static_cast<size_t>(n * size));
      }
    }
  });
  return digest;
}

namespace {

// An open file and its validated header.
struct OpenFile {
  std::unique_ptr<io::RandomAccessFile> file;
  Header header;
  uint64_t data_start = 0;
};

OpenFile open_file(const std::string& path, io::FileSystem* fs) {
  OpenFile f;
  f.file = io::resolve(fs).open_for_read(path);
  const uint64_t size = f.file->size();
  char prefix[8] = {};
  if (size >= 8) f.file->pread(0, prefix, 8);
  const uint64_t n = header_length(prefix, size, path);
  std::string text(n, '\0');
  f.file->pread(8, text.data(), n);
  f.data_start = 8 + n;
  f.header = parse_header(text, size - f.data_start, path);
  return f;
}

}  // namespace

Contents load(const std::string& path, io::FileSystem* fs) {
  OpenFile f = open_file(path, fs);
  Contents c;
  c.metadata = std::move(f.header.metadata);
  for (const auto& e : f.header.entries) {
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(scalar_type(e)));
    if (e.end > e.begin) f.file->pread(f.data_start + e.begin, t.data_ptr(), e.end - e.begin);
    c.tensors.emplace_back(e.name, std::move(t));
  }
  return c;
}

struct Reader::Impl {
  OpenFile f;
  std::string path;
  std::map<std::string, const HeaderEntry*> by_name;
};

Reader::Reader(const std::string& path, io::FileSystem* fs) : impl_(std::make_unique<Impl>()) {
  impl_->f = open_file(path, fs);
  impl_->path = path;
  for (const auto& e : impl_->f.header.entries) impl_->by_name[e.name] = &e;
}

Reader::~Reader() = default;

const std::map<std::string, std::string>& Reader::metadata() const {
  return impl_->f.header.metadata;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> Reader::shapes() const {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& e : impl_->f.header.entries) out.emplace_back(e.name, e.shape);
  return out;
}

void Reader::read(const std::string& name, int64_t offset, at::Tensor dst) {
  auto it = impl_->by_name.find(name);
  DSCPP_CHECK(it != impl_->by_name.end(), IoError, "'", impl_->path, "' has no tensor '", name,
              "'");
  const HeaderEntry& e = *it->second;
  const int64_t item = static_cast<int64_t>(kDtypeBytes[e.dtype]);
  const int64_t numel = static_cast<int64_t>((e.end - e.begin) / item);
  const int64_t count = dst.numel();
  DSCPP_CHECK(offset >= 0 && offset + count <= numel, IoError, "'", impl_->path, "': elements [",
              offset, ", ", offset + count, ") of tensor '", name, "' lie outside its ", numel);
  if (count == 0) return;
  const uint64_t at = impl_->f.data_start + e.begin + offset * item;
  bytes_read_ += static_cast<uint64_t>(count * item);
  if (dst.is_contiguous() && dst.device().is_cpu() && dst.scalar_type() == scalar_type(e)) {
    impl_->f.file->pread(at, dst.data_ptr(), static_cast<size_t>(count * item));  // no copy
    return;
  }
  // Converted through one buffer of at most kReadPiece bytes.
  constexpr int64_t kReadPiece = int64_t{16} << 20;
  const int64_t piece = std::max<int64_t>(1, std::min(count, kReadPiece / item));
  at::Tensor buf = at::empty({piece}, at::TensorOptions().dtype(scalar_type(e)));
  at::Tensor flat = dst.view({-1});
  at::NoGradGuard no_grad;
  for (int64_t i = 0; i < count; i += piece) {
    const int64_t n = std::min(piece, count - i);
    impl_->f.file->pread(at + i * item, buf.data_ptr(), static_cast<size_t>(n * item));
    flat.narrow(0, i, n).copy_(buf.narrow(0, 0, n));
  }
}

at::ScalarType Reader::dtype(const std::string& name) const {
  auto it = impl_->by_name.find(name);
  DSCPP_CHECK(it != impl_->by_name.end(), IoError, "'", impl_->path, "' has no tensor '", name,
              "'");
  return scalar_type(*it->second);
}

void check_matches(const std::vector<std::pair<std::string, std::vector<int64_t>>>& wanted,
                   const std::vector<std::pair<std::string, std::vector<int64_t>>>& file,
                   const std::string& path) {
  std::map<std::string, std::vector<int64_t>> in_file(file.begin(), file.end());
  std::vector<std::string> missing, mismatched, extra;
  std::set<std::string> names;
  for (const auto& [name, shape] : wanted) {
    names.insert(name);
    auto it = in_file.find(name);
    if (it == in_file.end()) {
      missing.push_back(name);
    } else if (it->second != shape) {
      mismatched.push_back(detail::str_cat(name, " (module ", c10::IntArrayRef(shape), ", file ",
                                           c10::IntArrayRef(it->second), ")"));
    }
  }
  for (const auto& [name, shape] : file) {
    if (!names.count(name)) extra.push_back(name);
  }
  if (missing.empty() && extra.empty() && mismatched.empty()) return;
  std::ostringstream os;
  os << "'" << path << "' does not match the module (" << wanted.size() << " parameters, file "
     << file.size() << " tensors):";
  auto list = [&os](const char* what, const std::vector<std::string>& list_names) {
    if (list_names.empty()) return;
    os << "\n  " << what << " (" << list_names.size() << "):";
    for (const auto& n : list_names) os << "\n    " << n;
  };
  list("missing from the file", missing);
  list("in the file but not in the module", extra);
  list("shape mismatch", mismatched);
  os << "\nHINT: the file was saved from a model with another configuration (n_layer, n_embd, "
        "vocab_size, block_size?).";
  throw CheckpointError(os.str());
}

void save(const torch::nn::Module& module, const std::string& path,
          const std::map<std::string, std::string>& metadata, io::FileSystem* fs) {
  TensorList tensors;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    tensors.emplace_back(item.key(), item.value().detach().to(at::kCPU, at::kFloat));
  }
  save(path, tensors, metadata, fs);
}

std::map<std::string, std::string> load_into(torch::nn::Module& module, const std::string& path,
                                             io::FileSystem* fs) {
  Contents c = load(path, fs);
  auto params = module.named_parameters(/*recurse=*/true);
  std::vector<std::pair<std::string, std::vector<int64_t>>> wanted, file;
  for (const auto& item : params) wanted.emplace_back(item.key(), item.value().sizes().vec());
  std::map<std::string, at::Tensor> by_name;
  for (auto& [name, t] : c.tensors) {
    file.emplace_back(name, t.sizes().vec());
    by_name.emplace(name, t);
  }
  check_matches(wanted, file, path);
  at::NoGradGuard no_grad;
  for (auto& item : params) item.value().copy_(by_name.at(item.key()));
  return c.metadata;
}

}  // namespace dscpp::safetensors
