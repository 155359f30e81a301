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
  complete_.assign(n_blocks, 0);
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
  drop_read_ahead();
}

int64_t GradSwapper::file_bytes_for(int64_t numel, at::ScalarType dtype) {
  return static_cast<int64_t>(io::align_up(numel * c10::elementSize(dtype)));
}

int64_t GradSwapper::buffer_bytes_for(int64_t numel, at::ScalarType dtype, int64_t read_elements) {
  const int64_t item = static_cast<int64_t>(c10::elementSize(dtype));
  const int64_t blocks = (numel + kBlock - 1) / kBlock;
  const int64_t reads = numel > 0 ? 2 : 0;
  return std::min<int64_t>(blocks, kBuffersKept) * kBlock * item +
         reads * static_cast<int64_t>(io::align_up(std::min(read_elements, numel) * item) +
                                      io::kDirectAlignment);
}

int64_t GradSwapper::block_numel(int64_t b) const {
  return std::min(kBlock, o_.numel - b * kBlock);
}

uint64_t GradSwapper::block_offset(int64_t b) const {
  return static_cast<uint64_t>(b * kBlock) * item_;
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
  // A backward that did not reach its end (an exception in the reducer) leaves blocks half
  // filled: that window is dropped, and nothing of it may count again.
  while (!writes_.empty()) retire_oldest_write();
  drop_open_blocks();
  final_ = final;
  error_ = nullptr;
  squares_valid_ = false;
  std::fill(complete_.begin(), complete_.end(), 0);
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

void GradSwapper::load(int64_t b, void* buffer) {
  if (fresh_) {
    std::memset(buffer, 0, kBlock * item_);
    return;
  }
  // Summed over the window's earlier backwards (their writes were waited for at their ends).
  const auto t0 = Clock::now();
  try {
    file_->read(block_offset(b), buffer, block_bytes(b))->wait();
    bytes_read_ += static_cast<int64_t>(block_bytes(b));
  } catch (...) {
    keep_error();  // the window is lost; end_backward says so
    std::memset(buffer, 0, kBlock * item_);
  }
  wait_seconds_ += seconds_since(t0);
}

GradSwapper::Block& GradSwapper::open(int64_t b) {
  auto it = open_.find(b);
  if (it != open_.end()) return it->second;
  Block blk;
  blk.missing = expected_[b];
  if (ahead_.block == b) {  // read ahead: wait for it and take its buffer
    const auto t0 = Clock::now();
    try {
      ahead_.handle->wait();
    } catch (...) {
      keep_error();  // the window is lost; end_backward says so
      std::memset(ahead_.buffer.data(), 0, ahead_.buffer.size());
    }
    wait_seconds_ += seconds_since(t0);
    blk.buffer = std::move(ahead_.buffer);
    ahead_ = Ahead{};
  } else {
    blk.buffer = take_buffer();
    load(b, blk.buffer.data());
  }
  return open_.emplace(b, std::move(blk)).first->second;
}

void GradSwapper::read_block_ahead(int64_t b) {
  if (fresh_ || b < 0 || b >= blocks() || expected_[b] == 0 || open_.count(b) != 0 ||
      complete_[b] || ahead_.block == b)
    return;
  drop_read_ahead();
  io::AlignedBuffer buffer = take_buffer();
  try {
    ahead_.handle = file_->read(block_offset(b), buffer.data(), block_bytes(b));
  } catch (...) {
    free_.push_back(std::move(buffer));  // open() reads it then, and meets the error itself
    return;
  }
  bytes_read_ += static_cast<int64_t>(block_bytes(b));
  ahead_.block = b;
  ahead_.buffer = std::move(buffer);
}

void GradSwapper::drop_read_ahead() {
  if (ahead_.block < 0) return;
  try {
    ahead_.handle->wait();
  } catch (...) {  // nobody needs the block now
  }
  free_.push_back(std::move(ahead_.buffer));
  ahead_ = Ahead{};
}

void GradSwapper::arrived(int64_t b, int64_t lo, int64_t hi) {
  Block& blk = open_.at(b);
  blk.missing -= hi - lo;
  DSCPP_CHECK(blk.missing >= 0, Error, "internal: block ", b,
              " of the gradient shard got more elements than its reductions fill");
  if (blk.missing == 0) close(b);
}

void GradSwapper::close(int64_t b) {
  auto it = open_.find(b);
  if (final_) squares_[b] = optim::squared_norm(block_view(it->second, b));
  Block blk = std::move(it->second);
  open_.erase(it);
  complete_[b] = 1;
  while (static_cast<int>(writes_.size()) >= kWritesInFlight) retire_oldest_write();
  Write w;
  try {
    w.handle = file_->write(block_offset(b), blk.buffer.data(), block_bytes(b));
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
  const int64_t first = pos / kBlock, last = (pos + n - 1) / kBlock;
  auto range = [&](int64_t b) {
    return std::make_pair(std::max(pos, b * kBlock), std::min(pos + n, (b + 1) * kBlock));
  };
  if (factor == 1.0) {
    // a + x rounds once in a vector's lanes and in its scalar tail alike: block by block, each
    // written as soon as it is complete (a bucket's piece spans up to ~100 blocks), from the
    // piece's end to its start as the reductions come, the block below read ahead meanwhile
    // (after the window's first backward).
    for (int64_t b = last; b >= first; --b) {
      const auto [lo, hi] = range(b);
      Block& blk = open(b);
      read_block_ahead(b - 1);  // touches no open block
      block_view(blk, b)
          .narrow(0, lo - b * kBlock, hi - lo)
          .add_(piece.narrow(0, lo - pos, hi - lo));
      arrived(b, lo, hi);
    }
    return;
  }
  // One operation over the whole piece, as in memory (NOTE [gradients on disk]). A block the piece
  // fills alone (not open, this piece all it expects) is not held while the sum is taken: its old
  // values go into `sum` through a spare buffer and come back into a fresh one.
  auto alone = [&](int64_t b) {
    const auto [lo, hi] = range(b);
    return open_.count(b) == 0 && expected_[b] == hi - lo;
  };
  at::Tensor sum = at::empty({n}, piece.options().dtype(o_.dtype));
  for (int64_t b = first; b <= last; ++b) {
    const auto [lo, hi] = range(b);
    at::Tensor dst = sum.narrow(0, lo - pos, hi - lo);
    if (alone(b)) {
      if (ahead_.block == b) drop_read_ahead();
      io::AlignedBuffer spare = take_buffer();
      load(b, spare.data());
      dst.copy_(at::from_blob(spare.data(), {block_numel(b)}, at::TensorOptions(o_.dtype))
                    .narrow(0, lo - b * kBlock, hi - lo));
      free_.push_back(std::move(spare));
    } else {
      dst.copy_(block_view(open(b), b).narrow(0, lo - b * kBlock, hi - lo));
    }
  }
  sum.add_(piece, factor);
  for (int64_t b = first; b <= last; ++b) {
    const auto [lo, hi] = range(b);
    if (open_.count(b) == 0) {  // filled alone: padding zeros, the rest this piece's sum
      Block blk;
      blk.buffer = take_buffer();
      blk.missing = expected_[b];
      std::memset(blk.buffer.data(), 0, blk.buffer.size());
      open_.emplace(b, std::move(blk));
    }
    block_view(open_.at(b), b)
        .narrow(0, lo - b * kBlock, hi - lo)
        .copy_(sum.narrow(0, lo - pos, hi - lo));
    arrived(b, lo, hi);
  }
}

void GradSwapper::drop_open_blocks() {
  drop_read_ahead();
  for (auto& [b, blk] : open_) free_.push_back(std::move(blk.buffer));
  open_.clear();
  if (free_.size() > kBuffersKept) free_.resize(kBuffersKept);
}

void GradSwapper::end_backward() {
  while (!writes_.empty()) retire_oldest_write();
  const bool incomplete = !open_.empty();
  const int64_t first_open = incomplete ? open_.begin()->first : -1;
  drop_open_blocks();
  if (error_) std::rethrow_exception(error_);
  DSCPP_CHECK(!incomplete, Error, "internal: block ", first_open,
              " of the gradient shard did not get every element its reductions fill");
  fresh_ = false;
  squares_valid_ = final_;
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
  drop_open_blocks();
  error_ = nullptr;
  fresh_ = true;
  squares_valid_ = false;
  std::fill(squares_.begin(), squares_.end(), 0.0);
}

int64_t GradSwapper::buffer_bytes() const {
  int64_t total = 0;
  for (const auto& [b, blk] : open_) total += static_cast<int64_t>(blk.buffer.size());
  for (const auto& w : writes_) total += static_cast<int64_t>(w.buffer.size());
  for (const auto& f : free_) total += static_cast<int64_t>(f.size());
  for (const auto& r : reads_) total += static_cast<int64_t>(r.size());
  return total + static_cast<int64_t>(ahead_.buffer.size());
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

double GradSwapper::squared_norm() {
  if (!squares_valid_) {
    // The window's last backward was not its boundary's (flush_accumulation at an epoch's ragged
    // end): the sums are taken now, reading the shard back block by block.
    io::AlignedBuffer buffer = take_buffer();
    for (int64_t b = 0; b < blocks(); ++b) {
      squares_[b] = 0.0;
      if (expected_[b] == 0) continue;
      const auto t0 = Clock::now();
      file_->read(block_offset(b), buffer.data(), block_bytes(b))->wait();
      wait_seconds_ += seconds_since(t0);
      bytes_read_ += static_cast<int64_t>(block_bytes(b));
      squares_[b] = optim::squared_norm(
          at::from_blob(buffer.data(), {block_numel(b)}, at::TensorOptions(o_.dtype)));
    }
    free_.push_back(std::move(buffer));
    squares_valid_ = true;
  }
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
