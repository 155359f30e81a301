// dscpp check: the pre-flight a user runs before a big job. In order: the hosts the job would
// use (hostfile, include/exclude, counts); that every remote host resolves and answers the
// remote command; that MASTER_ADDR:MASTER_PORT can be opened here and reached from every host;
// that the config's batch triple fits the world size those hosts imply; and a short
// all_reduce / reduce_scatter / all_gather / barrier across all ranks (started through the same
// launcher), printing latency and bus bandwidth per operation and size. Every failure is a
// specific message; the exit status is 0 only when every check passed.
//
// Hidden modes: `--worker` (what each rank runs), `--probe_connect ADDR:PORT` (run on a remote
// host: can it open a TCP connection to the master?) and `--probe_listen PORT` (run on the
// master host when that is not this machine).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "comm/comms_logger.h"
#include "config/key_verdicts.h"
#include "dscpp/comm.h"
#include "dscpp/config.h"
#include "dscpp/data.h"
#include "dscpp/device_link.h"
#include "dscpp/error.h"
#include "dscpp/models/gpt.h"
#include "dscpp/zero.h"
#include "engine/check_supported.h"
#include "engine/estimate.h"
#include "launch/launcher.h"
#include "tools.h"
#include "util/log.h"

namespace dscpp::tools {
namespace {

using Clock = std::chrono::steady_clock;

struct Checklist {
  int failures = 0;
  void ok(const std::string& what) { std::cout << "[ ok ] " << what << std::endl; }
  void fail(const std::string& what) {
    ++failures;
    std::cout << "[FAIL] " << what << std::endl;
  }
};

std::string self_exe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  DSCPP_CHECK(n > 0, LaunchError, "cannot find the dscpp executable (/proc/self/exe)");
  return std::string(buf, n);
}

// Opens a TCP connection to addr:port within `timeout_ms`. Returns "" on success, else why not.
std::string try_connect(const std::string& addr, int port, int timeout_ms) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) return std::string("does not resolve: ") + gai_strerror(rc);
  std::string err = "no address worked";
  for (addrinfo* a = res; a; a = a->ai_next) {
    int fd = socket(a->ai_family, SOCK_STREAM, 0);
    if (fd < 0) continue;
    fcntl(fd, F_SETFL, O_NONBLOCK);
    rc = connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      if (poll(&p, 1, timeout_ms) == 1) {
        int so = 0;
        socklen_t len = sizeof(so);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &len);
        rc = so == 0 ? 0 : -1;
        if (so) errno = so;
      } else {
        errno = ETIMEDOUT;
      }
    }
    if (rc == 0) {
      close(fd);
      freeaddrinfo(res);
      return "";
    }
    err = strerror(errno);
    close(fd);
  }
  freeaddrinfo(res);
  return err;
}

// Listens on port (all interfaces) when addr is an address of this machine. Returns the fd,
// or -1 with `why` set.
int listen_as_master(const std::string& addr, int port, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(addr.c_str(), nullptr, &hints, &res) != 0 || !res) {
    why = "MASTER_ADDR " + addr + " does not resolve on this host";
    return -1;
  }
  sockaddr_in probe = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  freeaddrinfo(res);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  probe.sin_port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&probe), sizeof(probe)) != 0) {
    close(fd);
    why = "MASTER_ADDR " + addr + " is not an address of this machine. HINT: run dscpp check on "
          "the master host (the first host of the hostfile), where rank 0 will listen";
    return -1;
  }
  close(fd);
  fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_addr.s_addr = htonl(INADDR_ANY);
  any.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(fd, reinterpret_cast<sockaddr*>(&any), sizeof(any)) != 0 || listen(fd, 64) != 0) {
    why = fmt::format("port {} cannot be opened on this machine ({}). HINT: another job may be "
                      "using it; pick a free one with --master_port",
                      port, strerror(errno));
    close(fd);
    return -1;
  }
  return fd;
}

