// SyncMonitor: remembers the last collective this rank entered and, when a collective times
// out or fails, gathers every rank's record through the store and builds the report.
//
// NOTE [sync report]
// Each rank keeps its last collective (sequence number, operation, dtype, elements, step, and
// whether it completed) in memory; nothing is written per collective. A watcher thread polls
// the store key "<prefix>/alarm" every kPollInterval through its own store client. A rank whose
// collective times out (or fails) sets the alarm, publishes its record under
// "<prefix>/state/<rank>", and waits up to kAnswerWait for the others (not for a rank seen to have
// exited, see PeerExited). Every rank's watcher that
// sees the alarm publishes its record too, whatever its training thread is doing (computing,
// blocked in another collective, sleeping). The rank that timed out then prints a table of who
// reached what, and names the ranks that are behind (lowest sequence number) with the collective
// they never entered, or the ranks that did not answer at all (dead, or hung outside dscpp).
// Every rank that times out builds the same table, so each surviving rank reports it.
//
// The store is served by rank 0, and a store call to a stopped rank 0 blocks in the socket until
// the store's own limit (the rendezvous timeout, 300 s by default, plus a grace; StoreClient),
// far beyond a report's wait. So no store call runs on a thread that must
// finish: the watcher and each report's exchange own their state through a shared pointer, the
// reporter waits for the exchange at most kAnswerWait + kStoreGrace (then reports that the
// store did not answer, naming rank 0), and the destructor leaves a watcher stuck in the store
// behind instead of joining it.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/op_desc.h"

namespace dscpp::comm {

struct RankRecord {
  int rank = 0;
  int64_t seq = 0;  // 0: no collective entered yet
  OpDesc op;
  int64_t step = -1;
  bool completed = true;
  std::string serialize() const;
  static std::optional<RankRecord> parse(const std::string& s);
};

// Builds the report text from the records that answered (missing ranks have no record).
// `reporter` is the rank writing the report, `what` says what happened to it.
// `store_silent`: the store (on rank 0) did not answer, so only the reporter's record is known.
std::string format_sync_report(int reporter, int world_size, const std::string& what,
                               const std::vector<std::optional<RankRecord>>& records,
                               bool store_silent = false);

class SyncMonitor {
 public:
  static constexpr std::chrono::milliseconds kPollInterval{200};
  static constexpr std::chrono::milliseconds kAnswerWait{5000};
  static constexpr std::chrono::milliseconds kStoreGrace{1000};

  // `store` must be usable from the watcher thread concurrently with other users (a dedicated
  // StoreClient connection, or a thread-safe HashStore in tests). Keys live under `prefix`.
  SyncMonitor(c10::intrusive_ptr<c10d::Store> store, std::string prefix, int rank, int world_size);
  ~SyncMonitor();
  SyncMonitor(const SyncMonitor&) = delete;
  SyncMonitor& operator=(const SyncMonitor&) = delete;

  void on_enter(int64_t seq, const OpDesc& op, int64_t step);
  void on_complete(int64_t seq);

  // Raises the alarm, publishes this rank's record, collects the others' and returns the
  // report. Safe to call more than once (later calls rebuild the table).
  std::string report(const std::string& what, int exited_rank = -1);

 private:
  struct Shared;  // what the watcher and the exchanges use; outlives this object if they hang
  static void watch(const std::shared_ptr<Shared>& s);

  std::shared_ptr<Shared> shared_;
  std::thread watcher_;
};

}  // namespace dscpp::comm
