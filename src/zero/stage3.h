// ZeRO stage 3: parameters sharded too. The model is cut into units (submodules chosen by a
// zero::UnitPolicy); each unit's large parameters form one flat group, sharded 1/N per rank
// (NOTE [flat partition]), and a unit's full parameters exist only while it runs: zero::call
// gathers them (ParamFetcher, NOTE [unit storage]), runs the unit, releases them, and backward
// gathers them again before the unit's gradients are computed (NOTE [stage 3 backward]).
// Parameters below stage3_param_persistence_threshold and parameters in no unit stay whole on
// every rank (the resident group, stage 2's path). The gradients of a unit are reduce-scattered
// into this rank's gradient shard through stage 2's staging slots (reduce_scatter.h).
//
// NOTE [stage 3 backward]: zero::call threads two autograd functions through a unit: UnitOutputs
// on its outputs, whose backward runs before any of the unit's own backward and gathers the unit
// (waiting for a prefetch), and UnitInputs on its inputs, whose backward runs after the unit's
// own. A unit is released in backward once every gradient of its parameters has arrived (the
// reducer says so per group) and every UnitInputs of its calls has run: then no node that saved
// its parameters is left to run.
//
// NOTE [stage 3 prefetch order]: the first step records the order in which units are requested
// (forward, then backward), and all ranks compare one hash of it. Later steps follow the record:
// after serving request i, the units of the next requests are gathered ahead while their
// elements stay within stage3_prefetch_bucket_size (and the live units within
// stage3_max_live_parameters), and a unit whose next request comes within
// stage3_max_reuse_distance elements of gathering is kept instead of released. Every decision
// depends on the record alone, so every rank issues the same all-gathers in the same order. When
// a request differs from the record, the record is dropped (debug log), units are gathered on
// demand for the rest of the step, and the next step records again.
//
// NOTE [stage 3 parameter offload]: with offload_param nvme, the shards of the units past the
// first max_in_cpu elements of this rank's part live in a swap file (offload/param_swapper.h),
// in part order, so the step's updated values stream into it front to back (a Part with a sink,
// strategy.h). A shard comes into memory for its unit's all-gather only: following the record,
// the shards of the next requests are read ahead (up to offload_param.buffer_count of them) while
// earlier units run, and the all-gather drops its input once done. Ranks decide every all-gather
// from the record alone, never from whether a read has finished, so collectives stay in step.
//
// NOTE [released reads]: libtorch modules have no forward hooks, so a unit whose forward runs
// past zero::call (block->forward(x), a Sequential, a unit policy with no zero::call in the
// model) reads parameters whose storage is released. Until the first backward ends, a
// thread-local RecordFunction observer on the engine's thread looks at every op's input tensors:
// one whose storage is a released unit's, outside that unit's call and any GatheredParameters
// scope, is gathered on the spot (every rank's forward reaches the same op, so the all-gathers
// stay in step) so the op reads the right values, and the unit is named in an error logged at
// once and thrown at the next zero::call or backward (libtorch swallows an observer's
// exceptions). Stage 3's own ops run under OwnOps, unwatched. Later passes are not watched: the
// observer boxes every op's inputs. Debug mode is not watched either: its released units hold
// NaN, and check_used_inside_units walks every backward's graph.
//
// A model with no policy is one unit, the whole model: its full parameters are kept between steps
// (its forward runs without zero::call) and released while the optimizer steps on the shards;
// the engine says once that parameter memory in forward is not reduced.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "dscpp/zero.h"
#include "zero/fetcher.h"
#include "zero/reduce_scatter.h"
#include "zero/shard_swap.h"
#include "zero/stage3_plan.h"
#include "zero/strategy.h"

namespace torch::nn {
class Module;
}