// Runs a shell command with a time limit; returns its exit status (124 on timeout) and output.
int run_with_timeout(const std::string& cmd, int seconds, std::string& output) {
  // Quote cmd for sh -c: close the quote around embedded single quotes.
  std::string quoted;
  for (char c : cmd) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  std::string full = fmt::format("timeout -k 2 {} /bin/sh -c '{}' 2>&1", seconds, quoted);
  FILE* p = popen(full.c_str(), "r");
  if (!p) return 127;
  char buf[1024];
  while (fgets(buf, sizeof(buf), p)) output += buf;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

void check_hosts(Checklist& cl, const launch::LaunchOptions& opts,
                 const std::vector<launch::HostSlots>& hosts, const std::string& launcher) {
  for (const auto& h : hosts) {
    if (launch::is_local_host(h.host)) {
      cl.ok(fmt::format("host {}: this machine, {} rank(s)", h.host, h.num_procs()));
      continue;
    }
    if (launcher != "ssh") {
      cl.ok(fmt::format("host {}: {} rank(s), started by {} (not probed here)", h.host,
                        h.num_procs(), launcher));
      continue;
    }
    std::string tmpl = opts.remote_cmd.empty() ? launch::kDefaultRemoteCmd : opts.remote_cmd;
    if (tmpl.rfind("ssh", 0) == 0) {
      addrinfo* res = nullptr;
      int rc = getaddrinfo(h.host.c_str(), nullptr, nullptr, &res);
      if (rc != 0) {
        cl.fail(fmt::format("host {} does not resolve: {}. HINT: fix the name in the hostfile "
                            "or /etc/hosts",
                            h.host, gai_strerror(rc)));
        continue;
      }
      freeaddrinfo(res);
    }
    std::string out;
    int st = run_with_timeout(launch::expand_remote_cmd(tmpl, h.host, {"true"}), 15, out);
    if (st == 0) {
      cl.ok(fmt::format("host {}: answers the remote command, {} rank(s)", h.host, h.num_procs()));
    } else {
      cl.fail(fmt::format("host {} does not answer '{}' (status {}{}): {}. HINT: check ssh "
                          "access without a password (BatchMode) or --remote_cmd",
                          h.host, launch::expand_remote_cmd(tmpl, h.host, {"true"}), st,
                          st == 124 ? ", timed out after 15 s" : "", out));
    }
  }
}

// Accepts `accepts` connections on port (all interfaces) or gives up after `seconds`; prints
// "listening" once ready. Run on the master host by check_master() when that is not this one.
int probe_listen(int port, int accepts, int seconds) {
  std::string why;
  int fd = listen_as_master("0.0.0.0", port, why);
  if (fd < 0) {
    std::cout << why << std::endl;
    return 1;
  }
  std::cout << "listening" << std::endl;
  auto deadline = Clock::now() + std::chrono::seconds(seconds);
  for (int n = 0; n < accepts && Clock::now() < deadline;) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 200) == 1) {
      int c = accept(fd, nullptr, nullptr);
      if (c >= 0) close(c), ++n;
    }
  }
  close(fd);
  return 0;
}

// The ranks of one host that will share memory in this job (what Communicator::host_group_size
// will say, predicted from the hosts): a model in host memory, shared memory not turned off,
// every host with the same number of ranks, and across hosts the hierarchy on; 1 otherwise.
int predicted_host_group(const std::vector<launch::HostSlots>& hosts, const std::string& device) {
  auto env_is = [](const char* name, const char* value) {
    const char* v = std::getenv(name);
    return v && std::string(v) == value;
  };
  if (hosts.empty() || device != "cpu" || env_is("DSCPP_COMM_SHM", "off")) return 1;
  const int per = hosts.front().num_procs();
  for (const auto& h : hosts) {
    if (h.num_procs() != per) return 1;
  }
  if (hosts.size() > 1 && env_is("DSCPP_COMM_HIERARCHY", "off")) return 1;
  return per;
}

