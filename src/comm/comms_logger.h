// CommsLogger: DeepSpeed's comms_logger for dscpp. Records each collective's operation, size and
// latency, and summarises per operation and message size: count, total and mean latency,
// algorithmic bandwidth (bytes / time) and bus bandwidth (algbw times the ring factor:
// 2(n-1)/n for all_reduce, (n-1)/n for reduce_scatter and all_gather, 1 otherwise), the number
// that can be compared with the link's speed, and the bytes this rank sent over TCP to ranks on
// its own host and on other hosts (shared memory sends none). Thread-safe.
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "comm/op_desc.h"
#include "dscpp/config.h"

namespace dscpp::comm {

double bus_bandwidth_factor(OpKind kind, int world_size);

class CommsLogger {
 public:
  CommsLogger(CommsLoggerConfig config, int world_size);

  bool enabled() const { return config_.enabled; }
  // `bytes` is the message size as DeepSpeed counts it (the full buffer for all_reduce, the
  // gathered/scattered buffer for all_gather/reduce_scatter); `sent`: what this rank sent over
  // TCP to ranks on its own host and on other hosts.
  void record(const OpDesc& op, int64_t bytes, std::chrono::nanoseconds latency,
              const Traffic& sent = {});
  // The summary table, one row per (operation, message size); empty when nothing was recorded.
  std::string summary() const;

 private:
  struct Stats {
    int64_t count = 0;
    double total_s = 0;
    double min_s = 1e30, max_s = 0;
    Traffic sent;  // summed; counted only when every call's was
  };
  bool wanted(OpKind kind) const;

  CommsLoggerConfig config_;
  int world_size_;
  mutable std::mutex mu_;
  std::map<std::pair<int, int64_t>, Stats> stats_;  // (OpKind, bytes) -> stats
};

}  // namespace dscpp::comm
