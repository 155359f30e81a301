// The job launcher behind `dscpp launch` (and `dscpp check`): resolves hosts from a hostfile
// and DeepSpeed's flags, then runs the program once per rank, either here (local), through a
// node agent per host started over ssh or any remote-command template (ssh), or by handing
// the job to OpenMPI's mpirun or Slurm's srun. Each rank gets RANK, LOCAL_RANK, WORLD_SIZE,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and DSCPP_LAUNCHER=1. The first rank to fail
// stops the job; a report on stderr says which rank failed, on which host, how, and its last
// lines. Torch-free; see docs/launch.md for the user-facing description.
//
// Threading: run_job() runs on the calling thread and blocks until the job is over. It installs
// signal handlers (SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE) for the duration and restores the
// previous ones; only one job may run at a time in a process. It sets the log rank to
// "launcher" (set_log_rank(-1)) and, with log_level, the log level.
#pragma once

#include <string>
#include <vector>

#include "launch/hostfile.h"
#include "launch/process_group.h"

namespace dscpp::launch {

inline constexpr const char* kDefaultRemoteCmd = "ssh -o BatchMode=yes {host} {command}";

// Every flag of `dscpp launch`, plus the program to run.
struct LaunchOptions {
  // --num_procs (alias --num_gpus): processes per node. -1: every slot of each host, or 1
  // without a hostfile.
  int num_procs = -1;
  // --num_nodes: run on the first N hosts. -1: all.
  int num_nodes = -1;
  // -H/--hostfile: lines `hostname slots=N`. Empty: this machine only.
  std::string hostfile;
  // -i/--include, -e/--exclude: DeepSpeed's `host1:0,1@host2`; at most one of them.
  std::string include;
  std::string exclude;
  // --master_addr: where rank 0 listens. Empty: the first host (127.0.0.1 for this machine).
  std::string master_addr;
  // --master_port: 1-65535.
  int master_port = 29500;
  // --launcher: local | ssh | openmpi | slurm. Empty: local when the only host is this
  // machine, else ssh.
  std::string launcher;
  // --launcher_args: extra arguments for ssh (default template only), mpirun or srun.
  std::string launcher_args;
  // --enable_each_rank_log DIR: rank N's stdout and stderr go to DIR/rank_N.log instead of
  // the console. DIR is created when missing (on each host).
  std::string enable_each_rank_log;
  // --bind_cores_to_rank: each rank is bound to its share of the node's cores and gets
  // OMP_NUM_THREADS = the size of that share.
  bool bind_cores_to_rank = false;
  // --remote_cmd (ssh launcher): how to run a command on a host; `{host}` and `{command}` are
  // replaced, and the result is run by `/bin/sh -c 'exec ...'`. Empty: kDefaultRemoteCmd.
  std::string remote_cmd;
  // --remote_dscpp (ssh launcher): path of dscpp on the hosts. Empty: this executable's path.
  std::string remote_dscpp;
  // --log_level: debug | info | warning | error. Empty: unchanged (DSCPP_LOG_LEVEL or info).
  std::string log_level;
  // The program and its arguments.
  std::vector<std::string> program;
  // Seconds between SIGTERM and SIGKILL when the job stops (not a flag of the main launcher).
  double stop_grace_s = 5.0;
  // --max_restarts (torchrun's name): how many times a failed job is started again, whole, on
  // the same hosts (local and ssh launchers). Each start sets DSCPP_RESTART_COUNT (0, 1, ...)
  // for every rank; a program that resumes from its last checkpoint (dscpp train --resume)
  // loses only the steps since it. A job stopped by a signal to the launcher is not restarted.
  int max_restarts = 0;
  // --nnodes MIN:MAX (torchrun's spelling; N alone means N:N), ssh launcher: the job may go on
  // with as few as MIN hosts. With --max_restarts, a host lost in a failure (its node agent
  // killed or unreachable, or a probe of it that fails) is dropped, and the job starts again
  // on the hosts that remain, at the world size they give (NOTE [elastic hosts]). -1: not
  // given (the hosts never change). The hosts the job starts with must number MIN..MAX.
  int min_nodes = -1;
  int max_nodes = -1;

