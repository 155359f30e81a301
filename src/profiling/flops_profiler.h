// The flops profiler: DeepSpeed's `flops_profiler` section for one optimizer window on rank 0.
//
// NOTE [flops profiler]: while a FlopsProfiler lives, libtorch's RecordFunction calls it on the
// thread that made it (a thread-local callback, which autograd carries into its worker threads)
// at the start and end of every op, autograd node and user scope. It counts the FLOPs of every
// matmul-like op from its input shapes (mm, addmm, bmm, baddbmm, addbmm: 2·n·k·m per product;
// convolution and its backward: 2 x output elements x input channels per group x kernel size,
// per gradient asked for), once: an op nested in one already counted (linear -> addmm) is not
// counted again. Each count and its time go to the current phase (forward, backward, optimizer:
// the engine says which) and, in forward, to every module scope open: zero::call / zero::checkpoint
// open one per unit, named by the unit's path in the model ("h.3"), and the built-in GPT opens
// "attn" and "mlp" inside its blocks; any RECORD_USER_SCOPE("name") a program opens counts too,
// as a child of the scope around it. The per-module table is of forward FLOPs and latency, as
// DeepSpeed's is; backward FLOPs (with activation checkpointing's recomputed forward) are counted
// for the window as a whole.
#pragma once

#include <ATen/record_function.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "dscpp/config.h"

namespace torch::nn {
class Module;
}

namespace dscpp::profiling {

enum class Phase { forward, backward, optimizer };

// The FLOPs of one op from its name and inputs (0 for an op that is not matmul-like).
// Exposed for the tests.
int64_t op_flops(const std::string& name, c10::ArrayRef<const c10::IValue> inputs);

// What the engine adds to the report: the window it profiled.
struct WindowInfo {
  int64_t step = 0;     // global_steps after the window
  int micro_steps = 0;  // this rank's micro-steps in it
  int world = 1;
  int64_t tokens = 0;  // tokens this rank trained in the window (0: unknown)
  double seconds = 0;  // the window's wall time
  double backward_s = 0, reduce_wait_s = 0, optimizer_s = 0;
  at::ScalarType dtype = at::kFloat;  // training dtype (for the matmul peak)
  // The model's device: op and scope times, the peak and the utilization are reported for CPU
  // models only (on a GPU the host sees launch times, not kernel times).
  at::Device device = at::kCPU;
};

class FlopsProfiler {
 public:
  // Starts counting on this thread. Throws Error when another profiler is active in this process.
  FlopsProfiler(const torch::nn::Module& model, FlopsProfilerConfig config);
  ~FlopsProfiler();  // stops counting
  FlopsProfiler(const FlopsProfiler&) = delete;
  FlopsProfiler& operator=(const FlopsProfiler&) = delete;

  void set_phase(Phase phase);
  // Stops counting, measures this machine's matmul peak in `info.dtype` on this process's threads
  // and returns the report (printed, or written to output_file, by the engine).
  std::string finish(const WindowInfo& info);

  // Totals so far, for the tests: FLOPs counted in a phase, and per module scope path.
  int64_t flops(Phase phase) const;
  int64_t module_flops(const std::string& path) const;

  // Callbacks' entry points (RecordFunction takes plain function pointers).
  std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn);
  void on_end(const at::RecordFunction& fn, at::ObserverContext* ctx);

 private:
  using Clock = std::chrono::steady_clock;
  struct OpStats {
    int64_t calls = 0, flops = 0;
    double seconds = 0;
  };
  struct ModuleStats {
    int64_t calls = 0, flops = 0;
    double seconds = 0;  // forward time inside the scope (wall)
  };

  const torch::nn::Module& model_;
  FlopsProfilerConfig config_;
  at::CallbackHandle handle_ = 0;
  mutable std::mutex mu_;
  Phase phase_ = Phase::forward;
  int counted_depth_ = 0;            // counted ops open (nesting)
  std::vector<std::string> scopes_;  // open module scope paths, innermost last
  OpStats phase_stats_[3];
  std::map<std::string, OpStats> ops_;  // by op name, whole window
  std::map<std::string, ModuleStats> modules_;
  std::vector<std::string> module_order_;  // first-seen order, for the table
  bool finished_ = false;
};

// zero::call / zero::checkpoint: the scope name of a unit's module while a profiler is active,
// "/" and its path from the model's root ("/h.3"); "" otherwise, or when the module is not in
// the profiled model.
std::string unit_scope_name(const torch::nn::Module& unit);

}  // namespace dscpp::profiling
