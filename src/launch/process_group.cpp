// Implements ChildGroup: fork/exec of children into their own process groups, the poll loop
// that forwards their output line by line, and the stop policy (first failure, a signal to
// the launcher, or a lost lifeline stops everyone: SIGTERM, then SIGKILL after the grace).
// Everything runs on the thread that owns the ChildGroup; the signal handlers only write the
// signal number into a self-pipe read by run().
#include "launch/process_group.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <string_view>

#include "dscpp/error.h"
#include "launch/error_lines.h"
#include "util/log.h"
#include "util/shm_names.h"

namespace dscpp::launch {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxLine = 64 * 1024;       // a longer line without '\n' is forwarded in pieces
constexpr size_t kErrorScanBytes = 4 << 20;  // how far back a rank's log is searched for errors
constexpr auto kDrainAfterLastExit = std::chrono::milliseconds(500);
constexpr auto kWaitAfterKill = std::chrono::seconds(5);
constexpr int kHandledSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE};

// Self-pipe shared with the signal handler; only one ChildGroup is alive at a time.
std::atomic<bool> g_group_alive{false};
int g_sig_pipe[2] = {-1, -1};
struct sigaction g_old_actions[sizeof(kHandledSignals) / sizeof(int)];

void on_signal(int sig) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = ::write(g_sig_pipe[1], &b, 1);
  errno = saved;
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Async-signal-safe text for the few errno values exec() commonly fails with.
const char* exec_errno_text(int e) {
  switch (e) {
    case ENOENT:
      return "no such file or directory";
    case EACCES:
      return "permission denied";
    case ENOEXEC:
      return "not an executable format";
    case ENOMEM:
      return "out of memory";
    case E2BIG:
      return "argument list too long";
    default:
      return "exec failed";
  }
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

std::string percent_encode(const std::string& s) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (c <= 0x20 || c == 0x7f || c == '%' || c == '=') {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

bool percent_decode(const std::string& s, std::string* out) {
  out->clear();
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      *out += s[i];
      continue;
    }
    if (i + 2 >= s.size()) return false;
    auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      return -1;
    };
    int hi = hex(s[i + 1]), lo = hex(s[i + 2]);
    if (hi < 0 || lo < 0) return false;
    *out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return true;
}

// Calls fn(line) for each line in the last `max_bytes` of a file (a rank's log with
// --enable_each_rank_log), oldest first; a first line the cut fell into is skipped. Does
// nothing when the file cannot be read.
template <typename Fn>
void for_each_line_of_file_end(const std::string& path, size_t max_bytes, Fn&& fn) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  struct stat st {};
  ::fstat(fd, &st);
  off_t start = std::max<off_t>(0, st.st_size - static_cast<off_t>(max_bytes));
  std::string data(static_cast<size_t>(st.st_size - start), '\0');
  ssize_t got = ::pread(fd, data.data(), data.size(), start);
  ::close(fd);
  data.resize(got > 0 ? static_cast<size_t>(got) : 0);
  size_t pos = 0;
  if (start > 0) {  // the first line was likely cut in the middle
    const size_t nl = data.find('\n');
    pos = nl == std::string::npos ? data.size() : nl + 1;
  }
  while (pos < data.size()) {
    size_t nl = data.find('\n', pos);
    if (nl == std::string::npos) nl = data.size();
    fn(std::string_view(data).substr(pos, nl - pos));
    pos = nl + 1;
  }
}

// The last `n` lines of a file.
std::vector<std::string> file_tail(const std::string& path, size_t n) {
  std::deque<std::string> lines;
  for_each_line_of_file_end(path, kMaxLine, [&](std::string_view line) {
    lines.emplace_back(line);
    if (lines.size() > n) lines.pop_front();
  });
  return {lines.begin(), lines.end()};
}

// The error lines (NOTE [error lines] in error_lines.h) of a file's last kErrorScanBytes.
std::vector<std::string> file_error_lines(const std::string& path, size_t n) {
  ErrorLines errors(n);
  for_each_line_of_file_end(path, kErrorScanBytes,
                            [&](std::string_view line) { errors.add(line); });
  return errors.lines();
}

