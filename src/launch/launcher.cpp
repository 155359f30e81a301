// Implements run_job() and the pure pieces it is made of: host resolution, the choice of
// launcher, command construction for mpirun, srun and node agents, and the failure report.
// The child processes themselves are run by a ChildGroup (process_group.h). Everything runs
// on the caller's thread.
//
// NOTE [node agent protocol]: a multi-node ssh job runs one node agent per host:
//   sh -c 'exec <remote_cmd with {host} and {command}>'
// where {command} is `dscpp launch --node_agent --node_rank K --nnodes M --node_host H
// --num_procs S --rank_offset R --world_size W --master_addr A --master_port P --stop_grace G
// [--slots ..] [--enable_each_rank_log DIR] [--bind_cores_to_rank] --log_level L -- PROGRAM
// ARGS` (words encoded per NOTE [remote words]). The agent runs its S ranks with the same
// local machinery as a single-node job, prefixes their lines with "[rank N] " itself, and:
//  - its stdin carries one line first, the job's rendezvous secret (comm/job_secret.h), which
//    it puts in its ranks' environment; after that stdin is its lifeline: EOF (the main
//    launcher died or closed the pipe) stops its ranks at once;
//  - on the first failing rank it prints one NOTE [agent failure line] on stderr right away,
//    then stops its other ranks and exits with the failed rank's status;
//  - SIGTERM/SIGINT stop its ranks like they stop a launcher.
// The main launcher forwards the agents' lines unchanged, takes the first agent failure line
// (or the first agent that exits non-zero) as the cause, closes every agent's stdin and sends
// SIGTERM to the others, and SIGKILL after its grace. Agents get a grace 2 s shorter than the
// main launcher's, so they finish tearing down their ranks before they could be killed.
//
// NOTE [restarts]: with --max_restarts N (torchrun's name) a job that fails on its own (a rank
// exits non-zero or is killed; not a signal to the launcher) is stopped whole as always, then
// started again whole on the same hosts and master port, at most N times. Every start sets
// DSCPP_RESTART_COUNT to its number (0 first) in every rank's environment (carried to the hosts
// with the other DSCPP_ variables). The program resumes itself: `dscpp train --save_dir D
// --resume` loads D/latest and says how many steps were trained again.
//
// NOTE [elastic hosts]: with --nnodes MIN:MAX (ssh launcher) a restart may leave hosts out.
// After a failure, a host is lost when its node agent died by a signal before the launcher
// began to stop the job (something killed it), or when a probe of it (the remote-command
// template running `true`, all hosts at once, 15 s at most; ssh's 255 for a host it cannot
// reach) fails. Every host but the first kind is probed: how an agent the launcher stopped
// ended says nothing (ssh exits 255 on SIGTERM, a slow agent is SIGKILLed after the grace), and
// a 255 may be a rank's own exit status. Lost hosts are dropped for
// the rest of the job (a host that lost its agent is suspect; bringing it back is a new job),
// the others are renumbered in hostfile order, and the job starts again on them at the world
// size they give, while at least MIN remain. Rank 0 runs on the first remaining host; its
// name becomes the master address unless --master_addr was given (then losing the first host
// ends the job: the given address belongs to it). A rank failure on a healthy host drops
// nothing. The program re-resolves its batch for the new world size (dscpp train: the
// config's `elasticity` section keeps train_batch_size) and resumes from its last checkpoint.
#include "launch/launcher.h"

#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "comm/job_secret.h"
#include "dscpp/error.h"
#include "util/log.h"
#include "util/strings.h"

extern char** environ;

namespace dscpp::launch {
namespace {

constexpr const char* kEncodedPrefix = "@x:";

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

std::string join(const std::vector<std::string>& words, const std::string& sep = " ") {
  std::string out;
  for (size_t i = 0; i < words.size(); ++i) out += (i ? sep : "") + words[i];
  return out;
}

std::string join_ints(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

bool is_safe_word(const std::string& w) {
  if (w.empty()) return false;
  for (char c : w) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              std::strchr("_@%+=:,./-", c) != nullptr;
    if (!ok) return false;
  }
  return true;
}

// 'word' quoted for a POSIX shell, for messages a user may copy.
std::string shell_quote(const std::string& w) {
  if (is_safe_word(w)) return w;
  std::string out = "'";
  for (char c : w) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string quoted_command(const std::vector<std::string>& words) {
  std::vector<std::string> q;
  for (const auto& w : words) q.push_back(shell_quote(w));
  return join(q);
}

std::string ranks_text(const HostSlots& h) {
  if (h.num_procs() == 1) return "rank " + std::to_string(h.first_rank);
  return "ranks " + std::to_string(h.first_rank) + "-" +
         std::to_string(h.first_rank + h.num_procs() - 1);
}

std::vector<int> parse_slot_list(const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    char* end = nullptr;
    long v = std::strtol(item.c_str(), &end, 10);
    DSCPP_CHECK(!item.empty() && *end == '\0' && v >= 0 && v < (1 << 20), LaunchError, "--slots '",
                text, "' is not a comma-separated list of slot indices");
    out.push_back(static_cast<int>(v));
  }
  return out;
}

// The CPUs this process may run on (its affinity mask: taskset, cgroups).
std::vector<int> usable_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int i = 0; i < CPU_SETSIZE; ++i) {
      if (CPU_ISSET(i, &set)) cpus.push_back(i);
    }
  }
  if (cpus.empty()) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (long i = 0; i < std::max(1L, n); ++i) cpus.push_back(static_cast<int>(i));
  }
  return cpus;
}

// Local rank `i` of `n`'s share of `cpus`: an equal contiguous slice, or one CPU each
// (round robin) when there are more ranks than CPUs.
std::vector<int> cpu_slice(const std::vector<int>& cpus, int i, int n) {
  size_t per = cpus.size() / static_cast<size_t>(n);
  if (per == 0) return {cpus[static_cast<size_t>(i) % cpus.size()]};
  return {cpus.begin() + static_cast<ptrdiff_t>(per * i),
          cpus.begin() + static_cast<ptrdiff_t>(per * (i + 1))};
}

std::string describe_cpus(const std::vector<int>& cpus) {
  if (cpus.size() > 1 && cpus.back() - cpus.front() + 1 == static_cast<int>(cpus.size())) {
    return std::to_string(cpus.front()) + "-" + std::to_string(cpus.back());
  }
  return join_ints(cpus);
}

