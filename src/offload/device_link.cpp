// make_device_link (include/dscpp/device_link.h): CUDA streams, one per direction, where this
// build has CUDA; an error naming why otherwise.
//
// NOTE [copy streams]: a copy is issued on its direction's side stream after an event recorded
// on the device's current stream, so it starts once the work queued before it (the reduction
// that produced a gradient, kernels still reading a parameter) is done, and never waits for work
// queued after it. Device-to-host and host-to-device copies run on separate streams, so a
// gradient going down and an updated parameter going up share the bus in both directions at
// once. The copy's own event is what wait() synchronises on; the caching allocator is told that
// the side stream uses the device tensor (recordStream), so memory freed on the main stream is
// not handed out again while the copy still reads or writes it. The order with a gradient's
// reduction rests on the reduction's wait and the reducer's scaling running on the calling
// thread's current stream, which the event follows: a program that trains under a stream guard
// of its own keeps that order as long as it issues backward() and step() on one stream. The side
// streams come from c10's pool, which NCCL's streams come from too: sharing one would only
// serialise work, never reorder it.
#include "dscpp/device_link.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>

#include "dscpp/error.h"

#if defined(DSCPP_HAVE_NCCL)
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace dscpp::offload {

#if defined(DSCPP_HAVE_NCCL)
namespace {

class CudaCopy final : public LinkCopy {
 public:
  CudaCopy(at::Tensor dst, at::Tensor src) : dst_(std::move(dst)), src_(std::move(src)) {}
  void wait() override {
    if (done_) return;
    try {
      event_.synchronize();
    } catch (const std::exception& e) {
      DSCPP_FAIL(Error, "a copy of ", src_.nbytes(), " bytes from ", src_.device(), " to ",
                 dst_.device(), " failed: ", e.what());
    }
    done_ = true;
    dst_ = src_ = at::Tensor();
  }
  at::cuda::CUDAEvent& event() { return event_; }

 private:
  at::Tensor dst_, src_;
  at::cuda::CUDAEvent event_;
  bool done_ = false;
};

class CudaLink final : public DeviceLink {
 public:
  explicit CudaLink(const at::Device& device)
      : device_(device),
        to_host_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index())),
        to_device_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index())) {}

  at::Device device() const override { return device_; }
  std::string describe() const override {
    return fmt::format("{}: a copy stream each way (streams {} and {})", device_.str(),
                       to_host_.id(), to_device_.id());
  }
  at::Tensor host_empty(int64_t numel, at::ScalarType dtype, bool pinned) override {
    return at::empty({numel}, at::TensorOptions().dtype(dtype).pinned_memory(pinned));
  }
  CopyHandle to_host(const at::Tensor& dst, const at::Tensor& src) override {
    check(dst, src, /*dst_on_host=*/true);
    return issue(to_host_, dst, src, src);
  }
  CopyHandle to_device(const at::Tensor& dst, const at::Tensor& src) override {
    check(dst, src, /*dst_on_host=*/false);
    return issue(to_device_, dst, src, dst);
  }

 private:
  void check(const at::Tensor& dst, const at::Tensor& src, bool dst_on_host) const {
    const at::Tensor& dev = dst_on_host ? src : dst;
    const at::Tensor& host = dst_on_host ? dst : src;
    DSCPP_CHECK(dev.device() == device_ && host.is_cpu() && dst.numel() == src.numel() &&
                    dst.scalar_type() == src.scalar_type() && dst.is_contiguous() &&
                    src.is_contiguous(),
                Error,
                "internal: a device link copy needs contiguous tensors of one dtype and "
                "length, one on ",
                device_, " and one in host memory");
  }
  CopyHandle issue(const c10::cuda::CUDAStream& side, const at::Tensor& dst, const at::Tensor& src,
                   const at::Tensor& on_device) {
    c10::cuda::CUDAGuard guard(device_);
    at::cuda::CUDAEvent ready;
    ready.record(c10::cuda::getCurrentCUDAStream(device_.index()));
    ready.block(side);
    auto copy = std::make_shared<CudaCopy>(dst, src);
    {
      c10::cuda::CUDAStreamGuard on_side(side);
      at::Tensor d = dst;
      d.copy_(src, /*non_blocking=*/true);
    }
    c10::cuda::CUDACachingAllocator::recordStream(on_device.storage().data_ptr(), side);
    copy->event().record(side);
    return copy;
  }

  at::Device device_;
  c10::cuda::CUDAStream to_host_, to_device_;
};

}  // namespace

bool cuda_link_available() { return true; }

std::unique_ptr<DeviceLink> make_device_link(const at::Device& device) {
  DSCPP_CHECK(device.is_cuda() && device.has_index(), Error,
              "internal: a device link needs a CUDA device with an index, got ", device);
  return std::make_unique<CudaLink>(device);
}

namespace {
// The capped share of the device's memory (1: none), as cap_gpu_memory set it.
double& memory_fraction() {
  static double fraction = 1.0;
  return fraction;
}
}  // namespace

int64_t gpu_free_memory(const at::Device& device) {
  if (!device.is_cuda()) return -1;
  c10::cuda::CUDAGuard guard(device);
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return -1;
  // Under a per-process fraction the allocator stops at fraction x total.
  const auto capped = static_cast<int64_t>(memory_fraction() * static_cast<double>(total));
  return std::min<int64_t>(static_cast<int64_t>(free), capped);
}

void cap_gpu_memory(const at::Device& device, int64_t bytes) {
  DSCPP_CHECK(device.is_cuda(), Error, "internal: no GPU memory to cap on ", device);
  c10::cuda::CUDAGuard guard(device);
  size_t free = 0, total = 0;
  C10_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  const double fraction = std::min(1.0, static_cast<double>(bytes) / static_cast<double>(total));
  c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, device.index());
  memory_fraction() = fraction;
}

#else

bool cuda_link_available() { return false; }

int64_t gpu_free_memory(const at::Device&) { return -1; }

void cap_gpu_memory(const at::Device& device, int64_t) {
  DSCPP_FAIL(
      Error, "DSCPP_GPU_MEMORY_LIMIT on ", device,
      ": this dscpp was built without CUDA. HINT: unset it, or rebuild with -DDSCPP_CUDA=ON");
}

std::unique_ptr<DeviceLink> make_device_link(const at::Device& device) {
  DSCPP_FAIL(Error, "offload to CPU memory of a model on ", device,
             " needs a dscpp built with CUDA, and this one was built for the CPU only (the "
             "configure step said \"CUDA and the NCCL process group: OFF\"). HINT: rebuild "
             "with -DDSCPP_CUDA=ON against a CUDA libtorch");
}

#endif

}  // namespace dscpp::offload