// Removes the shared-memory names the processes of group `pgid` left in /dev/shm (NOTE
// [shared-memory names] in util/shm_names.h); memory still mapped stays valid.
void remove_shm_segments(pid_t pgid) {
  DIR* dir = ::opendir("/dev/shm");
  if (!dir) return;
  const std::string prefix = shm_segment_prefix(pgid);
  while (const dirent* e = ::readdir(dir)) {
    if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) != 0) continue;
    if (::shm_unlink(("/" + std::string(e->d_name)).c_str()) == 0) {
      DSCPP_LOG_DEBUG("removed /dev/shm/{}, left by process group {}", e->d_name, pgid);
    }
  }
  ::closedir(dir);
}

}  // namespace

void write_all(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n > 0) {
      off += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 100);
    } else {
      return;  // the reader went away (EPIPE): output is lost, the job goes on
    }
  }
}

// ---------------------------------------------------------------------------------------------
ExitStatus ExitStatus::from_wait_status(int status) {
  ExitStatus s;
  if (WIFEXITED(status)) {
    s.exited = true;
    s.code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    s.signal = WTERMSIG(status);
  }
  return s;
}

std::string ExitStatus::describe() const {
  if (exited) return "exited with status " + std::to_string(code);
  return "killed by signal " + std::to_string(signal) + " (" + signal_name(signal) + ")";
}

std::string signal_name(int sig) {
  switch (sig) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGILL:
      return "SIGILL";
    case SIGTRAP:
      return "SIGTRAP";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGALRM:
      return "SIGALRM";
    case SIGTERM:
      return "SIGTERM";
    case SIGXCPU:
      return "SIGXCPU";
    case SIGXFSZ:
      return "SIGXFSZ";
    case SIGSYS:
      return "SIGSYS";
    default:
      return "signal " + std::to_string(sig);
  }
}

std::string format_agent_failure(const Failure& f) {
  std::string out = std::string(kAgentFailureMarker) + " who=" + percent_encode(f.who) +
                    " how=" + percent_encode(f.how) + " exit=" + std::to_string(f.exit_code);
  // What does not fit in kMaxLine (NOTE [agent failure line]) is left out: the oldest last
  // lines first, then the newest error lines.
  size_t room = kMaxLine - 1 - std::min(out.size(), kMaxLine - 1);
  for (const auto& l : f.error_lines) {
    std::string entry = " error=" + percent_encode(l);
    if (entry.size() > room) break;
    room -= entry.size();
    out += entry;
  }
  std::vector<std::string> newest_first;
  for (auto l = f.last_lines.rbegin(); l != f.last_lines.rend(); ++l) {
    std::string entry = " line=" + percent_encode(*l);
    if (entry.size() > room) break;
    room -= entry.size();
    newest_first.push_back(std::move(entry));
  }
  for (auto e = newest_first.rbegin(); e != newest_first.rend(); ++e) out += *e;
  return out;
}

std::optional<Failure> parse_agent_failure(const std::string& line) {
  const std::string marker = std::string(kAgentFailureMarker) + " ";
  if (line.rfind(marker, 0) != 0) return std::nullopt;
  Failure f;
  bool has_who = false, has_exit = false;
  size_t pos = marker.size();
  while (pos < line.size()) {
    size_t end = line.find(' ', pos);
    if (end == std::string::npos) end = line.size();
    std::string field = line.substr(pos, end - pos);
    pos = end + 1;
    if (field.empty()) continue;
    size_t eq = field.find('=');
    if (eq == std::string::npos) return std::nullopt;
    std::string key = field.substr(0, eq), value;
    if (!percent_decode(field.substr(eq + 1), &value)) return std::nullopt;
    if (key == "who") {
      f.who = value;
      has_who = true;
    } else if (key == "how") {
      f.how = value;
    } else if (key == "exit") {
      char* e = nullptr;
      long v = std::strtol(value.c_str(), &e, 10);
      if (value.empty() || *e || v <= 0 || v > 255) return std::nullopt;
      f.exit_code = static_cast<int>(v);
      has_exit = true;
    } else if (key == "line") {
      f.last_lines.push_back(value);
    } else if (key == "error") {
      f.error_lines.push_back(value);
    }  // unknown keys are skipped: a newer agent may say more
  }
  if (!has_who || !has_exit) return std::nullopt;
  return f;
}

