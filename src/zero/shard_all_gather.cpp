// Implements gather_in_place (shard_all_gather.h).
#include "zero/shard_all_gather.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

#include "util/fault_inject.h"

namespace dscpp::zero {

void gather_in_place(comm::Communicator& comm, const at::Tensor& flat, int64_t shard,
                     int64_t bucket) {
  const int world = comm.world_size();
  const int64_t piece = std::max<int64_t>(1, bucket / world);
  std::vector<comm::WorkHandle> works;
  for (int64_t start = 0; start < shard; start += piece) {
    const int64_t len = std::min(piece, shard - start);
    std::vector<at::Tensor> outputs;
    for (int r = 0; r < world; ++r) outputs.push_back(flat.narrow(0, r * shard + start, len));
    works.push_back(comm.all_gather_into(outputs, outputs[comm.rank()]));
    fault::point(fault::Phase::all_gather);
  }
  for (auto& w : works) w->wait();
}

}  // namespace dscpp::zero