namespace dscpp::zero {

struct Stage3Options {
  UnitPolicy units;
  int64_t persistence_threshold = 100000;   // elements: smaller parameters stay whole
  int64_t prefetch_bucket_size = 50000000;  // elements gathered ahead (0: no prefetch)
  int64_t max_live_parameters = 1000000000;
  int64_t max_reuse_distance = 1000000000;
  bool debug = false;  // released units are NaN-filled instead of freed (fetcher.h)
  // zero_quantized_weights (ZeRO++ qwZ): forward's and backward's gathers send int8 codes and
  // block scales (NOTE [block-wise quantization]); GatheredParameters still gathers exact values.
  bool quantize_weights = false;
  // zero_hpz_partition_size (ZeRO++ hpZ): R > 1 keeps a secondary partition inside each host of
  // R ranks for backward's gathers (NOTE [secondary partition]); the communicator's host group
  // must have R ranks. 1: off.
  int secondary_group = 1;
  // offload_param nvme (NOTE [stage 3 parameter offload]): makes the swap file for the shards of
  // the units past the first `max_in_cpu` shard elements (their lengths in part order, training
  // dtype); null: every shard stays in memory.
  std::function<std::unique_ptr<ShardSwap>(const std::vector<int64_t>& numels,
                                           at::ScalarType dtype)>
      make_param_swapper;
  int64_t max_in_cpu = 0;
  // Makes where the rank's gradient shard of `numel` elements (training dtype) is summed: on disk
  // with both offloads on nvme (NOTE [gradients on disk] in offload/grad_swapper.h); null: in
  // memory.
  std::function<std::unique_ptr<GradShard>(int64_t numel, at::ScalarType dtype)> make_grad_shard;
};

class Stage3 final : public Strategy {
 public:
  // `np`: model's trainable parameters (fp32, whole, every rank already holding rank 0's values).
  Stage3(torch::nn::Module& model, NamedParams np, comm::Communicator& comm,
         const StrategyOptions& options, const Stage3Options& s3, const PartTapFactory& make_tap);
  ~Stage3() override;

  // ----- Strategy
  int64_t numel() const override { return numel_; }
  int64_t part_numel() const override { return part_numel_; }
  bool replicated() const override { return false; }
  int64_t part_begin() const override { return 0; }
  at::Tensor flat_params() const override { return at::Tensor(); }
  at::TensorOptions options() const override { return options_; }
  GradReducer& reducer() override { return *reducer_; }
  bool reduces_every_backward() const override { return true; }
  void reduce_accumulated() override;
  std::vector<Part> parts() override;
  void before_backward(const at::Tensor& loss) override;
  void after_backward() override;
  void before_update() override;
  void publish_params() override;
  int64_t param_bytes() const override;
  int64_t param_swap_buffer_bytes() const override {
    return param_swap_ ? param_swap_->buffer_bytes() : 0;
  }
  int64_t param_host_bytes() const override { return param_swap_ ? param_swap_->host_bytes() : 0; }
  int64_t grad_swap_buffer_bytes() const override { return reducer_->shard().buffer_bytes(); }
  std::vector<CheckpointGroup> checkpoint_groups() const override;
  bool gathered_scope_open() const override { return !scopes_.empty(); }
  int64_t gathered_peak_bytes() const override { return fetcher_.peak_live_bytes(); }
  FetchStats take_fetch_stats() override;

  // ----- zero::call (unit_call.cpp) and the units' autograd functions
  int num_units() const { return static_cast<int>(units_.size()); }
  const std::string& unit_name(int u) const { return units_[u].storage.name; }
  // Runs `fn` as unit `u` (zero::call / zero::checkpoint).
  std::vector<at::Tensor> run_unit(int u, const detail::UnitFn& fn,
                                   const std::vector<at::Tensor>& inputs, bool recompute);
  // Backward reached u's outputs (UnitOutputs / a checkpoint's recompute): gathers u.
  void enter_backward(int u);
  // Backward passed u's inputs (UnitInputs / a checkpoint's end).
  void inputs_done(int u);

