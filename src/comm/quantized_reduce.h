// ZeRO++'s quantized gradient reduce-scatter (zero_quantized_gradients, "qgZ") between the members
// of a group: what one member sends another is int4.
//
// NOTE [quantized reduce-scatter]
// Each member quantizes every other member's chunk of its input once (block-wise int4, NOTE
// [block-wise quantization] in quantize.h) and sends it straight to that member: an all-to-all,
// not a ring, so no partial sum is quantized again on its way round (DeepSpeed's qgZ is
// all-to-all for the same reason). The receiver adds, in member order and in fp32, its own chunk
// exactly and every other member's dequantized, and rounds once to the output's dtype. Each
// member sends (M-1)/M of the input, as a ring does, at about 1/8 of fp32's bytes (1/4 of
// bf16's) plus one float scale per 512 elements. Where ranks span hosts in the hierarchy's layout,
// the members are a column's ranks, one per host: each host's ranks have summed exactly through
// shared memory first, so only what crosses hosts is quantized
// (HostHierarchy::reduce_scatter_quantized). Across hosts in other layouts every rank is a
// member and every chunk it sends is quantized, as in DeepSpeed. On one host qgZ is the exact
// reduce-scatter: nothing crosses a network.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "comm/ring.h"

namespace dscpp::comm {

// output [counts[ctx.rank]] = sum over members of their input chunk ctx.rank (input [sum(counts)];
// output may alias this member's own chunk). `remote[m]`: whether member m is on another host
// (for ctx.traffic). Blocks until done; sums only (callers divide for avg).
void quantized_reduce_scatter(const RingContext& ctx, const at::Tensor& output,
                              const at::Tensor& input, const std::vector<int64_t>& counts,
                              const std::vector<bool>& remote);

}  // namespace dscpp::comm