// This process's environment with `set` applied (replacing variables of the same name).
std::vector<std::string> child_env(const std::map<std::string, std::string>& set) {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    if (!set.count(kv.substr(0, kv.find('=')))) env.push_back(kv);
  }
  for (const auto& [k, v] : set) env.push_back(k + "=" + v);
  return env;
}

void mkdir_p(const std::string& dir) {
  std::string cur;
  std::stringstream ss(dir);
  if (!dir.empty() && dir[0] == '/') cur = "/";
  for (std::string part; std::getline(ss, part, '/');) {
    if (part.empty()) continue;
    cur += part + "/";
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) {
      DSCPP_FAIL(LaunchError, "cannot create the folder '", cur, "' for --enable_each_rank_log '",
                 dir, "': ", std::strerror(errno), ". HINT: choose a writable folder");
    }
  }
  struct stat st {};
  DSCPP_CHECK(
      ::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && ::access(dir.c_str(), W_OK) == 0,
      LaunchError, "--enable_each_rank_log '", dir,
      "' is not a writable folder. HINT: choose a writable folder");
}

std::string self_exe() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  DSCPP_CHECK(n > 0, LaunchError, "cannot read /proc/self/exe: ", std::strerror(errno),
              ". HINT: give the path of dscpp on the hosts with --remote_dscpp");
  return std::string(buf, static_cast<size_t>(n));
}

// The variables of this process that kForwardedEnv names, as NAME=VALUE.
std::vector<std::string> forwarded_env() {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    std::string name = kv.substr(0, kv.find('='));
    // The launcher sets these itself; the secret never goes on a command line.
    if (name == "DSCPP_LAUNCHER" || name == comm::kSecretEnv) continue;
    for (std::string f : kForwardedEnv) {
      if (f.back() == '_' ? starts_with(name, f) : name == f) {
        out.push_back(kv);
        break;
      }
    }
  }
  return out;
}

std::string current_dir() {
  char cwd[4096];
  return ::getcwd(cwd, sizeof(cwd)) ? std::string(cwd) : std::string("the current folder");
}