  // NOTE [released reads]: the observer's check of one input tensor of op `op`.
  void check_read(const at::Tensor& t, const char* op) noexcept;

  // zero::load_weights (include/dscpp/zero.h): this rank's byte ranges of a safetensors file.
  std::map<std::string, std::string> load_weights(const std::string& path);
  // Bytes of tensor data the last load_weights read.
  uint64_t last_load_bytes() const { return last_load_bytes_; }

  // ----- GatheredParameters (include/dscpp/zero.h); a collective
  // Gathers the units that hold `module`'s parameters; returns the scope's id.
  int open_scope(torch::nn::Module& module, std::optional<int> modifier_rank);
  // Writes the modifier rank's values back (if any) and releases the scope's units.
  void close_scope(int scope);
  // Closes the scope without communicating (an exception is unwinding).
  void abandon_scope(int scope);

 private:
  struct Unit {
    torch::nn::Module* module = nullptr;
    FlatLayout layout;
    int group = 0;            // in the reducer
    int64_t part_offset = 0;  // of its shard in this rank's part
    FetchUnit storage;
    // Its sharded parameters, their names and shapes when sharded (checked at each request).
    std::vector<at::Tensor> params;
    std::vector<std::string> names;
    std::vector<std::vector<int64_t>> shapes;
    int disk = -1;  // its shard's index in the parameter swap file, or -1: in memory
    int held = 0;   // GatheredParameters scopes holding it gathered
    // In the current backward (NOTE [stage 3 backward]).
    int pending_inputs = 0;  // UnitInputs made in forward whose backward has not run
    bool in_backward = false;
    bool grads_done = false;
  };
  // ----- set-up (stage3_layout.cpp), the constructor's steps in order
  // The flat layouts and this rank's part (the resident shard, then each unit's); with
  // offload_param nvme which shards go to disk (the swap file made). Returns the elements of
  // unit shards kept in memory.
  int64_t lay_out(const UnitAssignment& a);
  // The resident group's flat buffer (whole on every rank), its part handed to the tap.
  void flatten_resident(const NamedParams& resident);
  // Each unit's parameters become views of its gathered storage; this rank's shard kept in
  // shards_ (or written to disk), taken from zero::Init's shard or from the whole values.
  void shard_units(const std::vector<NamedParams>& sharded, int64_t in_memory);
  // Refuses a module zero::Init sharded that is no unit here (its values are gone).
  void check_no_presharded_left(torch::nn::Module& model);
  // The gradient path: the resident group (group 0), then the units in order.
  void build_reducer(const UnitAssignment& a, const ReduceOptions& reduce);
  // Rank 0: the layout's log line, and the keep-gathered warning when it applies.
  void report_layout() const;

