// GradReducer: the bucketed gradient path every ZeRO stage shares. It cuts the parameters' flat
// gradient space into buckets, watches each parameter's gradient accumulator, and launches a
// bucket's reduction as soon as the bucket is complete, while backward goes on. What a reduction
// is, and where the gradients accumulate until then, is the gradient path's own (one class per
// stage family, each in its own file):
//   all_reduce.h       stage 0: a full gradient buffer, all-reduced bucket by bucket
//   reduce_scatter.h   stage 1: the same buffer, reduce-scattered in place
//                      stages 2-3: staging slots reduce-scattered into a gradient shard
//
// The flat gradient space is the concatenation of the groups' flat buffers (NOTE [flat
// partition] in partition.h): one group at stages 0-2, one per unit at stage 3. Buckets of about
// reduce_bucket_size elements are cut from the end of each group (the last parameters' gradients
// are ready first in backward) and never cross a group or split a parameter. A post-hook on each
// parameter's gradient accumulator counts its bucket down; a pre-hook lets the gradient path
// choose where the gradient goes just before autograd accumulates it.
//
// Parameters that the loss does not reach (an unused branch) are found before backward runs, by
// walking the loss's autograd graph, and count as ready at once, so their buckets never hold the
// others back.
//
// NOTE [bucket order]: buckets are launched strictly in index order on every rank, even if a
// later bucket is ready first, so ranks always issue the same collectives in the same order (a
// parameter unused on one rank only cannot reorder them). Buckets still pending when backward
// returns (unused parameters) are launched then, in order, with zeros for the missing gradients.
//
// NOTE [bucket cap]: a bucket larger than a sixteenth of the model (but at least kMinBucketCap
// elements) helps nothing: it only delays the first reduction, so less overlaps with backward,
// and at stages 2-3 it sizes the staging slots. DeepSpeed's default of 5e8 elements is larger
// than most models. capped_bucket_size() applies the cap to reduce_bucket_size and
// allgather_bucket_size; bucket sizes never change the trajectory, and smaller values are kept
// as given.
//
// NOTE [wire dtype]: communication_data_type other than the training dtype (fp32 reductions of
// bf16 gradients, the common case): at launch a bucket is copied into that dtype, which is
// prescaled and reduced; when the reduction is retired this rank's reduced part is copied back
// into the bucket's own place (rounded once into the training dtype), before anything reads it.
// A post-scale (prescale_gradients, gradient_predivide_factor) is then applied in the training
// dtype, a second rounding; DeepSpeed applies it before the copy back.
// With torch_autocast the wire dtype is a parameter's own (ReduceOptions::wire_dtype_of): a
// bucket holds parameters of one wire dtype.
// At most kWireCopiesInFlight such copies exist: a launch waits for the oldest reduction in
// flight beyond that. Only the gradients' reductions change: parameters are gathered in the
// training dtype (DeepSpeed's engine.allreduce_bucket and ZeRO's average_tensor do the same).
//
// Threading: hooks run on the autograd thread(s); the bucket state is guarded by a mutex.
// Reductions run on the communicator's thread; they are waited for ("retired") in launch order.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/comm.h"

