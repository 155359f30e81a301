// Implements LiveSnapshot (live_snapshot.h).
#include "checkpoint/live_snapshot.h"

#include <ATen/ATen.h>

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
  // The writer thread's side: the piece is handed to the file's writer where it lies, under the
  // lock, so copy_unwritten() never replaces memory that is being read.
  auto visit = [this, s, size = static_cast<int64_t>(source.element_size())](
                   int64_t offset, int64_t n, const safetensors::StreamedTensor::Put& put) {
    std::lock_guard<std::mutex> lock(mutex_);
    put(static_cast<const char*>(s->memory.data_ptr()) + (offset - s->base) * size,
        static_cast<size_t>(n * size));
    s->read = std::max(s->read, offset + n);
  };
  safetensors::StreamedTensor t;
  t.name = std::move(name);
  t.numel = source.numel();
  t.dtype = source.scalar_type();
  t.visit = std::move(visit);
  return t;
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
