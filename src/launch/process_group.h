// ChildGroup: the set of child processes one launcher runs (the ranks of this node, the
// node agents of a multi-node job, or one mpirun/srun), and the loop that watches them.
// (The file keeps the name process_group.h; "process group" here never means c10d's.)
//
// It starts each child in its own POSIX process group (so a signal reaches the child's whole
// tree), forwards each line a child prints with a prefix such as "[rank 3] ", keeps the last
// lines and the error lines (NOTE [error lines] in error_lines.h) of each child for failure
// reports, forwards SIGINT/SIGTERM/SIGHUP received by the launcher, and on the first failure
// stops all the others: SIGTERM to their process groups, SIGKILL to whatever is left after a
// grace period. Node agents (see NOTE [node agent protocol] in launcher.cpp) report a failing
// rank with one machine-readable line that the group parses (format_agent_failure /
// parse_agent_failure).
//
// Threading: a ChildGroup is used by one thread, the one that created it; run() is a
// single-threaded poll loop. Signal handlers only write to a self-pipe that the loop reads.
// Only one ChildGroup may exist at a time in a process (the handlers are process-wide); the
// previous handlers are restored by its destructor, so run_job() can be called again.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <csignal>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dscpp::launch {

// How a child ended, as waitpid() reported it.
struct ExitStatus {
  bool exited = false;  // true: exit code in `code`; false: killed by `signal`
  int code = 0;
  int signal = 0;

  static ExitStatus from_wait_status(int status);
  bool ok() const { return exited && code == 0; }
  // "exited with status 3" or "killed by signal 9 (SIGKILL)".
  std::string describe() const;
  // The status a launcher exits with for this ending: the code, or 128 + signal.
  int launcher_code() const { return exited ? code : 128 + signal; }
};

// "SIGKILL" for 9, "signal 77" for a number without a name.
std::string signal_name(int sig);

// Writes all of `data` to `fd`, retrying on EINTR/EAGAIN; drops the rest when the reader is
// gone (EPIPE), so a closed console never stops a job.
void write_all(int fd, const std::string& data);

// What failed, for the report: the child (or, via a node agent, the remote rank) that ended
// badly first.
struct Failure {
  std::string who;    // "rank 3 on host-b", "node agent for host-b (ranks 2-3)", "mpirun"
  std::string how;    // "exited with status 3", "killed by signal 9 (SIGKILL)", or an error
  int exit_code = 1;  // what the launcher exits with; never 0
  std::vector<std::string> last_lines;  // oldest first, without prefixes
  // Its error lines (NOTE [error lines] in error_lines.h), oldest first, without prefixes;
  // they may also be among last_lines. The report shows them first.
  std::vector<std::string> error_lines;
};

// NOTE [agent failure line]: a node agent reports the first failing rank on its node as one
// line on its stderr: "@@dscpp-agent-failure who=.. how=.. exit=N line=.. error=..", values
// percent-encoded (space, '%', '=' and control bytes as %XX), one `line=` per last line and
// one `error=` per error line. Unknown keys are skipped, so an older main launcher reads a
// newer agent's line (without its error lines), and a newer one reads an older agent's. The
// line stays under 64 KiB, the longest line the main launcher reads in one piece: entries that
// do not fit are left out, the oldest last lines first, then the newest error lines.
inline constexpr const char* kAgentFailureMarker = "@@dscpp-agent-failure";
std::string format_agent_failure(const Failure& f);
// Parses a line made by format_agent_failure. Returns nullopt for any other line.
std::optional<Failure> parse_agent_failure(const std::string& line);

