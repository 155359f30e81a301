// Implements GradSwapper (grad_swapper.h): NOTE [gradients on disk].
#include "offload/grad_swapper.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <utility>

#include "dscpp/error.h"
#include "optim/dispatch.h"

namespace dscpp::offload {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

constexpr int64_t kBlock = optim::kSquaresChunk;  // elements per block

}  // namespace

GradSwapper::GradSwapper(io::AsyncIo& io, GradSwapperOptions options)
    : o_(std::move(options)), item_(c10::elementSize(o_.dtype)) {
  DSCPP_CHECK(o_.numel >= 0 && o_.read_elements >= 0, Error,
              "internal: GradSwapper needs sizes of at least 0");
  o_.read_elements = std::min(o_.read_elements, o_.numel);
  file_bytes_ = file_bytes_for(o_.numel, o_.dtype);
  const int64_t n_blocks = (o_.numel + kBlock - 1) / kBlock;
  expected_.assign(n_blocks, 0);
  squares_.assign(n_blocks, 0.0);
  file_ = io.open(o_.path);
  std::remove(o_.path.c_str());  // lives as long as it is open
  file_->reserve(static_cast<uint64_t>(file_bytes_));
}

GradSwapper::~GradSwapper() {
  // Nothing may still write from or read into a buffer freed with this object.
  for (auto& w : writes_) {
    try {
      w.handle->wait();
    } catch (...) {
    }
  }
  for (auto& r : pending_) {
    try {
      if (r.handle) r.handle->wait();
    } catch (...) {
    }
  }
}

int64_t GradSwapper::file_bytes_for(int64_t numel, at::ScalarType dtype) {
  return static_cast<int64_t>(io::align_up(numel * c10::elementSize(dtype)));
}

int64_t GradSwapper::buffer_bytes_for(int64_t numel, at::ScalarType dtype, int64_t read_elements) {
  const int64_t item = static_cast<int64_t>(c10::elementSize(dtype));
  const int64_t blocks = (numel + kBlock - 1) / kBlock;
  const int64_t reads = numel > 0 ? 2 : 0;
  return std::min<int64_t>(blocks, kWritesInFlight + kBlocksFilling) * kBlock * item +
         reads * static_cast<int64_t>(io::align_up(std::min(read_elements, numel) * item) +
                                      io::kDirectAlignment);
}

int64_t GradSwapper::block_numel(int64_t b) const {
  return std::min(kBlock, o_.numel - b * kBlock);
}

size_t GradSwapper::block_bytes(int64_t b) const { return io::align_up(block_numel(b) * item_); }

at::Tensor GradSwapper::block_view(const Block& blk, int64_t b) const {
  return at::from_blob(blk.buffer.data(), {block_numel(b)}, at::TensorOptions(o_.dtype));
}

void GradSwapper::expect(int64_t pos, int64_t n) {
  DSCPP_CHECK(pos >= 0 && n >= 0 && pos + n <= o_.numel, Error, "internal: elements [", pos, ", ",
              pos + n, ") outside a gradient shard of ", o_.numel);
  for (int64_t at = pos; at < pos + n;) {
    const int64_t b = at / kBlock;
    const int64_t end = std::min(pos + n, (b + 1) * kBlock);
    expected_[b] += end - at;
    at = end;
  }
}

void GradSwapper::begin_backward(bool final) {
  final_ = final;
  error_ = nullptr;
  if (final_) std::fill(squares_.begin(), squares_.end(), 0.0);
}

io::AlignedBuffer GradSwapper::take_buffer() {
  if (free_.empty()) return io::AlignedBuffer(kBlock * item_);
  io::AlignedBuffer b = std::move(free_.back());
  free_.pop_back();
  return b;
}

void GradSwapper::keep_error() {
  if (!error_) error_ = std::current_exception();
}

void GradSwapper::retire_oldest_write() {
  Write w = std::move(writes_.front());
  writes_.pop_front();
  const auto t0 = Clock::now();
  try {
    w.handle->wait();
  } catch (...) {
    keep_error();
  }
  wait_seconds_ += seconds_since(t0);
  free_.push_back(std::move(w.buffer));
}

