// Strategy: one ZeRO stage family, as the engine's step sees it. Each family lives in its own
// file (stage0.cpp: data parallelism; stage1_2.cpp: optimizer state and gradients sharded;
// stage3_*.cpp: parameters sharded too, gathered unit by unit), owns
// the parameters' storage and a gradient path (reducer.h), and answers the step's questions in
// the order the step asks them (src/engine/step.cpp):
//
//   backward   reducer().prepare_backward(...), loss.backward(), reducer().finish_backward()
//   boundary   reduce_accumulated() when the boundary backward did not reduce (stages 0-1)
//   update     parts(): this rank's parameters (training dtype) and averaged gradients, as
//              contiguous pieces of the optimizer's buffer; the engine runs the optimizer on them
//              (through the fp32 master weights under mixed precision, src/precision/)
//              publish_params(): every rank's parameters are current again (stages 1-2: the
//              updated shards are all-gathered)
//              reducer().zero_grads()
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/comm.h"
#include "zero/partition.h"
#include "zero/reducer.h"

namespace dscpp::zero {

class GradShard;  // grad_shard.h

struct StrategyOptions {
  int stage = 0;
  ReduceOptions reduce;               // bucket size already capped (NOTE [bucket cap])
  int64_t allgather_bucket_size = 0;  // stages 1-2, already capped
  int64_t side_channel = 0;           // stage 0 fp32: statistics elements (NOTE [side channel])
};

// NOTE [checkpoint groups]: what a checkpoint records of this rank's part, one entry per flat
// group (stages 0-2: "model"; stage 3: "resident" and "unit:<path>" per unit). Elements [begin,
// begin + length) of the group's flat buffer lie at [part_offset, part_offset + length) of the
// optimizer's buffer (this rank's part: the fp32 values and every optimizer state). Stage 0 holds
// the whole group, [0, numel); stages 1-3 exactly this rank's shard [r * S, (r + 1) * S).
struct CheckpointGroup {
  std::string name;
  std::vector<std::string> names;  // the group's parameters in buffer order
  std::vector<std::vector<int64_t>> shapes;
  FlatLayout layout;  // at this world size
  int64_t begin = 0, length = 0, part_offset = 0;
};
// The group of `np` laid out by `layout`, held in the part as described above.
CheckpointGroup checkpoint_group(std::string name, const NamedParams& np, const FlatLayout& layout,
                                 int64_t begin, int64_t length, int64_t part_offset);

// Where the updated parameters of a part on disk go (stage 3's offload_param,
// offload/param_swapper.h): the step puts their values front to back, then finish() waits until
// they are written (and rethrows an I/O failure).
class ParamSink {
 public:
  virtual ~ParamSink() = default;
  // Elements [offset, offset + values.numel()) of the sink's part (fp32 or training dtype).
  virtual void put(int64_t offset, const at::Tensor& values) = 0;
  virtual void finish() = 0;
};

// A contiguous piece of what this rank updates: params [n] in the training dtype, the averaged
// gradient [n] in the training dtype, and where the piece starts in the optimizer's buffer.
// Parameters on disk (stage 3's offload_param) have no params tensor: store() hands their
// updated values to `sink` instead. A gradient shard on disk (NOTE [gradients on disk] in
// offload/grad_swapper.h) leaves `grads` undefined: elements [offset, offset + length) of
// `grads_on_disk` are the part's (the offset is the position in the gradient shard).
struct Part {
  at::Tensor params;
  at::Tensor grads;
  int64_t offset = 0;
  ParamSink* sink = nullptr;
  GradShard* grads_on_disk = nullptr;
  int64_t length = 0;  // with grads_on_disk
  int64_t numel() const { return grads.defined() ? grads.numel() : length; }
  // The updated values of elements [off, off + values.numel()) of this part, cast.
  void store(int64_t off, const at::Tensor& values) const {
    if (sink) {
      sink->put(off, values);
    } else {
      params.narrow(0, off, values.numel()).copy_(values);
    }
  }
};

class Strategy {
 public:
  virtual ~Strategy() = default;

  // Trainable elements, and how many of them this rank updates (its part).
  virtual int64_t numel() const = 0;
  virtual int64_t part_numel() const = 0;
  // Whether every rank holds the whole averaged gradient (stage 0): the gradient norm needs no
  // sum over ranks.
  virtual bool replicated() const = 0;
  // Where this rank's part starts in the flat buffer of the whole model (NOTE [flat partition]).
  virtual int64_t part_begin() const = 0;
  // [offset, numel) of each parameter in the optimizer's buffer, for optimizers that need whole
  // parameters (Lamb); empty when the part does not hold whole parameters.
  virtual std::vector<std::pair<int64_t, int64_t>> optimizer_segments() const { return {}; }
  // The trainable parameters as one flat tensor [numel] in the training dtype (rank 0's are
  // broadcast at start-up); undefined at stage 3, which shards them as it sets up.
  virtual at::Tensor flat_params() const = 0;
  // The training dtype and the parameters' device.
  virtual at::TensorOptions options() const = 0;

