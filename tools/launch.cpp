// `dscpp launch`: DeepSpeed's launcher flags parsed with CLI11 into LaunchOptions, then
// run_job() (src/launch/launcher.h). Everything after the first positional argument (or
// after `--`) is the program and its arguments. The node-agent flags are hidden: the main
// launcher passes them to the dscpp it starts on each host of an ssh job.
#include <CLI/CLI.hpp>

#include "dscpp/error.h"
#include "launch/launcher.h"
#include "tools.h"

namespace dscpp::tools {

int launch_main(int argc, char** argv) {
  launch::LaunchOptions o;
  CLI::App app{
      "dscpp launch [OPTIONS] PROGRAM [ARGS...]\n\n"
      "Start a job: one process per rank, on this machine or on the hosts of a hostfile.\n"
      "Each process gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,\n"
      "MASTER_PORT and DSCPP_LAUNCHER=1. The first process to fail stops the job.",
      "dscpp launch"};
  app.prefix_command();
  app.add_option("--num_procs,--num_gpus", o.num_procs,
                 "processes per node (default: every slot of each host; 1 without a hostfile)");
  app.add_option("--num_nodes", o.num_nodes, "run on the first N hosts of the hostfile");
  app.add_option("-H,--hostfile", o.hostfile, "hostfile: lines `hostname slots=N`");
  app.add_option("-i,--include", o.include, "hosts/slots to use, e.g. host1:0,1@host2");
  app.add_option("-e,--exclude", o.exclude, "hosts/slots to leave out, e.g. host1:3@host2");
  app.add_option("--master_addr", o.master_addr,
                 "address of rank 0 (default: the first host; 127.0.0.1 for this machine)");
  app.add_option("--master_port", o.master_port, "port of rank 0's store")
      ->default_val(29500)
      ->check(CLI::Range(1, 65535));
  app.add_option("--launcher", o.launcher,
                 "local, ssh, openmpi or slurm (default: local for this machine only, else ssh)")
      ->check(CLI::IsMember({"local", "ssh", "openmpi", "slurm"}));
  app.add_option("--launcher_args", o.launcher_args, "extra arguments for ssh, mpirun or srun");
  app.add_option("--enable_each_rank_log", o.enable_each_rank_log,
                 "write rank N's stdout and stderr to DIR/rank_N.log instead of the console");
  app.add_flag("--bind_cores_to_rank", o.bind_cores_to_rank,
               "bind each rank to its share of the node's cores; OMP_NUM_THREADS = that share");
  app.add_option("--remote_cmd", o.remote_cmd,
                 std::string("ssh launcher: how to run a command on a host (default: '") +
                     launch::kDefaultRemoteCmd + "')");
  app.add_option("--remote_dscpp", o.remote_dscpp,
                 "ssh launcher: path of dscpp on the hosts (default: this executable's path)");
  app.add_option("--max_restarts", o.max_restarts,
                 "start a failed job again, whole, up to N times (local and ssh launchers; "
                 "DSCPP_RESTART_COUNT tells the ranks which start it is)")
      ->capture_default_str();
  std::string nnodes;
  app.add_option("--nnodes", nnodes,
                 "MIN:MAX: with --max_restarts, a lost host is dropped and the job starts again "
                 "on the others while at least MIN remain (ssh launcher; torchrun's spelling)");
  // DeepSpeed's launcher spells the same range --elastic_training with --min_elastic_nodes
  // (default 1) and --max_elastic_nodes (default: the hosts given).
  bool elastic_training = false;
  int min_elastic = -1, max_elastic = -1;
  app.add_flag("--elastic_training", elastic_training,
               "DeepSpeed's spelling of --nnodes MIN:MAX, with --min_elastic_nodes and "
               "--max_elastic_nodes");
  app.add_option("--min_elastic_nodes", min_elastic, "with --elastic_training: MIN (default 1)");
  app.add_option("--max_elastic_nodes", max_elastic,
                 "with --elastic_training: MAX (default: the number of hosts)");
  app.add_option("--log_level", o.log_level, "debug, info, warning or error")
      ->check(CLI::IsMember({"debug", "info", "warning", "warn", "error"}));
  // Node agent flags (see NOTE [node agent protocol] in src/launch/launcher.cpp).
  app.add_flag("--node_agent", o.node_agent)->group("");
  app.add_option("--node_rank", o.node_rank)->group("");
  app.add_option("--node_host", o.node_host)->group("");
  app.add_option("--rank_offset", o.rank_offset)->group("");
  app.add_option("--world_size", o.world_size)->group("");
  app.add_option("--slots", o.slots)->group("");
  app.add_option("--stop_grace", o.stop_grace_s)->group("");
  app.add_option("--workdir", o.workdir)->group("");
  app.add_option("--env", o.env)->group("")->allow_extra_args(false);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  // --nnodes is also the node agent's host count (a plain number, NOTE [node agent protocol]).
  if (!nnodes.empty() && o.node_agent) {
    int unused = 0;
    launch::parse_nnodes(nnodes, &o.nnodes, &unused);
  } else if (!nnodes.empty()) {
    launch::parse_nnodes(nnodes, &o.min_nodes, &o.max_nodes);
  }
  DSCPP_CHECK(elastic_training || (min_elastic == -1 && max_elastic == -1), LaunchError,
              "--min_elastic_nodes and --max_elastic_nodes need --elastic_training (DeepSpeed's "
              "rule). HINT: add --elastic_training, or write --nnodes MIN:MAX");
  if (elastic_training) {
    DSCPP_CHECK(nnodes.empty(), LaunchError,
                "give either --nnodes MIN:MAX or --elastic_training with --min_elastic_nodes / "
                "--max_elastic_nodes, not both");
    o.min_nodes = min_elastic == -1 ? 1 : min_elastic;
    o.max_nodes = max_elastic;  // -1: the number of hosts, resolved by run_job
    DSCPP_CHECK(o.min_nodes >= 1 && (o.max_nodes == -1 || o.max_nodes >= o.min_nodes), LaunchError,
                "--min_elastic_nodes ", o.min_nodes, " and --max_elastic_nodes ", o.max_nodes,
                " need 1 <= MIN <= MAX");
  }
  o.program = app.remaining();
  const bool after_dashes = !o.program.empty() && o.program[0] == "--";
  if (after_dashes) o.program.erase(o.program.begin());
  DSCPP_CHECK(after_dashes || o.program.empty() || o.program[0].rfind('-', 0) != 0, LaunchError,
              "unknown option '", o.program[0],
              "'. HINT: see dscpp launch --help; put `--` before a program whose name starts "
              "with '-'");
  DSCPP_CHECK(!o.program.empty(), LaunchError,
              "no program given. HINT: dscpp launch [options] PROGRAM [ARGS...]");
  return launch::run_job(o);
}

}  // namespace dscpp::tools