  // Node agent (hidden flags, set by the main launcher for each host of an ssh job): runs
  // `num_procs` ranks starting at global rank `rank_offset` and reports to the launcher
  // through its stdout/stderr; its stdin is its lifeline. See NOTE [node agent protocol].
  bool node_agent = false;
  int node_rank = 0;
  int nnodes = 1;
  std::string node_host;  // the host's name in the hostfile, for messages
  int rank_offset = 0;
  int world_size = 0;
  std::string slots;  // selected slots, "1,3"; empty: 0..num_procs-1
  // Folder to run the ranks in: the main launcher's working folder, as DeepSpeed does.
  std::string workdir;
  // NAME=VALUE set before the ranks start: the main launcher's variables named in
  // kForwardedEnv (ssh does not carry the environment).
  std::vector<std::string> env;
};

// Variables a multi-node ssh job carries to the hosts: these names, and names starting with
// these prefixes (those ending in '_').
inline constexpr const char* kForwardedEnv[] = {"NCCL_", "GLOO_", "TORCH_", "DSCPP_",
                                                "OMP_NUM_THREADS"};

// Parses --nnodes: "N" or "MIN:MAX" with 1 <= MIN <= MAX. Throws LaunchError otherwise.
void parse_nnodes(const std::string& text, int* min_nodes, int* max_nodes);

// The hosts left when those at `lost` (indices) are dropped, with their first global ranks
// renumbered in hostfile order.
std::vector<HostSlots> drop_hosts(const std::vector<HostSlots>& hosts,
                                  const std::vector<size_t>& lost);

// The hosts the job runs on, with the slots used on each and the first global rank of each.
// Without a hostfile: this machine ("localhost") with num_procs slots (1 if -1), except with
// --launcher slurm, where Slurm picks the nodes and the result is empty. Throws LaunchError
// for a bad hostfile, filter or count (see hostfile.h).
std::vector<HostSlots> resolve_hosts(const LaunchOptions& opts);

// The launcher that will run the job: opts.launcher, or local/ssh as described there. Throws
// LaunchError for an unknown name or `local` with hosts other than this machine.
std::string choose_launcher(const LaunchOptions& opts, const std::vector<HostSlots>& hosts);

// opts.master_addr, or the first host ("127.0.0.1" when it is this machine).
std::string resolve_master_addr(const LaunchOptions& opts, const std::vector<HostSlots>& hosts);

// The full path of `program`: as given when it contains '/', else searched in `path_env`
// (a PATH value). Throws LaunchError when it is missing or not executable.
std::string resolve_program(const std::string& program, const std::string& path_env);

// What command construction needs to know about this machine (kept apart so the builders
// are pure functions).
struct HostFacts {
  bool is_root = false;          // mpirun refuses root without --allow-run-as-root
  int local_cores = 1;           // CPUs this process may run on
  bool omp_threads_set = false;  // OMP_NUM_THREADS is set in the environment
};
HostFacts host_facts();

// mpirun -np N --host h1:s1,h2:s2 [--allow-run-as-root] [--oversubscribe] -x MASTER_ADDR=..
// -x MASTER_PORT=.. -x OMP_NUM_THREADS[=n] [launcher_args] PROGRAM ARGS. --oversubscribe when
// this machine runs more ranks than it has cores. Throws LaunchError for bad launcher_args.
std::vector<std::string> openmpi_command(const LaunchOptions& opts,
                                         const std::vector<HostSlots>& hosts,
                                         const HostFacts& facts);

// srun --nodes N --ntasks-per-node S [--nodelist h1,h2] --export=ALL[,MASTER_ADDR=..],
// MASTER_PORT=.. [launcher_args] PROGRAM ARGS. With a hostfile the hosts give N, S and the
// node list (every host must run the same number of ranks); without one, num_nodes and
// num_procs do (default 1), and MASTER_ADDR is exported only when given (else the ranks take
// the first node of SLURM_JOB_NODELIST). Throws LaunchError for uneven hosts or bad args.
std::vector<std::string> slurm_command(const LaunchOptions& opts,
                                       const std::vector<HostSlots>& hosts);

// The words of the node-agent command for host `node` of an ssh job, starting with
// `dscpp_path`; opts.workdir and opts.env are passed on when set. Every word is safe to pass
// through two shells unquoted (program arguments that are not are encoded, see encode_remote_word).
std::vector<std::string> agent_command(const LaunchOptions& opts,
                                       const std::vector<HostSlots>& hosts, size_t node,
                                       const std::string& master_addr,
                                       const std::string& dscpp_path);

// Replaces {host} and {command} in a remote-command template. Throws LaunchError when the
// template has no {command}.
std::string expand_remote_cmd(const std::string& tmpl, const std::string& host,
                              const std::vector<std::string>& command);

// NOTE [remote words]: a word made only of [A-Za-z0-9_@%+=:,./-] (and not starting with
// "@x:") passes through unchanged; any other becomes "@x:" + hex of its bytes, which the node
// agent decodes. So `sh -c 'echo $RANK'` survives ssh's remote shell and exec-style wrappers
// (ip netns exec, docker exec) alike.
std::string encode_remote_word(const std::string& word);
std::string decode_remote_word(const std::string& word);

// Splits a string into words like a POSIX shell would (quotes and backslashes; no
// expansion). Throws LaunchError for an unterminated quote.
std::vector<std::string> split_shell_words(const std::string& text);

// The report printed on stderr when a job did not succeed: the cause (who, how, its error
// lines, then its last lines) or the signal that stopped it, the processes the launcher
// stopped, and the exit status.
std::string failure_report(const RunOutcome& outcome);

// Runs the job and returns the status the launcher should exit with: 0 when every rank
// exited 0; the failing rank's exit code (or 128 + its signal) when one failed; 128 + signal
// when SIGINT/SIGTERM/SIGHUP stopped the launcher. Throws LaunchError, before anything is
// started, for bad options, hosts or a program that cannot be found; nothing is left running
// when it returns or throws.
int run_job(const LaunchOptions& opts);

}  // namespace dscpp::launch
