// The launcher: pure pieces (host resolution, mpirun/srun/agent command construction, the
// agent failure line, the failure report), run_job() called twice in one process, and the
// real `dscpp launch` binary running small /bin/sh programs: environment of each rank, output
// prefixes, a failing or killed rank stopping the job, SIGTERM to the launcher, per-rank logs,
// core binding, mpirun, and (as root) a two-node job over network namespaces
// (multinode_netns.sh). The binary is DSCPP_CLI_PATH unless the environment variable
// DSCPP_TEST_CLI names another one.
#include "launch/launcher.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "dscpp/error.h"
#include "support/errors.h"

namespace dscpp::launch {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string cli_path() {
  const char* p = std::getenv("DSCPP_TEST_CLI");
  return p && *p ? p : DSCPP_CLI_PATH;
}

using dscpp::testing::error_of;

bool contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  sched_getaffinity(0, sizeof(set), &set);
  return CPU_COUNT(&set);
}

// A process started by a test, with its stdout and stderr captured.
struct Result {
  bool exited = false;
  int code = -1;   // exit code when exited
  int signal = 0;  // signal when killed
  std::string out, err;
  double seconds = 0;
};

class Proc {
 public:
  // `env` entries "NAME=value" are set, "NAME" alone is unset, in the child only.
  explicit Proc(const std::vector<std::string>& argv, const std::vector<std::string>& env = {}) {
    int out[2], err[2];
    EXPECT_EQ(pipe2(out, O_CLOEXEC), 0);
    EXPECT_EQ(pipe2(err, O_CLOEXEC), 0);
    start_ = Clock::now();
    pid_ = fork();
    if (pid_ == 0) {
      for (const auto& e : env) {
        size_t eq = e.find('=');
        if (eq == std::string::npos) {
          unsetenv(e.c_str());
        } else {
          setenv(e.substr(0, eq).c_str(), e.substr(eq + 1).c_str(), 1);
        }
      }
      dup2(out[1], 1);
      dup2(err[1], 2);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(out[1]);
    close(err[1]);
    out_fd_ = out[0];
    err_fd_ = err[0];
  }
  ~Proc() {
    if (pid_ > 0 && !done_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_fd_ >= 0) close(out_fd_);
    if (err_fd_ >= 0) close(err_fd_);
  }
  pid_t pid() const { return pid_; }

  // Collects output until the process exits; kills it (and fails the test) after timeout_s.
  Result wait(double timeout_s = 30) {
    Result r;
    const auto deadline = start_ + std::chrono::duration<double>(timeout_s);
    int status = 0;
    bool reaped = false;
    while (out_fd_ >= 0 || err_fd_ >= 0 || !reaped) {
      std::vector<pollfd> fds;
      if (out_fd_ >= 0) fds.push_back({out_fd_, POLLIN, 0});
      if (err_fd_ >= 0) fds.push_back({err_fd_, POLLIN, 0});
      poll(fds.data(), fds.size(), 50);
      for (auto& p : fds) {
        if (!p.revents) continue;
        char buf[8192];
        ssize_t n = read(p.fd, buf, sizeof(buf));
        std::string& dst = p.fd == out_fd_ ? r.out : r.err;
        if (n > 0) {
          dst.append(buf, static_cast<size_t>(n));
        } else {
          (p.fd == out_fd_ ? out_fd_ : err_fd_) = -1;
          close(p.fd);
        }
      }
      if (!reaped && waitpid(pid_, &status, WNOHANG) == pid_) reaped = true;
      if (Clock::now() > deadline) {
        ADD_FAILURE() << "process did not finish within " << timeout_s << " s; killing it\n"
                      << "stdout:\n"
                      << r.out << "\nstderr:\n"
                      << r.err;
        kill(pid_, SIGKILL);
        if (!reaped) waitpid(pid_, &status, 0);
        reaped = true;
        break;
      }
    }
    done_ = true;
    r.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    r.exited = WIFEXITED(status);
    r.code = r.exited ? WEXITSTATUS(status) : -1;
    r.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    return r;
  }

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1, err_fd_ = -1;
  bool done_ = false;
  Clock::time_point start_;
};

Result launch(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
              double timeout_s = 30) {
  std::vector<std::string> argv = {cli_path(), "launch"};
  argv.insert(argv.end(), args.begin(), args.end());
  return Proc(argv, env).wait(timeout_s);
}

std::string dump(const Result& r) {
  return "exit " + std::to_string(r.code) + " signal " + std::to_string(r.signal) + " after " +
         std::to_string(r.seconds) + " s\n--- stdout:\n" + r.out + "--- stderr:\n" + r.err;
}

// A fresh temporary folder, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/dscpp_launch_test_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
};

// Running and not a zombie (a zombie has exited; init reaps it when it gets to it).
bool alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z';
}

std::optional<pid_t> read_pid(const fs::path& p) {
  std::ifstream in(p);
  long v = 0;
  if (!(in >> v) || v <= 0) return std::nullopt;
  return static_cast<pid_t>(v);
}