// ---------------------------------------------------------------------------------------------
struct ChildGroup::Stream {
  int fd = -1;
  bool is_err = false;
  std::string buf;
};

struct ChildGroup::Child {
  ChildSpec spec;
  pid_t pid = -1;
  Stream out, err;
  int lifeline = -1;  // write end of the child's stdin pipe
  bool running = true;
  bool stopped = false;
  ExitStatus status;
  std::deque<std::string> tail;
  ErrorLines errors;  // sized in start()
};

ChildGroup::ChildGroup(ChildGroupOptions options) : options_(options) {
  bool expected = false;
  DSCPP_CHECK(g_group_alive.compare_exchange_strong(expected, true), LaunchError,
              "a launcher is already running in this process. HINT: run jobs one after another");
  // A launcher started with stdin/stdout/stderr closed would hand those numbers to its pipes,
  // and a child would lose them at exec: keep 0-2 taken.
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) < 0) ::open("/dev/null", O_RDWR);
  }
  if (::pipe2(g_sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    g_group_alive = false;
    DSCPP_FAIL(LaunchError, "cannot create a pipe: ", std::strerror(errno));
  }
  for (size_t i = 0; i < std::size(kHandledSignals); ++i) {
    struct sigaction sa {};
    sa.sa_handler = kHandledSignals[i] == SIGPIPE ? SIG_IGN : on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | (kHandledSignals[i] == SIGCHLD ? SA_NOCLDSTOP : 0);
    ::sigaction(kHandledSignals[i], &sa, &g_old_actions[i]);
  }
}

ChildGroup::~ChildGroup() {
  for (auto& c : children_) {
    if (c->running) {
      ::kill(-c->pid, SIGKILL);
      ::kill(c->pid, SIGKILL);
      int st = 0;
      while (::waitpid(c->pid, &st, 0) < 0 && errno == EINTR) {
      }
    }
    close_fd(c->out.fd);
    close_fd(c->err.fd);
    close_fd(c->lifeline);
  }
  for (size_t i = 0; i < std::size(kHandledSignals); ++i) {
    ::sigaction(kHandledSignals[i], &g_old_actions[i], nullptr);
  }
  close_fd(g_sig_pipe[0]);
  close_fd(g_sig_pipe[1]);
  g_group_alive = false;
}

