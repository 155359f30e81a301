// Implements ParamSwapper (param_swapper.h, NOTE [parameter swap file]).
#include "offload/param_swapper.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>

#include "dscpp/error.h"

namespace dscpp::offload {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

// Aligned buffers of one size, shared with the tensors take() hands out (their deleter returns
// the buffer), so it outlives the swapper if a tensor does.
struct ParamSwapper::Pool {
  size_t size = 0;
  std::mutex mu;
  std::vector<std::unique_ptr<io::AlignedBuffer>> free;
  int64_t allocated = 0;  // bytes, in use or free

  std::unique_ptr<io::AlignedBuffer> get() {
    std::lock_guard<std::mutex> lock(mu);
    if (!free.empty()) {
      auto b = std::move(free.back());
      free.pop_back();
      return b;
    }
    allocated += static_cast<int64_t>(io::align_up(size));
    return std::make_unique<io::AlignedBuffer>(size);
  }
  void give(std::unique_ptr<io::AlignedBuffer> b) {
    if (!b) return;
    std::lock_guard<std::mutex> lock(mu);
    free.push_back(std::move(b));
  }
};

ParamSwapper::ParamSwapper(io::AsyncIo& io, ParamSwapperOptions options)
    : o_(std::move(options)), pool_(std::make_shared<Pool>()) {
  DSCPP_CHECK(o_.buffer_count >= 1, Error, "internal: ParamSwapper needs a buffer");
  int64_t largest = 0;
  for (int64_t n : o_.numels) {
    begin_.push_back(total_);
    start_.push_back(file_bytes_);
    total_ += n;
    file_bytes_ += static_cast<int64_t>(io::align_up(n * c10::elementSize(o_.dtype)));
    largest = std::max(largest, n);
  }
  buffer_size_ = io::align_up(largest * c10::elementSize(o_.dtype));
  pool_->size = buffer_size_;
  file_ = io.open(o_.path);
  std::remove(o_.path.c_str());  // lives while open (NOTE [parameter swap file])
  file_->reserve(static_cast<uint64_t>(file_bytes_));
}

ParamSwapper::~ParamSwapper() {
  // Nothing may still read into or write from a buffer once the swapper is gone.
  for (auto& [i, p] : ahead_) {
    try {
      if (p.read) p.read->wait();
    } catch (...) {
    }
  }
  for (auto& w : writes_) {
    try {
      w.write->wait();
    } catch (...) {
    }
  }
}

int64_t ParamSwapper::buffer_bytes() const {
  std::lock_guard<std::mutex> lock(pool_->mu);
  return pool_->allocated;
}

size_t ParamSwapper::bytes_of(int i) const {
  return io::align_up(o_.numels[i] * c10::elementSize(o_.dtype));
}

at::Tensor ParamSwapper::view(io::AlignedBuffer& buffer, int i) const {
  return at::from_blob(buffer.data(), {o_.numels[i]}, at::TensorOptions().dtype(o_.dtype));
}

void ParamSwapper::wait(const io::IoHandle& h) {
  if (!h) return;
  const auto t0 = Clock::now();
  h->wait();
  stats_.wait_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
}

bool ParamSwapper::read_ahead(int i) {
  if (ahead_.count(i)) return true;
  if (static_cast<int>(ahead_.size()) >= o_.buffer_count) return false;
  Pending p;
  p.buffer = pool_->get();
  p.read = file_->read(start_[i], p.buffer->data(), bytes_of(i));
  stats_.bytes_read += static_cast<int64_t>(bytes_of(i));
  ++stats_.reads;
  ++stats_.reads_ahead;
  ahead_.emplace(i, std::move(p));
  return true;
}

at::Tensor ParamSwapper::take(int i) {
  std::unique_ptr<io::AlignedBuffer> buffer;
  if (auto it = ahead_.find(i); it != ahead_.end()) {
    Pending p = std::move(it->second);
    ahead_.erase(it);
    try {
      wait(p.read);
    } catch (...) {
      pool_->give(std::move(p.buffer));
      throw;
    }
    buffer = std::move(p.buffer);
  } else {
    buffer = pool_->get();
    stats_.bytes_read += static_cast<int64_t>(bytes_of(i));
    ++stats_.reads;
    try {
      wait(file_->read(start_[i], buffer->data(), bytes_of(i)));
    } catch (...) {
      pool_->give(std::move(buffer));
      throw;
    }
  }
  io::AlignedBuffer* raw = buffer.release();
  std::shared_ptr<Pool> pool = pool_;
  return at::from_blob(
      raw->data(), {o_.numels[i]},
      [pool, raw](void*) { pool->give(std::unique_ptr<io::AlignedBuffer>(raw)); },
      at::TensorOptions().dtype(o_.dtype));
}

void ParamSwapper::forget(int i) {
  auto it = ahead_.find(i);
  if (it == ahead_.end()) return;
  Pending p = std::move(it->second);
  ahead_.erase(it);
  try {
    wait(p.read);  // the buffer is the disk's until the read is done
  } catch (...) {
    // Its values are about to be replaced; a failing disk will say so at the write.
  }
  pool_->give(std::move(p.buffer));
}

void ParamSwapper::store(int i, const at::Tensor& values) {
  DSCPP_CHECK(values.numel() == o_.numels[i], Error, "internal: shard ", i, " has ", o_.numels[i],
              " elements, not ", values.numel());
  forget(i);
  auto buffer = pool_->get();
  view(*buffer, i).copy_(values.reshape({-1}));
  stats_.bytes_written += static_cast<int64_t>(bytes_of(i));
  try {
    wait(file_->write(start_[i], buffer->data(), bytes_of(i)));
  } catch (...) {
    pool_->give(std::move(buffer));
    throw;
  }
  pool_->give(std::move(buffer));
}

void ParamSwapper::retire_oldest_write() {
  Writing w = std::move(writes_.front());
  writes_.pop_front();
  try {
    wait(w.write);
  } catch (...) {
    pool_->give(std::move(w.buffer));
    throw;
  }
  pool_->give(std::move(w.buffer));
}

void ParamSwapper::put(int64_t offset, const at::Tensor& values) {
  at::Tensor flat = values.reshape({-1});
  const int64_t n = flat.numel();
  DSCPP_CHECK(offset == next_ && offset + n <= total_, Error,
              "internal: parameter swap writes must come front to back (expected element ", next_,
              ", got [", offset, ", ", offset + n, ") of ", total_, ")");
  for (int64_t at_ = offset; at_ < offset + n;) {
    if (filling_ < 0) {
      // The next shard with elements (shards of 0 elements have nothing to write).
      int i =
          static_cast<int>(std::upper_bound(begin_.begin(), begin_.end(), at_) - begin_.begin()) -
          1;
      while (o_.numels[i] == 0) ++i;
      if (static_cast<int>(writes_.size()) >= o_.buffer_count) retire_oldest_write();
      forget(i);
      filling_ = i;
      fill_buffer_ = pool_->get();
    }
    const int i = filling_;
    const int64_t end = std::min(offset + n, begin_[i] + o_.numels[i]);
    view(*fill_buffer_, i)
        .narrow(0, at_ - begin_[i], end - at_)
        .copy_(flat.narrow(0, at_ - offset, end - at_));
    at_ = end;
    if (end == begin_[i] + o_.numels[i]) {
      Writing w;
      w.write = file_->write(start_[i], fill_buffer_->data(), bytes_of(i));
      w.buffer = std::move(fill_buffer_);
      writes_.push_back(std::move(w));
      stats_.bytes_written += static_cast<int64_t>(bytes_of(i));
      filling_ = -1;
    }
  }
  next_ = offset + n;
}

void ParamSwapper::finish() {
  // Every write waited for, even after a failure, so no buffer is still the disk's.
  std::exception_ptr error;
  while (!writes_.empty()) {
    try {
      retire_oldest_write();
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  pool_->give(std::move(fill_buffer_));
  const int64_t written = next_;
  const bool complete = (written == total_ || written == 0) && filling_ < 0;
  filling_ = -1;
  next_ = 0;
  if (error) std::rethrow_exception(error);
  DSCPP_CHECK(complete, Error, "internal: the step wrote ", written, " of ", total_,
              " swapped parameter elements");
}

ParamSwapStats ParamSwapper::take_stats() {
  ParamSwapStats s = stats_;
  stats_ = ParamSwapStats{};
  return s;
}

}  // namespace dscpp::offload