GradSwapper::Block& GradSwapper::open(int64_t b) {
  auto it = open_.find(b);
  if (it != open_.end()) return it->second;
  Block blk;
  blk.buffer = take_buffer();
  blk.missing = expected_[b];
  if (fresh_) {
    std::memset(blk.buffer.data(), 0, blk.buffer.size());
  } else {
    // Summed over the window's earlier backwards (their writes were waited for at their ends).
    const auto t0 = Clock::now();
    try {
      file_->read(static_cast<uint64_t>(b * kBlock) * item_, blk.buffer.data(), block_bytes(b))
          ->wait();
      bytes_read_ += static_cast<int64_t>(block_bytes(b));
    } catch (...) {
      keep_error();  // the window is lost; end_backward says so
      std::memset(blk.buffer.data(), 0, blk.buffer.size());
    }
    wait_seconds_ += seconds_since(t0);
  }
  return open_.emplace(b, std::move(blk)).first->second;
}

void GradSwapper::close(int64_t b) {
  auto it = open_.find(b);
  Block blk = std::move(it->second);
  open_.erase(it);
  if (final_) squares_[b] = optim::squared_norm(block_view(blk, b));
  while (static_cast<int>(writes_.size()) >= kWritesInFlight) retire_oldest_write();
  Write w;
  w.block = b;
  try {
    w.handle =
        file_->write(static_cast<uint64_t>(b * kBlock) * item_, blk.buffer.data(), block_bytes(b));
  } catch (...) {
    keep_error();
    free_.push_back(std::move(blk.buffer));
    return;
  }
  bytes_written_ += static_cast<int64_t>(block_bytes(b));
  w.buffer = std::move(blk.buffer);
  writes_.push_back(std::move(w));
}

void GradSwapper::add(int64_t pos, const at::Tensor& piece, double factor) {
  const int64_t n = piece.numel();
  DSCPP_CHECK(pos >= 0 && pos + n <= o_.numel, Error, "internal: elements [", pos, ", ", pos + n,
              ") outside a gradient shard of ", o_.numel);
  at::NoGradGuard no_grad;
  // The blocks the piece covers, each its part of the piece: [first, last].
  const int64_t first = pos / kBlock, last = (pos + n - 1) / kBlock;
  auto each_block = [&](const auto& fn) {
    for (int64_t b = first; b <= last; ++b) {
      const int64_t lo = std::max(pos, b * kBlock), hi = std::min(pos + n, (b + 1) * kBlock);
      fn(b, block_view(open(b), b).narrow(0, lo - b * kBlock, hi - lo), lo - pos, hi - lo);
    }
  };
  if (factor == 1.0) {
    // a + x rounds once in a vector's lanes and in its scalar tail alike: block by block.
    each_block([&](int64_t, at::Tensor dst, int64_t off, int64_t len) {
      dst.add_(piece.narrow(0, off, len));
    });
  } else {
    // One operation over the whole piece, as in memory (NOTE [gradients on disk]).
    at::Tensor sum = at::empty({n}, piece.options().dtype(o_.dtype));
    each_block([&](int64_t, at::Tensor src, int64_t off, int64_t len) {
      sum.narrow(0, off, len).copy_(src);
    });
    sum.add_(piece, factor);
    each_block([&](int64_t, at::Tensor dst, int64_t off, int64_t len) {
      dst.copy_(sum.narrow(0, off, len));
    });
  }
  for (int64_t b = first; b <= last; ++b) {
    Block& blk = open_.at(b);
    const int64_t lo = std::max(pos, b * kBlock), hi = std::min(pos + n, (b + 1) * kBlock);
    blk.missing -= hi - lo;
    DSCPP_CHECK(blk.missing >= 0, Error, "internal: block ", b,
                " of the gradient shard got more elements than its reductions fill");
    if (blk.missing == 0) close(b);
  }
}