// Waits (up to 3 s) for the pids to be gone; returns those still running.
std::vector<pid_t> still_running(const std::vector<pid_t>& pids) {
  std::vector<pid_t> left = pids;
  for (int i = 0; i < 30 && !left.empty(); ++i) {
    std::vector<pid_t> next;
    for (pid_t p : left) {
      if (alive(p)) next.push_back(p);
    }
    left = next;
    if (!left.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return left;
}

LaunchOptions options(int procs) {
  LaunchOptions o;
  o.num_procs = procs;
  o.program = {"prog", "--flag", "a b"};
  return o;
}

std::vector<HostSlots> two_hosts() { return {{"n1", {0, 1}, 0}, {"n2", {0, 1}, 2}}; }

// ---------------------------------------------------------------------------------------------
// Pure pieces.

TEST(LaunchResolve, DefaultsToOneLocalProcess) {
  LaunchOptions o;
  o.program = {"true"};
  auto hosts = resolve_hosts(o);
  ASSERT_EQ(hosts.size(), 1u);
  EXPECT_EQ(hosts[0].host, "localhost");
  EXPECT_EQ(hosts[0].num_procs(), 1);
  EXPECT_EQ(choose_launcher(o, hosts), "local");
  EXPECT_EQ(resolve_master_addr(o, hosts), "127.0.0.1");
  o.num_procs = 3;
  EXPECT_EQ(resolve_hosts(o)[0].slots, (std::vector<int>{0, 1, 2}));
  o.include = "localhost:0,2";
  EXPECT_EQ(resolve_hosts(o)[0].slots, (std::vector<int>{0, 2}));
}

TEST(LaunchResolve, HostfileChoosesSshAndFirstHostAsMaster) {
  TempDir dir;
  std::string hf = dir.str() + "/hosts";
  std::ofstream(hf) << "node-a slots=2\nnode-b slots=2\nnode-c slots=4\n";
  LaunchOptions o;
  o.hostfile = hf;
  o.program = {"true"};
  auto hosts = resolve_hosts(o);
  ASSERT_EQ(hosts.size(), 3u);
  EXPECT_EQ(hosts[2].first_rank, 4);
  EXPECT_EQ(choose_launcher(o, hosts), "ssh");
  EXPECT_EQ(resolve_master_addr(o, hosts), "node-a");
  o.master_addr = "10.1.2.3";
  EXPECT_EQ(resolve_master_addr(o, hosts), "10.1.2.3");
  o.num_nodes = 2;
  o.num_procs = 1;
  EXPECT_EQ(describe_hosts(resolve_hosts(o)), "node-a (slots 0), node-b (slots 0)");
  o.launcher = "local";
  EXPECT_TRUE(contains(error_of([&] { choose_launcher(o, hosts); }), "this machine only"));
  o.launcher = "pdsh";
  EXPECT_TRUE(contains(error_of([&] { choose_launcher(o, hosts); }), "unknown --launcher"));
  o.launcher = "";
  o.num_nodes = 4;
  EXPECT_TRUE(contains(error_of([&] { resolve_hosts(o); }), "--num_nodes 4"));
}

TEST(LaunchResolve, BadCountsAreErrors) {
  LaunchOptions o;
  o.program = {"true"};
  o.num_procs = 0;
  EXPECT_TRUE(contains(error_of([&] { resolve_hosts(o); }), "--num_procs 0"));
  o.num_procs = 1;
  o.num_nodes = 2;
  EXPECT_TRUE(contains(error_of([&] { resolve_hosts(o); }), "needs a hostfile"));
  o.num_nodes = -1;
  o.hostfile = "/nonexistent/hostfile";
  EXPECT_TRUE(contains(error_of([&] { resolve_hosts(o); }), "cannot open hostfile"));
}

TEST(LaunchResolve, NnodesRangeAndDroppedHosts) {
  int lo = 0, hi = 0;
  parse_nnodes("2:4", &lo, &hi);
  EXPECT_EQ(lo, 2);
  EXPECT_EQ(hi, 4);
  parse_nnodes("3", &lo, &hi);
  EXPECT_EQ(lo, 3);
  EXPECT_EQ(hi, 3);
  for (const char* bad : {"", "0:2", "3:2", "a:b", "2:", ":2", "1:2:3", "-1:2"}) {
    std::string msg = error_of([&] { parse_nnodes(bad, &lo, &hi); });
    EXPECT_TRUE(contains(msg, "--nnodes")) << bad << ": " << msg;
  }
  // Dropping a host renumbers the ranks of those after it, in hostfile order.
  std::vector<HostSlots> hosts = {{"a", {0, 1}, 0}, {"b", {0, 1, 2}, 2}, {"c", {1}, 5}};
  std::vector<HostSlots> left = drop_hosts(hosts, {1});
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(left[0].host, "a");
  EXPECT_EQ(left[0].first_rank, 0);
  EXPECT_EQ(left[1].host, "c");
  EXPECT_EQ(left[1].first_rank, 2);
  EXPECT_EQ(left[1].slots, std::vector<int>{1});
  left = drop_hosts(hosts, {0});
  EXPECT_EQ(left[0].first_rank, 0);
  EXPECT_EQ(left[1].first_rank, 3);
}

TEST(LaunchResolve, ProgramLookup) {
  EXPECT_EQ(resolve_program("sh", "/nonexistent:/bin:/usr/bin"), "/bin/sh");
  EXPECT_EQ(resolve_program("/bin/sh", ""), "/bin/sh");
  std::string msg = error_of([] { resolve_program("no_such_program_dscpp", "/bin:/usr/bin"); });
  EXPECT_TRUE(contains(msg, "not found in PATH")) << msg;
  EXPECT_TRUE(contains(msg, "HINT:")) << msg;
  msg = error_of([] { resolve_program("/nonexistent/prog", "/bin"); });
  EXPECT_TRUE(contains(msg, "does not exist")) << msg;
  msg = error_of([] { resolve_program("/etc/passwd", "/bin"); });
  EXPECT_TRUE(contains(msg, "not an executable")) << msg;
}

TEST(LaunchCommand, OpenmpiCommand) {
  LaunchOptions o = options(2);
  o.launcher_args = "--mca btl tcp,self -x 'FOO=a b'";
  HostFacts facts{/*is_root=*/true, /*local_cores=*/8, /*omp_threads_set=*/false};
  auto cmd = openmpi_command(o, two_hosts(), facts);
  std::vector<std::string> want = {"mpirun",    "-np",
                                   "4",         "--host",
                                   "n1:2,n2:2", "--allow-run-as-root",
                                   "-x",        "MASTER_ADDR=n1",
                                   "-x",        "MASTER_PORT=29500",
                                   "-x",        "DSCPP_RENDEZVOUS_SECRET",
                                   "-x",        "OMP_NUM_THREADS=4",
                                   "--mca",     "btl",
                                   "tcp,self",  "-x",
                                   "FOO=a b",   "prog",
                                   "--flag",    "a b"};
  EXPECT_EQ(cmd, want);
}

TEST(LaunchCommand, OpenmpiOversubscribesAndPassesOmpThrough) {
  LaunchOptions o = options(4);
  o.master_addr = "10.0.0.1";
  o.master_port = 1234;
  HostFacts facts{/*is_root=*/false, /*local_cores=*/2, /*omp_threads_set=*/true};
  auto cmd = openmpi_command(o, {{"localhost", {0, 1, 2, 3}, 0}}, facts);
  std::vector<std::string> want = {"mpirun",      "-np",
                                   "4",           "--host",
                                   "localhost:4", "--oversubscribe",
                                   "-x",          "MASTER_ADDR=10.0.0.1",
                                   "-x",          "MASTER_PORT=1234",
                                   "-x",          "DSCPP_RENDEZVOUS_SECRET",
                                   "-x",          "OMP_NUM_THREADS",
                                   "prog",        "--flag",
                                   "a b"};
  EXPECT_EQ(cmd, want);
}

TEST(LaunchCommand, SlurmCommandFromHostfile) {
  LaunchOptions o = options(2);
  o.hostfile = "hosts";
  o.launcher = "slurm";
  o.launcher_args = "--partition gpu";
  auto cmd = slurm_command(o, two_hosts());
  std::vector<std::string> want = {"srun",
                                   "--nodes",
                                   "2",
                                   "--ntasks-per-node",
                                   "2",
                                   "--nodelist=n1,n2",
                                   "--export=ALL,MASTER_ADDR=n1,MASTER_PORT=29500",
                                   "--partition",
                                   "gpu",
                                   "prog",
                                   "--flag",
                                   "a b"};
  EXPECT_EQ(cmd, want);
  std::string msg = error_of([&] { slurm_command(o, {{"n1", {0, 1}, 0}, {"n2", {0}, 2}}); });
  EXPECT_TRUE(contains(msg, "same number of tasks")) << msg;
}

TEST(LaunchCommand, SlurmCommandWithoutHostfile) {
  LaunchOptions o = options(4);
  o.num_nodes = 3;
  o.launcher = "slurm";
  EXPECT_TRUE(resolve_hosts(o).empty());  // Slurm picks the nodes
  auto cmd = slurm_command(o, {});
  std::vector<std::string> want = {
      "srun", "--nodes", "3",  "--ntasks-per-node", "4", "--export=ALL,MASTER_PORT=29500",
      "prog", "--flag",  "a b"};
  EXPECT_EQ(cmd, want);
  o.master_addr = "head";
  EXPECT_EQ(slurm_command(o, {})[5], "--export=ALL,MASTER_ADDR=head,MASTER_PORT=29500");
}

TEST(LaunchCommand, AgentCommandWordsPassThroughShells) {
  LaunchOptions o = options(2);
  o.program = {"sh", "-c", "echo \"$RANK\" 'x' `id` ; exit 3", "", "@x:literal", "plain"};
  o.enable_each_rank_log = "/tmp/my logs";
  o.bind_cores_to_rank = true;
  o.log_level = "debug";
  o.workdir = "/work/my project";
  o.env = {"NCCL_DEBUG=INFO", "DSCPP_X=a b"};
  auto hosts = two_hosts();
  hosts[1].slots = {1, 3};
  auto cmd = agent_command(o, hosts, 1, "10.0.0.1", "/opt/dscpp/bin/dscpp");
  std::string joined;
  for (const auto& w : cmd) {
    EXPECT_EQ(w.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                  "0123456789_@%+=:,./-"),
              std::string::npos)
        << "word needs quoting: " << w;
    joined += w + " ";
  }
  for (const char* part :
       {"/opt/dscpp/bin/dscpp launch --node_agent --node_rank 1 --nnodes 2 --node_host n2 "
        "--num_procs 2 --rank_offset 2 --world_size 4 --master_addr 10.0.0.1 --master_port 29500",
        "--slots 1,3", "--bind_cores_to_rank", "--log_level debug", " -- sh -c @x:"}) {
    EXPECT_TRUE(contains(joined, part)) << part << "\nin: " << joined;
  }
  // The program words come back intact on the other side.
  auto dashes = std::find(cmd.begin(), cmd.end(), "--");
  ASSERT_NE(dashes, cmd.end());
  std::vector<std::string> decoded;
  for (auto it = dashes + 1; it != cmd.end(); ++it) decoded.push_back(decode_remote_word(*it));
  EXPECT_EQ(decoded, o.program);
  auto value_of = [&](const char* flag) {
    auto it = std::find(cmd.begin(), cmd.end(), flag);
    return it == cmd.end() || it + 1 == cmd.end() ? "(missing)" : decode_remote_word(*(it + 1));
  };
  EXPECT_EQ(value_of("--enable_each_rank_log"), "/tmp/my logs");
  EXPECT_EQ(value_of("--workdir"), "/work/my project");
  EXPECT_EQ(value_of("--env"), "NCCL_DEBUG=INFO");
  EXPECT_TRUE(contains(joined, "--env " + encode_remote_word("DSCPP_X=a b"))) << joined;
}

TEST(LaunchCommand, RemoteCmdTemplate) {
  EXPECT_EQ(expand_remote_cmd(kDefaultRemoteCmd, "n2", {"/bin/dscpp", "launch", "x"}),
            "ssh -o BatchMode=yes n2 /bin/dscpp launch x");
  EXPECT_EQ(expand_remote_cmd("ip netns exec {host} {command}", "ns1", {"a", "b"}),
            "ip netns exec ns1 a b");
  std::string msg = error_of([] { expand_remote_cmd("ssh {host}", "n", {"a"}); });
  EXPECT_TRUE(contains(msg, "{command}")) << msg;
}

TEST(LaunchCommand, SplitShellWords) {
  EXPECT_EQ(split_shell_words(""), std::vector<std::string>{});
  EXPECT_EQ(split_shell_words("  -a  b\t'c d' \"e \\\"f\\\"\" g\\ h ''"),
            (std::vector<std::string>{"-a", "b", "c d", "e \"f\"", "g h", ""}));
  EXPECT_TRUE(contains(error_of([] { split_shell_words("a 'b"); }), "unterminated"));
  EXPECT_TRUE(contains(error_of([] { split_shell_words("a \"b"); }), "unterminated"));
}

TEST(LaunchAgentLine, RoundTrip) {
  Failure f{"rank 3 on node-b",
            "exited with status 5",
            5,
            {"plain", "with spaces and = and %", "", "tab\there", "ünïcode"},
            {"[2026-11-29 22:30:01.123] [rank 3] [error] bad = 100%"}};
  std::string line = format_agent_failure(f);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_EQ(line.rfind(kAgentFailureMarker, 0), 0u);
  auto back = parse_agent_failure(line);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->who, f.who);
  EXPECT_EQ(back->how, f.how);
  EXPECT_EQ(back->exit_code, 5);
  EXPECT_EQ(back->last_lines, f.last_lines);
  EXPECT_EQ(back->error_lines, f.error_lines);
  // A line from an agent without error lines (older, or nothing to say) still parses.
  back = parse_agent_failure("@@dscpp-agent-failure who=x exit=1 line=a");
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->last_lines, std::vector<std::string>{"a"});
  EXPECT_TRUE(back->error_lines.empty());
}

