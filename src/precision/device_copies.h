// DeviceCopies: the copies of a step in host memory for a model on a device (NOTE [host step] in
// part_store.cpp), shared by the stores that step there: host memory (offload_optimizer cpu) and
// the swap file (nvme). The gradients come down into one host buffer of the part, piece by piece
// as their reductions finish (NOTE [final pieces] in src/zero/reducer.h) and the rest when the
// step begins; each sub-group's updated parameters go up from one of `buffer_count` page-locked
// buffers (or from where the caller keeps them) while later sub-groups step.
//
// Threading: piece_final runs on whichever thread retires a reduction (under the reducer's lock);
// everything else on the training thread, after backward returned.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dscpp/device_link.h"
#include "zero/strategy.h"

namespace dscpp::precision {

class DeviceCopies {
 public:
  // `staged`: updated parameters go up from the copies' own buffers (up_buffer); otherwise
  // from host memory the caller keeps unchanged until finish_step.
  DeviceCopies(offload::DeviceLink& link, at::ScalarType dtype, int64_t sub_group_size,
               bool pin_memory, int buffer_count, bool staged);
  ~DeviceCopies();

  // Allocates the gradients' host buffer [part_numel] (and the up buffers).
  void open(int64_t part_numel);
  int64_t sub_group_size() const { return sub_group_size_; }
  // Whether pieces may go down during backward (piece_final): with pageable memory CUDA would
  // copy each only once the device's queued work is done, stalling backward at every bucket, so
  // then everything goes down when the step begins.
  bool takes_pieces() const { return pin_; }

  // Elements [pos, pos + grads.numel()) of the part's gradient are final: they go down now.
  void piece_final(int64_t pos, const at::Tensor& grads);
  // What of the parts' gradients has not gone down yet goes now (in sub-group order).
  void gradients_final(const std::vector<zero::Part>& parts);

  // The step, sub-group by sub-group: begin_sub_group(k) waits for k's gradients (and frees k's
  // up buffer); grads() is where they came down; up_buffer() is where k's updated parameters
  // are cast (staged); send_up() copies them to the device. finish_step() waits for every copy
  // up. A step that throws calls drain().
  void begin_sub_group(int64_t k);
  at::Tensor grads(int64_t lo, int64_t n) const { return grads_.narrow(0, lo, n); }
  at::Tensor up_buffer(int64_t k, int64_t lo, int64_t n);
  void send_up(int64_t k, const at::Tensor& dst_device, const at::Tensor& src_host);
  void finish_step();
  // Waits for every copy in flight, failures dropped, and forgets the window's.
  void drain();

  // Host memory of the gradients' buffer and the up buffers.
  int64_t buffer_bytes() const;
  // "gradients down X MiB (Y GB/s at least), parameters up ..., waited for copies Z ms" since
  // the last call.
  std::string take_report();

 private:
  using Clock = std::chrono::steady_clock;
  struct Slot {
    at::Tensor buffer;                    // [sub_group_size] training dtype, pinned
    std::vector<offload::CopyHandle> up;  // its copies to the device in flight
  };
  struct Stats {
    int64_t bytes_down = 0, bytes_up = 0;
    double wait_seconds = 0;
    // From a step's first copy down issued (in backward) to its last one waited for, and from
    // its first copy up issued to the last one waited for.
    double down_span_seconds = 0, up_span_seconds = 0;
  };
  int64_t sub_groups() const { return (part_numel_ + sub_group_size_ - 1) / sub_group_size_; }
  // Issues [pos, pos + grads.numel()) down, a copy per sub-group it touches (under mu_).
  void issue_down(int64_t pos, const at::Tensor& grads);
  void wait(const offload::CopyHandle& h);

  offload::DeviceLink& link_;
  at::ScalarType dtype_;
  int64_t sub_group_size_;
  bool pin_, staged_;
  int buffer_count_;
  int64_t part_numel_ = 0;
  at::Tensor grads_;  // [part_numel] training dtype, host
  std::vector<Slot> slots_;  // min(buffer_count, sub-groups), at least 2 (or 1 sub-group)
  std::vector<offload::CopyHandle> up_;                 // unstaged copies up in flight
  std::vector<std::vector<offload::CopyHandle>> down_;  // [sub-group] its copies down in flight
  std::map<int64_t, int64_t> issued_;                   // ranges [begin, end) gone down
  std::optional<Clock::time_point> first_down_, first_up_;
  Clock::time_point last_down_;
  Stats stats_;
  std::mutex mu_;
};

}  // namespace dscpp::precision
