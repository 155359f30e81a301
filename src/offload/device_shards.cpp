// Implements DeviceShards (device_shards.h, NOTE [shards off the device]).
#include "offload/device_shards.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>

#include "dscpp/error.h"

namespace dscpp::offload {
namespace {

// Where each shard starts in their concatenation, and (last) its length.
std::vector<int64_t> starts(const std::vector<int64_t>& numels) {
  std::vector<int64_t> begin{0};
  for (int64_t n : numels) begin.push_back(begin.back() + n);
  return begin;
}

}  // namespace

DeviceShards::DeviceShards(DeviceLink& link, std::vector<int64_t> numels, at::ScalarType dtype,
                           int buffer_count, bool pinned)
    : link_(link),
      numels_(std::move(numels)),
      begin_(starts(numels_)),
      total_(begin_.back()),
      dtype_(dtype),
      buffer_count_(std::max(1, buffer_count)),
      pinned_(pinned),
      host_(link.host_empty(total_, dtype, pinned)) {}

DeviceShards::DeviceShards(DeviceLink& link, std::unique_ptr<zero::ShardSwap> on_disk,
                           std::vector<int64_t> numels, at::ScalarType dtype, int buffer_count)
    : link_(link),
      disk_(std::move(on_disk)),
      numels_(std::move(numels)),
      begin_(starts(numels_)),
      total_(begin_.back()),
      dtype_(dtype),
      buffer_count_(std::max(1, buffer_count)) {}

DeviceShards::~DeviceShards() {
  for (auto& [i, a] : ahead_) {
    try {
      if (a.up) a.up->wait();
    } catch (...) {  // nothing may still copy into memory about to be freed; the error was seen
    }
  }
}

int64_t DeviceShards::buffer_bytes() const {
  int64_t b = disk_ ? disk_->buffer_bytes() : 0;
  for (const auto& [i, a] : ahead_) {
    if (a.device.defined()) b += static_cast<int64_t>(a.device.nbytes());  // on disk: not yet
  }
  return b;
}

int64_t DeviceShards::host_bytes() const {
  return host_.defined() ? static_cast<int64_t>(host_.nbytes()) : 0;
}

DeviceShards::Ahead DeviceShards::copy_up(int i, const at::Tensor& h) {
  Ahead a;
  a.device = at::empty({numels_[i]}, at::TensorOptions(link_.device()).dtype(dtype_));
  a.up = link_.to_device(a.device, h);
  stats_.bytes_read += static_cast<int64_t>(a.device.nbytes());
  ++stats_.reads;
  return a;
}

void DeviceShards::wait(const CopyHandle& h) {
  const auto t0 = std::chrono::steady_clock::now();
  h->wait();
  stats_.wait_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool DeviceShards::read_ahead(int i) {
  if (ahead_.count(i)) return true;
  if (static_cast<int>(ahead_.size()) >= buffer_count_) return false;
  // From pageable memory CUDA copies only once the device's queued work is done: a copy ahead
  // would stall the units computing, so the shard goes up when its gather asks for it.
  if (!disk_ && !pinned_) return false;
  if (disk_) {
    if (!disk_->read_ahead(i)) return false;
    ahead_[i] = Ahead{};
  } else {
    ahead_[i] = copy_up(i, host(i));
  }
  return true;
}

at::Tensor DeviceShards::take(int i) {
  Ahead a;
  const auto it = ahead_.find(i);
  if (it != ahead_.end()) {
    a = std::move(it->second);
    ahead_.erase(it);
    if (a.up) ++stats_.reads_ahead;
  }
  if (!a.up) a = copy_up(i, disk_ ? disk_->take(i) : host(i));
  wait(a.up);
  return a.device;
}

void DeviceShards::forget(int64_t lo, int64_t hi) {
  for (auto it = ahead_.begin(); it != ahead_.end();) {
    const int i = it->first;
    if (begin_[i] < hi && begin_[i] + numels_[i] > lo) {
      if (it->second.up) {
        try {
          it->second.up->wait();
        } catch (...) {  // its values are dropped anyway; take() copies again
        }
      }
      it = ahead_.erase(it);
    } else {
      ++it;
    }
  }
}

void DeviceShards::store(int i, const at::Tensor& values) {
  DSCPP_CHECK(values.numel() == numels_[i], Error, "internal: shard ", i, " has ", numels_[i],
              " elements, not ", values.numel());
  forget(begin_[i], begin_[i] + numels_[i]);
  if (disk_) return disk_->store(i, values.to(at::kCPU));
  host(i).copy_(values.reshape({-1}));
}

void DeviceShards::put(int64_t offset, const at::Tensor& values) {
  const int64_t n = values.numel();
  forget(offset, offset + n);
  if (disk_) return disk_->put(offset, values.to(at::kCPU));
  host_.narrow(0, offset, n).copy_(values.reshape({-1}));
}

void DeviceShards::finish() {
  if (disk_) disk_->finish();
}

zero::ShardSwapStats DeviceShards::take_stats() {
  zero::ShardSwapStats s = std::exchange(stats_, zero::ShardSwapStats{});
  if (disk_) {  // the disk's reads and writes, the waits for both
    const zero::ShardSwapStats d = disk_->take_stats();
    s.bytes_read = d.bytes_read;
    s.bytes_written = d.bytes_written;
    s.reads = d.reads;
    s.reads_ahead = d.reads_ahead;
    s.wait_seconds += d.wait_seconds;
  }
  return s;
}

}  // namespace dscpp::offload