TEST(LaunchAgentLine, LongLinesKeepTheLineUnder64KiB) {
  // The main launcher reads lines of up to 64 KiB in one piece: what does not fit is left
  // out, the oldest last lines first.
  Failure f{"rank 3 on node-b", "exited with status 5", 5, {}, {}};
  for (int i = 0; i < 10; ++i) f.error_lines.push_back("error " + std::string(3000, 'e'));
  for (int i = 0; i < 20; ++i) {
    f.last_lines.push_back("line" + std::to_string(i) + " " + std::string(5000, 'x'));
  }
  std::string line = format_agent_failure(f);
  EXPECT_LT(line.size(), 64u * 1024);
  auto back = parse_agent_failure(line);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->error_lines, f.error_lines);
  ASSERT_FALSE(back->last_lines.empty());
  EXPECT_LT(back->last_lines.size(), f.last_lines.size());
  EXPECT_EQ(back->last_lines.back(), f.last_lines.back());
}

TEST(LaunchAgentLine, OtherLinesAreNotFailures) {
  EXPECT_FALSE(parse_agent_failure("[rank 1] hello"));
  EXPECT_FALSE(parse_agent_failure("@@dscpp-agent-failure"));
  EXPECT_FALSE(parse_agent_failure("@@dscpp-agent-failure who=x"));            // no exit
  EXPECT_FALSE(parse_agent_failure("@@dscpp-agent-failure who=x exit=zero"));  // bad exit
  EXPECT_FALSE(parse_agent_failure("@@dscpp-agent-failure who=%zz exit=1"));   // bad escape
  EXPECT_TRUE(parse_agent_failure("@@dscpp-agent-failure who=x exit=1 future=1"));
}

