// Implements AllReduceReducer (all_reduce.h, NOTE [side channel]).
#include "zero/all_reduce.h"

#include <ATen/ATen.h>

#include "dscpp/error.h"

namespace dscpp::zero {
namespace {

int64_t sum_segments(const std::vector<std::pair<int64_t, int64_t>>& segments) {
  int64_t n = 0;
  for (const auto& s : segments) n += s.second;
  return n;
}

}  // namespace

AllReduceReducer::AllReduceReducer(std::vector<at::Tensor> params, std::vector<std::string> names,
                                   std::vector<std::pair<int64_t, int64_t>> segments,
                                   int64_t padded, comm::Communicator& comm, ReduceOptions options,
                                   int64_t side_channel)
    : GradReducer(std::move(params), std::move(names), std::move(segments),
                  {GroupGeometry{0, padded, padded / comm.world_size(), 0}}, {}, comm, options),
      numel_(sum_segments(segments_)),
      buffer_(params_, segments_, padded, side_channel, buffer_options_) {
  DSCPP_CHECK(!options_.accumulate_dtype, Error,
              "internal: gradients accumulate in a dtype of their own at stage 1 only");
  DSCPP_CHECK(side_channel == 0 || (options_.dtype == at::kFloat && !options_.wire_dtype &&
                                    options_.wire_dtype_of.empty()),
              Error, "internal: the gradient side channel needs fp32 all-reduce");
  install_hooks();
}

AllReduceReducer::~AllReduceReducer() { drain_quietly(); }

bool AllReduceReducer::may_launch_locked(const Bucket& b) const {
  // The side channel's bucket waits for finish_backward (NOTE [side channel]).
  return !(&b == &buckets_.back() && buffer_.side().numel() > 0 && !finishing_);
}

void AllReduceReducer::launch_locked(Bucket& b) {
  for (int p : b.params) buffer_.settle(p);
  // The bucket at the start of the buffer, launched last, also carries the side channel just
  // before it (NOTE [side channel]; never with a wire dtype of its own).
  const int64_t side = buffer_.side().numel();
  at::Tensor t = &b == &buckets_.back() && side > 0
                     ? buffer_.storage().narrow(0, 0, side + b.numel)
                     : buffer_.grads().narrow(0, b.offset, b.numel);
  InFlight f;
  at::Tensor wire = on_wire(b, t, 0, t.numel(), f);
  at::Tensor grads = wire.narrow(0, wire.numel() - b.numel, b.numel);
  prescale(grads);
  // The side channel's values are sums, so its bucket is summed and divided afterwards.
  f.work = comm_.all_reduce(wire, t.numel() > b.numel ? comm::ReduceOp::sum : reduce_op());
  in_flight_.push_back(std::move(f));
}

void AllReduceReducer::after_finish() {
  const double factor = postscale_factor();
  if (factor != 1.0) {
    buffer_.grads().narrow(0, 0, numel_).mul_(factor);
  } else if (reduce_op() == comm::ReduceOp::avg && buffer_.side().numel() > 0) {
    const Bucket& b = buckets_.back();  // the one that carried the side channel
    buffer_.grads().narrow(0, b.offset, b.numel).div_(comm_.world_size());
  }
}

void AllReduceReducer::reduce_all_now() {
  prepare_backward(true);
  finish_backward();
}

}  // namespace dscpp::zero
