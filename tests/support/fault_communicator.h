// FaultCommunicator: a Communicator wrapper for tests that, on a chosen rank, skips, fails or
// delays the Nth collective (counted from 1, all operations together), and otherwise forwards
// to the real communicator. Tests use it to make a rank fall out of step on purpose.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>

#include "dscpp/comm.h"

namespace dscpp::comm {

struct Fault {
  enum class Kind { none, skip, fail, delay };
  Kind kind = Kind::none;
  int rank = -1;    // the rank it applies to
  int64_t nth = 0;  // which collective (1-based)
  std::chrono::milliseconds delay{0};
};

class FaultCommunicator final : public Communicator {
 public:
  FaultCommunicator(std::shared_ptr<Communicator> inner, Fault fault);

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string backend_name() const override { return inner_->backend_name(); }
  using Communicator::all_gather;
  using Communicator::reduce_scatter;
  WorkHandle all_reduce(at::Tensor tensor, ReduceOp op) override;
  WorkHandle reduce_scatter(at::Tensor output, at::Tensor input, std::vector<int64_t> counts,
                            ReduceOp op) override;
  WorkHandle reduce_scatter_quantized(at::Tensor output, at::Tensor input,
                                      std::vector<int64_t> counts, ReduceOp op) override;
  WorkHandle all_gather(at::Tensor output, at::Tensor input, std::vector<int64_t> counts) override;
  WorkHandle all_gather_into(std::vector<at::Tensor> outputs, at::Tensor input) override;
  int host_group_size() const override { return inner_->host_group_size(); }
  WorkHandle host_all_gather_into(std::vector<at::Tensor> outputs, at::Tensor input) override;
  WorkHandle broadcast(at::Tensor tensor, int root) override;
  WorkHandle barrier() override;
  WorkHandle send(at::Tensor tensor, int dst) override;
  WorkHandle recv(at::Tensor tensor, int src) override;
  void set_step(int64_t step) override { inner_->set_step(step); }
  int64_t sequence_number() const override { return inner_->sequence_number(); }
  void log_summary() override { inner_->log_summary(); }

 private:
  // Returns a handle to use instead of calling the inner communicator, or null to forward.
  WorkHandle intercept(const char* what);

  std::shared_ptr<Communicator> inner_;
  Fault fault_;
  std::atomic<int64_t> count_{0};
};

}  // namespace dscpp::comm
