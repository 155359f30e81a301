// EngineImpl::on_every_rank: a local step whose failure on any rank every rank learns (set-up,
// the offloaded step, checkpoints), and the small tensors such agreements travel in.
#include <ATen/ATen.h>

#include <string>

#include "dscpp/error.h"
#include "engine/engine_impl.h"

namespace dscpp::engine {

at::Tensor rank_values(int64_t n, const at::Device& device) {
  return at::zeros({n}, at::TensorOptions().dtype(at::kDouble).device(device));
}

void EngineImpl::on_every_rank(const std::string& what, const std::function<void()>& fn,
                               bool checkpoint_error) {
  std::exception_ptr error;
  try {
    fn();
  } catch (...) {
    error = std::current_exception();
  }
  const int world = comm_->world_size();
  at::Tensor flags = rank_values(world, device_);
  if (error) flags[comm_->rank()] = 1.0;
  comm_->all_reduce(flags)->wait();
  flags = flags.cpu();
  if (error) std::rethrow_exception(error);
  std::string ranks;
  for (int q = 0; q < world; ++q) {
    if (flags.data_ptr<double>()[q] > 0) ranks += (ranks.empty() ? "" : ",") + std::to_string(q);
  }
  if (!checkpoint_error) {
    DSCPP_CHECK(ranks.empty(), Error, what, " failed on rank(s) ", ranks, " (its error says why)");
  }
  DSCPP_CHECK(ranks.empty(), CheckpointError, what, " failed on rank(s) ", ranks,
              " (its error says why)");
}

}  // namespace dscpp::engine