  // Launches u's all-gather (fetcher.h), bringing its shard in from disk first when it is there.
  void gather(int u, Gather kind);
  // The kind of gather a request made now needs: backward's (hpZ's secondary), a training
  // forward's, or an evaluation's.
  Gather request_kind() const;
  // The kind of gather ahead for record_[j]: backward's for a request of backward's.
  Gather ahead_kind(size_t j) const;
  // hpZ: every unit's secondary shard goes back to the pool (backward is over, or the shards
  // change).
  void drop_secondaries();
  // Reads ahead the shards on disk of the next requests in the record.
  void read_ahead();
  // Ensures u is gathered and its all-gather done; with `record`, records / follows the order
  // and prefetches (NOTE [stage 3 prefetch order]).
  void request(int u, bool record);
  // request() without the context a collective's error gets.
  void request_gathered(int u, bool record);
  void prefetch();
  // prefetch()'s all-gathers of the next requests' units.
  void gather_ahead();
  // Whether u's next request in the record comes within stage3_max_reuse_distance elements.
  bool reused_soon(int u) const;
  // Releases u unless backward still needs it or it is reused soon.
  void maybe_release(int u);
  void on_group_complete(int group);
  void check_order_across_ranks();
  void check_request_across_ranks(int u);
  // Throws naming the parameter when one of u's was replaced or reshaped after sharding.
  void check_unchanged(int u) const;
  // Debug mode: throws naming the parameter when the loss's graph uses a unit's parameter
  // outside that unit's zero::call (where it was released).
  void check_used_inside_units(const at::Tensor& loss) const;
  // Throws the error a destructor could not (a scope closed out of order), once.
  void raise_deferred();
  // Replaces the tensors that require grad by Fn's outputs (UnitInputs / UnitOutputs) over them;
  // false when none does.
  template <typename Fn>
  static bool thread_through(std::vector<at::Tensor>& tensors, int64_t owner, int u);
  // Rank `root`'s values of u's (or the resident group's, u = -1) parameters become every
  // rank's, in the shard and through the part tap (master weights).
  void write_back(int u, int root);
  void register_units();
  void unregister_units();
  // NOTE [released reads]: the first pass's observer, on the thread that built the engine.
  void start_watching();
  void stop_watching();
  // While one lives, this thread's ops are stage 3's own (gathers, releases): not watched.
  struct OwnOps {
    OwnOps();
    ~OwnOps();
    OwnOps(const OwnOps&) = delete;
    OwnOps& operator=(const OwnOps&) = delete;
  };

  comm::Communicator& comm_;
  Stage3Options s3_;
  at::TensorOptions options_;
  int64_t numel_ = 0, part_numel_ = 0;
  bool whole_model_unit_ = false;  // no policy: the model is one unit

  FlatLayout resident_layout_;
  at::Tensor resident_flat_;  // [padded] the resident group's parameters (whole on every rank)
  int64_t allgather_bucket_size_ = 0;
  std::vector<Unit> units_;
  at::Tensor shards_;  // [sum of the in-memory units' shards] this rank's shards, training dtype
  // offload_param nvme: the other units' shards (NOTE [stage 3 parameter offload]).
  std::unique_ptr<ShardSwap> param_swap_;
  std::unique_ptr<SlotReducer> reducer_;
  ParamFetcher fetcher_;
  int running_ = -1;  // the unit whose fn runs now (units do not nest)
  bool backward_ = false;  // between before_backward and after_backward
  int64_t registry_id_ = 0;
  torch::nn::Module* model_ = nullptr;
  PartTap tap_;  // mixed precision: the master weights take written-back values through it
  std::vector<at::Tensor> resident_params_;
  std::vector<std::string> resident_names_;
  // Open GatheredParameters scopes, innermost last: the units each gathered (-1: the resident
  // group) and its modifier rank.
  struct Scope {
    int id;
    std::vector<int> units;
    bool resident = false;
    std::optional<int> modifier;
  };
  std::vector<Scope> scopes_;
  std::string deferred_error_;
  // NOTE [released reads]
  uint64_t watch_handle_ = 0;  // the observer (at::CallbackHandle), 0 once removed
  bool watch_paused_ = false;  // in backward
  std::unordered_map<const c10::StorageImpl*, int> unit_of_storage_;
  std::vector<char> reported_;  // per unit: named already
  uint64_t last_load_bytes_ = 0;
  int next_scope_ = 0;

  // NOTE [stage 3 prefetch order]
  std::vector<int> record_;   // requests of the recorded step
  std::vector<int> current_;  // requests of this step so far
  // Where backward's requests begin in record_ and current_: a gather ahead for one of them is
  // backward's (hpZ's host gather, NOTE [secondary partition]) even when forward issues it.
  size_t record_backward_ = 0, current_backward_ = 0;
  bool following_ = false;    // this step follows record_
  bool dropped_ = false;      // this pass left the record
  size_t cursor_ = 0;         // next expected request in record_
  FetchStats stats_;
};

}  // namespace dscpp::zero