size_t ChildGroup::start(const ChildSpec& spec) {
  auto c = std::make_unique<Child>();
  c->spec = spec;
  c->err.is_err = true;
  c->errors = ErrorLines(options_.error_lines);
  // Everything the child needs is prepared here: after fork() it only makes system calls.
  int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1}, in_pipe[2] = {-1, -1};
  int log_fd = -1, null_fd = -1;
  auto cleanup = [&] {
    for (int* fd : {&out_pipe[0], &out_pipe[1], &err_pipe[0], &err_pipe[1], &in_pipe[0],
                    &in_pipe[1], &log_fd, &null_fd}) {
      close_fd(*fd);
    }
  };
  if (!spec.log_path.empty()) {
    log_fd = ::open(spec.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    DSCPP_CHECK(log_fd >= 0, LaunchError, "cannot open the log file '", spec.log_path, "' of ",
                spec.name, ": ", std::strerror(errno),
                ". HINT: check that the --enable_each_rank_log folder is writable");
  } else if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
    int e = errno;
    cleanup();
    DSCPP_FAIL(LaunchError, "cannot create pipes for ", spec.name, ": ", std::strerror(e),
               ". HINT: raise the open-file limit (ulimit -n)");
  }
  if (spec.lifeline_stdin) {
    if (::pipe2(in_pipe, O_CLOEXEC) != 0) {
      int e = errno;
      cleanup();
      DSCPP_FAIL(LaunchError, "cannot create a pipe for ", spec.name, ": ", std::strerror(e));
    }
  } else {
    null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  std::vector<std::string> argv = spec.argv, env = spec.env;
  std::vector<char*> c_argv = c_strings(argv), c_env = c_strings(env);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int cpu : spec.cpus) CPU_SET(cpu, &cpus);
  const std::string exec_msg = "dscpp launch: cannot execute " + spec.path + ": ";
  const pid_t parent = ::getpid();
  const int child_in = spec.lifeline_stdin ? in_pipe[0] : null_fd;
  const int child_out = log_fd >= 0 ? log_fd : out_pipe[1];
  const int child_err = log_fd >= 0 ? log_fd : err_pipe[1];

  pid_t pid = ::fork();
  if (pid < 0) {
    int e = errno;
    cleanup();
    DSCPP_FAIL(LaunchError, "fork() failed for ", spec.name, ": ", std::strerror(e),
               ". HINT: check the process limit (ulimit -u) and free memory");
  }
  if (pid == 0) {
    // Child: own process group, die with the launcher, default signal dispositions.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, spec.parent_death_signal);
    if (::getppid() != parent) ::_exit(1);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE, SIGQUIT}) {
      ::sigaction(sig, &dfl, nullptr);
    }
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (child_in >= 0) ::dup2(child_in, 0);
    ::dup2(child_out, 1);
    ::dup2(child_err, 2);
    if (!spec.cpus.empty()) ::sched_setaffinity(0, sizeof(cpus), &cpus);
    ::execve(spec.path.c_str(), c_argv.data(), c_env.data());
    const char* why = exec_errno_text(errno);
    [[maybe_unused]] ssize_t n = ::write(2, exec_msg.data(), exec_msg.size());
    n = ::write(2, why, std::strlen(why));
    n = ::write(2, "\n", 1);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so no signal can miss the group (the child may be late)
  c->pid = pid;
  close_fd(out_pipe[1]);
  close_fd(err_pipe[1]);
  close_fd(in_pipe[0]);
  close_fd(log_fd);
  close_fd(null_fd);
  c->out.fd = out_pipe[0];
  c->err.fd = err_pipe[0];
  c->lifeline = in_pipe[1];
  if (c->lifeline >= 0 && !spec.stdin_first_line.empty()) {
    // Far below the pipe's buffer, so it cannot block; a child that is already gone is
    // reported by run() like any other.
    const std::string line = spec.stdin_first_line + "\n";
    (void)!::write(c->lifeline, line.data(), line.size());
  }
  for (int fd : {c->out.fd, c->err.fd}) {
    if (fd >= 0) set_nonblocking(fd);
  }
  DSCPP_LOG_DEBUG("started {} as pid {}: {}", spec.name, pid, [&] {
    std::string s;
    for (const auto& a : spec.argv) s += (s.empty() ? "" : " ") + a;
    return s;
  }());
  children_.push_back(std::move(c));
  return children_.size() - 1;
}

void ChildGroup::handle_line(Child& c, const std::string& line, bool is_err) {
  if (c.spec.agent_lines && line.rfind(kAgentFailureMarker, 0) == 0) {
    if (auto f = parse_agent_failure(line)) {
      DSCPP_LOG_DEBUG("{} reports: {} {}", c.spec.name, f->who, f->how);
      if (!stopping_ && !cause_) set_cause(*f, &c);
      return;
    }
  }
  write_all(is_err ? 2 : 1, c.spec.prefix + line + "\n");
  c.tail.push_back(line);
  while (c.tail.size() > options_.tail_lines) c.tail.pop_front();
  c.errors.add(line);
}

void ChildGroup::flush_partial(Child& c, Stream& s) {
  if (!s.buf.empty()) {
    std::string rest;
    rest.swap(s.buf);
    handle_line(c, rest, s.is_err);
  }
}

