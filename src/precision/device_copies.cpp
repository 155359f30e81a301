// Implements DeviceCopies (device_copies.h).
#include "precision/device_copies.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <iterator>

namespace dscpp::precision {
namespace {

double seconds_between(std::chrono::steady_clock::time_point a,
                       std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

void wait_quietly(const offload::CopyHandle& h) {
  try {
    h->wait();
  } catch (...) {  // the window is dropped with its failure
  }
}

}  // namespace

DeviceCopies::DeviceCopies(offload::DeviceLink& link, at::ScalarType dtype, int64_t sub_group_size,
                           bool pin_memory, int buffer_count, bool staged)
    : link_(link),
      dtype_(dtype),
      sub_group_size_(std::max<int64_t>(1, sub_group_size)),
      pin_(pin_memory),
      staged_(staged),
      buffer_count_(std::max(2, buffer_count)) {}

DeviceCopies::~DeviceCopies() { drain(); }

void DeviceCopies::open(int64_t part_numel) {
  part_numel_ = part_numel;
  grads_ = link_.host_empty(part_numel, dtype_, pin_);
  if (!staged_) return;
  // Never more buffers than sub-groups (DeepSpeed's default sub_group_size makes one).
  slots_.resize(
      static_cast<size_t>(std::min<int64_t>(buffer_count_, std::max<int64_t>(1, sub_groups()))));
  const int64_t n = std::min(sub_group_size_, part_numel);
  for (auto& s : slots_) s.buffer = link_.host_empty(n, dtype_, /*pinned=*/true);
}

void DeviceCopies::piece_final(int64_t pos, const at::Tensor& grads) {
  std::lock_guard<std::mutex> g(mu_);
  issue_down(pos, grads);
}

void DeviceCopies::gradients_final(const std::vector<zero::Part>& parts) {
  std::lock_guard<std::mutex> g(mu_);
  for (const auto& part : parts) {
    const int64_t end = part.offset + part.numel();
    int64_t at = part.offset;
    while (at < end) {
      // The issued range covering `at`, if any, is the one before the first beginning after it.
      auto next = issued_.upper_bound(at);
      if (next != issued_.begin() && std::prev(next)->second > at) {
        at = std::prev(next)->second;
        continue;
      }
      const int64_t hi = next == issued_.end() ? end : std::min(end, next->first);
      issue_down(at, part.grads.narrow(0, at - part.offset, hi - at));
      at = hi;
    }
  }
}

void DeviceCopies::issue_down(int64_t pos, const at::Tensor& grads) {
  if (down_.empty()) down_.resize(sub_groups());
  if (!first_down_) first_down_ = Clock::now();
  const int64_t end = pos + grads.numel();
  for (int64_t lo = pos; lo < end;) {
    const int64_t k = lo / sub_group_size_;
    const int64_t hi = std::min(end, (k + 1) * sub_group_size_);
    down_[k].push_back(
        link_.to_host(grads_.narrow(0, lo, hi - lo), grads.narrow(0, lo - pos, hi - lo)));
    stats_.bytes_down += (hi - lo) * static_cast<int64_t>(grads_.element_size());
    lo = hi;
  }
  // Merge [pos, end) into the issued ranges (they never overlap: each piece is final once).
  auto it = issued_.emplace(pos, end).first;
  if (it != issued_.begin() && std::prev(it)->second == pos) {
    std::prev(it)->second = end;
    it = std::prev(issued_.erase(it));
  }
  const auto next = std::next(it);
  if (next != issued_.end() && next->first == it->second) {
    it->second = next->second;
    issued_.erase(next);
  }
}

void DeviceCopies::wait(const offload::CopyHandle& h) {
  const auto t0 = Clock::now();
  h->wait();
  stats_.wait_seconds += seconds_between(t0, Clock::now());
}

void DeviceCopies::begin_sub_group(int64_t k) {
  if (k < static_cast<int64_t>(down_.size())) {
    for (auto& h : down_[k]) wait(h);
  }
  last_down_ = Clock::now();
  if (staged_) {
    Slot& s = slots_[k % slots_.size()];
    for (auto& h : s.up) wait(h);
    s.up.clear();
  }
}

at::Tensor DeviceCopies::up_buffer(int64_t k, int64_t lo, int64_t n) {
  return slots_[k % slots_.size()].buffer.narrow(0, lo - k * sub_group_size_, n);
}

void DeviceCopies::send_up(int64_t k, const at::Tensor& dst_device, const at::Tensor& src_host) {
  if (!first_up_) first_up_ = Clock::now();
  (staged_ ? slots_[k % slots_.size()].up : up_).push_back(link_.to_device(dst_device, src_host));
  stats_.bytes_up += static_cast<int64_t>(src_host.nbytes());
}

void DeviceCopies::finish_step() {
  for (auto& s : slots_) {
    for (auto& h : s.up) wait(h);
    s.up.clear();
  }
  for (auto& h : up_) wait(h);
  up_.clear();
  if (first_down_) stats_.down_span_seconds += seconds_between(*first_down_, last_down_);
  if (first_up_) stats_.up_span_seconds += seconds_between(*first_up_, Clock::now());
  // What is left: copies down a publish between a backward and its step did not wait for.
  drain();
}

void DeviceCopies::drain() {
  for (auto& group : down_) {
    for (auto& h : group) wait_quietly(h);
  }
  for (auto& s : slots_) {
    for (auto& h : s.up) wait_quietly(h);
    s.up.clear();
  }
  for (auto& h : up_) wait_quietly(h);
  up_.clear();
  down_.clear();
  issued_.clear();
  first_down_.reset();
  first_up_.reset();
}

int64_t DeviceCopies::buffer_bytes() const {
  int64_t b = grads_.defined() ? static_cast<int64_t>(grads_.nbytes()) : 0;
  for (const auto& s : slots_)
    b += s.buffer.defined() ? static_cast<int64_t>(s.buffer.nbytes()) : 0;
  return b;
}

std::string DeviceCopies::take_report() {
  const Stats s = std::exchange(stats_, Stats{});
  // A direction's bytes over the time from its first copy issued to its last one waited for:
  // a lower bound of the bandwidth the copies reached (the link may have idled meanwhile).
  auto rate = [](int64_t bytes, double span) {
    return span > 0 ? fmt::format(" ({:.2f} GB/s at least)", bytes / span / 1e9) : std::string();
  };
  return fmt::format(
      "gradients down {:.1f} MiB{}, parameters up {:.1f} MiB{}, waited for copies "
      "{:.1f} ms",
      s.bytes_down / double(1 << 20), rate(s.bytes_down, s.down_span_seconds),
      s.bytes_up / double(1 << 20), rate(s.bytes_up, s.up_span_seconds), s.wait_seconds * 1e3);
}

}  // namespace dscpp::precision