void check_master(Checklist& cl, const launch::LaunchOptions& opts,
                  const std::vector<launch::HostSlots>& hosts, const std::string& launcher,
                  const std::string& master) {
  const std::string tmpl = opts.remote_cmd.empty() ? launch::kDefaultRemoteCmd : opts.remote_cmd;
  const std::string dscpp = opts.remote_dscpp.empty() ? self_exe() : opts.remote_dscpp;
  const std::string port = std::to_string(opts.master_port);
  std::string why;
  int fd = listen_as_master(master, opts.master_port, why);
  FILE* remote_listener = nullptr;
  if (fd < 0 && launcher == "ssh" && !launch::is_local_host(hosts.at(0).host)) {
    // Rank 0 will run on the first host: listen there, through the remote command.
    std::string cmd = launch::expand_remote_cmd(
        tmpl, hosts[0].host,
        {dscpp, "check", "--probe_listen", port, "--probe_accepts", std::to_string(hosts.size())});
    remote_listener = popen(cmd.c_str(), "r");
    char line[512] = {0};
    if (!remote_listener || !fgets(line, sizeof(line), remote_listener) ||
        std::string(line).rfind("listening", 0) != 0) {
      cl.fail(fmt::format("port {} cannot be opened on the master host {}: {}. HINT: another job "
                          "may be using it; pick a free one with --master_port",
                          opts.master_port, hosts[0].host, line));
      if (remote_listener) pclose(remote_listener);
      return;
    }
  } else if (fd < 0) {
    cl.fail(why);
    return;
  }
  bool all = true;
  for (const auto& h : hosts) {
    std::string err;
    if (launch::is_local_host(h.host) || launcher != "ssh") {
      err = try_connect(master, opts.master_port, 5000);
    } else {
      std::string out;
      int st = run_with_timeout(
          launch::expand_remote_cmd(tmpl, h.host,
                                    {dscpp, "check", "--probe_connect", master + ":" + port}),
          20, out);
      if (st != 0) err = out.empty() ? fmt::format("probe exited with status {}", st) : out;
    }
    if (!err.empty()) {
      all = false;
      cl.fail(fmt::format("host {} cannot reach the master {}:{}: {}. HINT: a firewall, a wrong "
                          "MASTER_ADDR (use an address the other hosts can route to), or another "
                          "network namespace",
                          h.host, master, opts.master_port, err));
    }
  }
  if (fd >= 0) close(fd);
  if (remote_listener) pclose(remote_listener);
  if (all) {
    cl.ok(fmt::format("master {}:{} opens on {} and every host reaches it", master,
                      opts.master_port, remote_listener ? hosts[0].host : "this machine"));
  }
}

// --model gpt: what dscpp train would decide once it has the model, with the config already
// resolved for `world` ranks: the memory on this host (its ranks of the job; dscpp train's check
// before the build), then the engine's own model check (engine::check_model) on the GPT built for
// its shapes only. Throws the ConfigError dscpp train would.
void check_gpt(Checklist& cl, const Config& cfg, models::GPTConfig gpt, bool checkpointing,
               const std::vector<launch::HostSlots>& hosts, int world, const std::string& device) {
  if (gpt.vocab_size == 0 || gpt.block_size == 0) {
    const data::ReverseTaskOptions task;  // dscpp train's built-in task
    if (gpt.vocab_size == 0) gpt.vocab_size = task.vocab_size();
    if (gpt.block_size == 0) gpt.block_size = task.block_size();
  }
  gpt.validate();
  // dscpp train passes no optimizer of its own: the config's is the one.
  engine::check_optimizer_sources(cfg, /*client_optimizer=*/false, /*client_lr_scheduler=*/false);
  int local = 0;
  for (const auto& h : hosts) {
    if (launch::is_local_host(h.host)) local += h.num_procs();
  }
  const engine::EstimateInput in =
      engine::gpt_estimate_input(gpt, cfg, world, device != "cpu", checkpointing);
  std::string memory = "no rank of the job runs on this machine, so its memory is not checked";
  if (local > 0) {
    const bool gpu_here = device != "cpu" && at::hasCUDA();
    engine::check_gpt_fits(in, cfg, local,
                           gpu_here ? offload::gpu_free_memory(at::Device("cuda:0")) : -1);
    memory = fmt::format("fits this machine's memory with its {} rank(s){}", local,
                         device != "cpu" && !gpu_here ? " (host memory only: no GPU here)" : "");
  }
  models::GPT built(nullptr);
  {
    zero::ShapesOnly shapes;
    built = models::GPT(gpt, /*seed=*/0);
  }
  for (const auto& w : engine::check_model(cfg, *built, models::GPTImpl::zero_units(), world))
    std::cout << "       warning: " << w << std::endl;
  cl.ok(fmt::format("model GPT {} ({} trainable parameters): {}, and the engine accepts it",
                    gpt.to_string(), gpt.num_parameters(), memory));
}

