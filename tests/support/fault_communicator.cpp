// Implements FaultCommunicator (see fault_communicator.h).
#include "support/fault_communicator.h"

#include <thread>

#include "dscpp/error.h"
#include "util/log.h"

namespace dscpp::comm {
namespace {

class DoneWork final : public Work {
 public:
  explicit DoneWork(std::exception_ptr e = nullptr) : error_(std::move(e)) {}
  void wait() override {
    if (error_) std::rethrow_exception(error_);
  }
  bool is_completed() const override { return true; }

 private:
  std::exception_ptr error_;
};

}  // namespace

FaultCommunicator::FaultCommunicator(std::shared_ptr<Communicator> inner, Fault fault)
    : inner_(std::move(inner)), fault_(fault) {}

WorkHandle FaultCommunicator::intercept(const char* what) {
  int64_t n = ++count_;
  if (fault_.kind == Fault::Kind::none || fault_.rank != inner_->rank() || fault_.nth != n)
    return nullptr;
  switch (fault_.kind) {
    case Fault::Kind::skip:
      DSCPP_LOG_WARN("fault injection: rank {} skips collective {} ({})", fault_.rank, n, what);
      return std::make_shared<DoneWork>();
    case Fault::Kind::fail:
      DSCPP_LOG_WARN("fault injection: rank {} fails collective {} ({})", fault_.rank, n, what);
      return std::make_shared<DoneWork>(
          std::make_exception_ptr(CommError(std::string("injected failure of ") + what)));
    case Fault::Kind::delay:
      DSCPP_LOG_WARN("fault injection: rank {} delays collective {} ({}) by {} ms", fault_.rank, n,
                     what, fault_.delay.count());
      std::this_thread::sleep_for(fault_.delay);
      return nullptr;
    case Fault::Kind::none:
      break;
  }
  return nullptr;
}

WorkHandle FaultCommunicator::all_reduce(at::Tensor tensor, ReduceOp op) {
  if (auto w = intercept("all_reduce")) return w;
  return inner_->all_reduce(std::move(tensor), op);
}
WorkHandle FaultCommunicator::reduce_scatter_quantized(at::Tensor output, at::Tensor input,
                                                       std::vector<int64_t> counts, ReduceOp op) {
  if (auto w = intercept("reduce_scatter")) return w;
  return inner_->reduce_scatter_quantized(std::move(output), std::move(input), std::move(counts),
                                          op);
}

WorkHandle FaultCommunicator::reduce_scatter(at::Tensor output, at::Tensor input,
                                             std::vector<int64_t> counts, ReduceOp op) {
  if (auto w = intercept("reduce_scatter")) return w;
  return inner_->reduce_scatter(std::move(output), std::move(input), std::move(counts), op);
}
WorkHandle FaultCommunicator::all_gather(at::Tensor output, at::Tensor input,
                                         std::vector<int64_t> counts) {
  if (auto w = intercept("all_gather")) return w;
  return inner_->all_gather(std::move(output), std::move(input), std::move(counts));
}
WorkHandle FaultCommunicator::all_gather_into(std::vector<at::Tensor> outputs, at::Tensor input) {
  if (auto w = intercept("all_gather")) return w;
  return inner_->all_gather_into(std::move(outputs), std::move(input));
}
WorkHandle FaultCommunicator::host_all_gather_into(std::vector<at::Tensor> outputs,
                                                   at::Tensor input) {
  if (auto w = intercept("all_gather")) return w;
  return inner_->host_all_gather_into(std::move(outputs), std::move(input));
}
WorkHandle FaultCommunicator::broadcast(at::Tensor tensor, int root) {
  if (auto w = intercept("broadcast")) return w;
  return inner_->broadcast(std::move(tensor), root);
}
WorkHandle FaultCommunicator::barrier() {
  if (auto w = intercept("barrier")) return w;
  return inner_->barrier();
}
WorkHandle FaultCommunicator::send(at::Tensor tensor, int dst) {
  if (auto w = intercept("send")) return w;
  return inner_->send(std::move(tensor), dst);
}
WorkHandle FaultCommunicator::recv(at::Tensor tensor, int src) {
  if (auto w = intercept("recv")) return w;
  return inner_->recv(std::move(tensor), src);
}

}  // namespace dscpp::comm