TEST(LaunchReport, NamesCauseLastLinesAndStoppedRanks) {
  RunOutcome o;
  o.exit_code = 3;
  o.cause = Failure{"rank 2 on localhost", "exited with status 3", 3, {"loading", "oops"}};
  ExitStatus term;
  term.signal = SIGTERM;
  ExitStatus three;
  three.exited = true;
  three.code = 3;
  o.children = {{"rank 0 on localhost", 10, term, true, true, false, {}},
                {"rank 2 on localhost", 12, three, true, false, true, {}},
                {"rank 3 on localhost", 13, term, false, true, false, {}}};
  std::string r = failure_report(o);
  EXPECT_TRUE(contains(r, "cause: rank 2 on localhost exited with status 3")) << r;
  EXPECT_TRUE(contains(r, "  | loading\n  | oops\n")) << r;
  EXPECT_TRUE(contains(r,
                       "stopped by the launcher:\n  rank 0 on localhost: killed by signal 15 "
                       "(SIGTERM)"))
      << r;
  EXPECT_TRUE(contains(r,
                       "did not exit even after SIGKILL:\n  rank 3 on localhost: still "
                       "running as pid 13"))
      << r;
  EXPECT_TRUE(contains(r, "exits with status 3")) << r;
  EXPECT_EQ(three.describe(), "exited with status 3");
  EXPECT_EQ(term.launcher_code(), 143);
}

TEST(LaunchReport, ErrorLinesComeBeforeLastLines) {
  RunOutcome o;
  o.exit_code = 1;
  o.cause = Failure{"rank 0 on localhost",
                    "exited with status 1",
                    1,
                    {"config: a", "config: b"},
                    {"[2026-11-29 22:30:01.123] [rank 0] [error] shard 2 is corrupt"}};
  std::string r = failure_report(o);
  EXPECT_TRUE(contains(r,
                       "  last 1 error line of rank 0 on localhost:\n"
                       "  | [2026-11-29 22:30:01.123] [rank 0] [error] shard 2 is corrupt\n"
                       "  last 2 lines of rank 0 on localhost:\n"
                       "  | config: a\n  | config: b\n"))
      << r;
  o.cause->error_lines.clear();
  r = failure_report(o);
  EXPECT_FALSE(contains(r, "error line")) << r;
  o.cause->last_lines.clear();
  EXPECT_TRUE(contains(failure_report(o), "(it printed nothing)"));
}

TEST(LaunchReport, SignalStoppedJob) {
  RunOutcome o;
  o.exit_code = 130;
  o.signal = SIGINT;
  std::string r = failure_report(o);
  EXPECT_TRUE(contains(r, "the launcher received SIGINT")) << r;
}

// run_job() is a library call (dscpp check uses it): a second job in the same process works.
TEST(LaunchApi, RunJobTwiceInOneProcess) {
  LaunchOptions o;
  o.num_procs = 2;
  o.log_level = "warning";
  o.program = {"/bin/sh", "-c", "exit 0"};
  EXPECT_EQ(run_job(o), 0);
  o.program = {"/bin/sh", "-c", "[ $RANK = 1 ] && exit 4; exit 0"};
  EXPECT_EQ(run_job(o), 4);
  o.program = {"/nonexistent/program"};
  EXPECT_TRUE(contains(error_of([&] { run_job(o); }), "does not exist"));
  o.program = {"/bin/true"};
  EXPECT_EQ(run_job(o), 0);
}

// ---------------------------------------------------------------------------------------------
// The real binary.

TEST(LaunchProcess, EnvironmentOfFourRanks) {
  Result r = launch({"--num_procs", "4", "--master_port", "29611", "sh", "-c",
                     "echo \"env RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD_SIZE=$WORLD_SIZE "
                     "LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE MASTER_ADDR=$MASTER_ADDR "
                     "MASTER_PORT=$MASTER_PORT DSCPP_LAUNCHER=$DSCPP_LAUNCHER "
                     "OMP_NUM_THREADS=$OMP_NUM_THREADS\""},
                    {"OMP_NUM_THREADS", "RANK=77", "WORLD_SIZE=99"});
  ASSERT_EQ(r.code, 0) << dump(r);
  const int omp = std::max(1, usable_cores() / 4);
  for (int rank = 0; rank < 4; ++rank) {
    std::string want = "[rank " + std::to_string(rank) + "] env RANK=" + std::to_string(rank) +
                       " LOCAL_RANK=" + std::to_string(rank) +
                       " WORLD_SIZE=4 LOCAL_WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=29611 "
                       "DSCPP_LAUNCHER=1 OMP_NUM_THREADS=" +
                       std::to_string(omp) + "\n";
    EXPECT_TRUE(contains(r.out, want)) << want << dump(r);
  }
  EXPECT_TRUE(contains(r.err, "OMP_NUM_THREADS is not set")) << dump(r);
  EXPECT_TRUE(contains(r.err, "[launcher]")) << dump(r);
}

