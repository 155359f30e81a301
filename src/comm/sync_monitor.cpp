// Implements SyncMonitor and the sync report table; see NOTE [sync report] in sync_monitor.h.
#include "comm/sync_monitor.h"

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <sstream>

#include "util/log.h"

namespace dscpp::comm {
namespace {

std::vector<uint8_t> to_bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string from_bytes(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

std::string join_ranks(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? "," : "") + std::to_string(ranks[i]);
  return out;
}

}  // namespace

std::string RankRecord::serialize() const {
  return fmt::format("{} {} {} {} {} {} {} {}", rank, seq, static_cast<int>(op.kind),
                     static_cast<int>(op.dtype), op.numel, op.peer, step, completed ? 1 : 0);
}

std::optional<RankRecord> RankRecord::parse(const std::string& s) {
  std::istringstream is(s);
  RankRecord r;
  int kind = 0, dtype = 0, done = 0;
  if (!(is >> r.rank >> r.seq >> kind >> dtype >> r.op.numel >> r.op.peer >> r.step >> done))
    return std::nullopt;
  r.op.kind = static_cast<OpKind>(kind);
  r.op.dtype = static_cast<c10::ScalarType>(dtype);
  r.completed = done != 0;
  return r;
}

std::string format_sync_report(int reporter, int world_size, const std::string& what,
                               const std::vector<std::optional<RankRecord>>& records,
                               bool store_silent) {
  std::string out = fmt::format("{} on rank {}. Last collective of each rank:\n", what, reporter);
  out += fmt::format("  {:>4}  {:>5}  {:<16} {:<9} {:>12}  {:>6}  {}\n", "rank", "seq",
                     "operation", "dtype", "elements", "step", "state");
  int64_t max_seq = 0;
  std::vector<int> missing;
  for (int r = 0; r < world_size; ++r) {
    const auto& rec = records[r];
    if (!rec && store_silent) {
      out += fmt::format("  {:>4}  {:>5}  {}\n", r, "-", "unknown (the store did not answer)");
      continue;
    }
    if (!rec) {
      missing.push_back(r);
      out += fmt::format("  {:>4}  {:>5}  {}\n", r, "-",
                         "no answer (process dead, hung outside dscpp, or unreachable)");
      continue;
    }
    max_seq = std::max(max_seq, rec->seq);
    std::string op = rec->seq == 0 ? "(none yet)" : op_kind_name(rec->op.kind);
    out += fmt::format("  {:>4}  {:>5}  {:<16} {:<9} {:>12}  {:>6}  {}\n", r, rec->seq, op,
                       rec->seq == 0 ? std::string("-") : dtype_name(rec->op.dtype), rec->op.numel,
                       rec->step, rec->completed ? "completed" : "waiting in it");
  }
  if (store_silent) {
    return out +
           "rank 0 did not answer: the store every rank reports through runs in rank 0's "
           "process, so rank 0 is stopped (SIGSTOP, a debugger), hung outside dscpp, or its "
           "host is unreachable.\nHINT: look at rank 0's process and output.\n";
  }
  // Ranks behind: those whose last collective is older than the newest one any rank entered.
  std::vector<int> behind, ahead;
  const RankRecord* newest = nullptr;
  for (int r = 0; r < world_size; ++r) {
    if (!records[r]) continue;
    if (records[r]->seq < max_seq) behind.push_back(r);
    else {
      ahead.push_back(r);
      newest = &*records[r];
    }
  }
  if (!behind.empty() && newest) {
    for (int r : behind) {
      out += fmt::format(
          "rank {} is behind: its last collective is #{}, and it never entered #{} ({}) that "
          "rank(s) {} {}.\n",
          r, records[r]->seq, records[r]->seq + 1,
          records[r]->seq + 1 == max_seq ? newest->op.to_string() : std::string("and later ones"),
          join_ranks(ahead), newest->completed ? "entered" : "are waiting in");
    }
    out += "HINT: every rank must issue the same collectives in the same order; look for a "
           "branch, early exit or exception on the rank(s) behind.\n";
  }
  if (!missing.empty()) {
    out += fmt::format(
        "rank(s) {} did not answer: the process died, is stuck outside dscpp's collectives, or "
        "cannot reach rank 0's host over the network.\n"
        "HINT: look at the output of rank(s) {} (dscpp launch prints the error lines and last "
        "lines of a rank that died), and whether their hosts still reach each other ('dscpp "
        "check').\n",
        join_ranks(missing), join_ranks(missing));
  }
  // Ranks at the same number but in different operations: one issued a collective the others
  // did not (over TCP nothing checks the shapes unless DSCPP_DEBUG_SYNC is set).
  std::string differ;
  for (int r = 0; r < world_size && newest; ++r) {
    const auto& rec = records[r];
    if (!rec || rec->seq != max_seq) continue;
    if (rec->op.kind != newest->op.kind || rec->op.dtype != newest->op.dtype ||
        rec->op.numel != newest->op.numel || rec->op.peer != newest->op.peer) {
      differ = fmt::format("rank {} entered {}", r, rec->op.to_string());
    }
  }
  if (!differ.empty()) {
    const int last = ahead.back();
    out += fmt::format(
        "the ranks entered different operations as collective #{}: {}, rank {} entered {}: a "
        "rank issued a collective the others did not.\nHINT: every rank must issue the same "
        "collectives in the same order (a call made on some ranks only, such as "
        "save_checkpoint inside `if (rank == 0)`); DSCPP_DEBUG_SYNC=1 reports this at once.\n",
        max_seq, differ, last, records[last]->op.to_string());
  } else if (behind.empty() && missing.empty()) {
    out += "All ranks entered the same collective; it did not complete in time.\n"
           "HINT: a slow or blocked network, or a timeout too short for the message size "
           "(DSCPP_COMM_TIMEOUT, in seconds).\n";
  }
  return out;
}

struct SyncMonitor::Shared {
  c10::intrusive_ptr<c10d::Store> store;
  std::string prefix;
  int rank = 0;
  int world_size = 1;
  std::mutex mu;  // guards last, watcher_done
  RankRecord last;
  std::condition_variable cv;
  bool watcher_done = false;
  std::atomic<bool> stop{false};

