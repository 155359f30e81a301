// DeviceLink: the copies between a model's device memory and host memory that offload to CPU
// memory makes (ZeRO-Offload: `offload_optimizer.device: "cpu"` for a model on a GPU). A copy is
// issued at once and runs beside the training thread, in issue order with the other copies in
// the same direction; wait() blocks until it is done and rethrows its failure (like comm::Work
// and io::IoWork).
//
// On CUDA (make_device_link) each direction has a stream of its own, and a copy starts only
// after the work the device has queued so far (the reduction that produced a gradient, the
// kernels that last read a parameter). The tests' stand-in (tests/support/stand_in_link.h) makes
// the CPU act as a device: its "device" memory is the model's own tensors, its host memory
// separate buffers, and a worker thread per direction does the copies late (an injected delay)
// or not at all (an injected failure), so that the bookkeeping of every copy is tested on
// machines without a GPU. A program may pass its own (InitOptions::device_link).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

namespace dscpp::offload {

// One copy in flight.
class LinkCopy {
 public:
  virtual ~LinkCopy() = default;
  // Blocks until the copy is complete and rethrows its failure. Afterwards the host buffer may
  // be read (to_host) or reused (to_device), and whatever the device runs next sees the copied
  // values. Waiting twice is harmless.
  virtual void wait() = 0;
};
using CopyHandle = std::shared_ptr<LinkCopy>;

class DeviceLink {
 public:
  virtual ~DeviceLink() = default;
  // The device whose memory the link copies to and from.
  virtual at::Device device() const = 0;
  // One line for the start-up log: the device and how copies run.
  virtual std::string describe() const = 0;
  // A host buffer [numel] of `dtype` for copies; `pinned`: page-locked, so that a copy runs
  // asynchronously at the bus's speed (under CUDA, pageable memory is copied synchronously).
  virtual at::Tensor host_empty(int64_t numel, at::ScalarType dtype, bool pinned) = 0;
  // Copies device tensor `src` into host tensor `dst` (same dtype and numel, both contiguous).
  // Both must stay alive and untouched until wait() returns (the handle keeps them alive).
  virtual CopyHandle to_host(const at::Tensor& dst, const at::Tensor& src) = 0;
  // Copies host tensor `src` into device tensor `dst`, likewise.
  virtual CopyHandle to_device(const at::Tensor& dst, const at::Tensor& src) = 0;
};

// Whether this build can copy through CUDA streams (it was compiled with CUDA).
bool cuda_link_available();
// The link of a model on `device` (a CUDA device): a copy stream per direction. Throws
// dscpp::Error naming the reason when this build has no CUDA or the device is not a GPU.
std::unique_ptr<DeviceLink> make_device_link(const at::Device& device);

// Bytes free on CUDA device `device` as the driver reports them, less what the caching
// allocator's per-process memory fraction keeps from this process; -1 when unknown (no CUDA).
int64_t gpu_free_memory(const at::Device& device);
// Caps the caching allocator of CUDA device `device` at `bytes` (torch's
// set_per_process_memory_fraction): `dscpp train` under DSCPP_GPU_MEMORY_LIMIT emulates a
// smaller GPU with it. Throws dscpp::Error without CUDA.
void cap_gpu_memory(const at::Device& device, int64_t bytes);

}  // namespace dscpp::offload
