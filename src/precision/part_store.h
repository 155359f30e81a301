// PartStore: where this rank's part of the fp32 values lives, and the optimizer step over it.
// The engine picks one at set-up (make_part_store) and never asks which it has:
//   in the parameters  fp32 training: the part of the flat buffer is the values themselves; so
//                      with bf16.bf16_master_weights_and_grads (no fp32 copy), whose bf16
//                      values are widened to fp32 a piece at a time for the step, and with
//                      bf16.bf16_optimizer_states the optimizer's states beside them in bf16
//   master weights     bf16 / fp16: an fp32 copy of the part in memory, rank 0's original values
//                      taken as the model is flattened, cast into the parameters after each step
//   swap file          offload_optimizer nvme (src/offload/optimizer_swapper.h): the optimizer's
//                      states, and the fp32 values too under mixed precision or with the
//                      parameters on disk, stepped sub-group by sub-group through the file
//   host memory        offload_optimizer cpu of a model on a device (ZeRO-Offload): the fp32
//                      values and the optimizer's states in host memory, the gradients copied
//                      down and the updated parameters up through a DeviceLink, sub-group by
//                      sub-group (NOTE [host step] in part_store.cpp)
//
// The part is the strategy's (zero::Strategy::parts(): its parameters and averaged gradients at
// each part offset); the store sees it only through those Parts and the tap it hands the
// strategy, so it never knows the ZeRO stage.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/optim.h"
#include "zero/strategy.h"

namespace dscpp::offload {
class DeviceLink;
class OptimizerSwapper;
}

namespace dscpp::precision {

// The name a checkpoint gives the fp32 values, beside the optimizer's state names.
inline constexpr const char* kValues = "fp32";

class PartStore {
 public:
  virtual ~PartStore() = default;

  // Makes room for a part of `part_numel` elements and returns the tap through which the
  // strategy hands over the part's fp32 values as it flattens the model (and, at stage 3, as a
  // GatheredParameters scope writes back); null when the parameters hold the values.
  virtual zero::PartTap open(int64_t part_numel) = 0;
  // Whether the optimizer's states live here (the optimizer is then built holding none).
  virtual bool holds_optimizer_states() const { return false; }
  // Whether the optimizer steps in host memory while the parameters are on a device (the
  // optimizer is then built on the CPU).
  virtual bool steps_on_host() const { return false; }
  // Whether a step or a load goes through a file or a copy between devices, and can fail half
  // done.
  virtual bool can_fail_midway() const { return false; }

  // Whether the store wants each piece of the averaged gradient as soon as its reduction is
  // done (gradient_piece_final; NOTE [final pieces] in src/zero/reducer.h).
  virtual bool takes_final_pieces() const { return false; }
  // Elements [part_offset, part_offset + grads.numel()) of the part's averaged gradient are
  // final for this window (called under the reducer's lock, possibly on an autograd thread).
  virtual void gradient_piece_final(int64_t /*part_offset*/, const at::Tensor& /*grads*/) {}
  // The parts' averaged gradients are final for this window (the boundary's reductions are
  // done and nothing writes them before the step): a store that steps elsewhere may start
  // moving what it has not moved yet. step() follows, or the window is dropped and drain() is
  // called.
  virtual void gradients_final(const std::vector<zero::Part>& /*parts*/) {}
  // Waits for whatever the store still has in flight (a dropped window's gradient copies) and
  // forgets it; failures are dropped with the window. Called before the gradients are zeroed.
  virtual void drain() {}

  // One optimizer step over `parts` (StepContext's lr, step, betas and grad_scale set by the
  // caller), leaving the training-dtype parameters updated: written by the step itself or cast
  // from the updated values. Parts with a sink (stage 3's parameters on disk) are handed their
  // values; the caller waits for them (zero::finish_stores).
  virtual void step(optim::Optimizer& optimizer, const std::vector<zero::Part>& parts,
                    optim::StepContext ctx) = 0;
  // The training-dtype parameters cast from the values (after a checkpoint load).
  virtual void publish(const std::vector<zero::Part>& parts) = 0;

  // For checkpoints. `what` is kValues or an optimizer state's name. On disk: read and write
  // elements [offset, offset + n) of it through fp32 tensors; otherwise the values are
  // values(), a view into memory, and a state is state_view()'s where the store holds it in
  // memory (bf16 states), else the optimizer's. flush() ends a series of them.
  virtual bool on_disk(const std::string& what) const { return false; }
  virtual at::Tensor values(const std::vector<zero::Part>& parts, int64_t offset,
                            int64_t n) const = 0;
  // Elements [offset, offset + n) of the optimizer's state `name` in the store's memory, in the
  // dtype it is held in; undefined when the store does not hold it there.
  virtual at::Tensor state_view(const std::string& /*name*/, int64_t /*offset*/,
                                int64_t /*n*/) const {
    return {};
  }
  virtual void read(const std::string& what, int64_t offset, const at::Tensor& dst);
  virtual void write(const std::string& what, int64_t offset, const at::Tensor& src);
  virtual void flush() {}

  // Bytes of fp32 values held in memory apart from the parameters (the master weights), and of
  // I/O buffers.
  virtual int64_t bytes() const { return 0; }
  // Bytes of the optimizer's states held in memory by the store (not by the optimizer).
  virtual int64_t state_bytes() const { return 0; }
  virtual int64_t buffer_bytes() const { return 0; }
  // What the store's disk did since the last call, for the step line; empty when it has none.
  virtual std::string take_report() { return {}; }
};

// Builds this rank's optimizer swap file for `numel` elements, holding the fp32 values first
// when `with_values` (the engine checks the folder on every rank and logs the file).
using SwapperFactory =
    std::function<std::unique_ptr<offload::OptimizerSwapper>(int64_t numel, bool with_values)>;

struct PartStoreOptions {
  at::ScalarType dtype = at::kFloat;  // the training dtype of parameters and gradients
  // bf16.bf16_master_weights_and_grads: the bf16 parameters are the values (in memory only).
  bool bf16_master = false;
  // bf16.bf16_optimizer_states (with bf16_master): the optimizer's states, each state's name and
  // starting value, held by the store in bf16 (the optimizer is then built holding none).
  std::vector<std::pair<std::string, float>> bf16_states;
  at::Device device = at::kCPU;       // the parameters' device
  // offload_optimizer nvme: the swap file, stepped `sub_group_size` elements at a time.
  bool nvme = false;
  SwapperFactory make_swapper;
  int64_t sub_group_size = 0;
  // offload_param nvme: the parameters are on disk, so the fp32 values cannot be read from
  // them and go to the swap file even in fp32.
  bool params_on_disk = false;
  // offload_optimizer cpu of a model on a device: the link to host memory (not owned), the host
  // buffers the copies touch page-locked or not (pin_memory), and the sub-group buffers the
  // updated parameters go up from (buffer_count, at least 2).
  offload::DeviceLink* link = nullptr;
  bool pin_memory = false;
  int buffer_count = 4;
};

// The store for these options: the swap file with offload_optimizer nvme, else host memory with
// a link, else the master weights under mixed precision (unless bf16_master), else the
// parameters.
std::unique_ptr<PartStore> make_part_store(const PartStoreOptions& options);

}  // namespace dscpp::precision