int worker_main(const std::vector<int64_t>& sizes_kib, int iters) {
  at::set_num_threads(1);
  auto comm = comm::init_from_env(comm::CommOptions::from_config());
  const int w = comm->world_size();
  if (comm->rank() == 0) {
    std::cout << fmt::format("collectives across {} ranks ({} backend), median of {} runs:\n", w,
                             comm->backend_name(), iters)
              << fmt::format("  {:<16} {:>10} {:>12} {:>14} {:>14}\n", "operation", "size",
                             "latency ms", "algbw MB/s", "busbw MB/s");
  }
  auto time_op = [&](comm::OpKind kind, int64_t bytes, const std::function<void()>& op) {
    op();  // warm-up
    std::vector<double> t;
    for (int i = 0; i < iters; ++i) {
      auto t0 = Clock::now();
      op();
      t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    double med = t[t.size() / 2];
    double algbw = bytes / med / 1e6;
    if (comm->rank() == 0) {
      std::cout << fmt::format("  {:<16} {:>10} {:>12.3f} {:>14.1f} {:>14.1f}\n",
                               comm::op_kind_name(kind),
                               kind == comm::OpKind::barrier ? "-" : fmt::format("{} KiB", bytes / 1024),
                               med * 1e3, kind == comm::OpKind::barrier ? 0.0 : algbw,
                               kind == comm::OpKind::barrier ? 0.0 : algbw * comm::bus_bandwidth_factor(kind, w));
    }
  };
  for (int64_t kib : sizes_kib) {
    int64_t n = std::max<int64_t>(w, kib * 1024 / 4 / w * w);  // floats, a multiple of w
    auto full = at::ones({n});
    auto shard = at::ones({n / w});
    time_op(comm::OpKind::all_reduce, n * 4, [&] { comm->all_reduce(full)->wait(); });
    time_op(comm::OpKind::reduce_scatter, n * 4, [&] { comm->reduce_scatter(shard, full)->wait(); });
    time_op(comm::OpKind::all_gather, n * 4, [&] { comm->all_gather(full, shard)->wait(); });
  }
  time_op(comm::OpKind::barrier, 0, [&] { comm->barrier()->wait(); });
  // The numbers must also be right: one sum checks every rank took part.
  auto t = at::full({1}, static_cast<float>(comm->rank() + 1));
  comm->all_reduce(t)->wait();
  DSCPP_CHECK(t.item<float>() == w * (w + 1) / 2.0f, CommError, "all_reduce check gave ",
              t.item<float>(), ", expected ", w * (w + 1) / 2.0f);
  return 0;
}

}  // namespace

