// ParamSwapper: stage 3's parameter shards on disk (ZeRO-Infinity's parameter offload,
// `offload_param.device: nvme`). A unit's shard (this rank's 1/N of its parameters, training
// dtype) comes into memory only for the unit's all-gather, and goes back to disk only when the
// optimizer has updated it.
//
// NOTE [parameter swap file]: one file per rank, `<nvme_path>/dscpp_params_rank<r>_pid<p>.swp`,
// unlinked as soon as it is open (like the optimizer's, NOTE [swap file layout]). Shard i lies at
// a 4 KiB-aligned offset, in the order of the rank's part, so the step writes the file front to
// back. A shard in memory is a tensor over a pooled aligned buffer, which returns to the pool when
// the last reference to the tensor goes (the all-gather's input is dropped once it completes).
// Reads ahead (read_ahead, on stage 3's recorded order) take at most `buffer_count` buffers;
// the step's writes keep at most `buffer_count` in flight.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dscpp/async_io.h"
#include "zero/shard_swap.h"

namespace dscpp::offload {

struct ParamSwapperOptions {
  std::string path;             // the swap file (created, reserved, then unlinked)
  std::vector<int64_t> numels;  // [shards] elements of each shard, in part order
  at::ScalarType dtype = at::kFloat;
  int buffer_count = 5;  // shards read ahead, and writes in flight, at most
};

using ParamSwapStats = zero::ShardSwapStats;

// zero::ShardSwap over a swap file.
class ParamSwapper final : public zero::ShardSwap {
 public:
  ParamSwapper(io::AsyncIo& io, ParamSwapperOptions options);
  ~ParamSwapper() override;

  int shards() const { return static_cast<int>(o_.numels.size()); }
  int64_t numel() const override { return total_; }  // of every shard together
  int64_t file_bytes() const { return file_bytes_; }
  // Aligned memory held by the pool (buffers in use or free).
  int64_t buffer_bytes() const override;

  // Starts reading shard i into a free buffer unless it is read ahead already; false when
  // buffer_count shards are read ahead (nothing started).
  bool read_ahead(int i) override;
  // Shard i in memory, [numel] in the training dtype: the read ahead (waited for) or a read now.
  // Writable; its buffer returns to the pool when the tensor and its views are gone.
  at::Tensor take(int i) override;
  // Writes fp32 or training-dtype `values` [numel] as shard i and waits (set-up, load,
  // GatheredParameters).
  void store(int i, const at::Tensor& values) override;

  // ----- zero::ParamSink: the step's updated values, front to back
  void put(int64_t offset, const at::Tensor& values) override;
  void finish() override;

  ParamSwapStats take_stats() override;

 private:
  struct Pool;
  struct Pending {
    std::unique_ptr<io::AlignedBuffer> buffer;
    io::IoHandle read;
  };
  struct Writing {
    std::unique_ptr<io::AlignedBuffer> buffer;
    io::IoHandle write;
  };
  size_t bytes_of(int i) const;
  at::Tensor view(io::AlignedBuffer& buffer, int i) const;
  // Drops a read ahead of shard i (its values are about to change).
  void forget(int i);
  void wait(const io::IoHandle& h);
  // Waits for the oldest write in flight and returns its buffer to the pool.
  void retire_oldest_write();

  ParamSwapperOptions o_;
  std::unique_ptr<io::AsyncFile> file_;
  std::vector<int64_t> begin_;  // [shards] first element of each in the concatenation
  std::vector<int64_t> start_;  // [shards] byte offset in the file
  int64_t total_ = 0, file_bytes_ = 0;
  size_t buffer_size_ = 0;  // bytes per buffer: the largest shard, aligned
  std::shared_ptr<Pool> pool_;
  std::map<int, Pending> ahead_;
  // The step's writer: the shard being filled, and the writes in flight.
  int filling_ = -1;
  std::unique_ptr<io::AlignedBuffer> fill_buffer_;
  int64_t next_ = 0;  // the next element put() expects
  std::deque<Writing> writes_;
  ParamSwapStats stats_;
};

}  // namespace dscpp::offload
