// The all-gather of updated shards after the optimizer step: every rank's shard of a flat buffer
// to every rank, straight into its place in the buffer, in pieces. Stages 1-2 publish the whole
// model this way, stage 3 its resident group. Stage 3's unit-by-unit gathers before a unit runs
// are elsewhere: src/zero/fetcher.h.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "dscpp/comm.h"

namespace dscpp::zero {

// `flat` [world * shard]: rank r's shard [r * shard, (r + 1) * shard) holds its current values.
// Gathers `bucket` elements per collective (bucket / world from each rank's shard): piece j of
// rank r's shard lands where it belongs (Gloo: no staging buffer and no copy; NCCL: libtorch's
// list all-gather stages world x piece). The pieces are launched together and run in order on
// the communicator's thread; returns once all are done.
void gather_in_place(comm::Communicator& comm, const at::Tensor& flat, int64_t shard,
                     int64_t bucket);

}  // namespace dscpp::zero