int check_main(int argc, char** argv) {
  CLI::App app{"dscpp check: pre-flight for a distributed job"};
  launch::LaunchOptions opts;
  std::string config_path, level, probe, device = "cpu";
  bool worker = false, no_collectives = false, keys = false;
  std::vector<int64_t> sizes_kib{4, 256, 4096};
  int iters = 5;
  app.add_option("-H,--hostfile", opts.hostfile, "hostfile: lines 'hostname slots=N'");
  app.add_option("--num_procs,--num_gpus", opts.num_procs, "processes per node");
  app.add_option("--num_nodes", opts.num_nodes, "use the first N hosts");
  app.add_option("-i,--include", opts.include, "hosts/slots to use: host1:0,1@host2");
  app.add_option("-e,--exclude", opts.exclude, "hosts/slots to leave out");
  app.add_option("--master_addr", opts.master_addr, "address of rank 0's host");
  app.add_option("--master_port", opts.master_port, "rendezvous port");
  app.add_option("--launcher", opts.launcher, "local|ssh|openmpi|slurm");
  app.add_option("--launcher_args", opts.launcher_args, "extra arguments for the launcher");
  app.add_option("--remote_cmd", opts.remote_cmd, "remote-command template with {host} {command}");
  app.add_option("--remote_dscpp", opts.remote_dscpp, "path of dscpp on the remote hosts");
  app.add_option("--config", config_path,
                 "DeepSpeed JSON config to check as the job would: its batch against the world "
                 "size, and every setting the engine's set-up would refuse");
  app.add_option("--device", device,
                 "cpu|cuda: where the job's model is (dscpp train's --device), for the engine's "
                 "checks of the config")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  std::string model;
  models::GPTConfig gpt;
  gpt.n_layer = 2;  // dscpp train's defaults
  gpt.n_head = 4;
  gpt.n_embd = 64;
  gpt.vocab_size = 0;
  gpt.block_size = 0;
  bool checkpointing = false;
  app.add_option("--model", model,
                 "gpt: also check the config against the model dscpp train would build with the "
                 "shape below (built for its shapes only: no memory), and its memory on this host")
      ->check(CLI::IsMember({"gpt"}));
  app.add_option("--n_layer", gpt.n_layer, "GPT blocks (dscpp train's)")->capture_default_str();
  app.add_option("--n_head", gpt.n_head, "GPT heads")->capture_default_str();
  app.add_option("--n_embd", gpt.n_embd, "GPT width")->capture_default_str();
  app.add_option("--vocab_size", gpt.vocab_size,
                 "GPT vocabulary (default: the built-in task's, as dscpp train without --data)");
  app.add_option("--block_size", gpt.block_size, "GPT context (default: as --vocab_size)");
  app.add_flag("--checkpoint_activations", checkpointing,
               "the GPT recomputes each block in backward (dscpp train's flag)");
  app.add_option("--sizes_kib", sizes_kib, "message sizes for the collective test")->delimiter(',');
  app.add_option("--iters", iters, "timed runs per operation and size");
  app.add_flag("--no_collectives", no_collectives, "skip the collective test");
  app.add_flag("--keys", keys,
               "print every DeepSpeed config key with what dscpp does with it (markdown) and exit");
  app.add_option("--log_level", level, "debug|info|warning|error");
  app.add_flag("--worker", worker)->group("");
  app.add_option("--probe_connect", probe)->group("");
  int probe_port = 0, probe_accepts = 1;
  app.add_option("--probe_listen", probe_port)->group("");
  app.add_option("--probe_accepts", probe_accepts)->group("");
  CLI11_PARSE(app, argc, argv);
  if (!level.empty()) set_log_level(parse_log_level(level));
  opts.log_level = level;

  if (!probe.empty()) {
    auto colon = probe.rfind(':');
    std::string err = try_connect(probe.substr(0, colon), std::stoi(probe.substr(colon + 1)), 5000);
    if (!err.empty()) std::cout << err << std::endl;
    return err.empty() ? 0 : 1;
  }
  if (probe_port > 0) return probe_listen(probe_port, probe_accepts, 30);
  if (keys) {
    std::cout << config::config_key_reference();
    return 0;
  }
  if (worker) return worker_main(sizes_kib, iters);

  Checklist cl;
  std::vector<launch::HostSlots> hosts;
  std::string launcher, master;
  try {
    hosts = launch::resolve_hosts(opts);
    launcher = launch::choose_launcher(opts, hosts);
    master = launch::resolve_master_addr(opts, hosts);
  } catch (const Error& e) {
    cl.fail(e.what());
    std::cout << "1 check failed" << std::endl;
    return 1;
  }
  int world = 0;
  for (const auto& h : hosts) world += h.num_procs();
  cl.ok(fmt::format("{} host(s), {} rank(s), launcher {}: {}", hosts.size(), world, launcher,
                    launch::describe_hosts(hosts)));
  check_hosts(cl, opts, hosts, launcher);
  check_master(cl, opts, hosts, launcher, master);
  if (!config_path.empty()) {
    try {
      auto cfg = Config::parse(config_path);
      // The engine's own decisions on the config (initialize() makes them first, with this text),
      // for a model on --device and no optimizer but the config's (dscpp train).
      engine::SupportContext support;
      support.model_on_device = device != "cpu";
      support.device = device;
      support.world = world;
      support.host_group = world > 0 ? predicted_host_group(hosts, device) : 0;
      support.collectives = device == "cpu" ? "Gloo over TCP" : "NCCL";
      const std::vector<std::string> warnings = engine::check_config(
          cfg, support, "the hosts and --num_procs that dscpp check was given");
      cl.ok(fmt::format("config {}: train_batch_size {} = micro batch {} * GAS {} * {} ranks",
                        config_path, cfg.batch.train_batch_size,
                        cfg.batch.train_micro_batch_size_per_gpu,
                        cfg.batch.gradient_accumulation_steps, world));
      for (const auto& w : warnings) std::cout << "       warning: " << w << std::endl;
      DSCPP_LOG_INFO("resolved config (values in force):\n{}", cfg.describe());
      if (model.empty()) {
        // What needs the model: said, not passed in silence.
        std::vector<std::string> unchecked;
        const auto& z = cfg.zero_optimization;
        if (cfg.torch_autocast.enabled && cfg.torch_autocast.lower_precision_safe_modules)
          unchecked.push_back("torch_autocast.lower_precision_safe_modules");
        if (z.stage == 3 && (!z.leaf_module.classes.empty() || !z.leaf_module.names.empty() ||
                             !z.leaf_module.name_suffixes.empty()))
          unchecked.push_back("zero_optimization.leaf_module");
        if (z.stage == 3 && z.offload_param.device == "nvme")
          unchecked.push_back("offload_param.buffer_size against the largest unit shard");
        unchecked.push_back("the memory this job needs");
        std::cout << "       note: not checked without a model: "
                  << fmt::format("{}", fmt::join(unchecked, ", "))
                  << " (--model gpt checks them for dscpp train's GPT; dscpp::check() in a "
                     "program of your own)"
                  << std::endl;
      }
      if (model == "gpt") {
        try {
          check_gpt(cl, cfg, gpt, checkpointing, hosts, world, device);
        } catch (const Error& e) {
          cl.fail(fmt::format("config {} with the GPT ({}): {}", config_path, gpt.to_string(),
                              e.what()));
        }
      }
    } catch (const Error& e) {
      cl.fail(fmt::format("config {}: {}", config_path, e.what()));
    }
  } else if (!model.empty()) {
    cl.fail("--model needs --config: the model is checked against a config");
  }
  if (!no_collectives && cl.failures == 0) {
    launch::LaunchOptions job = opts;
    job.program = {self_exe(), "check", "--worker", "--iters", std::to_string(iters), "--sizes_kib"};
    std::string s;
    for (size_t i = 0; i < sizes_kib.size(); ++i) s += (i ? "," : "") + std::to_string(sizes_kib[i]);
    job.program.push_back(s);
    int st = launch::run_job(job);
    if (st == 0) cl.ok(fmt::format("collectives across {} rank(s) completed with correct results", world));
    else cl.fail(fmt::format("the collective test across {} rank(s) failed (status {}); see the report above", world, st));
  } else if (!no_collectives) {
    std::cout << "[skip] collective test: fix the failures above first" << std::endl;
  }
  std::cout << (cl.failures ? fmt::format("{} check(s) failed", cl.failures)
                            : std::string("all checks passed"))
            << std::endl;
  return cl.failures ? 1 : 0;
}

}  // namespace dscpp::tools
