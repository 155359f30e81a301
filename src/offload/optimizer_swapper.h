// OptimizerSwapper: this rank's optimizer part on disk (ZeRO-Infinity's optimizer offload to
// NVMe, `offload_optimizer.device: nvme`). Per element of the part it stores T fp32 numbers: the
// master weight under mixed precision, then each optimizer state (Adam: exp_avg, exp_avg_sq).
// The step runs sub-group by sub-group (`sub_group_size` elements): sub-group k's numbers are
// read into an aligned buffer, the optimizer steps on them, and they are written back, with the
// read of k+1 and the write of k-1 in flight meanwhile (pipeline_read, pipeline_write).
//
// NOTE [swap file layout]: one file per rank, `<nvme_path>/dscpp_optimizer_rank<r>_pid<p>.swp`,
// unlinked as soon as it is open, so a killed run leaves nothing behind (its blocks are freed
// when the process exits; df sees them, ls does not). Sub-group k of length L occupies T
// consecutive runs of align(L) floats (align: a multiple of 4 KiB), tensor t's run first-to-last,
// so swapping a sub-group in or out is one sequential request. A sub-group never written holds
// the optimizer's initial state, filled in memory instead of read.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dscpp/async_io.h"

namespace dscpp::offload {

struct SwapperOptions {
  std::string path;                // the swap file (created, reserved, then unlinked)
  int64_t numel = 0;               // elements of the part
  std::vector<std::string> names;  // the T tensors per element
  std::vector<float> initial;      // [T] each tensor's value in a sub-group never written
  int64_t sub_group_size = 0;      // elements per sub-group, > 0
  int buffer_count = 3;            // sub-group buffers of the pipeline (1..3 are used)
  bool pipeline_read = true;       // read k+1 while k steps
  bool pipeline_write = true;      // write k-1 back while k steps
  // Reserve the file's blocks as set-up writes the sub-groups (in order) and all of them at the
  // first flush(), instead of at once: zero::Init's spill file (NOTE [spilled shards]) shrinks
  // meanwhile, so the disk never holds both whole.
  bool reserve_in_setup = false;
};

// What the swap did since the last take_stats().
struct SwapStats {
  int64_t bytes_read = 0, bytes_written = 0;
  double total_seconds = 0;  // in for_each_sub_group, start to end
  double wait_seconds = 0;   // of which the training thread was blocked on reads and writes
  double step_seconds = 0;   // of which inside the per-sub-group function
};

class OptimizerSwapper {
 public:
  OptimizerSwapper(io::AsyncIo& io, SwapperOptions options);
  ~OptimizerSwapper();

  int64_t numel() const { return o_.numel; }
  int64_t sub_groups() const { return static_cast<int64_t>(begin_.size()); }
  int64_t file_bytes() const { return file_bytes_; }
  // Bytes of aligned memory held: the pipeline's buffers (and the cursor's while it is held).
  int64_t buffer_bytes() const;
  const std::vector<std::string>& names() const { return o_.names; }

  // Calls fn(offset, length, tensors) for each sub-group in order: `tensors` are its T fp32
  // tensors [length], swapped in; what fn leaves in them is written back. Rethrows an I/O
  // failure (IoError naming the file) after every request in flight has finished.
  using SubGroupFn =
      std::function<void(int64_t offset, int64_t length, const std::vector<at::Tensor>& tensors)>;
  void for_each_sub_group(const SubGroupFn& fn);

  // Elements [offset, offset + values.numel()) of tensor t, copied from / into fp32 `values`,
  // through the cursor (one sub-group held in memory, written back when the cursor moves on or
  // flush() is called): start-up (the master weights) and checkpoints.
  void write(int t, int64_t offset, const at::Tensor& values);
  void read(int t, int64_t offset, const at::Tensor& values);
  // Writes the cursor's sub-group back if changed and frees the cursor's buffer (the first one
  // ends set-up: with reserve_in_setup the whole file is reserved then).
  void flush();

  SwapStats take_stats();

 private:
  int64_t length(int64_t k) const;
  uint64_t offset_of(int64_t k) const { return static_cast<uint64_t>(start_[k]); }
  size_t bytes_of(int64_t k) const;
  // Views of `buffer` as the T tensors of sub-group k.
  std::vector<at::Tensor> views(void* buffer, int64_t k) const;
  // Fills `buffer` with sub-group k: a read (returned), or the initial values (null handle).
  io::IoHandle load(void* buffer, int64_t k);
  // Moves the cursor to sub-group k.
  void seek(int64_t k);
  // Writes the cursor's sub-group back if it changed (the buffer stays).
  void write_back_cursor();
  // Waits for h (if any), counting the time blocked.
  void wait(const io::IoHandle& h);
  // Reserves the file's blocks up to byte `end` (once).
  void reserve_to(uint64_t end);

  SwapperOptions o_;
  std::unique_ptr<io::AsyncFile> file_;
  std::vector<int64_t> begin_;  // [sub-groups] first element of each
  std::vector<int64_t> start_;  // [sub-groups] byte offset in the file
  std::vector<bool> written_;   // [sub-groups] ever written
  int64_t file_bytes_ = 0;
  uint64_t reserved_ = 0;  // bytes of the file reserved so far
  bool in_setup_ = false;  // reserve_in_setup, before the first flush()
  std::exception_ptr setup_error_;  // a set-up write that failed, rethrown by that flush()
  std::vector<io::AlignedBuffer> slots_;
  io::AlignedBuffer cursor_;
  int64_t cursor_k_ = -1;
  bool cursor_dirty_ = false;
  SwapStats stats_;
};

}  // namespace dscpp::offload