// One child to start.
struct ChildSpec {
  std::string path;               // executable, absolute (or relative to the cwd)
  std::vector<std::string> argv;  // argv[0] included
  std::vector<std::string> env;   // the child's whole environment, "NAME=value"
  std::string name;               // for reports: "rank 3 on host-b"
  std::string prefix;             // put before each forwarded line: "[rank 3] "; may be empty
  std::string log_path;           // non-empty: stdout and stderr go to this file, not to us
  std::vector<int> cpus;          // non-empty: the child is bound to these CPUs
  // true: the child's stdin is a pipe this launcher holds open, its lifeline; closed when the
  // job stops. false: stdin is /dev/null.
  bool lifeline_stdin = false;
  // With lifeline_stdin: written to the pipe as the first line, as the child starts.
  std::string stdin_first_line;
  // true: lines starting with kAgentFailureMarker are parsed, not forwarded.
  bool agent_lines = false;
  // Sent to the child if the launcher dies without stopping it (Linux PR_SET_PDEATHSIG): a
  // safety net, since a killed launcher cannot run its stop policy. SIGTERM for node agents,
  // which then stop their ranks properly.
  int parent_death_signal = SIGKILL;
};

// How one child ended, for the report.
struct ChildEnd {
  std::string name;
  pid_t pid = -1;
  ExitStatus status;
  bool reaped = false;   // false only if it outlived SIGKILL and the final wait
  bool stopped = false;  // it was still running when the launcher began to stop the job
  bool cause = false;    // the failure came from it (the failed rank, or its node agent)
  std::vector<std::string> last_lines;
};

// What run() saw.
struct RunOutcome {
  int exit_code = 0;               // 0 when every child exited 0
  std::optional<Failure> cause;    // the first failure, if the job failed on its own
  int signal = 0;                  // the signal that made the launcher stop the job, or 0
  bool lifeline_lost = false;      // watch_stdin was set and stdin reached EOF
  std::vector<ChildEnd> children;  // in start order
};

struct ChildGroupOptions {
  // After SIGTERM, how long children get before SIGKILL.
  std::chrono::milliseconds grace{5000};
  // Node agent: EOF (or an error) on our own stdin stops the job at once.
  bool watch_stdin = false;
  // Lines of each child kept for reports.
  size_t tail_lines = 20;
  // Error lines (NOTE [error lines] in error_lines.h) of each child kept for reports: the last
  // ones.
  size_t error_lines = 10;
  // Called once, at the moment the first failure is known (before the others are stopped);
  // a node agent uses it to tell the main launcher right away.
  std::function<void(const Failure&)> on_cause;
};

class ChildGroup {
 public:
  // Installs the signal handlers (SIGINT, SIGTERM, SIGHUP, SIGCHLD; SIGPIPE ignored). Throws
  // LaunchError when another ChildGroup is alive in this process or a pipe cannot be made.
  explicit ChildGroup(ChildGroupOptions options = {});
  // Kills (SIGKILL to its process group) and reaps every child still running, closes all
  // pipes and restores the previous signal handlers.
  ~ChildGroup();
  ChildGroup(const ChildGroup&) = delete;
  ChildGroup& operator=(const ChildGroup&) = delete;

  // Starts one child and returns its index. Throws LaunchError when the log file, a pipe or
  // fork() fails; children started before keep running until run() or the destructor. A
  // failing exec() shows up later as that child exiting with status 127, its last line
  // saying why.
  size_t start(const ChildSpec& spec);

  // Forwards output until every child has ended, applying the stop policy described at the
  // top of this file. Returns what happened; never throws for a child's failure.
  RunOutcome run();

 private:
  struct Child;
  struct Stream;

  void read_stream(Child& c, Stream& s, bool drain);
  void handle_line(Child& c, const std::string& line, bool is_err);
  void flush_partial(Child& c, Stream& s);
  void reap(Child& c, int wait_status);
  void set_cause(Failure f, const Child* from);
  void begin_stop(int sig, const Child* except);
  void kill_all(int sig, const Child* except);
  std::vector<std::string> last_lines_of(const Child& c) const;
  std::vector<std::string> error_lines_of(const Child& c) const;

  ChildGroupOptions options_;
  std::vector<std::unique_ptr<Child>> children_;
  std::optional<Failure> cause_;
  const Child* cause_child_ = nullptr;
  int signal_ = 0;
  bool lifeline_lost_ = false;
  bool stopping_ = false;
  bool killed_ = false;
  std::chrono::steady_clock::time_point stop_deadline_;
  std::chrono::steady_clock::time_point kill_time_;
};

}  // namespace dscpp::launch