const char* getenv_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string format_seconds(double s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

std::string log_level_name(LogLevel l) {
  switch (l) {
    case LogLevel::debug:
      return "debug";
    case LogLevel::info:
      return "info";
    case LogLevel::warning:
      return "warning";
    case LogLevel::error:
      return "error";
  }
  return "info";
}

// Runs this node's ranks: `host` gives the slots and the first global rank. Used by a
// single-node job (agent = false: prints the failure report) and by a node agent (agent =
// true: prints the agent failure line, watches its stdin). `secret`: the job's rendezvous secret,
// put in each rank's environment only.
int run_ranks(const LaunchOptions& opts, const HostSlots& host, int world_size,
              const std::string& master_addr, const std::string& program_path, bool agent,
              const std::string& secret, int* stopped_by_signal = nullptr) {
  const int procs = host.num_procs();
  const std::vector<int> cpus = usable_cpus();
  std::map<std::string, std::string> common = {
      {"WORLD_SIZE", std::to_string(world_size)},
      {"LOCAL_WORLD_SIZE", std::to_string(procs)},
      {"MASTER_ADDR", master_addr},
      {"MASTER_PORT", std::to_string(opts.master_port)},
      {"DSCPP_LAUNCHER", "1"},
      {comm::kSecretEnv, secret},
  };
  if (!opts.bind_cores_to_rank && !std::getenv("OMP_NUM_THREADS")) {
    int threads = std::max(1, static_cast<int>(cpus.size()) / procs);
    common["OMP_NUM_THREADS"] = std::to_string(threads);
    DSCPP_LOG_INFO("OMP_NUM_THREADS is not set: using {} per process ({} on {}, {} cores)", threads,
                   ranks_text(host), host.host, cpus.size());
  }
  bool identity_slots = true;
  for (int i = 0; i < procs; ++i) identity_slots &= host.slots[i] == i;
  if (!identity_slots) {
    common["CUDA_VISIBLE_DEVICES"] = join_ints(host.slots);
    DSCPP_LOG_INFO("slots {} selected on {}: CUDA_VISIBLE_DEVICES={}", join_ints(host.slots),
                   host.host, common["CUDA_VISIBLE_DEVICES"]);
  }
  if (opts.bind_cores_to_rank && static_cast<int>(cpus.size()) < procs) {
    DSCPP_LOG_WARN("--bind_cores_to_rank: {} processes share {} cores on {}", procs, cpus.size(),
                   host.host);
  }
  if (!opts.enable_each_rank_log.empty()) {
    mkdir_p(opts.enable_each_rank_log);
    DSCPP_LOG_INFO("each rank writes its output to {}/rank_<N>.log", opts.enable_each_rank_log);
  }

  ChildGroupOptions group_opts;
  group_opts.grace = std::chrono::milliseconds(static_cast<long>(opts.stop_grace_s * 1000));
  group_opts.watch_stdin = agent;
  if (agent) {
    group_opts.on_cause = [](const Failure& f) { write_all(2, format_agent_failure(f) + "\n"); };
  }
  ChildGroup group(group_opts);
  DSCPP_LOG_INFO("starting {} on {}: world size {}, master {}:{}: {}", ranks_text(host), host.host,
                 world_size, master_addr, opts.master_port, quoted_command(opts.program));
  for (int i = 0; i < procs; ++i) {
    const int rank = host.first_rank + i;
    std::map<std::string, std::string> vars = common;
    vars["RANK"] = std::to_string(rank);
    vars["LOCAL_RANK"] = std::to_string(i);
    ChildSpec spec;
    spec.path = program_path;
    spec.argv = opts.program;
    spec.name = "rank " + std::to_string(rank) + " on " + host.host;
    spec.prefix = "[rank " + std::to_string(rank) + "] ";
    if (opts.bind_cores_to_rank) {
      spec.cpus = cpu_slice(cpus, i, procs);
      vars["OMP_NUM_THREADS"] = std::to_string(spec.cpus.size());
      DSCPP_LOG_INFO("rank {} bound to cores {} (OMP_NUM_THREADS={})", rank,
                     describe_cpus(spec.cpus), spec.cpus.size());
    }
    if (!opts.enable_each_rank_log.empty()) {
      spec.log_path = opts.enable_each_rank_log + "/rank_" + std::to_string(rank) + ".log";
    }
    spec.env = child_env(vars);
    group.start(spec);
  }
  RunOutcome outcome = group.run();
  if (stopped_by_signal) *stopped_by_signal = outcome.signal;
  if (!agent && outcome.exit_code != 0) write_all(2, failure_report(outcome));
  if (outcome.exit_code == 0) {
    DSCPP_LOG_INFO("{} on {}: exited with status 0", ranks_text(host), host.host);
  }
  return outcome.exit_code;
}

// A multi-node job over ssh (or any remote-command template): one node agent per host.
// The remote-command template of an ssh job (--remote_cmd, or ssh with --launcher_args).
std::string remote_template(const LaunchOptions& opts) {
  if (!opts.remote_cmd.empty()) return opts.remote_cmd;
  if (!opts.launcher_args.empty()) {
    return "ssh -o BatchMode=yes " + opts.launcher_args + " {host} {command}";
  }
  return kDefaultRemoteCmd;
}

// Each agent reads the job's secret from the first line of its stdin (NOTE [node agent
// protocol]), so it never shows on a command line on either host. `lost` (when given) gets one
// entry per host after a failure: why the host counts as lost (NOTE [elastic hosts]), or "".
int run_agents(const LaunchOptions& opts, const std::vector<HostSlots>& hosts,
               const std::string& master_addr, const std::string& secret, int* stopped_by_signal,
               std::vector<std::string>* lost = nullptr) {
  std::string dscpp_path = opts.remote_dscpp.empty() ? self_exe() : opts.remote_dscpp;
  DSCPP_CHECK(is_safe_word(dscpp_path) && !starts_with(dscpp_path, kEncodedPrefix), LaunchError,
              "the path of dscpp on the hosts, '", dscpp_path,
              "', has characters that cannot pass through a remote shell. HINT: install dscpp "
              "under a plain path and give it with --remote_dscpp");
  const std::string tmpl = remote_template(opts);
  int world = 0;
  for (const auto& h : hosts) world += h.num_procs();
  LaunchOptions agent_opts = opts;
  agent_opts.workdir = current_dir();
  agent_opts.env = forwarded_env();
  if (!agent_opts.env.empty()) {
    std::vector<std::string> names;
    for (const auto& kv : agent_opts.env) names.push_back(kv.substr(0, kv.find('=')));
    DSCPP_LOG_INFO("passing {} to the hosts", join(names, ", "));
  }
  ChildGroupOptions group_opts;
  group_opts.grace = std::chrono::milliseconds(static_cast<long>(opts.stop_grace_s * 1000));
  ChildGroup group(group_opts);
  DSCPP_LOG_INFO("starting {} node agents for {} ranks on {}; master {}:{}", hosts.size(), world,
                 describe_hosts(hosts), master_addr, opts.master_port);
  for (size_t k = 0; k < hosts.size(); ++k) {
    std::string cmd = expand_remote_cmd(
        tmpl, hosts[k].host, agent_command(agent_opts, hosts, k, master_addr, dscpp_path));
    DSCPP_LOG_INFO("node {} ({}, {}): {}", k, hosts[k].host, ranks_text(hosts[k]), cmd);
    ChildSpec spec;
    spec.path = "/bin/sh";
    spec.argv = {"sh", "-c", "exec " + cmd};
    spec.env = child_env({});
    spec.name = "node agent for " + hosts[k].host + " (" + ranks_text(hosts[k]) + ")";
    spec.lifeline_stdin = true;
    spec.stdin_first_line = secret;
    spec.agent_lines = true;
    spec.parent_death_signal = SIGTERM;
    group.start(spec);
  }
  RunOutcome outcome = group.run();
  *stopped_by_signal = outcome.signal;
  if (outcome.exit_code != 0) {
    // An agent that failed by itself (no rank reported) most likely never started.
    for (size_t k = 0; k < outcome.children.size() && outcome.cause; ++k) {
      if (!outcome.children[k].cause || !starts_with(outcome.cause->who, "node agent")) continue;
      const std::string probe = expand_remote_cmd(tmpl, hosts[k].host, {"true"});
      if (outcome.cause->exit_code == 255) {
        outcome.cause->how += ". HINT: ssh uses 255 for connection errors: check that `" + probe +
                              "` works without a password";
      } else if (outcome.cause->exit_code == 126 || outcome.cause->exit_code == 127) {
        outcome.cause->how += ". HINT: the remote command or dscpp was not found on " +
                              hosts[k].host + ": check --remote_cmd and --remote_dscpp (" +
                              dscpp_path + ")";
      }
    }
    write_all(2, failure_report(outcome));
  } else {
    DSCPP_LOG_INFO("all {} ranks on {} hosts exited with status 0", world, hosts.size());
  }
  if (lost) {
    // Only an agent that ended by a signal on its own, before the launcher stopped anything, is
    // lost for certain. Every other host is probed (hosts_after_failure): an agent the launcher
    // stopped may end any way (ssh exits 255 on SIGTERM; a slow agent is SIGKILLed after the
    // grace), and a status of 255 may be ssh's "unreachable" or a rank's own exit(255).
    lost->assign(hosts.size(), "");
    for (size_t k = 0; outcome.exit_code != 0 && outcome.signal == 0 && k < hosts.size(); ++k) {
      const ChildEnd& end = outcome.children.at(k);
      if (!end.stopped && !end.status.exited) {
        (*lost)[k] = "its node agent was " + end.status.describe();
      }
    }
  }
  return outcome.exit_code;
}

// Runs `true` on every host through the remote-command template, all at once; returns, per
// host, "" or why the probe failed. Hosts whose entry in `skip` is non-empty are not probed.
std::vector<std::string> probe_hosts(const std::string& tmpl, const std::vector<HostSlots>& hosts,
                                     const std::vector<std::string>& skip) {
  constexpr auto kProbeLimit = std::chrono::seconds(15);
  std::vector<std::string> why(hosts.size());
  std::vector<pid_t> pids(hosts.size(), -1);
  for (size_t k = 0; k < hosts.size(); ++k) {
    if (!skip[k].empty()) continue;
    const std::string cmd =
        "exec " + expand_remote_cmd(tmpl, hosts[k].host, {"true"}) + " </dev/null >/dev/null 2>&1";
    const pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a launcher killed while probing takes it along
      if (::getppid() != parent) ::_exit(1);
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    if (pid < 0) {  // this machine's trouble, not the host's: keep the host
      DSCPP_LOG_WARN("cannot probe {}: {}; keeping it", hosts[k].host, std::strerror(errno));
      continue;
    }
    pids[k] = pid;
  }
  const auto deadline = std::chrono::steady_clock::now() + kProbeLimit;
  for (size_t k = 0; k < hosts.size(); ++k) {
    if (pids[k] < 0) continue;
    const std::string probe = "`" + expand_remote_cmd(tmpl, hosts[k].host, {"true"}) + "`";
    for (;;) {
      int st = 0;
      pid_t r = ::waitpid(pids[k], &st, WNOHANG);
      if (r == pids[k]) {
        ExitStatus es = ExitStatus::from_wait_status(st);
        if (!es.ok()) why[k] = "a probe of it, " + probe + ", " + es.describe();
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        ::kill(-pids[k], SIGKILL);
        ::waitpid(pids[k], &st, 0);
        why[k] = "a probe of it, " + probe + ", did not answer within " +
                 std::to_string(kProbeLimit.count()) + " s";
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return why;
}

// NOTE [elastic hosts]: the hosts of the next start after a failure, or none when the job
// cannot go on (the reason is logged).
std::optional<std::vector<HostSlots>> hosts_after_failure(const LaunchOptions& opts,
                                                          const std::vector<HostSlots>& live,
                                                          const std::vector<std::string>& lost) {
  std::vector<std::string> why = probe_hosts(remote_template(opts), live, lost);
  std::vector<size_t> gone;
  for (size_t k = 0; k < live.size(); ++k) {
    if (lost[k].empty() && why[k].empty()) continue;
    gone.push_back(k);
    DSCPP_LOG_WARN("host {} ({}) is lost: {}", live[k].host, ranks_text(live[k]),
                   lost[k].empty() ? why[k] : lost[k]);
  }
  if (gone.empty()) return live;
  std::vector<HostSlots> next = drop_hosts(live, gone);
  if (static_cast<int>(next.size()) < opts.min_nodes) {
    DSCPP_LOG_ERROR(
        "{} of {} hosts lost; the {} left are fewer than --nnodes {}:{} allows; "
        "giving up",
        gone.size(), live.size(), next.size(), opts.min_nodes, opts.max_nodes);
    return std::nullopt;
  }
  if (gone.front() == 0 && !opts.master_addr.empty()) {
    DSCPP_LOG_ERROR(
        "the first host, {}, where rank 0 and the master address {} were, is lost; "
        "giving up. HINT: leave --master_addr out, so that the first remaining host "
        "becomes the master",
        live[0].host, opts.master_addr);
    return std::nullopt;
  }
  int world = 0;
  for (const auto& h : next) world += h.num_procs();
  DSCPP_LOG_WARN("the job goes on without {}: {} host(s) left ({}), world size {}",
                 gone.size() == 1 ? live[gone[0]].host : std::to_string(gone.size()) + " hosts",
                 next.size(), describe_hosts(next), world);
  return next;
}

// The job is handed to mpirun or srun, run as one child whose output is forwarded as is. The
// secret is in that child's environment, which both pass on to the ranks (mpirun by the name
// `-x DSCPP_RENDEZVOUS_SECRET`, srun with --export=ALL).
int run_wrapped(const LaunchOptions& opts, const std::vector<std::string>& cmd,
                const std::string& secret) {
  const std::string path = resolve_program(cmd[0], getenv_or_empty("PATH"));
  DSCPP_LOG_INFO("running: {}", quoted_command(cmd));
  ChildGroupOptions group_opts;
  group_opts.grace = std::chrono::milliseconds(static_cast<long>(opts.stop_grace_s * 1000));
  ChildGroup group(group_opts);
  ChildSpec spec;
  spec.path = path;
  spec.argv = cmd;
  spec.env = child_env({{comm::kSecretEnv, secret}});
  spec.name = cmd[0];
  group.start(spec);
  RunOutcome outcome = group.run();
  if (outcome.exit_code != 0) write_all(2, failure_report(outcome));
  return outcome.exit_code;
}

// A node agent's first line of stdin: the job's secret, written by the main launcher when it
// started the agent (NOTE [node agent protocol]). Read a byte at a time, so nothing after it is
// taken from the lifeline.
std::string read_secret_line() {
  constexpr int kWaitMs = 60000;
  std::string line;
  for (;;) {
    pollfd p{0, POLLIN, 0};
    int rc = ::poll(&p, 1, kWaitMs);
    if (rc < 0 && errno == EINTR) continue;
    DSCPP_CHECK(rc > 0, LaunchError, "node agent: the job's secret did not arrive on stdin within ",
                kWaitMs / 1000,
                " s. HINT: node agents are started by 'dscpp launch', which writes "
                "it there; do not start one by hand");
    char c;
    ssize_t n = ::read(0, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    DSCPP_CHECK(n == 1, LaunchError,
                "node agent: stdin closed before the job's secret arrived "
                "(the main launcher is gone)");
    if (c == '\n') break;
    line.push_back(c);
    DSCPP_CHECK(line.size() <= 4096, LaunchError,
                "node agent: the first line of stdin is not a secret");
  }
  comm::check_secret(line, "the node agent's stdin");
  return line;
}

int run_node_agent(const LaunchOptions& given) {
  LaunchOptions opts = given;
  const std::string host =
      opts.node_host.empty() ? "node " + std::to_string(opts.node_rank) : opts.node_host;
  try {
    for (auto& w : opts.program) w = decode_remote_word(w);
    opts.enable_each_rank_log = decode_remote_word(opts.enable_each_rank_log);
    for (const auto& encoded : opts.env) {
      std::string kv = decode_remote_word(encoded);
      size_t eq = kv.find('=');
      DSCPP_CHECK(eq != std::string::npos && eq > 0, LaunchError, "node agent: --env '", kv,
                  "' is not NAME=VALUE");
      ::setenv(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), 1);
    }
    if (!opts.workdir.empty()) {
      const std::string dir = decode_remote_word(opts.workdir);
      // As DeepSpeed's `cd DIR; ...`: hosts without that folder run in the agent's own one.
      if (::chdir(dir.c_str()) != 0) {
        DSCPP_LOG_WARN("cannot change to {} on {} ({}); running in {}", dir, host,
                       std::strerror(errno), current_dir());
      }
    }
    DSCPP_CHECK(!opts.program.empty(), LaunchError, "node agent: no program given");
    DSCPP_CHECK(opts.num_procs >= 1 && opts.world_size >= 1 && opts.rank_offset >= 0 &&
                    opts.rank_offset + opts.num_procs <= opts.world_size,
                LaunchError, "node agent: ranks ", opts.rank_offset, "..",
                opts.rank_offset + opts.num_procs - 1, " do not fit world size ", opts.world_size);
    HostSlots hs{host, {}, opts.rank_offset};
    if (opts.slots.empty()) {
      for (int i = 0; i < opts.num_procs; ++i) hs.slots.push_back(i);
    } else {
      hs.slots = parse_slot_list(opts.slots);
      DSCPP_CHECK(hs.num_procs() == opts.num_procs, LaunchError, "node agent: --slots '",
                  opts.slots, "' does not list ", opts.num_procs, " slots");
    }
    const std::string path = resolve_program(opts.program[0], getenv_or_empty("PATH"));
    const std::string secret = read_secret_line();
    DSCPP_LOG_INFO("node agent {} of {} on {}", opts.node_rank, opts.nnodes, host);
    return run_ranks(opts, hs, opts.world_size, opts.master_addr, path, /*agent=*/true, secret);
  } catch (const Error& e) {
    Failure f{"node agent on " + host, e.what(), 2, {}};
    write_all(2, format_agent_failure(f) + "\n");
    DSCPP_LOG_ERROR("{}", e.what());
    return 2;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
void parse_nnodes(const std::string& text, int* min_nodes, int* max_nodes) {
  auto number = [&](const std::string& part) {
    DSCPP_CHECK(!part.empty() && part.size() < 7 &&
                    part.find_first_not_of("0123456789") == std::string::npos,
                LaunchError, "--nnodes '", text,
                "' is not N or MIN:MAX. HINT: e.g. --nnodes 2:4 (at least 2 hosts, at most 4)");
    return std::stoi(part);
  };
  const size_t colon = text.find(':');
  *min_nodes = number(text.substr(0, colon));
  *max_nodes = colon == std::string::npos ? *min_nodes : number(text.substr(colon + 1));
  DSCPP_CHECK(*min_nodes >= 1 && *min_nodes <= *max_nodes, LaunchError, "--nnodes '", text,
              "' needs 1 <= MIN <= MAX");
}

std::vector<HostSlots> drop_hosts(const std::vector<HostSlots>& hosts,
                                  const std::vector<size_t>& lost) {
  std::vector<HostSlots> out;
  int first_rank = 0;
  for (size_t k = 0; k < hosts.size(); ++k) {
    if (std::find(lost.begin(), lost.end(), k) != lost.end()) continue;
    out.push_back(hosts[k]);
    out.back().first_rank = first_rank;
    first_rank += hosts[k].num_procs();
  }
  return out;
}

std::vector<HostSlots> resolve_hosts(const LaunchOptions& opts) {
  if (opts.hostfile.empty() && opts.launcher == "slurm") {
    // Slurm picks the nodes of its allocation; only the counts are ours (see slurm_command).
    DSCPP_CHECK(opts.include.empty() && opts.exclude.empty(), LaunchError,
                "--include/--exclude need a hostfile with --launcher slurm. HINT: pass "
                "-H/--hostfile, or select nodes with --launcher_args '--nodelist=...'");
    DSCPP_CHECK(opts.num_nodes == -1 || opts.num_nodes >= 1, LaunchError, "--num_nodes ",
                opts.num_nodes, " is not a node count. HINT: give a number >= 1");
    DSCPP_CHECK(opts.num_procs == -1 || opts.num_procs >= 1, LaunchError, "--num_procs ",
                opts.num_procs, " would start no process. HINT: give a number >= 1");
    return {};
  }
  std::vector<HostfileEntry> entries;
  if (opts.hostfile.empty()) {
    DSCPP_CHECK(opts.num_procs == -1 || opts.num_procs >= 1, LaunchError, "--num_procs ",
                opts.num_procs, " would start no process. HINT: give a number >= 1");
    entries.push_back({"localhost", opts.num_procs == -1 ? 1 : opts.num_procs, 0});
  } else {
    entries = read_hostfile(opts.hostfile);
  }
  std::vector<HostSlots> hosts = filter_hosts(entries, opts.include, opts.exclude);
  if (opts.hostfile.empty()) {
    DSCPP_CHECK(opts.num_nodes == -1 || opts.num_nodes <= 1, LaunchError, "--num_nodes ",
                opts.num_nodes,
                " needs a hostfile naming the nodes. HINT: pass -H/--hostfile with lines "
                "`hostname slots=N`");
    return limit_hosts(std::move(hosts), opts.num_nodes, -1);
  }
  return limit_hosts(std::move(hosts), opts.num_nodes, opts.num_procs);
}

std::string choose_launcher(const LaunchOptions& opts, const std::vector<HostSlots>& hosts) {
  const bool only_here = hosts.size() == 1 && is_local_host(hosts[0].host);
  if (opts.launcher.empty()) return only_here ? "local" : "ssh";
  const std::string& l = opts.launcher;
  DSCPP_CHECK(l == "local" || l == "ssh" || l == "openmpi" || l == "slurm", LaunchError,
              "unknown --launcher '", l, "'. HINT: use local, ssh, openmpi or slurm");
  DSCPP_CHECK(l != "local" || only_here, LaunchError,
              "--launcher local runs processes on this machine only, but the hosts are ",
              describe_hosts(hosts),
              ". HINT: use --launcher ssh (the default for several hosts), openmpi or slurm");
  return l;
}

std::string resolve_master_addr(const LaunchOptions& opts, const std::vector<HostSlots>& hosts) {
  if (!opts.master_addr.empty()) return opts.master_addr;
  // 127.0.0.1 only when every rank runs here: ranks on other hosts could not reach it.
  bool all_here = true;
  for (const auto& h : hosts) all_here &= is_local_host(h.host);
  if (hosts.empty() || (is_local_host(hosts[0].host) && all_here)) return "127.0.0.1";
  return hosts[0].host;
}

std::string resolve_program(const std::string& program, const std::string& path_env) {
  DSCPP_CHECK(!program.empty(), LaunchError,
              "no program given. HINT: dscpp launch [options] PROGRAM [ARGS...]");
  auto runnable = [](const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (program.find('/') != std::string::npos) {
    struct stat st {};
    DSCPP_CHECK(::stat(program.c_str(), &st) == 0, LaunchError, "program '", program,
                "' does not exist. HINT: check the path (relative paths start from ", current_dir(),
                ")");
    DSCPP_CHECK(runnable(program), LaunchError, "program '", program,
                "' is not an executable file. HINT: chmod +x it, or name its interpreter "
                "first (e.g. sh ",
                program, ")");
    return program;
  }
  std::stringstream ss(path_env);
  for (std::string dir; std::getline(ss, dir, ':');) {
    std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (runnable(candidate)) return candidate;
  }
  DSCPP_FAIL(LaunchError, "program '", program, "' was not found in PATH (", path_env,
             "). HINT: give its path (e.g. ./", program, ") or add its folder to PATH");
}

HostFacts host_facts() {
  HostFacts f;
  f.is_root = ::geteuid() == 0;
  f.local_cores = static_cast<int>(usable_cpus().size());
  f.omp_threads_set = std::getenv("OMP_NUM_THREADS") != nullptr;
  return f;
}

std::vector<std::string> openmpi_command(const LaunchOptions& opts,
                                         const std::vector<HostSlots>& hosts,
                                         const HostFacts& facts) {
  int np = 0, local_procs = 0;
  std::vector<std::string> host_list;
  for (const auto& h : hosts) {
    np += h.num_procs();
    host_list.push_back(h.host + ":" + std::to_string(h.num_procs()));
    if (is_local_host(h.host)) local_procs += h.num_procs();
  }
  std::vector<std::string> cmd = {"mpirun", "-np", std::to_string(np), "--host",
                                  join(host_list, ",")};
  if (facts.is_root) cmd.push_back("--allow-run-as-root");
  if (local_procs > facts.local_cores) cmd.push_back("--oversubscribe");
  const std::string master = resolve_master_addr(opts, hosts);
  // The secret by name only: mpirun copies its value from its own environment (run_wrapped).
  for (std::string x : {"MASTER_ADDR=" + master, "MASTER_PORT=" + std::to_string(opts.master_port),
                        std::string(comm::kSecretEnv)}) {
    cmd.push_back("-x");
    cmd.push_back(x);
  }
  cmd.push_back("-x");
  if (facts.omp_threads_set) {
    cmd.push_back("OMP_NUM_THREADS");
  } else {
    int per_node = hosts.empty() ? 1 : hosts[0].num_procs();
    cmd.push_back("OMP_NUM_THREADS=" + std::to_string(std::max(1, facts.local_cores / per_node)));
  }
  for (auto& w : split_shell_words(opts.launcher_args)) cmd.push_back(w);
  cmd.insert(cmd.end(), opts.program.begin(), opts.program.end());
  return cmd;
}

std::vector<std::string> slurm_command(const LaunchOptions& opts,
                                       const std::vector<HostSlots>& hosts) {
  int nodes = 1, per_node = 1;
  std::string master;
  std::vector<std::string> node_list;
  if (opts.hostfile.empty()) {
    nodes = opts.num_nodes == -1 ? 1 : opts.num_nodes;
    per_node = opts.num_procs == -1 ? 1 : opts.num_procs;
    DSCPP_CHECK(nodes >= 1 && per_node >= 1, LaunchError, "--num_nodes ", opts.num_nodes,
                " and --num_procs ", opts.num_procs,
                " must be >= 1. HINT: leave them out to run one process");
    master = opts.master_addr;
  } else {
    nodes = static_cast<int>(hosts.size());
    per_node = hosts.at(0).num_procs();
    for (const auto& h : hosts) {
      DSCPP_CHECK(h.num_procs() == per_node, LaunchError,
                  "srun runs the same number of tasks on every node, but ", hosts[0].host, " has ",
                  per_node, " and ", h.host, " has ", h.num_procs(),
                  ". HINT: give every host the same slots, or use --num_procs");
      node_list.push_back(h.host);
    }
    master = resolve_master_addr(opts, hosts);
  }
  std::vector<std::string> cmd = {"srun", "--nodes", std::to_string(nodes), "--ntasks-per-node",
                                  std::to_string(per_node)};
  if (!node_list.empty()) cmd.push_back("--nodelist=" + join(node_list, ","));
  std::string exports = "--export=ALL";
  if (!master.empty()) exports += ",MASTER_ADDR=" + master;
  exports += ",MASTER_PORT=" + std::to_string(opts.master_port);
  cmd.push_back(exports);
  for (auto& w : split_shell_words(opts.launcher_args)) cmd.push_back(w);
  cmd.insert(cmd.end(), opts.program.begin(), opts.program.end());
  return cmd;
}

std::vector<std::string> agent_command(const LaunchOptions& opts,
                                       const std::vector<HostSlots>& hosts, size_t node,
                                       const std::string& master_addr,
                                       const std::string& dscpp_path) {
  const HostSlots& h = hosts.at(node);
  int world = 0;
  for (const auto& x : hosts) world += x.num_procs();
  std::vector<std::string> cmd = {dscpp_path, "launch", "--node_agent"};
  auto flag = [&](const char* name, const std::string& value) {
    cmd.push_back(name);
    cmd.push_back(value);
  };
  flag("--node_rank", std::to_string(node));
  flag("--nnodes", std::to_string(hosts.size()));
  flag("--node_host", h.host);
  flag("--num_procs", std::to_string(h.num_procs()));
  flag("--rank_offset", std::to_string(h.first_rank));
  flag("--world_size", std::to_string(world));
  flag("--master_addr", master_addr);
  flag("--master_port", std::to_string(opts.master_port));
  flag("--stop_grace", format_seconds(std::max(1.0, opts.stop_grace_s - 2.0)));
  bool identity = true;
  for (int i = 0; i < h.num_procs(); ++i) identity &= h.slots[i] == i;
  if (!identity) flag("--slots", join_ints(h.slots));
  if (!opts.enable_each_rank_log.empty()) {
    flag("--enable_each_rank_log", encode_remote_word(opts.enable_each_rank_log));
  }
  if (opts.bind_cores_to_rank) cmd.push_back("--bind_cores_to_rank");
  if (!opts.workdir.empty()) flag("--workdir", encode_remote_word(opts.workdir));
  for (const auto& kv : opts.env) flag("--env", encode_remote_word(kv));
  flag("--log_level", opts.log_level.empty() ? log_level_name(log_level()) : opts.log_level);
  cmd.push_back("--");
  for (const auto& w : opts.program) cmd.push_back(encode_remote_word(w));
  return cmd;
}

std::string expand_remote_cmd(const std::string& tmpl, const std::string& host,
                              const std::vector<std::string>& command) {
  DSCPP_CHECK(tmpl.find("{command}") != std::string::npos, LaunchError, "--remote_cmd '", tmpl,
              "' has no {command}. HINT: write it like '", kDefaultRemoteCmd, "'");
  std::string out;
  for (size_t i = 0; i < tmpl.size();) {
    if (tmpl.compare(i, 6, "{host}") == 0) {
      out += host;
      i += 6;
    } else if (tmpl.compare(i, 9, "{command}") == 0) {
      out += join(command);
      i += 9;
    } else {
      out += tmpl[i++];
    }
  }
  return out;
}

std::string encode_remote_word(const std::string& word) {
  if (is_safe_word(word) && !starts_with(word, kEncodedPrefix)) return word;
  return kEncodedPrefix + to_hex(word.data(), word.size());
}

std::string decode_remote_word(const std::string& word) {
  if (!starts_with(word, kEncodedPrefix)) return word;
  auto hex = [&](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    DSCPP_FAIL(LaunchError, "node agent: malformed encoded argument '", word, "'");
  };
  const size_t n = word.size() - 3;
  DSCPP_CHECK(n % 2 == 0, LaunchError, "node agent: malformed encoded argument '", word, "'");
  std::string out;
  for (size_t i = 3; i < word.size(); i += 2) {
    out += static_cast<char>(hex(word[i]) * 16 + hex(word[i + 1]));
  }
  return out;
}

std::vector<std::string> split_shell_words(const std::string& text) {
  std::vector<std::string> words;
  std::string cur;
  bool in_word = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(cur);
      cur.clear();
      in_word = false;
    } else if (c == '\'') {
      size_t end = text.find('\'', i + 1);
      DSCPP_CHECK(end != std::string::npos, LaunchError, "unterminated ' in '", text,
                  "'. HINT: close the quote in --launcher_args");
      cur += text.substr(i + 1, end - i - 1);
      i = end;
      in_word = true;
    } else if (c == '"') {
      size_t j = i + 1;
      for (; j < text.size() && text[j] != '"'; ++j) {
        if (text[j] == '\\' && j + 1 < text.size() && std::strchr("\"\\$`", text[j + 1])) ++j;
        cur += text[j];
      }
      DSCPP_CHECK(j < text.size(), LaunchError, "unterminated \" in '", text,
                  "'. HINT: close the quote in --launcher_args");
      i = j;
      in_word = true;
    } else if (c == '\\' && i + 1 < text.size()) {
      cur += text[++i];
      in_word = true;
    } else {
      cur += c;
      in_word = true;
    }
  }
  if (in_word) words.push_back(cur);
  return words;
}

std::string failure_report(const RunOutcome& outcome) {
  std::ostringstream os;
  os << "\n================ dscpp launch: the job failed ================\n";
  if (outcome.cause) {
    const Failure& f = *outcome.cause;
    os << "cause: " << f.who << " " << f.how << "\n";
    // The error lines come first: the last lines of a training program are often a config
    // dump or progress printed after the error (NOTE [error lines] in error_lines.h).
    auto section = [&](const std::vector<std::string>& lines, const char* what) {
      if (lines.empty()) return;
      os << "  last " << lines.size() << " " << what << (lines.size() == 1 ? "" : "s") << " of "
         << f.who << ":\n";
      for (const auto& l : lines) os << "  | " << l << "\n";
    };
    section(f.error_lines, "error line");
    section(f.last_lines, "line");
    if (f.last_lines.empty() && f.error_lines.empty()) os << "  (it printed nothing)\n";
  } else if (outcome.signal) {
    os << "cause: the launcher received " << signal_name(outcome.signal)
       << " and stopped the job\n";
  } else if (outcome.lifeline_lost) {
    os << "cause: the launcher's stdin closed (its parent launcher is gone)\n";
  }
  std::vector<const ChildEnd*> stopped, lost, other;
  for (const auto& c : outcome.children) {
    if (!c.reaped) {
      lost.push_back(&c);
    } else if (c.stopped) {
      stopped.push_back(&c);
    } else if (!c.status.ok() && !c.cause) {
      other.push_back(&c);
    }
  }
  constexpr size_t kMaxListed = 32;
  auto list = [&](const char* title, const std::vector<const ChildEnd*>& v) {
    if (v.empty()) return;
    os << title << "\n";
    for (size_t i = 0; i < v.size() && i < kMaxListed; ++i) {
      os << "  " << v[i]->name << ": "
         << (v[i]->reaped ? v[i]->status.describe()
                          : "still running as pid " + std::to_string(v[i]->pid))
         << "\n";
    }
    if (v.size() > kMaxListed) os << "  ... and " << v.size() - kMaxListed << " more\n";
  };
  list("stopped by the launcher:", stopped);
  list("also failed:", other);
  list("did not exit even after SIGKILL:", lost);
  os << "dscpp launch exits with status " << outcome.exit_code << "\n";
  os << "==============================================================\n";
  return os.str();
}

int run_job(const LaunchOptions& given) {
  LaunchOptions opts = given;
  set_log_rank(-1);
  if (!opts.log_level.empty()) {
    try {
      set_log_level(parse_log_level(opts.log_level));
    } catch (const Error& e) {
      DSCPP_FAIL(LaunchError, "--log_level: ", e.what());
    }
  }
  DSCPP_CHECK(opts.stop_grace_s > 0 && opts.stop_grace_s <= 600, LaunchError, "stop grace ",
              opts.stop_grace_s, " s is out of range. HINT: use 0 < grace <= 600 seconds");
  if (opts.node_agent) return run_node_agent(opts);

  DSCPP_CHECK(!opts.program.empty(), LaunchError,
              "no program given. HINT: dscpp launch [options] PROGRAM [ARGS...]");
  DSCPP_CHECK(opts.master_port >= 1 && opts.master_port <= 65535, LaunchError, "--master_port ",
              opts.master_port, " is not a TCP port. HINT: use 1-65535 (default 29500)");
  const std::vector<HostSlots> hosts = resolve_hosts(opts);
  const std::string kind = choose_launcher(opts, hosts);
  DSCPP_CHECK(opts.remote_cmd.empty() || kind == "ssh", LaunchError,
              "--remote_cmd applies to --launcher ssh only, but the launcher is ", kind,
              ". HINT: drop --remote_cmd or use --launcher ssh");
  DSCPP_CHECK(opts.remote_dscpp.empty() || kind == "ssh", LaunchError,
              "--remote_dscpp applies to --launcher ssh only, but the launcher is ", kind,
              ". HINT: drop --remote_dscpp or use --launcher ssh");
  DSCPP_CHECK(opts.launcher_args.empty() || kind != "local", LaunchError,
              "--launcher_args has nothing to pass to with --launcher local. HINT: drop it, or "
              "use --launcher ssh, openmpi or slurm");
  DSCPP_CHECK(opts.launcher_args.empty() || kind != "ssh" || opts.remote_cmd.empty(), LaunchError,
              "--launcher_args cannot be combined with --remote_cmd. HINT: write the extra "
              "arguments into the --remote_cmd template");
  if (kind == "openmpi" || kind == "slurm") {
    DSCPP_CHECK(opts.enable_each_rank_log.empty(), LaunchError,
                "--enable_each_rank_log is not supported with --launcher ", kind, ". HINT: ",
                kind == "openmpi" ? "pass --launcher_args '--output-filename DIR'"
                                  : "pass --launcher_args '--output=DIR/rank_%t.log'");
    DSCPP_CHECK(!opts.bind_cores_to_rank, LaunchError,
                "--bind_cores_to_rank is not supported with --launcher ", kind, ". HINT: ",
                kind == "openmpi" ? "pass --launcher_args '--bind-to core'"
                                  : "pass --launcher_args '--cpu-bind=cores'");
  }
  const std::string master_addr = resolve_master_addr(opts, hosts);
  DSCPP_CHECK(is_safe_word(master_addr), LaunchError, "--master_addr '", master_addr,
              "' is not a host name or address. HINT: give an IP address or host name");
  // The program must exist here too: a missing program is an error before anything starts.
  const std::string program_path = resolve_program(opts.program[0], getenv_or_empty("PATH"));

  DSCPP_CHECK(opts.max_restarts >= 0, LaunchError, "--max_restarts ", opts.max_restarts,
              " must be >= 0");
  DSCPP_CHECK(opts.max_restarts == 0 || kind == "local" || kind == "ssh", LaunchError,
              "--max_restarts applies to --launcher local and ssh, but the launcher is ", kind,
              ", which hands the whole job to ", kind == "openmpi" ? "mpirun" : "srun",
              ". HINT: drop --max_restarts and let the scheduler requeue the job (srun "
              "--requeue), or use --launcher ssh");
  if (kind == "openmpi") {
    bool identity = true;
    for (const auto& h : hosts) {
      for (int i = 0; i < h.num_procs(); ++i) identity &= h.slots[i] == i;
    }
    if (!identity) DSCPP_LOG_WARN("--launcher openmpi uses only the number of selected slots");
    return run_wrapped(opts, openmpi_command(opts, hosts, host_facts()), comm::make_job_secret());
  }
  if (kind == "slurm")
    return run_wrapped(opts, slurm_command(opts, hosts), comm::make_job_secret());
  if (opts.min_nodes != -1 && opts.min_nodes == opts.max_nodes) {
    // --nnodes N (torchrun's habit, e.g. --nnodes 1): a check of the host count, not elastic.
    DSCPP_CHECK(static_cast<int>(hosts.size()) == opts.min_nodes, LaunchError, "--nnodes ",
                opts.min_nodes, " but the job has ", hosts.size(),
                " host(s) (hostfile, --include/--exclude, --num_nodes). HINT: give --nnodes "
                "MIN:MAX to let the job go on with fewer hosts");
    opts.min_nodes = opts.max_nodes = -1;
  }
  if (opts.min_nodes != -1) {
    // --elastic_training without --max_elastic_nodes: as many as the job starts with.
    if (opts.max_nodes == -1) {
      opts.max_nodes = std::max<int>(opts.min_nodes, static_cast<int>(hosts.size()));
    }
    DSCPP_CHECK(kind == "ssh", LaunchError,
                "--nnodes applies to --launcher ssh, but the launcher "
                "is ",
                kind, ". HINT: give a hostfile of several hosts, or drop --nnodes");
    const int n = static_cast<int>(hosts.size());
    DSCPP_CHECK(n >= opts.min_nodes && n <= opts.max_nodes, LaunchError, "--nnodes ",
                opts.min_nodes, ":", opts.max_nodes, " but the job has ", n,
                " host(s) (hostfile, --include/--exclude, --num_nodes). HINT: list between ",
                opts.min_nodes, " and ", opts.max_nodes, " hosts");
    DSCPP_CHECK(opts.max_restarts > 0 || opts.min_nodes == n, LaunchError, "--nnodes ",
                opts.min_nodes, ":", opts.max_nodes,
                " lets a job go on without a lost host only when it starts again. HINT: add "
                "--max_restarts N");
  }
  // The job, started again after a failure up to --max_restarts times (NOTE [restarts]), on
  // fewer hosts where --nnodes allows (NOTE [elastic hosts]).
  std::vector<HostSlots> live = hosts;
  std::string master = master_addr;
  for (int restart = 0;; ++restart) {
    ::setenv("DSCPP_RESTART_COUNT", std::to_string(restart).c_str(), 1);
    // A new secret for every start: a rank left over from the last one cannot join this one.
    const std::string secret = comm::make_job_secret();
    int signal = 0;
    std::vector<std::string> lost;
    const int code = kind == "ssh"
                         ? run_agents(opts, live, master, secret, &signal, &lost)
                         : run_ranks(opts, live[0], live[0].num_procs(), master, program_path,
                                     /*agent=*/false, secret, &signal);
    if (code == 0 || signal != 0 || restart >= opts.max_restarts) {
      if (code != 0 && signal == 0 && opts.max_restarts > 0) {
        DSCPP_LOG_ERROR("the job failed again after {} restart(s) (--max_restarts {}); giving up",
                        restart, opts.max_restarts);
      }
      return code;
    }
    if (opts.min_nodes != -1) {
      std::optional<std::vector<HostSlots>> next = hosts_after_failure(opts, live, lost);
      if (!next) return code;
      live = std::move(*next);
      master = resolve_master_addr(opts, live);
    }
    DSCPP_LOG_WARN(
        "the job failed (exit status {}); starting it again: restart {} of {} "
        "(--max_restarts), DSCPP_RESTART_COUNT={}",
        code, restart + 1, opts.max_restarts, restart + 1);
  }
}

}  // namespace dscpp::launch