// The job's rendezvous secret (comm/job_secret.h) reaches every rank, locally through the
// environment and to node agents through their stdin, and never shows in the launcher's output
// or on an agent's command line; every start gets a new one.
TEST(LaunchProcess, JobSecretReachesRanksButNoCommandLine) {
  const std::string show =
      "echo got-\"secret:$DSCPP_RENDEZVOUS_SECRET\"; tr '\\0' ' ' < /proc/$PPID/cmdline; echo";
  auto secrets_of = [](const Result& r) {
    std::set<std::string> found;
    const std::string mark = "got-secret:";
    for (size_t at = r.out.find(mark); at != std::string::npos; at = r.out.find(mark, at + 1)) {
      found.insert(r.out.substr(at + mark.size(), r.out.find('\n', at) - at - mark.size()));
    }
    return found;
  };
  Result local = launch({"--num_procs", "2", "sh", "-c", show}, {"DSCPP_RENDEZVOUS_SECRET=mine"});
  ASSERT_EQ(local.code, 0) << dump(local);
  std::set<std::string> one = secrets_of(local);
  ASSERT_EQ(one.size(), 1u) << dump(local);  // both ranks, one secret (the launcher's own)
  const std::string secret = *one.begin();
  EXPECT_EQ(secret.size(), 64u) << dump(local);
  EXPECT_FALSE(contains(local.err, secret)) << dump(local);

  // Two "hosts" whose agents run here through a remote-command template.
  const std::string hostfile = ::testing::TempDir() + "/secret_hosts";
  std::ofstream(hostfile) << "node-a slots=1\nnode-b slots=1\n";
  Result agents = launch({"--hostfile", hostfile, "--master_addr", "127.0.0.1", "--remote_cmd",
                          "env NODE={host} {command}", "sh", "-c", show});
  ASSERT_EQ(agents.code, 0) << dump(agents);
  std::set<std::string> two = secrets_of(agents);
  ASSERT_EQ(two.size(), 1u) << dump(agents);
  EXPECT_EQ(two.begin()->size(), 64u) << dump(agents);
  EXPECT_NE(*two.begin(), secret) << "a new job must get a new secret";
  EXPECT_TRUE(contains(agents.out, "--node_agent")) << "the agent's command line was shown";
  const std::string lines = agents.out + agents.err;
  size_t uses = 0;
  for (size_t at = lines.find(*two.begin()); at != std::string::npos;
       at = lines.find(*two.begin(), at + 1)) {
    ++uses;
  }
  EXPECT_EQ(uses, 2u) << "the secret appears only where the ranks printed it\n" << dump(agents);
}

TEST(LaunchProcess, KeepsOmpNumThreadsWhenSet) {
  Result r =
      launch({"--num_procs", "2", "sh", "-c", "echo omp=$OMP_NUM_THREADS"}, {"OMP_NUM_THREADS=7"});
  ASSERT_EQ(r.code, 0) << dump(r);
  EXPECT_TRUE(contains(r.out, "[rank 0] omp=7\n")) << dump(r);
  EXPECT_TRUE(contains(r.out, "[rank 1] omp=7\n")) << dump(r);
}

TEST(LaunchProcess, OutputIsPrefixedPerRankAndStream) {
  Result r = launch({"--num_procs", "2", "--", "sh", "-c",
                     "echo out-$RANK; echo err-$RANK >&2; echo second-$RANK; printf part-$RANK"});
  ASSERT_EQ(r.code, 0) << dump(r);
  for (std::string n : {"0", "1"}) {
    // Each rank's lines in its own order; the two ranks' lines may interleave.
    std::string mine;
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("[rank " + n + "] ", 0) == 0) mine += line + "\n";
    }
    EXPECT_EQ(mine, "[rank " + n + "] out-" + n + "\n[rank " + n + "] second-" + n + "\n[rank " +
                        n + "] part-" + n + "\n")
        << dump(r);
    EXPECT_TRUE(contains(r.err, "[rank " + n + "] err-" + n + "\n")) << dump(r);
    EXPECT_FALSE(contains(r.out, "err-" + n)) << dump(r);
  }
}

TEST(LaunchProcess, FailingRankStopsTheJob) {
  Result r = launch({"--num_procs", "4", "sh", "-c",
                     "if [ $RANK = 2 ]; then echo starting; echo 'rank 2 last words' >&2; "
                     "sleep 0.2; exit 3; fi; exec sleep 60"});
  EXPECT_EQ(r.code, 3) << dump(r);
  EXPECT_LT(r.seconds, 10) << dump(r);
  EXPECT_TRUE(contains(r.err, "cause: rank 2 on localhost exited with status 3")) << dump(r);
  EXPECT_TRUE(contains(r.err, "  | starting\n  | rank 2 last words\n")) << dump(r);
  EXPECT_TRUE(contains(r.err, "stopped by the launcher:")) << dump(r);
  for (std::string n : {"0", "1", "3"}) {
    EXPECT_TRUE(contains(r.err, "rank " + n + " on localhost: killed by signal 15 (SIGTERM)"))
        << dump(r);
  }
}

// --max_restarts: a job that fails is started again, whole, with DSCPP_RESTART_COUNT counting
// the starts; once the restarts are used up, the failure is the job's.
TEST(LaunchProcess, MaxRestartsStartsAFailedJobAgain) {
  const std::string program =
      "echo \"start $DSCPP_RESTART_COUNT rank $RANK\"; if [ $DSCPP_RESTART_COUNT -lt 2 ] && "
      "[ $RANK = 1 ]; then exit 5; fi; sleep 0.2";
  Result r = launch({"--num_procs", "2", "--max_restarts", "2", "sh", "-c", program});
  EXPECT_EQ(r.code, 0) << dump(r);
  // Rank 1 prints before it fails; rank 0 may be stopped before it prints, but for the last start.
  for (std::string n : {"0", "1", "2"})
    EXPECT_TRUE(contains(r.out, "start " + n + " rank 1")) << dump(r);
  EXPECT_TRUE(contains(r.out, "start 2 rank 0")) << dump(r);
  EXPECT_TRUE(contains(r.err, "restart 1 of 2 (--max_restarts)")) << dump(r);
  EXPECT_TRUE(contains(r.err, "restart 2 of 2 (--max_restarts)")) << dump(r);
  EXPECT_TRUE(contains(r.err, "cause: rank 1 on localhost exited with status 5")) << dump(r);

  Result out = launch({"--num_procs", "2", "--max_restarts", "1", "sh", "-c", program});
  EXPECT_EQ(out.code, 5) << dump(out);
  EXPECT_TRUE(contains(out.err, "failed again after 1 restart(s) (--max_restarts 1); giving up"))
      << dump(out);
  EXPECT_FALSE(contains(out.out, "start 2")) << dump(out);

  Result none = launch({"--num_procs", "2", "sh", "-c", program});
  EXPECT_EQ(none.code, 5) << dump(none);
  EXPECT_TRUE(contains(none.out, "start 0 rank 1")) << dump(none);
  EXPECT_FALSE(contains(none.err, "restart")) << dump(none);

  EXPECT_NE(launch({"--max_restarts", "-1", "true"}).code, 0);
}

