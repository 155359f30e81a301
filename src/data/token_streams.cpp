// Token streams over files (text bytes, uint16 .bin) and in-memory tensors. File streams keep
// one open RandomAccessFile and pread exactly the slice asked for, so a rank touches only the
// bytes of its own samples.
#include <algorithm>
#include <stdexcept>

#include "dscpp/data.h"
#include "dscpp/error.h"
#include "dscpp/file_system.h"

namespace dscpp::data {
namespace {

void check_range(const TokenStream& s, int64_t begin, int64_t count) {
  DSCPP_CHECK(begin >= 0 && count >= 0 && begin + count <= s.size(), std::out_of_range, "tokens [",
              begin, ", ", begin + count, ") are outside '", s.name(), "' (", s.size(), " tokens)");
}

// A file of fixed-width little-endian tokens: 1 byte (text) or 2 bytes (uint16 .bin).
class FileTokenStream final : public TokenStream {
 public:
  FileTokenStream(std::unique_ptr<io::RandomAccessFile> file, int width, int64_t vocab_size)
      : file_(std::move(file)), width_(width), vocab_size_(vocab_size) {}

  int64_t size() const override { return static_cast<int64_t>(file_->size()) / width_; }
  int64_t vocab_size() const override { return vocab_size_; }
  std::string name() const override { return file_->path(); }

  at::Tensor read(int64_t begin, int64_t count) const override {
    check_range(*this, begin, count);
    at::Tensor out = at::empty({count}, at::kLong);
    auto* dst = out.data_ptr<int64_t>();
    if (width_ == 1) {
      std::vector<uint8_t> buf(count);
      if (count > 0) file_->pread(begin, buf.data(), count);
      std::copy(buf.begin(), buf.end(), dst);
      return out;  // every byte is < 256
    }
    std::vector<uint16_t> buf(count);
    if (count > 0) file_->pread(static_cast<uint64_t>(begin) * 2, buf.data(), count * 2);
    for (int64_t i = 0; i < count; ++i) {
      dst[i] = buf[i];
      DSCPP_CHECK(dst[i] < vocab_size_, ConfigError, "'", name(), "': token ", begin + i,
                  " has id ", dst[i], ", not below vocab_size ", vocab_size_,
                  ". HINT: pass the vocabulary size the file was tokenised with.");
    }
    return out;
  }

  // Largest id in the file + 1, reading it in 1 MiB chunks.
  int64_t scan_vocab() const {
    int64_t hi = -1;
    const int64_t n = size(), chunk = 1 << 19;
    std::vector<uint16_t> buf(chunk);
    for (int64_t b = 0; b < n; b += chunk) {
      const int64_t c = std::min(chunk, n - b);
      file_->pread(static_cast<uint64_t>(b) * 2, buf.data(), c * 2);
      hi = std::max<int64_t>(hi, *std::max_element(buf.begin(), buf.begin() + c));
    }
    return hi + 1;
  }

 private:
  std::unique_ptr<io::RandomAccessFile> file_;
  int width_;
  int64_t vocab_size_;
};

class TensorTokenStream final : public TokenStream {
 public:
  TensorTokenStream(at::Tensor tokens, int64_t vocab_size, std::string name)
      : tokens_(std::move(tokens)), vocab_size_(vocab_size), name_(std::move(name)) {}

  int64_t size() const override { return tokens_.numel(); }
  int64_t vocab_size() const override { return vocab_size_; }
  std::string name() const override { return name_; }
  at::Tensor read(int64_t begin, int64_t count) const override {
    check_range(*this, begin, count);
    return tokens_.narrow(0, begin, count).clone();
  }

 private:
  at::Tensor tokens_;  // [n] int64, CPU
  int64_t vocab_size_;
  std::string name_;
};

bool has_suffix(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::shared_ptr<TokenStream> open_text_file(const std::string& path, io::FileSystem* fs) {
  return std::make_shared<FileTokenStream>(io::resolve(fs).open_for_read(path), 1, 256);
}

std::shared_ptr<TokenStream> open_bin_file(const std::string& path, int64_t vocab_size,
                                           io::FileSystem* fs) {
  DSCPP_CHECK(vocab_size >= 0 && vocab_size <= 65536, ConfigError, "vocab_size ", vocab_size,
              " for '", path, "' does not fit uint16 tokens (at most 65536; 0 = scan the file)");
  auto file = io::resolve(fs).open_for_read(path);
  DSCPP_CHECK(file->size() % 2 == 0, IoError, "'", path, "' has ", file->size(),
              " bytes, an odd number, so it is not a file of uint16 tokens. HINT: a .bin holds "
              "raw little-endian uint16 token ids (numpy: arr.astype(np.uint16).tofile(path)); "
              "the file may be truncated.");
  auto stream = std::make_shared<FileTokenStream>(std::move(file), 2, vocab_size);
  if (vocab_size == 0) {
    const int64_t v = stream->scan_vocab();
    stream = std::make_shared<FileTokenStream>(io::resolve(fs).open_for_read(path), 2,
                                               std::max<int64_t>(v, 1));
  }
  return stream;
}

std::shared_ptr<TokenStream> open_token_file(const std::string& path, int64_t vocab_size,
                                             io::FileSystem* fs) {
  if (has_suffix(path, ".bin")) return open_bin_file(path, vocab_size, fs);
  DSCPP_CHECK(vocab_size == 0 || vocab_size == 256, ConfigError, "'", path,
              "' is read as text (one token per byte, vocab_size 256), but vocab_size ", vocab_size,
              " was asked for. HINT: name a file of uint16 tokens *.bin.");
  return open_text_file(path, fs);
}

std::shared_ptr<TokenStream> from_tensor(const at::Tensor& tokens, int64_t vocab_size,
                                         std::string name) {
  DSCPP_CHECK(tokens.dim() == 1 && !at::isFloatingType(tokens.scalar_type()) &&
                  tokens.scalar_type() != at::kBool,
              ConfigError, name, ": a token stream must be a 1-D integer tensor, got ",
              tokens.scalar_type(), " ", tokens.sizes());
  DSCPP_CHECK(vocab_size > 0, ConfigError, name, ": vocab_size must be > 0, got ", vocab_size);
  at::Tensor t = tokens.detach().to(at::kCPU, at::kLong).contiguous();
  if (t.numel() > 0) {
    const int64_t lo = t.min().item<int64_t>(), hi = t.max().item<int64_t>();
    DSCPP_CHECK(lo >= 0 && hi < vocab_size, ConfigError, name, ": token ids lie in [", lo, ", ", hi,
                "], outside [0, vocab_size=", vocab_size, ")");
  }
  return std::make_shared<TensorTokenStream>(std::move(t), vocab_size, std::move(name));
}

}  // namespace dscpp::data
