// Implements CommsLogger (see comms_logger.h).
#include "comm/comms_logger.h"

#include <fmt/format.h>

#include <algorithm>

#include "util/log.h"

namespace dscpp::comm {

double bus_bandwidth_factor(OpKind kind, int world_size) {
  double n = world_size;
  switch (kind) {
    case OpKind::all_reduce:
      return n > 1 ? 2.0 * (n - 1) / n : 1.0;
    case OpKind::reduce_scatter:
    case OpKind::all_gather:
      return n > 1 ? (n - 1) / n : 1.0;
    default:
      return 1.0;
  }
}

CommsLogger::CommsLogger(CommsLoggerConfig config, int world_size)
    : config_(std::move(config)), world_size_(world_size) {}

bool CommsLogger::wanted(OpKind kind) const {
  if (config_.prof_all) return true;
  return std::find(config_.prof_ops.begin(), config_.prof_ops.end(), op_kind_name(kind)) !=
         config_.prof_ops.end();
}

namespace {
std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return fmt::format("{:.{}f} {}", b, u == 0 ? 0 : 2, units[u]);
}
std::string human_rate(double bytes_per_s) { return human_bytes(bytes_per_s) + "/s"; }
}  // namespace

void CommsLogger::record(const OpDesc& op, int64_t bytes, std::chrono::nanoseconds latency,
                         const Traffic& sent) {
  if (!config_.enabled || !wanted(op.kind)) return;
  double s = std::chrono::duration<double>(latency).count();
  {
    std::lock_guard<std::mutex> g(mu_);
    auto& st = stats_[{static_cast<int>(op.kind), bytes}];
    st.sent.own_host += sent.own_host;
    st.sent.other_hosts += sent.other_hosts;
    st.sent.counted = (st.count == 0 || st.sent.counted) && sent.counted;
    st.count++;
    st.total_s += s;
    st.min_s = std::min(st.min_s, s);
    st.max_s = std::max(st.max_s, s);
  }
  if (config_.verbose) {
    double algbw = s > 0 ? bytes / s : 0;
    DSCPP_LOG_INFO("comm op: {} | msg size: {} | time: {:.3f} ms | algbw: {} | busbw: {}",
                   op_kind_name(op.kind), human_bytes(bytes), s * 1e3, human_rate(algbw),
                   human_rate(algbw * bus_bandwidth_factor(op.kind, world_size_)));
  }
}

std::string CommsLogger::summary() const {
  std::lock_guard<std::mutex> g(mu_);
  if (stats_.empty()) return "";
  std::string out =
      fmt::format("{:<16} {:>12} {:>7} {:>12} {:>12} {:>12} {:>14} {:>14} {:>14} {:>14}\n",
                  "operation", "msg size", "count", "total ms", "mean ms", "max ms", "algbw",
                  "busbw", "sent own host", "sent to hosts");
  for (const auto& [key, st] : stats_) {
    auto kind = static_cast<OpKind>(key.first);
    double mean = st.total_s / st.count;
    double algbw = mean > 0 ? key.second / mean : 0;
    // Totals over the calls; "-" where the backend's own algorithm moved the bytes.
    auto sent = [&](int64_t b) { return st.sent.counted ? human_bytes(b) : std::string("-"); };
    out += fmt::format(
        "{:<16} {:>12} {:>7} {:>12.3f} {:>12.3f} {:>12.3f} {:>14} {:>14} {:>14} {:>14}\n",
        op_kind_name(kind), human_bytes(key.second), st.count, st.total_s * 1e3, mean * 1e3,
        st.max_s * 1e3, human_rate(algbw),
        human_rate(algbw * bus_bandwidth_factor(kind, world_size_)), sent(st.sent.own_host),
        sent(st.sent.other_hosts));
  }
  return out;
}

}  // namespace dscpp::comm
