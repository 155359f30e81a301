// make_strategy (strategy.h): the ZeRO stage chosen once, here.
#include "zero/strategy.h"

#include <algorithm>

#include "zero/stage3.h"

namespace dscpp::zero {
namespace {

// The flatten tap that hands `take(part_offset, values)` the piece of each parameter falling in
// this rank's part [begin, begin + numel) of the flat buffer.
FlattenTap part_tap(int64_t begin, int64_t numel, PartTap take) {
  if (!take) return nullptr;
  return [begin, numel, take = std::move(take)](int64_t offset, const at::Tensor& values) {
    const int64_t lo = std::max(offset, begin);
    const int64_t hi = std::min(offset + values.numel(), begin + numel);
    if (lo < hi) take(lo - begin, values.narrow(0, lo - offset, hi - lo));
  };
}

}  // namespace

std::unique_ptr<Strategy> make_strategy(torch::nn::Module& model, NamedParams np,
                                        const FlatLayout& layout, comm::Communicator& comm,
                                        const StrategyOptions& options, const Stage3Options& s3,
                                        const PartTapFactory& make_tap) {
  if (options.stage == 3)
    return std::make_unique<Stage3>(model, std::move(np), comm, options, s3, make_tap);
  // Stage 0: this rank steps on the whole buffer; stages 1-2: on its shard.
  const int64_t begin = options.stage == 0 ? 0 : layout.shard_offset(comm.rank());
  const int64_t len = options.stage == 0 ? layout.numel : layout.shard;
  const FlattenTap tap = part_tap(begin, len, make_tap ? make_tap(len) : nullptr);
  return options.stage == 0 ? make_stage0(std::move(np), layout, comm, options, tap)
                            : make_stage1_2(std::move(np), layout, comm, options, tap);
}

}  // namespace dscpp::zero
