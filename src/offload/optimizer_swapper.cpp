// Implements OptimizerSwapper (optimizer_swapper.h): the swap file, the sub-group pipeline and
// the cursor.
#include "offload/optimizer_swapper.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <utility>

#include "dscpp/error.h"

namespace dscpp::offload {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

OptimizerSwapper::OptimizerSwapper(io::AsyncIo& io, SwapperOptions options)
    : o_(std::move(options)) {
  const int64_t T = static_cast<int64_t>(o_.names.size());
  DSCPP_CHECK(o_.initial.size() == o_.names.size() && o_.sub_group_size > 0 && o_.numel >= 0, Error,
              "internal: OptimizerSwapper needs each tensor's initial value and a "
              "positive sub_group_size");
  for (int64_t b = 0; b < o_.numel; b += o_.sub_group_size) {
    begin_.push_back(b);
    start_.push_back(file_bytes_);
    file_bytes_ += static_cast<int64_t>(
        T * io::align_up(sizeof(float) * std::min(o_.sub_group_size, o_.numel - b)));
  }
  written_.assign(begin_.size(), false);
  file_ = io.open(o_.path);
  // The file lives as long as it is open (NOTE [swap file layout]); its blocks are reserved now,
  // so a disk too small fails here rather than in the middle of training; or, with
  // reserve_in_setup, as set-up writes the sub-groups in order and wholly at its first flush().
  std::remove(o_.path.c_str());
  in_setup_ = o_.reserve_in_setup;
  if (!in_setup_) reserve_to(static_cast<uint64_t>(file_bytes_));
  const int wanted = 1 + (o_.pipeline_read ? 1 : 0) + (o_.pipeline_write ? 1 : 0);
  const int64_t n = std::min<int64_t>({std::max(o_.buffer_count, 1), wanted, sub_groups()});
  for (int64_t i = 0; i < n; ++i) slots_.emplace_back(bytes_of(0));
}

OptimizerSwapper::~OptimizerSwapper() = default;

int64_t OptimizerSwapper::length(int64_t k) const {
  return std::min(o_.sub_group_size, o_.numel - begin_[k]);
}

size_t OptimizerSwapper::bytes_of(int64_t k) const {
  return o_.names.size() * io::align_up(sizeof(float) * length(k));
}

int64_t OptimizerSwapper::buffer_bytes() const {
  int64_t b = static_cast<int64_t>(cursor_.size());
  for (const auto& s : slots_) b += static_cast<int64_t>(s.size());
  return b;
}

std::vector<at::Tensor> OptimizerSwapper::views(void* buffer, int64_t k) const {
  const int64_t L = length(k);
  const int64_t run = static_cast<int64_t>(io::align_up(sizeof(float) * L) / sizeof(float));
  std::vector<at::Tensor> out;
  for (size_t t = 0; t < o_.names.size(); ++t) {
    out.push_back(at::from_blob(static_cast<float*>(buffer) + t * run, {L}, at::kFloat));
  }
  return out;
}

io::IoHandle OptimizerSwapper::load(void* buffer, int64_t k) {
  if (written_[k]) {
    stats_.bytes_read += static_cast<int64_t>(bytes_of(k));
    return file_->read(offset_of(k), buffer, bytes_of(k));
  }
  auto v = views(buffer, k);
  for (size_t t = 0; t < v.size(); ++t) v[t].fill_(o_.initial[t]);
  return nullptr;
}

void OptimizerSwapper::wait(const io::IoHandle& h) {
  if (!h) return;
  const auto t0 = Clock::now();
  h->wait();
  stats_.wait_seconds += seconds_since(t0);
}

void OptimizerSwapper::for_each_sub_group(const SubGroupFn& fn) {
  const auto t_start = Clock::now();
  flush();
  const int64_t G = sub_groups(), S = static_cast<int64_t>(slots_.size());
  std::vector<io::IoHandle> reads(G), writes(G);
  auto buffer = [&](int64_t k) { return slots_[k % S].data(); };
  auto issue_read = [&](int64_t k) {
    // The slot last held sub-group k - S, whose write must be done before it is refilled.
    if (k >= S) {
      wait(writes[k - S]);
      writes[k - S] = nullptr;
    }
    reads[k] = load(buffer(k), k);
  };
  try {
    if (G > 0) issue_read(0);
    for (int64_t k = 0; k < G; ++k) {
      const bool ahead = o_.pipeline_read && S >= 2 && k + 1 < G;
      if (ahead) issue_read(k + 1);
      wait(reads[k]);
      reads[k] = nullptr;
      const auto t_step = Clock::now();
      fn(begin_[k], length(k), views(buffer(k), k));
      stats_.step_seconds += seconds_since(t_step);
      reserve_to(offset_of(k) + bytes_of(k));
      writes[k] = file_->write(offset_of(k), buffer(k), bytes_of(k));
      written_[k] = true;
      stats_.bytes_written += static_cast<int64_t>(bytes_of(k));
      if (!o_.pipeline_write) {
        wait(writes[k]);
        writes[k] = nullptr;
      }
      if (!ahead && k + 1 < G) issue_read(k + 1);
    }
    for (auto& w : writes) wait(w);
  } catch (...) {
    // Nothing may still be writing into or reading from a buffer once this returns.
    for (auto* list : {&reads, &writes}) {
      for (auto& h : *list) {
        try {
          if (h) h->wait();
        } catch (...) {
        }
      }
    }
    stats_.total_seconds += seconds_since(t_start);
    throw;
  }
  stats_.total_seconds += seconds_since(t_start);
}

void OptimizerSwapper::seek(int64_t k) {
  if (cursor_k_ == k) return;
  write_back_cursor();
  // One buffer for every position: a fresh one per sub-group would fault its pages in each time
  // (most of a 2B-parameter model's set-up).
  if (cursor_.size() == 0) cursor_ = io::AlignedBuffer(bytes_of(0));
  cursor_k_ = -1;
  wait(load(cursor_.data(), k));
  cursor_k_ = k;
}

void OptimizerSwapper::write_back_cursor() {
  if (cursor_k_ >= 0 && cursor_dirty_ && !setup_error_) {
    try {
      stats_.bytes_written += static_cast<int64_t>(bytes_of(cursor_k_));
      reserve_to(offset_of(cursor_k_) + bytes_of(cursor_k_));
      wait(file_->write(offset_of(cursor_k_), cursor_.data(), bytes_of(cursor_k_)));
      written_[cursor_k_] = true;
    } catch (...) {
      // During set-up with reserve_in_setup a full disk fails at the first flush(), which every
      // rank reaches (a throw here would leave the other ranks waiting in set-up's collectives).
      if (!in_setup_) throw;
      setup_error_ = std::current_exception();
    }
  }
  cursor_dirty_ = false;
}

void OptimizerSwapper::flush() {
  write_back_cursor();
  cursor_ = io::AlignedBuffer();
  cursor_k_ = -1;
  if (in_setup_) {  // set-up is over: its failure, else every block from now on
    in_setup_ = false;
    if (setup_error_) std::rethrow_exception(std::exchange(setup_error_, nullptr));
  }
  reserve_to(static_cast<uint64_t>(file_bytes_));
}

void OptimizerSwapper::reserve_to(uint64_t end) {
  if (end <= reserved_) return;
  file_->reserve(end);
  reserved_ = end;
}

void OptimizerSwapper::write(int t, int64_t offset, const at::Tensor& values) {
  at::Tensor flat = values.reshape({-1});
  const int64_t n = flat.numel();
  DSCPP_CHECK(offset >= 0 && offset + n <= o_.numel, Error, "internal: swap write [", offset, ", ",
              offset + n, ") outside the part of ", o_.numel);
  for (int64_t at_ = offset; at_ < offset + n;) {
    const int64_t k = at_ / o_.sub_group_size;
    const int64_t end = std::min(offset + n, begin_[k] + length(k));
    seek(k);
    views(cursor_.data(), k)[t]
        .narrow(0, at_ - begin_[k], end - at_)
        .copy_(flat.narrow(0, at_ - offset, end - at_));
    cursor_dirty_ = true;
    at_ = end;
  }
}

void OptimizerSwapper::read(int t, int64_t offset, const at::Tensor& values) {
  const int64_t n = values.numel();
  DSCPP_CHECK(offset >= 0 && offset + n <= o_.numel && values.is_contiguous(), Error,
              "internal: swap read [", offset, ", ", offset + n, ") outside the part of ",
              o_.numel);
  at::Tensor flat = values.view({-1});
  for (int64_t at_ = offset; at_ < offset + n;) {
    const int64_t k = at_ / o_.sub_group_size;
    const int64_t end = std::min(offset + n, begin_[k] + length(k));
    seek(k);
    flat.narrow(0, at_ - offset, end - at_)
        .copy_(views(cursor_.data(), k)[t].narrow(0, at_ - begin_[k], end - at_));
    at_ = end;
  }
}

SwapStats OptimizerSwapper::take_stats() {
  SwapStats s = stats_;
  stats_ = SwapStats{};
  return s;
}

}  // namespace dscpp::offload