  RankRecord snapshot() {
    std::lock_guard<std::mutex> g(mu);
    return last;
  }
  void publish() {
    store->set(prefix + "/state/" + std::to_string(rank), to_bytes(snapshot().serialize()));
  }
};

SyncMonitor::SyncMonitor(c10::intrusive_ptr<c10d::Store> store, std::string prefix, int rank,
                         int world_size)
    : shared_(std::make_shared<Shared>()) {
  shared_->store = std::move(store);
  shared_->prefix = std::move(prefix);
  shared_->rank = rank;
  shared_->world_size = world_size;
  shared_->last.rank = rank;
  watcher_ = std::thread([s = shared_] { watch(s); });
}

SyncMonitor::~SyncMonitor() {
  shared_->stop = true;
  std::unique_lock<std::mutex> lk(shared_->mu);
  // The watcher sleeps kPollInterval between store calls; one that is not back well after that
  // is blocked in the store (rank 0 stopped or gone) and is left behind, holding its state.
  if (shared_->cv.wait_for(lk, 3 * kPollInterval, [&] { return shared_->watcher_done; })) {
    lk.unlock();
    watcher_.join();
  } else {
    lk.unlock();
    watcher_.detach();
  }
}

void SyncMonitor::on_enter(int64_t seq, const OpDesc& op, int64_t step) {
  std::lock_guard<std::mutex> g(shared_->mu);
  RankRecord& last = shared_->last;
  last.seq = seq;
  last.op = op;
  last.step = step;
  last.completed = false;
}

void SyncMonitor::on_complete(int64_t seq) {
  std::lock_guard<std::mutex> g(shared_->mu);
  if (shared_->last.seq == seq) shared_->last.completed = true;
}

void SyncMonitor::watch(const std::shared_ptr<Shared>& s) {
  const std::string alarm = s->prefix + "/alarm";
  while (!s->stop) {
    try {
      if (s->store->check({alarm})) {
        s->publish();
        // Keep answering with a fresh record while the alarm stands (cheap, and the reporter
        // may read again).
        for (int i = 0; i < 10 && !s->stop; ++i) std::this_thread::sleep_for(kPollInterval);
        continue;
      }
    } catch (const std::exception& e) {
      // The store lives on rank 0; once it is gone there is nobody to answer.
      DSCPP_LOG_DEBUG("sync monitor: store unreachable ({}); watcher stops", e.what());
      break;
    }
    std::this_thread::sleep_for(kPollInterval);
  }
  std::lock_guard<std::mutex> g(s->mu);
  s->watcher_done = true;
  s->cv.notify_all();
}

std::string SyncMonitor::report(const std::string& what, int exited_rank) {
  // The exchange runs on a thread of its own that may block in the store for good; it fills
  // `records` (its own copy) and signals through `done`.
  struct Exchange {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::vector<std::optional<RankRecord>> records;
    std::string error;
  };
  auto ex = std::make_shared<Exchange>();
  std::thread([s = shared_, ex, exited_rank] {
    std::vector<std::optional<RankRecord>> records(s->world_size);
    std::string error;
    try {
      s->store->set(s->prefix + "/alarm", to_bytes(std::to_string(s->rank)));
      s->publish();
      std::vector<std::string> keys, awaited;  // a rank known to have exited cannot answer
      for (int r = 0; r < s->world_size; ++r) {
        keys.push_back(s->prefix + "/state/" + std::to_string(r));
        if (r != exited_rank) awaited.push_back(keys.back());
      }
      auto deadline = std::chrono::steady_clock::now() + kAnswerWait;
      while (std::chrono::steady_clock::now() < deadline && !s->store->check(awaited))
        std::this_thread::sleep_for(kPollInterval);
      // Give the others one more poll to refresh their records after seeing the alarm.
      std::this_thread::sleep_for(kPollInterval);
      for (int r = 0; r < s->world_size; ++r) {
        if (r != s->rank && s->store->check({keys[r]}))
          records[r] = RankRecord::parse(from_bytes(s->store->get(keys[r])));
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
    std::lock_guard<std::mutex> g(ex->mu);
    ex->records = std::move(records);
    ex->error = std::move(error);
    ex->done = true;
    ex->cv.notify_all();
  }).detach();

  std::unique_lock<std::mutex> lk(ex->mu);
  const auto limit = kAnswerWait + 2 * kPollInterval + kStoreGrace;
  const bool answered = ex->cv.wait_for(lk, limit, [&] { return ex->done; });
  std::vector<std::optional<RankRecord>> records =
      answered ? ex->records : std::vector<std::optional<RankRecord>>(shared_->world_size);
  records[shared_->rank] = shared_->snapshot();
  if (!answered) {
    return format_sync_report(shared_->rank, shared_->world_size, what, records,
                              /*store_silent=*/true) +
           fmt::format("(the store on rank 0 did not answer within {:.1f} s)\n",
                       std::chrono::duration<double>(limit).count());
  }
  if (!ex->error.empty()) {
    return format_sync_report(shared_->rank, shared_->world_size, what, records) +
           fmt::format("(the store on rank 0 could not be reached to ask the others: {})\n",
                       ex->error);
  }
  return format_sync_report(shared_->rank, shared_->world_size, what, records);
}

}  // namespace dscpp::comm