void ChildGroup::read_stream(Child& c, Stream& s, bool drain) {
  char buf[16384];
  size_t budget = drain ? SIZE_MAX : (1u << 20);  // don't let one chatty child starve others
  while (s.fd >= 0 && budget > 0) {
    ssize_t n = ::read(s.fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (n <= 0) {  // EOF, or an error we treat as EOF
      flush_partial(c, s);
      close_fd(s.fd);
      return;
    }
    budget -= std::min(budget, static_cast<size_t>(n));
    s.buf.append(buf, static_cast<size_t>(n));
    size_t pos = 0;
    for (size_t nl; (nl = s.buf.find('\n', pos)) != std::string::npos; pos = nl + 1) {
      handle_line(c, s.buf.substr(pos, nl - pos), s.is_err);
    }
    s.buf.erase(0, pos);
    if (s.buf.size() >= kMaxLine) flush_partial(c, s);
  }
}

std::vector<std::string> ChildGroup::last_lines_of(const Child& c) const {
  if (!c.spec.log_path.empty()) return file_tail(c.spec.log_path, options_.tail_lines);
  return {c.tail.begin(), c.tail.end()};
}

std::vector<std::string> ChildGroup::error_lines_of(const Child& c) const {
  if (!c.spec.log_path.empty()) return file_error_lines(c.spec.log_path, options_.error_lines);
  return c.errors.lines();
}

void ChildGroup::reap(Child& c, int wait_status) {
  c.running = false;
  c.status = ExitStatus::from_wait_status(wait_status);
  // Whatever it printed before exiting is already in the pipes: read it now, so that a node
  // agent's failure line is seen before its exit status is judged.
  read_stream(c, c.out, true);
  read_stream(c, c.err, true);
  DSCPP_LOG_DEBUG("{} (pid {}) {}", c.spec.name, c.pid, c.status.describe());
  // NOTE [leftovers of an ended child]: what the child left behind in its process group (a
  // `sleep 60 &` of a shell) is killed at once when the child failed or the job is stopping.
  // The group id cannot have been reused yet: it stays allocated while any member lives, and
  // an empty group just makes kill() fail with ESRCH (we signal right after waitpid(), before
  // the number could be handed to a new process).
  if (!c.status.ok() || stopping_) {
    ::kill(-c.pid, SIGKILL);
    remove_shm_segments(c.pid);
  }
  if (!c.status.ok() && !stopping_) {
    set_cause(Failure{c.spec.name, c.status.describe(), c.status.launcher_code(), last_lines_of(c),
                      error_lines_of(c)},
              &c);
  }
}

void ChildGroup::set_cause(Failure f, const Child* from) {
  if (f.exit_code == 0) f.exit_code = 1;
  cause_ = std::move(f);
  cause_child_ = from;
  if (options_.on_cause) options_.on_cause(*cause_);
  begin_stop(SIGTERM, from);
}

void ChildGroup::kill_all(int sig, const Child* except) {
  for (auto& c : children_) {
    if (!c->running || c.get() == except) continue;
    if (::kill(-c->pid, sig) != 0) ::kill(c->pid, sig);
  }
}

void ChildGroup::begin_stop(int sig, const Child* except) {
  stopping_ = true;
  stop_deadline_ = Clock::now() + options_.grace;
  for (auto& c : children_) {
    if (c->running && c.get() != except) c->stopped = true;
  }
  // Signal first, then close the lifelines: a node agent that saw its stdin close first could
  // finish and restore its default SIGTERM action before our signal arrives. SIGCONT after the
  // signal (as systemd and docker stop do): a stopped process gets to act on it now instead of
  // waiting for the SIGKILL at the end of the grace.
  kill_all(sig, except);
  if (sig != SIGKILL) kill_all(SIGCONT, except);
  for (auto& c : children_) close_fd(c->lifeline);
}

RunOutcome ChildGroup::run() {
  bool stdin_open = options_.watch_stdin;
  std::optional<Clock::time_point> all_ended;
  while (true) {
    const auto now = Clock::now();
    bool any_running =
        std::any_of(children_.begin(), children_.end(), [](const auto& c) { return c->running; });
    bool any_stream = std::any_of(children_.begin(), children_.end(),
                                  [](const auto& c) { return c->out.fd >= 0 || c->err.fd >= 0; });
    if (!any_running) {
      if (!all_ended) all_ended = now;
      // Grandchildren may hold a pipe open after the child exited: wait only briefly.
      if (!any_stream || now - *all_ended >= kDrainAfterLastExit) break;
    }
    if (killed_ && any_running && now - kill_time_ >= kWaitAfterKill) {
      DSCPP_LOG_ERROR("some processes did not exit after SIGKILL; giving up waiting for them");
      break;
    }

    // Wait for output, a signal, or the next deadline.
    std::vector<pollfd> fds;
    std::vector<std::pair<Child*, Stream*>> owners;
    fds.push_back({g_sig_pipe[0], POLLIN, 0});
    owners.emplace_back(nullptr, nullptr);
    if (stdin_open) {
      fds.push_back({0, POLLIN, 0});
      owners.emplace_back(nullptr, nullptr);
    }
    for (auto& c : children_) {
      for (Stream* s : {&c->out, &c->err}) {
        if (s->fd < 0) continue;
        fds.push_back({s->fd, POLLIN, 0});
        owners.emplace_back(c.get(), s);
      }
    }
    int timeout_ms = 100;  // SIGCHLD wakes us up; the timeout only bounds missed wakeups
    if (stopping_ && !killed_) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(stop_deadline_ - now);
      timeout_ms = static_cast<int>(std::clamp<long long>(left.count(), 0, timeout_ms));
    }
    int ready = ::poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) {
      DSCPP_LOG_ERROR("poll() failed: {}", std::strerror(errno));
    }

    if (ready > 0) {
      size_t i = 0;
      if (fds[i++].revents) {
        unsigned char sigs[64];
        ssize_t n;
        while ((n = ::read(g_sig_pipe[0], sigs, sizeof(sigs))) > 0) {
          for (ssize_t k = 0; k < n; ++k) {
            int sig = sigs[k];
            if (sig == SIGCHLD || sig == SIGPIPE) continue;
            if (!stopping_) {
              DSCPP_LOG_WARN("received {}: stopping all processes", signal_name(sig));
              signal_ = sig;
              begin_stop(sig, nullptr);
            } else if (!killed_) {
              DSCPP_LOG_WARN("received {} again: killing all processes now", signal_name(sig));
              if (!signal_ && !cause_) signal_ = sig;
              kill_all(SIGKILL, nullptr);
              killed_ = true;
              kill_time_ = Clock::now();
            }
          }
        }
      }
      if (stdin_open && fds[i++].revents) {
        char buf[4096];
        ssize_t n = ::read(0, buf, sizeof(buf));
        if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
          stdin_open = false;
          lifeline_lost_ = true;
          if (!stopping_) {
            DSCPP_LOG_WARN("stdin closed (the main launcher is gone): stopping all processes");
            begin_stop(SIGTERM, nullptr);
          }
        }
      }
      for (; i < fds.size(); ++i) {
        if (fds[i].revents) read_stream(*owners[i].first, *owners[i].second, false);
      }
    }

    for (auto& c : children_) {
      if (!c->running) continue;
      int st = 0;
      pid_t r = ::waitpid(c->pid, &st, WNOHANG);
      if (r == c->pid) reap(*c, st);
    }
    if (stopping_ && !killed_ && Clock::now() >= stop_deadline_) {
      bool left = false;
      for (auto& c : children_) left |= c->running;
      if (left) DSCPP_LOG_WARN("grace period over: sending SIGKILL to what is left");
      kill_all(SIGKILL, nullptr);
      killed_ = true;
      kill_time_ = Clock::now();
    }
  }

  RunOutcome out;
  for (auto& c : children_) {
    flush_partial(*c, c->out);
    flush_partial(*c, c->err);
    close_fd(c->out.fd);
    close_fd(c->err.fd);
    close_fd(c->lifeline);
    out.children.push_back(ChildEnd{c->spec.name, c->pid, c->status, !c->running, c->stopped,
                                    c.get() == cause_child_, last_lines_of(*c)});
  }
  out.cause = cause_;
  out.signal = signal_;
  out.lifeline_lost = lifeline_lost_;
  if (cause_) {
    out.exit_code = cause_->exit_code;
  } else if (signal_) {
    out.exit_code = 128 + signal_;
  } else if (lifeline_lost_) {
    out.exit_code = 1;
  } else {
    for (const auto& e : out.children) {
      if (!e.reaped || !e.status.ok()) out.exit_code = 1;
    }
  }
  return out;
}

}  // namespace dscpp::launch
