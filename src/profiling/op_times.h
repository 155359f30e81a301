// Op times: where a step's time goes inside libtorch, for wall_clock_breakdown's op table.
//
// NOTE [op times]: while an OpTimes lives, libtorch's RecordFunction calls it at the start and
// end of every ATen op and autograd node run on the thread that made it (a thread-local
// callback, which autograd carries into its worker threads). Each call's self time is its wall
// time less that of the calls it made (aten::linear less its aten::addmm; an autograd node such
// as MmBackward0 less the aten::mm of its formula: autograd's own work), so self times add up to
// the time spent inside ops, each counted once; what a window spends outside every op is the
// engine's and the program's own work and waiting (for collectives, data). Collectives run on
// communicator threads that carry no callback: their time shows only as the engine's waits.
// On a GPU the host sees launch times, not kernel times, so the engine times ops of CPU models
// only. One OpTimes per process at a time (the callback finds it through a global): a second
// engine in the same process (thread ranks in a test) gets none.
#pragma once

#include <ATen/record_function.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace dscpp::profiling {

class OpTimes {
 public:
  struct Op {
    std::string name;
    int64_t calls = 0;
    double self_seconds = 0;
  };
  struct Summary {
    std::vector<Op> ops;        // by self time, largest first
    double in_ops_seconds = 0;  // wall time inside outermost ops (= the sum of self times)
    int64_t calls = 0;
  };

  // Starts timing on this thread. Throws Error when another OpTimes is active in this process.
  OpTimes();
  ~OpTimes();  // stops timing
  OpTimes(const OpTimes&) = delete;
  OpTimes& operator=(const OpTimes&) = delete;

  // What was timed since the last take() (or since construction), and starts afresh.
  Summary take();

  // Callbacks' entry point: a call that ended, with its self and whole times.
  void add(const char* name, double self_seconds, bool outermost, double seconds);

 private:
  at::CallbackHandle handle_ = 0;
  std::mutex mu_;
  struct Stat {
    int64_t calls = 0;
    double self_seconds = 0;
  };
  std::unordered_map<std::string, Stat> ops_;
  double in_ops_seconds_ = 0;
};

// The top `n` ops of a summary as lines for the step log, each with its share of `seconds`.
std::string format_op_table(const OpTimes::Summary& summary, double seconds, size_t n);

}  // namespace dscpp::profiling
