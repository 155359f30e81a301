// StandInLink: a DeviceLink (include/dscpp/device_link.h) that makes the CPU act as a GPU, so the
// copy bookkeeping of offload to CPU memory is tested where no GPU is. Its "device" memory is the
// model's own CPU tensors, its host memory separate buffers filled with NaN (as garbage would be)
// so that reading one before a copy landed in it shows; a worker thread per direction does the
// copies in issue order, each after an injected delay (a slow bus: a store that reads too early
// reads stale values), or fails one (a failing copy). It logs every issue, completion and wait.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dscpp/device_link.h"

namespace dscpp::testing {

struct StandInOptions {
  std::chrono::microseconds delay{0};  // before each copy
  int64_t fail_copy = -1;              // the copy (0-based, in issue order over both directions)
                                       // that fails instead of copying; -1: none
};

class StandInLink final : public offload::DeviceLink {
 public:
  explicit StandInLink(StandInOptions options = {});
  ~StandInLink() override;

  at::Device device() const override { return at::kCPU; }
  std::string describe() const override { return "the tests' stand-in for a GPU"; }
  at::Tensor host_empty(int64_t numel, at::ScalarType dtype, bool pinned) override;
  offload::CopyHandle to_host(const at::Tensor& dst, const at::Tensor& src) override;
  offload::CopyHandle to_device(const at::Tensor& dst, const at::Tensor& src) override;

  // What happened, in order.
  struct Event {
    enum Kind { issued, copied, waited } kind;
    bool to_host = false;
    int64_t copy = 0;  // the copy's number in issue order
    int64_t bytes = 0;
  };
  std::vector<Event> events() const;
  int64_t bytes(bool to_host) const;
  int64_t pinned_bytes() const;
  void clear_events();

 private:
  struct Job;
  class Lane;
  offload::CopyHandle issue(bool to_host, const at::Tensor& dst, const at::Tensor& src);
  void log(Event e);

  StandInOptions o_;
  mutable std::mutex mu_;
  std::vector<Event> events_;
  int64_t next_copy_ = 0;
  int64_t pinned_bytes_ = 0;
  std::unique_ptr<Lane> down_, up_;
};

}  // namespace dscpp::testing