void GradSwapper::end_backward() {
  while (!writes_.empty()) retire_oldest_write();
  const bool incomplete = !open_.empty();
  const int64_t first_open = incomplete ? open_.begin()->first : -1;
  for (auto& [b, blk] : open_) free_.push_back(std::move(blk.buffer));
  open_.clear();
  if (error_) std::rethrow_exception(error_);
  DSCPP_CHECK(!incomplete, Error, "internal: block ", first_open,
              " of the gradient shard did not get every element its reductions fill");
  fresh_ = false;
}

void GradSwapper::zero() {
  for (auto& w : writes_) {
    try {
      w.handle->wait();  // a dropped window's; its failure goes with it
    } catch (...) {
    }
    free_.push_back(std::move(w.buffer));
  }
  writes_.clear();
  for (auto& [b, blk] : open_) free_.push_back(std::move(blk.buffer));
  open_.clear();
  error_ = nullptr;
  fresh_ = true;
  std::fill(squares_.begin(), squares_.end(), 0.0);
}

int64_t GradSwapper::buffer_bytes() const {
  int64_t total = 0;
  for (const auto& [b, blk] : open_) total += static_cast<int64_t>(blk.buffer.size());
  for (const auto& w : writes_) total += static_cast<int64_t>(w.buffer.size());
  for (const auto& f : free_) total += static_cast<int64_t>(f.size());
  for (const auto& r : reads_) total += static_cast<int64_t>(r.size());
  return total;
}

uint64_t GradSwapper::first_byte(int64_t pos) const {
  return static_cast<uint64_t>(pos) * item_ / io::kDirectAlignment * io::kDirectAlignment;
}

size_t GradSwapper::range_bytes(int64_t pos, int64_t n) const {
  return io::align_up(static_cast<uint64_t>(pos + n) * item_) - first_byte(pos);
}

void GradSwapper::read_ahead(int64_t pos, int64_t n) {
  DSCPP_CHECK(pos >= 0 && n > 0 && n <= o_.read_elements && pos + n <= o_.numel, Error,
              "internal: a read of elements [", pos, ", ", pos + n, ") of a gradient shard of ",
              o_.numel, " read ", o_.read_elements, " at a time");
  const int i = next_;
  next_ ^= 1;
  if (pending_[i].handle) {  // a read ahead nobody asked for: let it land
    try {
      pending_[i].handle->wait();
    } catch (...) {
    }
  }
  if (reads_[i].size() == 0) {
    reads_[i] = io::AlignedBuffer(io::align_up(o_.read_elements * item_) + io::kDirectAlignment);
  }
  pending_[i] = Read{pos, n, nullptr};
  const size_t bytes = range_bytes(pos, n);
  pending_[i].handle = file_->read(first_byte(pos), reads_[i].data(), bytes);
  bytes_read_ += static_cast<int64_t>(bytes);
}

at::Tensor GradSwapper::read(int64_t pos, int64_t n) {
  int i = 0;
  while (i < 2 && !(pending_[i].handle && pending_[i].pos == pos && pending_[i].n == n)) ++i;
  if (i == 2) {  // not read ahead: read it now
    i = next_;
    read_ahead(pos, n);
  }
  const auto t0 = Clock::now();
  io::IoHandle h = std::move(pending_[i].handle);
  pending_[i].handle = nullptr;
  h->wait();  // an IoError naming the file: the step fails on this rank (every rank learns it)
  wait_seconds_ += seconds_since(t0);
  auto* data = static_cast<char*>(reads_[i].data()) + (pos * item_ - first_byte(pos));
  return at::from_blob(data, {n}, at::TensorOptions(o_.dtype));
}

double GradSwapper::squared_norm() const {
  double total = 0.0;
  for (double s : squares_) total += s;
  return total;
}

std::string GradSwapper::take_report() {
  const std::string out = fmt::format(
      "gradients on disk: wrote {:.1f} MiB, read {:.1f} MiB, waited {:.1f} ms",
      bytes_written_ / double(1 << 20), bytes_read_ / double(1 << 20), wait_seconds_ * 1e3);
  bytes_written_ = bytes_read_ = 0;
  wait_seconds_ = 0;
  return out;
}

}  // namespace dscpp::offload