  virtual GradReducer& reducer() = 0;
  // Whether every backward reduces (stage 2): then the boundary never has gradients left to
  // reduce and no_sync() is refused.
  virtual bool reduces_every_backward() const = 0;
  // Reduces the gradients accumulated without reduction (no_sync, or a flush); stages 0-1.
  virtual void reduce_accumulated() = 0;
  // Stage 0 fp32: the statistics that ride in the gradient all-reduce (NOTE [side channel]);
  // otherwise an empty tensor.
  virtual at::Tensor side_channel() const { return at::Tensor(); }

  // At the start of backward(loss), before anything is counted or communicated.
  virtual void before_backward(const at::Tensor& /*loss*/) {}
  // After every backward (reduced or not), once finish_backward returned.
  virtual void after_backward() {}
  // At the boundary, before the optimizer runs on parts().
  virtual void before_update() {}
  virtual std::vector<Part> parts() = 0;
  virtual void publish_params() = 0;
  // What a checkpoint records of the part (NOTE [checkpoint groups]), in part order.
  virtual std::vector<CheckpointGroup> checkpoint_groups() const = 0;
  // Stage 3: a GatheredParameters scope is open (its gathered copies may be written back when
  // it closes, so a checkpoint taken or loaded inside it would not be what training continues
  // from).
  virtual bool gathered_scope_open() const { return false; }
  // Called before the strategy itself changes the values a checkpoint reads, outside step()
  // (stage 3: a GatheredParameters scope's write-back, zero::load_weights): a checkpoint being
  // written in the background copies what it has not written yet (src/checkpoint/live_snapshot.h).
  void set_before_values_change(std::function<void()> f) { before_values_change_ = std::move(f); }

  // Bytes held for the parameters, the gradients between steps and the staging buffers.
  virtual int64_t param_bytes() const = 0;
  // Stage 3 with offload_param: bytes of the parameter swap's buffers, and of the shards kept in
  // host memory for a model on a device (not counted in param_bytes()).
  virtual int64_t param_swap_buffer_bytes() const { return 0; }
  virtual int64_t param_host_bytes() const { return 0; }
  // Stage 3 with the gradient shard on disk: bytes of its buffers (not in grad_bytes()).
  virtual int64_t grad_swap_buffer_bytes() const { return 0; }
  // Stage 3: the most bytes of gathered unit parameters held at once so far.
  virtual int64_t gathered_peak_bytes() const { return 0; }
  // Stage 3: seconds the training thread waited for parameter all-gathers since the last call,
  // and how many gathers were issued and how many of them ahead of their request (prefetch).
  // With offload_param nvme also the shards read from disk (and of them read ahead), their
  // bytes, and the seconds waited for the disk.
  struct FetchStats {
    double wait_seconds = 0;
    int64_t gathers = 0, prefetched = 0;
    int64_t disk_reads = 0, disk_reads_ahead = 0, disk_bytes_read = 0, disk_bytes_written = 0;
    double disk_wait_seconds = 0;
    const char* shards_where = "on disk";  // or "in host memory" (a model on a GPU)
  };
  virtual FetchStats take_fetch_stats() { return {}; }
  int64_t grad_bytes() { return reducer().grad_bytes(); }
  int64_t staging_bytes() { return reducer().staging_bytes(); }

 protected:
  void before_values_change() const {
    if (before_values_change_) before_values_change_();
  }

 private:
  std::function<void()> before_values_change_;
};

// Sees the fp32 values of this rank's part as the strategy lays the model out (and as stage 3's
// GatheredParameters scopes write back): (offset in the part, values). The PartStore's
// (src/precision/part_store.h): the master weights or the swap file take them.
using PartTap = std::function<void(int64_t part_offset, const at::Tensor& values)>;
// Called once the part's length is known, before any value is taken; returns the tap (null: the
// parameters hold the values).
using PartTapFactory = std::function<PartTap(int64_t part_numel)>;

// Waits for the parts' parameters on disk to be written (ParamSink::finish).
inline void finish_stores(const std::vector<Part>& parts) {
  for (const auto& p : parts) {
    if (p.sink) p.sink->finish();
  }
}

struct Stage3Options;  // stage3.h

// The strategy of options.stage over `np` (fp32, one device): stage 0 or 1-2 laid out by `layout`
// (FlatLayout::of(np.params, world)), stage 3 by units as `s3` says. `make_tap` (optional) is
// called once the part's length is known; its tap sees the part's fp32 values first.
std::unique_ptr<Strategy> make_strategy(torch::nn::Module& model, NamedParams np,
                                        const FlatLayout& layout, comm::Communicator& comm,
                                        const StrategyOptions& options, const Stage3Options& s3,
                                        const PartTapFactory& make_tap);

// The stage's strategy over `np` (fp32, one device), laid out by `layout` (FlatLayout::of(np,
// world)). The parameters become views into a flat buffer of options.reduce.dtype; `tap` sees
// each parameter's fp32 values first (partition.h).
std::unique_ptr<Strategy> make_stage0(NamedParams np, const FlatLayout& layout,
                                      comm::Communicator& comm, const StrategyOptions& options,
                                      const FlattenTap& tap);
// Stage 3 (stage3.h) is built by make_stage3 there.
std::unique_ptr<Strategy> make_stage1_2(NamedParams np, const FlatLayout& layout,
                                        comm::Communicator& comm, const StrategyOptions& options,
                                        const FlattenTap& tap);

}  // namespace dscpp::zero
