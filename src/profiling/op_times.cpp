// Op times (NOTE [op times] in op_times.h): RecordFunction callbacks that sum each op's self
// time, and the step log's table of the top ones.
#include "profiling/op_times.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>

#include "dscpp/error.h"

namespace dscpp::profiling {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic<OpTimes*> g_active{nullptr};

// The calls open on this thread, innermost last: the time their callees took so far.
thread_local std::vector<double> t_child_seconds;

struct Context : at::ObserverContext {
  Clock::time_point start;
  size_t depth = 0;  // this call's index in t_child_seconds
};

std::unique_ptr<at::ObserverContext> start_callback(const at::RecordFunction&) {
  if (!g_active.load(std::memory_order_relaxed)) return nullptr;
  auto ctx = std::make_unique<Context>();
  ctx->depth = t_child_seconds.size();
  t_child_seconds.push_back(0);
  ctx->start = Clock::now();
  return ctx;
}

void end_callback(const at::RecordFunction& fn, at::ObserverContext* base) {
  const auto end = Clock::now();
  if (!base) return;
  auto* ctx = static_cast<Context*>(base);
  const double seconds = std::chrono::duration<double>(end - ctx->start).count();
  const double children = ctx->depth < t_child_seconds.size() ? t_child_seconds[ctx->depth] : 0.0;
  t_child_seconds.resize(std::min(t_child_seconds.size(), ctx->depth));
  const bool outermost = t_child_seconds.empty();
  if (!outermost) t_child_seconds.back() += seconds;
  if (OpTimes* p = g_active.load(std::memory_order_relaxed))
    p->add(fn.name(), std::max(0.0, seconds - children), outermost, seconds);
}

}  // namespace

OpTimes::OpTimes() {
  OpTimes* none = nullptr;
  DSCPP_CHECK(g_active.compare_exchange_strong(none, this), Error,
              "op times: another engine in this process is timing ops already (one at a time per "
              "process)");
  handle_ = at::addThreadLocalCallback(
      at::RecordFunctionCallback(start_callback, end_callback)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
}

OpTimes::~OpTimes() {
  at::removeCallback(handle_);
  OpTimes* self = this;
  g_active.compare_exchange_strong(self, nullptr);
}

void OpTimes::add(const char* name, double self_seconds, bool outermost, double seconds) {
  std::lock_guard<std::mutex> g(mu_);
  Stat& s = ops_[name];
  s.calls++;
  s.self_seconds += self_seconds;
  if (outermost) in_ops_seconds_ += seconds;
}

OpTimes::Summary OpTimes::take() {
  std::lock_guard<std::mutex> g(mu_);
  Summary s;
  s.in_ops_seconds = in_ops_seconds_;
  for (auto& [name, stat] : ops_) {
    s.ops.push_back({name, stat.calls, stat.self_seconds});
    s.calls += stat.calls;
  }
  std::sort(s.ops.begin(), s.ops.end(), [](const Op& a, const Op& b) {
    return a.self_seconds != b.self_seconds ? a.self_seconds > b.self_seconds : a.name < b.name;
  });
  ops_.clear();
  in_ops_seconds_ = 0;
  return s;
}

std::string format_op_table(const OpTimes::Summary& summary, double seconds, size_t n) {
  auto share = [seconds](double s) { return seconds > 0 ? 100 * s / seconds : 0.0; };
  std::string r = fmt::format(
      "ops by self time: {:.1f} ms inside libtorch ops ({:.1f}% of the time), {:.1f} ms outside "
      "them ({} calls)",
      summary.in_ops_seconds * 1e3, share(summary.in_ops_seconds),
      std::max(0.0, seconds - summary.in_ops_seconds) * 1e3, summary.calls);
  double shown = 0;
  for (size_t i = 0; i < summary.ops.size() && i < n; ++i) {
    const auto& op = summary.ops[i];
    r += fmt::format("\n  {:>5.1f}%  {:>9.1f} ms  {:>7} calls  {}", share(op.self_seconds),
                     op.self_seconds * 1e3, op.calls, op.name);
    shown += op.self_seconds;
  }
  if (summary.ops.size() > n) {
    r += fmt::format("\n  {:>5.1f}%  {:>9.1f} ms  {:>7} ops    the others",
                     share(summary.in_ops_seconds - shown), (summary.in_ops_seconds - shown) * 1e3,
                     summary.ops.size() - n);
  }
  return r;
}

}  // namespace dscpp::profiling