namespace dscpp::zero {

constexpr int64_t kBucketsPerModel = 16;
constexpr int64_t kMinBucketCap = int64_t{1} << 20;  // elements
constexpr int64_t kWireCopiesInFlight = 2;            // NOTE [wire dtype]
// The bucket size used for a configured size and a model of `numel` trainable elements
// (NOTE [bucket cap]): min(configured, max(kMinBucketCap, ceil(numel / kBucketsPerModel))).
int64_t capped_bucket_size(int64_t configured, int64_t numel);

struct ReduceOptions {
  at::ScalarType dtype = at::kFloat;  // of the parameters and gradients in training
  // Stage 1: the full gradient buffer's dtype when it differs from `dtype` (NOTE [accumulation
  // dtype] in grad_buffer.h); unset: `dtype`.
  std::optional<at::ScalarType> accumulate_dtype;
  // communication_data_type, when it differs from the gradient buffers' dtype (NOTE [wire
  // dtype]); unset: theirs.
  std::optional<at::ScalarType> wire_dtype;
  // torch_autocast (NOTE [autocast] in src/precision/autocast.h): the parameters, by name, whose
  // gradients are reduced in a dtype of their own whatever wire_dtype says (DeepSpeed's
  // comm_dtype of a parameter). Buckets are cut where the wire dtype changes.
  std::map<std::string, at::ScalarType> wire_dtype_of;
  // Elements per bucket (DeepSpeed's unit), used as given: the engine applies the cap.
  int64_t reduce_bucket_size = 500000000;
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  // false (gradient_allreduce_op "sum"): the gradients are summed over ranks, not averaged; the
  // two above are then not applied (DeepSpeed's rule).
  bool average = true;
  // Stages 1-3 (DeepSpeed's meaning; see reduce_scatter.h).
  bool overlap_comm = false;
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  // Stage 3, zero_quantized_gradients (ZeRO++ qgZ): the units' buckets are reduce-scattered with
  // what crosses hosts quantized to int4 (NOTE [quantized reduce-scatter]); the resident group
  // (small parameters, as DeepSpeed keeps 1-D tensors exact) stays exact.
  bool quantize_gradients = false;
  // Check each gradient this rank reduces for NaN/Inf before it is averaged (one sum per
  // parameter), so a non-finite step can name the rank and parameter it came from. fp16 leaves
  // it off: its loss scaler skips such steps.
  bool check_finite = false;
};

// A group's place in the flat gradient space and in this rank's shard of everything.
struct GroupGeometry {
  int64_t base = 0;        // where the group starts in the flat gradient space
  int64_t padded = 0;      // its padded length (a multiple of the world size)
  int64_t shard = 0;       // padded / world size
  int64_t shard_base = 0;  // where this rank's shard of the group starts in the rank's shard
};

class GradReducer {
 public:
  virtual ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Call before loss.backward(): whether this backward reduces gradients over ranks (stages 2-3
  // reduce in every backward). `loss` (optional) lets parameters it cannot reach count as ready
  // at once.
  void prepare_backward(bool reduce, const at::Tensor& loss = at::Tensor());
  // Call after loss.backward(): launches the buckets still pending (in order) and waits for
  // every reduction of this backward. Returns the seconds this backward spent waiting for
  // reductions to complete: here, and in its hooks (without overlap_comm, or for a staging slot).
  double finish_backward();
  // Names of the parameters that got no gradient in the last backward on this rank.
  std::vector<std::string> unused_in_last_backward() const;

  const std::vector<at::Tensor>& params() const { return params_; }
  const std::vector<std::string>& names() const { return names_; }
  // [offset, numel) of each parameter in the flat gradient space.
  const std::vector<std::pair<int64_t, int64_t>>& segments() const { return segments_; }
  size_t num_buckets() const { return buckets_.size(); }
  // Buckets launched so far in the current backward (all of them once finish_backward returns).
  size_t buckets_launched() const;
  // Whether every parameter's gradient of this backward is in (or known not to come): the
  // gradients are complete, whatever has been launched.
  bool all_gradients_ready() const;
  // Whether a gradient arrived after its bucket was reduced in this backward (an error was
  // raised from the hook; the gradients are incomplete).
  bool late_gradient() const;
  // The first parameter (in model order) whose own gradient on this rank was NaN or Inf when it
  // was reduced since the last clear_nonfinite(), or -1 (ReduceOptions::check_finite).
  int first_nonfinite() const;
  void clear_nonfinite();
  // NOTE [final pieces]: a listener that sees each piece of this rank's averaged gradient the
  // moment its reduction is retired in a backward whose reductions complete the window (the
  // accumulation boundary's, or a flush: set_final): (its position in the rank's gradient shard,
  // where it landed). It runs under the reducer's lock on whichever thread retires the reduction
  // (an autograd thread in backward, or the caller of finish_backward), after the piece was
  // scaled; nothing writes the piece again before the step. Offload to host memory starts the
  // piece's copy there (NOTE [host step]).
  using FinalPiece = std::function<void(int64_t shard_pos, const at::Tensor& grads)>;
  void set_on_final_piece(FinalPiece f);
  void set_final(bool final);

  // Bytes of the gradient buffers held between steps (full buffer or shard), and of staging
  // buffers held for the whole run.
  virtual int64_t grad_bytes() const = 0;
  virtual int64_t staging_bytes() const { return 0; }
  virtual void zero_grads() = 0;

 protected:
  struct Bucket {
    int group = 0;
    int64_t offset = 0;  // in the flat gradient space
    int64_t numel = 0;
    std::vector<int> params;
    int pending = 0;
    bool launched = false;
    int slot = -1;  // stages 2-3: the staging slot its gradients accumulate in, or -1
    // The dtype its gradients are reduced in when not the buffers' (NOTE [wire dtype]).
    std::optional<at::ScalarType> wire;
  };
  // A launched reduction of one bucket: where its result lands.
  struct InFlight {
    comm::WorkHandle work;
    at::Tensor staging;     // keeps the buffer alive until the reduction is done
    at::Tensor result;      // this rank's part of the bucket (a view of `staging`), or undefined
    int64_t shard_pos = 0;  // where `result` lands in this rank's gradient shard
    int slot = -1;          // the staging slot to free, or -1
    // NOTE [wire dtype]: the reduced part in the wire's dtype, copied into `wire_into` (in the
    // training dtype) when the reduction is retired; both undefined without a wire copy.
    at::Tensor wire;
    at::Tensor wire_into;
  };

  // `params`: the trainable parameters, distinct, on one device, already views into their
  // groups' flat buffers; `segments` their places in the flat gradient space; `groups` the
  // groups in flat order and `param_group` each parameter's (empty: all in group 0). The derived
  // class sets up its buffers, then calls install_hooks().
  GradReducer(std::vector<at::Tensor> params, std::vector<std::string> names,
              std::vector<std::pair<int64_t, int64_t>> segments, std::vector<GroupGeometry> groups,
              std::vector<int> param_group, comm::Communicator& comm, ReduceOptions options);
  void install_hooks();
  // For the derived destructor: waits for the reductions in flight (a backward that threw).
  void drain_quietly();

  // ----- what a gradient path decides; *_locked run under mu_ -----
  virtual bool reduces_every_backward() const { return false; }
  // Before the lock is taken in prepare_backward: point each .grad where autograd should put it.
  virtual void before_backward() {}
  virtual void reset_locked() {}
  // Just before `param`'s gradient is accumulated in a reducing backward (its bucket is not
  // launched yet).
  virtual void on_arriving_locked(int /*param*/, Bucket& /*b*/) {}
  // Just before autograd accumulates `grad` into `param`'s .grad, in any backward, after
  // on_arriving_locked: true when the path put it in place itself (NOTE [first gradient is
  // written] in grad_buffer.h).
  virtual bool take_gradient_locked(int /*param*/, const at::Tensor& /*grad*/) { return false; }
  // Whether `b` may go now that it is complete and next in order.
  virtual bool may_launch_locked(const Bucket& /*b*/) const { return true; }
  virtual void launch_locked(Bucket& b) = 0;
  // When the last gradient of `b` arrived (or the bucket was counted complete) in a reducing
  // backward; before it is launched.
  virtual void on_bucket_complete_locked(Bucket& /*b*/) {}
  // After a reduction was waited for (the slot is freed right after).
  virtual void on_reduced_locked(InFlight& /*f*/) {}
  // Where f's result is once on_reduced_locked ran: this rank's averaged gradient at
  // [f.shard_pos, f.shard_pos + f.result.numel()) of its shard (NOTE [final pieces]).
  virtual at::Tensor final_piece_locked(const InFlight& f) const { return f.result; }
  // Parameter `param`'s gradient accumulated so far in this window (its .grad, unless the path
  // keeps it elsewhere).
  virtual at::Tensor accumulated_grad_locked(int param) const { return params_[param].grad(); }
  virtual void release_slot_locked(int /*slot*/) {}
  // After finish_backward waited for everything, unlocked.
  virtual void after_finish() {}

  // What goes on the wire for bucket b's `staging` (NOTE [wire dtype]): `staging` itself, or a
  // copy in b's wire dtype, whose reduced [from, from + count) f copies back into staging's when
  // retired. Call under the lock, before pushing f.
  at::Tensor on_wire(const Bucket& b, const at::Tensor& staging, int64_t from, int64_t count,
                     InFlight& f);
  // Waits for the oldest reduction in flight, then on_reduced_locked and release_slot_locked
  // (the slot is released even when the wait throws).
  void retire_oldest_locked();
  // Retires the reductions already done, oldest first, without waiting.
  void retire_completed_locked();
  // The part of bucket `b` inside each rank's shard of its group (consecutive, possibly empty),
  // and where this rank's part starts in the flat gradient space.
  std::vector<int64_t> rank_counts(const Bucket& b, int64_t* own_start) const;
  // DeepSpeed's order of scaling (engine.allreduce_bucket): with prescale_gradients divide by the
  // world size before summing; otherwise divide by gradient_predivide_factor before and multiply
  // by predivide / world after. Both give the mean over ranks.
  // NOTE [mean in the reduction]: with neither (DeepSpeed's defaults) the collective itself takes
  // the mean (reduce_op() is avg): the shared-memory collectives divide the fp32 sum before
  // rounding it once, instead of a pass of its own over the reduced gradients (at stage 0 a
  // whole model's worth per step); postscale_factor() is then 1.
  void prescale(at::Tensor& t) const;
  comm::ReduceOp reduce_op() const;
  double postscale_factor() const;

  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<std::pair<int64_t, int64_t>> segments_;
  std::vector<GroupGeometry> groups_;
  std::vector<int> param_group_;
  comm::Communicator& comm_;
  ReduceOptions options_;
  at::TensorOptions buffer_options_;  // the gradients' dtype, the parameters' device
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_param_;

  mutable std::mutex mu_;
  bool reducing_ = false;
  bool final_ = false;
  FinalPiece on_final_piece_;
  bool finishing_ = false;  // in finish_backward, launching what is left
  std::deque<InFlight> in_flight_;
  // Seconds this backward waited for reductions to complete: in its hooks (a bucket that may
  // accumulate only after the previous reduction, a staging slot to free) and at its end.
  double wait_seconds_ = 0;

 private:
  // Whether the gradient path took `grad` in itself (autograd then accumulates nothing).
  bool on_grad_arriving(int param, const at::Tensor& grad);
  void on_grad_ready(int param);
  // Marks `param` as having its gradient for this backward; launches what is ready.
  void mark_ready_locked(int param);
  void launch_in_order_locked();
  // The gradient accumulators `loss` reaches (empty: unknown, assume all).
  std::vector<char> reachable_from(const at::Tensor& loss) const;

  // Per parameter in this backward: 0 nothing yet, 1 its gradient came, 2 the loss cannot reach
  // it (counted ready before backward).
  std::vector<char> got_grad_;
  bool late_gradient_ = false;
  // With check_finite: per parameter, the sum of its gradients reduced since clear_nonfinite()
  // (in the gradients' dtype on their device; made at the first): an Inf or NaN element makes
  // its sum, and every later sum it is added to, non-finite. One element view per parameter, so
  // the hook costs two ops (sum, add_).
  at::Tensor sums_;
  std::vector<at::Tensor> sum_slots_;
  size_t next_bucket_ = 0;
  // The hooked gradient accumulators (kept alive) and their hooks, removed on destruction so a
  // model that outlives its engine never calls into a dead reducer.
  struct Hooks {
    // An intrusive_ptr since libtorch 2.15, a shared_ptr before: whichever this libtorch returns.
    decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>())) acc;
    uintptr_t post_key;
    const torch::autograd::FunctionPreHook* pre;
  };
  std::vector<Hooks> hooks_;
};

}  // namespace dscpp::zero
