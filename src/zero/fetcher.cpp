// Implements ParamFetcher (fetcher.h, NOTE [unit storage]).
#include "zero/fetcher.h"

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>

#include <limits>

#include "comm/quantize.h"
#include "dscpp/error.h"
#include "util/fault_inject.h"

namespace dscpp::zero {
namespace {

c10::StorageImpl* storage_of(const at::Tensor& t) { return t.storage().unsafeGetStorageImpl(); }

}  // namespace

ParamFetcher::ParamFetcher(comm::Communicator& comm, bool debug_nan, bool quantize_weights,
                           int secondary_group)
    : comm_(comm),
      debug_nan_(debug_nan),
      quantize_(quantize_weights),
      secondary_group_(secondary_group) {
  DSCPP_CHECK(secondary_group_ == 1 || comm_.host_group_size() == secondary_group_, Error,
              "internal: hpZ's group of ", secondary_group_, " ranks is not the host group of ",
              comm_.host_group_size());
}

at::Tensor ParamFetcher::take(std::map<int64_t, std::vector<at::Tensor>>& pool, int64_t n,
                              const at::TensorOptions& options) {
  auto& free = pool[n];
  if (!free.empty()) {
    at::Tensor t = std::move(free.back());
    free.pop_back();
    return t;
  }
  at::Tensor t = at::empty({n}, options);
  pool_ += static_cast<int64_t>(t.nbytes());
  return t;
}

void ParamFetcher::swap_out(FetchUnit& u) {
  c10::StorageImpl* s = storage_of(u.full);
  s->set_data_ptr_noswap(at::DataPtr(nullptr, u.full.device()));
  s->set_nbytes(0);
}

void ParamFetcher::park(FetchUnit& u) {
  swap_out(u);
  if (!debug_nan_ || u.full.numel() == 0) return;
  u.block = at::full({u.full.numel()}, std::numeric_limits<float>::quiet_NaN(), u.full.options());
  pool_ += static_cast<int64_t>(u.block.nbytes());
  c10::StorageImpl* s = storage_of(u.full);
  s->set_data_ptr_noswap(at::DataPtr(u.block.data_ptr(), u.full.device()));
  s->set_nbytes(u.block.nbytes());
}

void ParamFetcher::gather(FetchUnit& u, Gather kind) {
  DSCPP_CHECK(!u.gathered, Error, "internal: unit '", u.name, "' is gathered already");
  const int64_t n = u.full.numel();
  if (n == 0) {  // a unit whose parameters all stay whole (stage3_param_persistence_threshold)
    u.gathered = true;
    return;
  }
  // Debug mode: the NaN-filled block it kept.
  if (!u.block.defined()) u.block = take(free_, n, u.full.options());
  c10::StorageImpl* s = storage_of(u.full);
  // Not owning: the pool keeps the block alive (u.block) until release() takes it back.
  s->set_data_ptr_noswap(at::DataPtr(u.block.data_ptr(), u.full.device()));
  s->set_nbytes(u.block.nbytes());
  u.gathered = true;
  live_ += static_cast<int64_t>(u.block.nbytes());
  peak_ = std::max(peak_, live_ + secondary_);
  if (from_host(u, kind)) {
    // NOTE [secondary partition]: from the host's secondary shards, through shared memory.
    const int64_t part = n / secondary_group_;
    std::vector<at::Tensor> outputs;
    for (int l = 0; l < secondary_group_; ++l) outputs.push_back(u.full.narrow(0, l * part, part));
    u.quantized = false;
    u.keep_secondary = false;
    u.work = comm_.host_all_gather_into(outputs, u.secondary);
    fault::point(fault::Phase::all_gather);
    return;
  }
  const int world = comm_.world_size();
  const int64_t shard = u.shard.numel();
  u.quantized = quantize_ && kind != Gather::kExact;
  u.keep_secondary = secondary_group_ > 1 && kind == Gather::kForward;
  if (!u.quantized) {
    std::vector<at::Tensor> outputs;
    for (int r = 0; r < world; ++r) outputs.push_back(u.full.narrow(0, r * shard, shard));
    u.work = comm_.all_gather_into(outputs, u.shard);
  } else {
    // NOTE [block-wise quantization]: this rank's codes and scales go into its own slots, then both
    // all-gathers run; wait() dequantizes every rank's slots, this rank's included, so all ranks
    // compute with the same weights.
    const int64_t blocks = comm::quant_blocks(shard, comm::kWeightFormat);
    u.codes = take(free_codes_, n, u.full.options().dtype(at::kChar));
    u.scales = take(free_scales_, world * blocks, u.full.options().dtype(at::kFloat));
    std::vector<at::Tensor> codes, scales;
    for (int r = 0; r < world; ++r) {
      codes.push_back(u.codes.narrow(0, r * shard, shard));
      scales.push_back(u.scales.narrow(0, r * blocks, blocks));
    }
    const int rank = comm_.rank();
    comm::quantize(u.shard, codes[rank], scales[rank], comm::kWeightFormat);
    u.work = comm_.all_gather_into(codes, codes[rank]);
    u.scale_work = comm_.all_gather_into(scales, scales[rank]);
  }
  fault::point(fault::Phase::all_gather);
}

void ParamFetcher::wait(FetchUnit& u) {
  if (!u.work) return;
  comm::WorkHandle w = std::move(u.work);
  u.work = nullptr;
  struct DropShard {
    FetchUnit& u;
    ~DropShard() {
      if (u.shard_on_disk) u.shard = at::Tensor();
    }
  } drop{u};
  w->wait();
  if (u.quantized) {
    comm::WorkHandle s = std::move(u.scale_work);
    u.scale_work = nullptr;
    s->wait();
    const int world = comm_.world_size();
    const int64_t shard = u.full.numel() / world;
    const int64_t blocks = comm::quant_blocks(shard, comm::kWeightFormat);
    for (int r = 0; r < world; ++r) {
      comm::dequantize(u.codes.narrow(0, r * shard, shard),
                       u.scales.narrow(0, r * blocks, blocks), u.full.narrow(0, r * shard, shard),
                       comm::kWeightFormat);
    }
    free_codes_[u.codes.numel()].push_back(std::move(u.codes));
    free_scales_[u.scales.numel()].push_back(std::move(u.scales));
    u.codes = at::Tensor();
    u.scales = at::Tensor();
  }
  if (u.keep_secondary) {
    // NOTE [secondary partition]: this rank's share of what forward computes with.
    u.keep_secondary = false;
    const int64_t part = u.full.numel() / secondary_group_;
    if (!u.secondary.defined()) {
      u.secondary = take(free_secondary_, part, u.full.options());
      secondary_ += static_cast<int64_t>(u.secondary.nbytes());
      peak_ = std::max(peak_, live_ + secondary_);
    }
    u.secondary.copy_(u.full.narrow(0, comm_.rank() % secondary_group_ * part, part));
  }
}

void ParamFetcher::drop_secondary(FetchUnit& u) {
  if (!u.secondary.defined()) return;
  secondary_ -= static_cast<int64_t>(u.secondary.nbytes());
  free_secondary_[u.secondary.numel()].push_back(std::move(u.secondary));
  u.secondary = at::Tensor();
}

void ParamFetcher::release(FetchUnit& u) {
  if (!u.gathered) return;
  if (u.full.numel() == 0) {
    u.gathered = false;
    return;
  }
  if (u.work) {
    try {
      wait(u);
    } catch (...) {
      // The communicator is broken and says so at its next wait; the memory is still ours.
    }
  }
  live_ -= static_cast<int64_t>(u.block.nbytes());
  u.gathered = false;
  if (debug_nan_) {
    // The block stays behind the parameters, so a read outside the unit's call sees NaN.
    u.block.fill_(std::numeric_limits<float>::quiet_NaN());
    return;
  }
  swap_out(u);
  free_[u.block.numel()].push_back(std::move(u.block));
  u.block = at::Tensor();
}

}  // namespace dscpp::zero
