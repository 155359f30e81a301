// Implements LiveSnapshot (live_snapshot.h).
#include "checkpoint/live_snapshot.h"

#include <ATen/ATen.h>

#include <cstring>

#include "dscpp/error.h"

namespace dscpp::checkpoint {

safetensors::StreamedTensor LiveSnapshot::add(std::string name, const at::Tensor& source) {
  DSCPP_CHECK(source.device().is_cpu() && source.is_contiguous(), Error,
              "internal: a live checkpoint source must be contiguous CPU memory ('", name, "')");
  Source* s = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    s = &sources_.emplace_back(Source{source.reshape({-1}), 0, source.numel(), 0, false});
  }
  const at::ScalarType dtype = source.scalar_type();
  // The writer thread's side: plain copies under the lock, no ATen work on its thread.
  auto fill = [this, s](int64_t offset, const at::Tensor& dst) {
    std::lock_guard<std::mutex> lock(mutex_);
    const int64_t n = dst.numel();
    const size_t size = dst.element_size();
    std::memcpy(dst.data_ptr(),
                static_cast<const char*>(s->memory.data_ptr()) + (offset - s->base) * size,
                static_cast<size_t>(n) * size);
    s->read = std::max(s->read, offset + n);
  };
  return safetensors::StreamedTensor{std::move(name), at::Tensor(), source.numel(), std::move(fill),
                                     dtype};
}

int64_t LiveSnapshot::copy_unwritten() {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t bytes = 0;
  for (Source& s : sources_) {
    if (s.copied) continue;
    s.copied = true;
    if (s.read >= s.numel) {
      s.memory = at::Tensor();  // written whole: the live memory is no longer read
      continue;
    }
    s.memory = s.memory.narrow(0, s.read - s.base, s.numel - s.read).clone();
    s.base = s.read;
    bytes += s.memory.numel() * static_cast<int64_t>(s.memory.element_size());
  }
  return bytes;
}

}  // namespace dscpp::checkpoint