// NOTE [elastic hosts]: two "hosts" whose agents run here through a remote-command template.
// On the first start, node-b's rank kills its node agent (as a host that dies takes its agent
// with it): node-b is lost, and the job starts again on node-a alone, at world size 1. A rank
// failure on a healthy host drops nothing; a host whose probe fails is dropped; too few hosts
// left ends the job.
TEST(LaunchProcess, NnodesDropsALostHostAndGoesOn) {
  TempDir d;
  const std::string hostfile = (d.path / "hosts").string();
  std::ofstream(hostfile) << "node-a slots=1\nnode-b slots=1\n";
  auto job = [&](const std::vector<std::string>& extra, const std::string& program,
                 const std::string& tmpl = "env NODE={host} {command}") {
    std::vector<std::string> args = {"--hostfile", hostfile,       "--master_addr",
                                     "127.0.0.1",  "--remote_cmd", tmpl};
    args.insert(args.end(), extra.begin(), extra.end());
    args.insert(args.end(), {"sh", "-c", program});
    return launch(args);
  };
  const std::string say =
      "echo \"start $DSCPP_RESTART_COUNT rank $RANK of $WORLD_SIZE on $NODE\"; ";
  Result r = job({"--nnodes", "1:2", "--max_restarts", "2"},
                 say +
                     "if [ $DSCPP_RESTART_COUNT = 0 ] && [ $NODE = node-b ]; then kill -9 $PPID; "
                     "sleep 5; fi; sleep 0.3");
  EXPECT_EQ(r.code, 0) << dump(r);
  EXPECT_TRUE(
      contains(r.err, "host node-b (rank 1) is lost: its node agent was killed by signal 9"))
      << dump(r);
  EXPECT_TRUE(contains(r.err, "the job goes on without node-b: 1 host(s) left (node-a")) << dump(r);
  EXPECT_TRUE(contains(r.out, "start 1 rank 0 of 1 on node-a")) << dump(r);
  EXPECT_FALSE(contains(r.out, "start 1 rank 0 of 2")) << dump(r);
  EXPECT_FALSE(contains(r.out, "start 1 rank 1")) << dump(r);  // node-b is not started again
  EXPECT_FALSE(contains(r.out, "start 2")) << dump(r);

  // A rank that fails on a healthy host: both hosts start again.
  Result healthy = job({"--nnodes", "1:2", "--max_restarts", "1"},
                       say +
                           "if [ $DSCPP_RESTART_COUNT = 0 ] && [ $NODE = node-b ]; then exit 3; "
                           "fi; sleep 0.3");
  EXPECT_EQ(healthy.code, 0) << dump(healthy);
  EXPECT_TRUE(contains(healthy.out, "start 1 rank 1 of 2 on node-b")) << dump(healthy);
  EXPECT_FALSE(contains(healthy.err, "is lost")) << dump(healthy);

  // A host that no longer answers the probe is dropped too (here: node-b, once the flag exists).
  const std::string flag = (d.path / "b_gone").string();
  Result probed = job({"--nnodes", "1:2", "--max_restarts", "1"},
                      say + "if [ $DSCPP_RESTART_COUNT = 0 ] && [ $NODE = node-b ]; then touch " +
                          flag + "; exit 3; fi; sleep 0.3",
                      "sh -c 'test {host} = node-b -a -e " + flag +
                          " && exit 7; exec env NODE={host} \"$@\"' probe {command}");
  EXPECT_EQ(probed.code, 0) << dump(probed);
  EXPECT_TRUE(contains(probed.err, "host node-b (rank 1) is lost: a probe of it, `sh -c"))
      << dump(probed);
  EXPECT_TRUE(contains(probed.err, "exited with status 7")) << dump(probed);
  EXPECT_TRUE(contains(probed.out, "start 1 rank 0 of 1 on node-a")) << dump(probed);

  // --nnodes 2:3: a lost host of two ends the job.
  Result strict = job({"--nnodes", "2:3", "--max_restarts", "2"},
                      say + "if [ $NODE = node-b ]; then kill -9 $PPID; sleep 5; fi; sleep 0.3");
  EXPECT_NE(strict.code, 0) << dump(strict);
  EXPECT_TRUE(contains(strict.err, "the 1 left are fewer than --nnodes 2:3 allows; giving up"))
      << dump(strict);

  // --nnodes N (torchrun's habit) only checks the number of hosts, with any launcher.
  EXPECT_EQ(job({"--nnodes", "2"}, "true").code, 0);
  EXPECT_EQ(launch({"--nnodes", "1", "true"}).code, 0);
  EXPECT_TRUE(contains(job({"--nnodes", "3"}, "true").err, "--nnodes 3 but the job has 2 host(s)"));

  // Bad combinations are refused before anything starts.
  EXPECT_TRUE(contains(job({"--nnodes", "1:2"}, "true").err,
                       "lets a job go on without a lost host only when it starts again"));
  EXPECT_TRUE(contains(job({"--nnodes", "3:4", "--max_restarts", "1"}, "true").err,
                       "but the job has 2 host(s)"));
  EXPECT_TRUE(contains(launch({"--nnodes", "1:2", "--max_restarts", "1", "true"}).err,
                       "--nnodes applies to --launcher ssh"));
  EXPECT_TRUE(contains(launch({"--nnodes", "x", "true"}).err, "is not N or MIN:MAX"));
  // DeepSpeed's spelling of the same range.
  Result ds = job({"--elastic_training", "--min_elastic_nodes", "1", "--max_restarts", "1"},
                  say +
                      "if [ $DSCPP_RESTART_COUNT = 0 ] && [ $NODE = node-b ]; then kill -9 "
                      "$PPID; sleep 5; fi; sleep 0.3");
  EXPECT_EQ(ds.code, 0) << dump(ds);
  EXPECT_TRUE(contains(ds.out, "start 1 rank 0 of 1 on node-a")) << dump(ds);
  EXPECT_TRUE(
      contains(launch({"--min_elastic_nodes", "1", "true"}).err, "need --elastic_training"));
}

