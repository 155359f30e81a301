// Implements the injection points of fault_inject.h: DSCPP_FAULT_INJECT is parsed once, the
// first time anything asks; the points count visits in atomics and signal this process when
// the chosen visit comes.
#include "util/fault_inject.h"

#include <signal.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dscpp/error.h"
#include "dscpp/process_env.h"
#include "util/strings.h"

namespace dscpp::fault {
namespace {

constexpr std::array<const char*, kPhaseCount> kNames = {"forward",    "backward", "optimizer",
                                                         "all_gather", "save",     "offload_io"};

enum class Action { none, count, kill, stop, eio };

struct Plan {
  Action action = Action::none;
  Phase phase = Phase::forward;
  int rank = 0;       // the rank that acts
  long hit = 1;       // on its hit-th visit of the phase
  int own_rank = 0;   // this process's rank
  std::string error;  // why DSCPP_FAULT_INJECT is malformed; empty when it is not
};

constexpr const char* kFormat =
    "HINT: use kill:phase=P:rank=R:hit=N, stop:phase=P:rank=R:hit=N, eio:phase=P:rank=R:hit=N "
    "or count, with P one of forward, backward, optimizer, all_gather, save, offload_io (eio: "
    "save or offload_io); or unset it";

long parse_count(const std::string& key, const std::string& v, long min_value, Plan& plan) {
  char* end = nullptr;
  long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || x < min_value) {
    plan.error = key + "='" + v + "' is not an integer >= " + std::to_string(min_value);
    return min_value;
  }
  return x;
}

Plan parse(const char* text) {
  Plan plan;
  if (!text || !*text) return plan;
  const std::vector<std::string> parts = split(text, ':');
  if (parts[0] == "count") {
    plan.action = Action::count;
    if (parts.size() > 1) plan.error = "count takes no arguments";
  } else if (parts[0] == "kill" || parts[0] == "stop" || parts[0] == "eio") {
    plan.action = parts[0] == "kill"   ? Action::kill
                  : parts[0] == "stop" ? Action::stop
                                       : Action::eio;
    bool has_phase = false;
    for (size_t i = 1; i < parts.size() && plan.error.empty(); ++i) {
      const size_t eq = parts[i].find('=');
      const std::string key = parts[i].substr(0, eq);
      const std::string value = eq == std::string::npos ? "" : parts[i].substr(eq + 1);
      if (key == "phase") {
        has_phase = false;
        for (int p = 0; p < kPhaseCount; ++p) {
          if (value == kNames[p]) {
            plan.phase = static_cast<Phase>(p);
            has_phase = true;
          }
        }
        if (!has_phase) plan.error = "unknown phase '" + value + "'";
      } else if (key == "rank") {
        plan.rank = static_cast<int>(parse_count(key, value, 0, plan));
      } else if (key == "hit") {
        plan.hit = parse_count(key, value, 1, plan);
      } else {
        plan.error = "unknown field '" + parts[i] + "'";
      }
    }
    if (plan.error.empty() && !has_phase) plan.error = "no phase= given";
    if (plan.error.empty() && plan.action == Action::eio && plan.phase != Phase::save &&
        plan.phase != Phase::offload_io) {
      plan.error = "eio fails a write or read: its phase must be save or offload_io";
    }
  } else {
    plan.error = "unknown action '" + parts[0] + "'";
  }
  if (plan.error.empty()) plan.own_rank = detect_process_env().rank;
  if (!plan.error.empty()) plan.action = Action::none;
  return plan;
}

std::array<std::atomic<long>, kPhaseCount> visits{};

const Plan& the_plan();

void print_counts() {
  std::string line = "dscpp fault points: rank " + std::to_string(the_plan().own_rank);
  for (int p = 0; p < kPhaseCount; ++p)
    line += std::string(" ") + kNames[p] + "=" + std::to_string(visits[p].load());
  line += "\n";
  std::fputs(line.c_str(), stderr);
}

const Plan& the_plan() {
  static const Plan plan = [] {
    Plan p;
    try {
      p = parse(std::getenv("DSCPP_FAULT_INJECT"));
    } catch (const Error& e) {  // a malformed RANK: check_environment() reports it
      p.action = Action::none;
      p.error = e.what();
    }
    if (p.action == Action::count) std::atexit(print_counts);
    return p;
  }();
  return plan;
}

}  // namespace

const char* phase_name(Phase p) { return kNames[static_cast<int>(p)]; }

void check_environment() {
  const Plan& plan = the_plan();
  DSCPP_CHECK(plan.error.empty(), ConfigError, "DSCPP_FAULT_INJECT='",
              std::getenv("DSCPP_FAULT_INJECT"), "': ", plan.error, ". ", kFormat);
}

bool point(Phase p) {
  const Plan& plan = the_plan();
  if (plan.action == Action::none) return false;
  const long n = ++visits[static_cast<int>(p)];
  if (plan.action == Action::count || p != plan.phase || plan.own_rank != plan.rank ||
      n != plan.hit) {
    return false;
  }
  const char* what = plan.action == Action::kill   ? "SIGKILL"
                     : plan.action == Action::stop ? "SIGSTOP"
                                                   : "EIO";
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  char line[256];
  const int len = std::snprintf(line, sizeof line,
                                "dscpp fault injection: rank %d (pid %d) %s at %s (hit %ld) at "
                                "%.6f\n",
                                plan.own_rank, static_cast<int>(getpid()), what,
                                kNames[static_cast<int>(p)], n, now);
  if (len > 0) (void)!write(STDERR_FILENO, line, static_cast<size_t>(len));
  if (plan.action == Action::eio) return true;
  raise(plan.action == Action::kill ? SIGKILL : SIGSTOP);
  return false;
}

}  // namespace dscpp::fault
