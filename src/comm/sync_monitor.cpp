// Implements SyncMonitor and the sync report table; see NOTE [sync report] in sync_monitor.h.
#include "comm/sync_monitor.h"

#include <fmt/format.h>

#include <algorithm>
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
                               const std::vector<std::optional<RankRecord>>& records) {
  std::string out = fmt::format("{} on rank {}. Last collective of each rank:\n", what, reporter);
  out += fmt::format("  {:>4}  {:>5}  {:<16} {:<9} {:>12}  {:>6}  {}\n", "rank", "seq",
                     "operation", "dtype", "elements", "step", "state");
  int64_t max_seq = 0;
  std::vector<int> missing;
  for (int r = 0; r < world_size; ++r) {
    const auto& rec = records[r];
    if (!rec) {
      missing.push_back(r);
      out += fmt::format("  {:>4}  {:>5}  {}\n", r, "-",
                         "no answer (process dead, or hung outside dscpp)");
      continue;
    }
    max_seq = std::max(max_seq, rec->seq);
    std::string op = rec->seq == 0 ? "(none yet)" : op_kind_name(rec->op.kind);
    out += fmt::format("  {:>4}  {:>5}  {:<16} {:<9} {:>12}  {:>6}  {}\n", r, rec->seq, op,
                       rec->seq == 0 ? std::string("-") : dtype_name(rec->op.dtype), rec->op.numel,
                       rec->step, rec->completed ? "completed" : "waiting in it");
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
        "rank(s) {} did not answer: the process died or is stuck outside dscpp's collectives.\n"
        "HINT: look at the output of rank(s) {} (dscpp launch prints the last lines of a rank "
        "that died).\n",
        join_ranks(missing), join_ranks(missing));
  }
  if (behind.empty() && missing.empty()) {
    out += "All ranks entered the same collective; it did not complete in time.\n"
           "HINT: a slow or blocked network, or a timeout too short for the message size "
           "(DSCPP_COMM_TIMEOUT, in seconds).\n";
  }
  return out;
}

SyncMonitor::SyncMonitor(c10::intrusive_ptr<c10d::Store> store, std::string prefix, int rank,
                         int world_size)
    : store_(std::move(store)), prefix_(std::move(prefix)), rank_(rank), world_size_(world_size) {
  last_.rank = rank;
  watcher_ = std::thread([this] { watch(); });
}

SyncMonitor::~SyncMonitor() {
  stop_ = true;
  if (watcher_.joinable()) watcher_.join();
}

void SyncMonitor::on_enter(int64_t seq, const OpDesc& op, int64_t step) {
  std::lock_guard<std::mutex> g(mu_);
  last_.seq = seq;
  last_.op = op;
  last_.step = step;
  last_.completed = false;
}

void SyncMonitor::on_complete(int64_t seq) {
  std::lock_guard<std::mutex> g(mu_);
  if (last_.seq == seq) last_.completed = true;
}

RankRecord SyncMonitor::snapshot() const {
  std::lock_guard<std::mutex> g(mu_);
  return last_;
}

void SyncMonitor::publish() {
  store_->set(prefix_ + "/state/" + std::to_string(rank_), to_bytes(snapshot().serialize()));
  published_ = true;
}

void SyncMonitor::watch() {
  const std::string alarm = prefix_ + "/alarm";
  while (!stop_) {
    try {
      if (store_->check({alarm})) {
        publish();
        // Keep answering with a fresh record while the alarm stands (cheap, and the reporter
        // may read again).
        for (int i = 0; i < 10 && !stop_; ++i) std::this_thread::sleep_for(kPollInterval);
        continue;
      }
    } catch (const std::exception& e) {
      // The store lives on rank 0; once it is gone there is nobody to answer.
      DSCPP_LOG_DEBUG("sync monitor: store unreachable ({}); watcher stops", e.what());
      return;
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

std::string SyncMonitor::report(const std::string& what) {
  std::vector<std::optional<RankRecord>> records(world_size_);
  try {
    store_->set(prefix_ + "/alarm", to_bytes(std::to_string(rank_)));
    publish();
    std::vector<std::string> keys;
    for (int r = 0; r < world_size_; ++r) keys.push_back(prefix_ + "/state/" + std::to_string(r));
    auto deadline = std::chrono::steady_clock::now() + kAnswerWait;
    while (std::chrono::steady_clock::now() < deadline && !store_->check(keys))
      std::this_thread::sleep_for(kPollInterval);
    // Give the others one more poll to refresh their records after seeing the alarm.
    std::this_thread::sleep_for(kPollInterval);
    for (int r = 0; r < world_size_; ++r) {
      if (r == rank_) {
        records[r] = snapshot();
      } else if (store_->check({keys[r]})) {
        records[r] = RankRecord::parse(from_bytes(store_->get(keys[r])));
      }
    }
  } catch (const std::exception& e) {
    records[rank_] = snapshot();
    return format_sync_report(rank_, world_size_, what, records) +
           fmt::format("(the store on rank 0 could not be reached to ask the others: {})\n",
                       e.what());
  }
  return format_sync_report(rank_, world_size_, what, records);
}

}  // namespace dscpp::comm