// A rank logs an error, then prints more than the report's last lines: the error still shows,
// ahead of the last lines, for console output and for a per-rank log file.
TEST(LaunchProcess, ErrorLinesComeFirstInTheReport) {
  const std::string program =
      "log() { echo \"[2026-11-29 22:30:01.123] [rank $RANK] [$1] $2\" >&2; }; "
      "if [ $RANK = 1 ]; then "
      "  for i in $(seq 1 30); do log info \"config line $i\"; done; "
      "  log error 'shard 2 is corrupt'; "
      "  for i in $(seq 1 30); do log info \"after $i\"; done; "
      "  exit 3; "
      "fi; exec sleep 60";
  TempDir dir;
  for (bool each_rank_log : {false, true}) {
    std::vector<std::string> args = {"--num_procs", "2"};
    if (each_rank_log) args.insert(args.end(), {"--enable_each_rank_log", dir.str()});
    args.insert(args.end(), {"sh", "-c", program});
    Result r = launch(args);
    EXPECT_EQ(r.code, 3) << dump(r);
    const std::string error_line =
        "  | [2026-11-29 22:30:01.123] [rank 1] [error] shard 2 is corrupt\n";
    const size_t errors = r.err.find("  last 1 error line of rank 1 on localhost:\n" + error_line);
    const size_t last = r.err.find("  last 20 lines of rank 1 on localhost:\n");
    ASSERT_NE(errors, std::string::npos) << dump(r);
    ASSERT_NE(last, std::string::npos) << dump(r);
    EXPECT_LT(errors, last) << dump(r);
    EXPECT_TRUE(contains(r.err.substr(last), "[info] after 30\n")) << dump(r);
    EXPECT_FALSE(contains(r.err.substr(last), "[error]")) << dump(r);
  }
}

TEST(LaunchProcess, KilledRankIsReportedWithItsSignal) {
  Result r = launch({"--num_procs", "4", "sh", "-c",
                     "if [ $RANK = 1 ]; then echo 'going down'; sleep 0.2; kill -9 $$; fi; "
                     "exec sleep 60"});
  EXPECT_EQ(r.code, 128 + 9) << dump(r);
  EXPECT_LT(r.seconds, 10) << dump(r);
  EXPECT_TRUE(contains(r.err, "cause: rank 1 on localhost killed by signal 9 (SIGKILL)"))
      << dump(r);
  EXPECT_TRUE(contains(r.err, "  | going down\n")) << dump(r);
}

TEST(LaunchProcess, KilledRankLeavesNoSharedMemoryName) {
  // Rank 0 killed while its shared-memory segment is named (NOTE [shared-memory names] in
  // src/util/shm_names.h): the launcher removes the name with the rank's process group.
  Result r =
      launch({"--num_procs", "2", "sh", "-c",
              "if [ $RANK = 0 ]; then f=/dev/shm/dscpp-$(cut -d' ' -f5 /proc/$$/stat)-$$-0-t; "
              ": > $f; echo \"segment $f\"; sleep 0.2; kill -9 $$; fi; exec sleep 60"});
  EXPECT_EQ(r.code, 128 + 9) << dump(r);
  const size_t at = r.out.find("segment /dev/shm/dscpp-");
  ASSERT_NE(at, std::string::npos) << dump(r);
  const std::string path = r.out.substr(at + 8, r.out.find('\n', at) - at - 8);
  EXPECT_FALSE(fs::exists(path)) << path << " is left\n" << dump(r);
  fs::remove(path);
}

TEST(LaunchProcess, RankIgnoringSigtermIsKilledAfterGrace) {
  Result r = launch({"--num_procs", "2", "sh", "-c",
                     "if [ $RANK = 0 ]; then sleep 0.3; exit 1; fi; trap '' TERM; "
                     "while :; do sleep 0.1; done"});
  EXPECT_EQ(r.code, 1) << dump(r);
  EXPECT_LT(r.seconds, 10) << dump(r);
  EXPECT_GT(r.seconds, 4) << dump(r);  // the grace period (5 s) passed before SIGKILL
  EXPECT_TRUE(contains(r.err, "rank 1 on localhost: killed by signal 9 (SIGKILL)")) << dump(r);
}

TEST(LaunchProcess, SigtermToLauncherStopsEverything) {
  TempDir dir;
  const std::string d = dir.str();
  Proc p({cli_path(), "launch", "--num_procs", "3", "sh", "-c",
          "sleep 60 & echo $! > " + d + "/bg.$RANK.tmp; mv " + d + "/bg.$RANK.tmp " + d +
              "/bg.$RANK; echo $$ > " + d + "/sh.$RANK.tmp; mv " + d + "/sh.$RANK.tmp " + d +
              "/sh.$RANK; wait"});
  std::vector<pid_t> pids;
  for (int i = 0; i < 100 && pids.size() < 6; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    pids.clear();
    for (int rank = 0; rank < 3; ++rank) {
      for (const char* kind : {"bg.", "sh."}) {
        if (auto pid = read_pid(dir.path / (kind + std::to_string(rank)))) pids.push_back(*pid);
      }
    }
  }
  ASSERT_EQ(pids.size(), 6u) << "the ranks did not start";
  for (pid_t pid : pids) EXPECT_TRUE(alive(pid)) << pid;
  ASSERT_EQ(kill(p.pid(), SIGTERM), 0);
  Result r = p.wait(15);
  EXPECT_EQ(r.code, 128 + SIGTERM) << dump(r);
  EXPECT_LT(r.seconds, 10) << dump(r);
  EXPECT_TRUE(contains(r.err, "the launcher received SIGTERM")) << dump(r);
  EXPECT_EQ(still_running(pids), std::vector<pid_t>{}) << dump(r);
}

TEST(LaunchProcess, SigintIsForwardedToRanks) {
  TempDir dir;
  const std::string d = dir.str();
  // Each rank traps SIGINT; its background sleep (which ignores SIGINT, as background jobs of
  // a non-interactive shell do) is swept when the rank exits.
  Proc p({cli_path(), "launch", "--num_procs", "2", "sh", "-c",
          "trap 'echo got-int; exit 0' INT; sleep 60 & echo $! > " + d + "/bg.$RANK.tmp; mv " + d +
              "/bg.$RANK.tmp " + d + "/bg.$RANK; wait"});
  std::vector<pid_t> pids;
  for (int i = 0; i < 100 && pids.size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    pids.clear();
    for (int rank = 0; rank < 2; ++rank) {
      if (auto pid = read_pid(dir.path / ("bg." + std::to_string(rank)))) pids.push_back(*pid);
    }
  }
  ASSERT_EQ(pids.size(), 2u) << "the ranks did not start";
  ASSERT_EQ(kill(p.pid(), SIGINT), 0);
  Result r = p.wait(15);
  EXPECT_EQ(r.code, 128 + SIGINT) << dump(r);
  EXPECT_TRUE(contains(r.out, "[rank 0] got-int\n")) << dump(r);
  EXPECT_TRUE(contains(r.out, "[rank 1] got-int\n")) << dump(r);
  EXPECT_TRUE(contains(r.err, "the launcher received SIGINT")) << dump(r);
  EXPECT_EQ(still_running(pids), std::vector<pid_t>{}) << dump(r);
}

