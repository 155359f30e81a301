// DeviceShards: stage 3's unit shards off a model's device (ZeRO-Offload / ZeRO-Infinity's
// parameter offload for a model on a GPU): in host memory (`offload_param.device: "cpu"`), or
// on disk behind the parameter swap file (`"nvme"`, offload/param_swapper.h). A shard goes up
// to the device through the DeviceLink only for its unit's all-gather (zero::ShardSwap: read
// ahead on stage 3's recorded order, taken just before the gather, dropped once it is done), so
// the device holds the shards in transit and the gathered units, never the part.
//
// NOTE [shards off the device]: in host memory a read ahead issues the shard's copy up at once,
// `buffer_count` in flight at most, and take() waits for it; the copies run on the link's
// host-to-device stream beside the units computing. Without pin_memory nothing goes ahead: CUDA
// copies pageable memory only once the device's queued work is done, which would stall it. On disk a read ahead starts the disk read
// (the swap file's own read-ahead), and take() copies the shard up once it is in host memory.
// What the step writes (ParamSink::put, front to back) and what set-up, loads and
// GatheredParameters store go to host memory (or the swap file) and drop a shard gone up
// already, whose values are then stale.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <vector>

#include "dscpp/device_link.h"
#include "zero/shard_swap.h"

namespace dscpp::offload {

class DeviceShards final : public zero::ShardSwap {
 public:
  // Shards [numels] (part order, training dtype) in host memory, page-locked when `pinned`.
  DeviceShards(DeviceLink& link, std::vector<int64_t> numels, at::ScalarType dtype,
               int buffer_count, bool pinned);
  // Shards on disk: `on_disk` brings them into host memory.
  DeviceShards(DeviceLink& link, std::unique_ptr<zero::ShardSwap> on_disk,
               std::vector<int64_t> numels, at::ScalarType dtype, int buffer_count);
  ~DeviceShards() override;

  int64_t numel() const override { return total_; }
  // Device memory of the shards gone up ahead, and the swap file's buffers.
  int64_t buffer_bytes() const override;
  // Host memory of the shards (in host memory only).
  int64_t host_bytes() const override;
  const char* where() const override { return disk_ ? "on disk" : "in host memory"; }
  bool read_ahead(int i) override;
  at::Tensor take(int i) override;
  void store(int i, const at::Tensor& values) override;
  void put(int64_t offset, const at::Tensor& values) override;
  void finish() override;
  zero::ShardSwapStats take_stats() override;

 private:
  struct Ahead {
    at::Tensor device;  // [numel] on the device
    CopyHandle up;      // null on disk: read ahead there, not copied up yet
  };
  at::Tensor host(int i) const { return host_.narrow(0, begin_[i], numels_[i]); }
  // Copies host shard `h` of shard i up into a new device tensor; the handle of the copy.
  Ahead copy_up(int i, const at::Tensor& h);
  // Drops what went up (or is going) of every shard overlapping [lo, hi) of the concatenation.
  void forget(int64_t lo, int64_t hi);
  void wait(const CopyHandle& h);

  DeviceLink& link_;
  std::unique_ptr<zero::ShardSwap> disk_;
  std::vector<int64_t> numels_, begin_;  // begin_: [shards + 1], the last the total
  int64_t total_;
  at::ScalarType dtype_;
  int buffer_count_;
  bool pinned_ = false;  // host_ page-locked: shards may go up ahead
  at::Tensor host_;      // [total] in host memory (none on disk)
  std::map<int, Ahead> ahead_;
  zero::ShardSwapStats stats_;
};

}  // namespace dscpp::offload