TEST(LaunchProcess, MissingProgramStartsNothing) {
  Result r = launch({"--num_procs", "2", "/nonexistent/dscpp_prog", "x"});
  EXPECT_EQ(r.code, 2) << dump(r);
  EXPECT_TRUE(contains(r.err, "program '/nonexistent/dscpp_prog' does not exist")) << dump(r);
  EXPECT_TRUE(contains(r.err, "HINT:")) << dump(r);
  EXPECT_FALSE(contains(r.out + r.err, "[rank")) << dump(r);
  r = launch({"--num_procs", "2", "dscpp_no_such_program"});
  EXPECT_EQ(r.code, 2) << dump(r);
  EXPECT_TRUE(contains(r.err, "not found in PATH")) << dump(r);
}

TEST(LaunchProcess, BadInputIsReportedBeforeStarting) {
  TempDir dir;
  std::string hf = dir.str() + "/hosts";
  std::ofstream(hf) << "localhost slots=2\nlocalhost slots 2\n";
  Result r = launch({"-H", hf, "echo", "hi"});
  EXPECT_EQ(r.code, 2) << dump(r);
  EXPECT_TRUE(contains(r.err, hf + ":2")) << dump(r);
  r = launch({"-i", "localhost", "-e", "localhost", "echo", "hi"});
  EXPECT_EQ(r.code, 2) << dump(r);
  EXPECT_TRUE(contains(r.err, "--include and --exclude")) << dump(r);
  r = launch({"--num_procs", "0", "echo", "hi"});
  EXPECT_EQ(r.code, 2) << dump(r);
  r = launch({"--bogus", "echo", "hi"});
  EXPECT_EQ(r.code, 2) << dump(r);
  EXPECT_TRUE(contains(r.err, "--bogus")) << dump(r);
  r = launch({"--num_procs", "2"});
  EXPECT_EQ(r.code, 2) << dump(r);
  EXPECT_TRUE(contains(r.err, "no program")) << dump(r);
}

TEST(LaunchProcess, EachRankLogWritesFiles) {
  TempDir dir;
  const std::string logs = dir.str() + "/logs/sub";
  Result r = launch({"--num_procs", "2", "--enable_each_rank_log", logs, "sh", "-c",
                     "echo hello from $RANK; echo warn $RANK >&2"});
  ASSERT_EQ(r.code, 0) << dump(r);
  EXPECT_FALSE(contains(r.out, "hello from")) << dump(r);
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream in(logs + "/rank_" + std::to_string(rank) + ".log");
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_TRUE(contains(text.str(), "hello from " + std::to_string(rank) + "\n")) << text.str();
    EXPECT_TRUE(contains(text.str(), "warn " + std::to_string(rank) + "\n")) << text.str();
  }
  // A failing rank's last lines come from its log file.
  r = launch({"--num_procs", "2", "--enable_each_rank_log", logs, "sh", "-c",
              "echo line-a-$RANK; echo line-b-$RANK; [ $RANK = 1 ] && exit 4; sleep 60"});
  EXPECT_EQ(r.code, 4) << dump(r);
  EXPECT_TRUE(contains(r.err, "  | line-a-1\n  | line-b-1\n")) << dump(r);
}

TEST(LaunchProcess, BindCoresToRank) {
  const int cores = usable_cores();
  Result r = launch({"--num_procs", "2", "--bind_cores_to_rank", "sh", "-c",
                     "echo omp=$OMP_NUM_THREADS; grep Cpus_allowed_list /proc/self/status"},
                    {"OMP_NUM_THREADS=13"});
  ASSERT_EQ(r.code, 0) << dump(r);
  const int per = std::max(1, cores / 2);
  EXPECT_TRUE(contains(r.out, "[rank 0] omp=" + std::to_string(per) + "\n")) << dump(r);
  EXPECT_TRUE(contains(r.out, "[rank 1] omp=" + std::to_string(per) + "\n")) << dump(r);
  if (cores >= 2) {
    auto allowed = [&](int rank) {
      std::string key = "[rank " + std::to_string(rank) + "] Cpus_allowed_list:";
      size_t at = r.out.find(key);
      return at == std::string::npos
                 ? ""
                 : r.out.substr(at + key.size(), r.out.find('\n', at) - at - key.size());
    };
    EXPECT_NE(allowed(0), "") << dump(r);
    EXPECT_NE(allowed(0), allowed(1)) << dump(r);
  }
}

TEST(LaunchProcess, OpenmpiTwoProcesses) {
  if (access("/usr/bin/mpirun", X_OK) != 0) GTEST_SKIP() << "mpirun is not installed";
  Result r = launch({"--launcher", "openmpi", "--num_procs", "2", "sh", "-c",
                     "echo ompi-rank=$OMPI_COMM_WORLD_RANK size=$OMPI_COMM_WORLD_SIZE "
                     "master=$MASTER_ADDR:$MASTER_PORT secret=${#DSCPP_RENDEZVOUS_SECRET}"},
                    {}, 60);
  ASSERT_EQ(r.code, 0) << dump(r);
  // Both ranks hold the job's secret (64 hex digits), passed by name with mpirun's -x.
  EXPECT_TRUE(contains(r.out, "ompi-rank=0 size=2 master=127.0.0.1:29500 secret=64\n")) << dump(r);
  EXPECT_TRUE(contains(r.out, "ompi-rank=1 size=2 master=127.0.0.1:29500 secret=64\n")) << dump(r);
  EXPECT_TRUE(contains(r.err, "running: mpirun -np 2 --host localhost:2")) << dump(r);
}

// Two "hosts" as network namespaces joined by a veth pair, reached with
// --remote_cmd 'ip netns exec {host} {command}'. Needs root; see multinode_netns.sh.
TEST(LaunchMultinode, NetnsTwoNodes) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
  Result r = Proc({"/bin/bash", std::string(DSCPP_SOURCE_DIR) + "/tests/launch/multinode_netns.sh",
                   cli_path()})
                 .wait(60);
  EXPECT_EQ(r.code, 0) << dump(r);
}

}  // namespace
}  // namespace dscpp::launch
