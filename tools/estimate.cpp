// dscpp estimate: the memory and disk per rank the model states take at every ZeRO stage, with
// and without the optimizer on disk (DeepSpeed's estimate_zero2/zero3_model_states_mem_needs,
// from the real config), and whether each fits this machine: the figures initialize()'s
// pre-flight check holds against the memory actually available. With --net_gbit, the time of a
// step across the hosts at stages 2 and 3, flat, hierarchical and with ZeRO++ (NOTE [step-time
// model]), and with --scaling the same at other host counts.
#include "engine/estimate.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "dscpp/config.h"
#include "dscpp/error.h"
#include "dscpp/models/gpt.h"
#include "engine/step_time.h"
#include "tools.h"
#include "util/log.h"
#include "util/memory.h"

namespace dscpp::tools {
namespace {

// What the step-time model needs beyond the config: the network, the compute, and the model's
// stage-3 units.
struct NetworkOptions {
  double gbit = 0;  // 0: no step-time section
  double latency_ms = 0;
  double shm_gbyte = 4;
  double compute_s = 0;     // 0: from --rank_gflops
  double rank_gflops = 45;  // this machine, 4 ranks on 2 cores (docs/benchmarks.md)
  double overlap = 0.49;
  std::vector<int> scaling;  // host counts for the scaling table
};

// The step-time rows at `hosts` x `per_host`: stages 2 and 3, flat and hierarchical, and stage 3
// with hpZ, and with qwZ, qgZ and hpZ added one at a time.
struct Variant {
  std::string name;
  engine::Cluster cluster;
  engine::StepWork work;
};
std::vector<Variant> variants(const engine::Cluster& base, const engine::StepWork& stage2,
                              const engine::StepWork& stage3) {
  std::vector<Variant> out;
  for (const auto* w : {&stage2, &stage3}) {
    const std::string stage = "stage " + std::to_string(w->stage);
    engine::Cluster flat = base;
    flat.hierarchy = false;
    out.push_back({stage + ", flat", flat, *w});
    out.push_back({stage + ", hierarchy", base, *w});
  }
  engine::StepWork q = stage3;
  q.secondary_partition = true;
  out.push_back({"stage 3, hierarchy + hpZ", base, q});
  q.secondary_partition = false;
  q.quantized_weights = true;
  out.push_back({"stage 3, hierarchy + qwZ", base, q});
  q.quantized_gradients = true;
  out.push_back({"stage 3, hierarchy + qwZ + qgZ", base, q});
  q.secondary_partition = true;
  out.push_back({"stage 3, hierarchy + qwZ + qgZ + hpZ", base, q});
  return out;
}

void print_step_times(const models::GPTConfig* gpt, int64_t params, const Config& config,
                      int num_procs, int num_nodes, const NetworkOptions& net) {
  const auto& zc = config.zero_optimization;
  engine::Cluster cluster;
  cluster.hosts = num_nodes;
  cluster.per_host = num_procs / num_nodes;
  cluster.net_bytes_per_s = net.gbit * 1e9 / 8;
  cluster.net_latency_s = net.latency_ms / 1000;
  cluster.shm_bytes_per_s = net.shm_gbyte * 1e9;
  engine::StepWork w;
  w.item_bytes = static_cast<int>(c10::elementSize(engine::training_dtype(config)));
  w.grad_wire_bytes =
      static_cast<int>(c10::elementSize(engine::communication_dtype(config, zc.stage)));
  // The batch as the config resolves it at this world size; one sample per rank without one.
  const engine::ConfiguredBatch batch = engine::configured_batch(config, num_procs);
  const int64_t micro = batch.micro;
  w.gas = static_cast<int>(batch.gas);
  w.reduce_bucket_size = zc.reduce_bucket_size;
  w.max_reuse_distance = zc.stage3_max_reuse_distance;
  w.overlap = net.overlap;
  if (gpt) {
    engine::add_gpt_units(*gpt, zc.stage3_param_persistence_threshold, &w);
  } else {
    w.units.assign(16, params / 16);  // without a model: 16 equal units
    w.other = params - 16 * (params / 16);
  }
  if (net.compute_s > 0) {
    w.compute_s = net.compute_s;
  } else {
    // 6 flops per parameter per token (forward and backward), and attention's 12 L T C.
    const double n = static_cast<double>(w.elements());
    const double per_token =
        6 * n + (gpt ? 12.0 * gpt->n_layer * gpt->block_size * gpt->n_embd : 0.0);
    const double tokens = static_cast<double>(micro) * w.gas * (gpt ? gpt->block_size : 1);
    w.compute_s = per_token * tokens / (net.rank_gflops * 1e9);
  }
  // Quantizing an element costs about 28 flops' time (step_time.h).
  w.quantize_s_per_element = 28 / (net.rank_gflops * 1e9);
  engine::StepWork s2 = w, s3 = w;
  s2.stage = 2;
  s3.stage = 3;
  // DeepSpeed's default overlap_comm per stage, unless the config set it for its own stage.
  s2.overlap_comm = zc.stage == 2 ? zc.overlap_comm : false;
  s3.overlap_comm = zc.stage == 3 ? zc.overlap_comm : true;

  std::cout << fmt::format(
      "\nstep time across {} host(s) x {} rank(s), links {} Gbit/s, latency {} ms; compute {:.3f} "
      "s per step per rank ({}); overlap {} (NOTE [step-time model])\n\n",
      cluster.hosts, cluster.per_host, net.gbit, net.latency_ms, w.compute_s,
      net.compute_s > 0 ? "--compute_s" : fmt::format("{} GFLOP/s per rank", net.rank_gflops),
      net.overlap);
  std::cout << "| setting | between hosts per step, all hosts (MiB) | communication the step waits "
               "for (s) | step (s) | units gathered again in backward |\n|---|---|---|---|---|\n";
  for (const Variant& v : variants(cluster, s2, s3)) {
    const engine::StepTime t = engine::model_step(v.cluster, v.work);
    std::cout << fmt::format("| {} | {:.1f} | {:.2f} | {:.2f} | {} |\n", v.name,
                             t.between_hosts() * cluster.hosts / 1048576.0, t.exposed_comm_s,
                             t.step_s,
                             v.work.stage == 3 ? std::to_string(t.units_regathered) : "-");
  }
  if (net.scaling.empty()) return;
  const std::vector<int>& hosts = net.scaling;
  std::cout << "\nscaling at " << cluster.per_host
            << " rank(s) per host: step seconds (efficiency: one host's step / this one's)\n\n"
            << "| setting |";
  for (int h : hosts) std::cout << fmt::format(" {} hosts |", h);
  std::cout << "\n|---|";
  for (size_t i = 0; i < hosts.size(); ++i) std::cout << "---|";
  std::cout << "\n";
  for (const Variant& v : variants(cluster, s2, s3)) {
    engine::Cluster one = v.cluster;
    one.hosts = 1;
    const double base = engine::model_step(one, v.work).step_s;
    std::cout << "| " << v.name << " |";
    for (int h : hosts) {
      engine::Cluster c = v.cluster;
      c.hosts = h;
      const double s = engine::model_step(c, v.work).step_s;
      std::cout << fmt::format(" {:.2f} ({:.0f}%) |", s, 100 * base / s);
    }
    std::cout << "\n";
  }
}

}  // namespace

int estimate_main(int argc, char** argv) {
  CLI::App app{"dscpp estimate: model-state memory and disk per rank at every ZeRO stage"};
  int64_t params = 0;
  std::string model, config_text = "{}", level = "warning";
  models::GPTConfig gpt;
  gpt.vocab_size = 256;
  gpt.block_size = 256;
  int num_procs = 1, num_nodes = 1;
  app.add_option("--params", params, "trainable parameters (or describe a --model)");
  app.add_option("--model", model, "gpt: count the built-in GPT's parameters")
      ->check(CLI::IsMember({"gpt"}));
  app.add_option("--n_layer", gpt.n_layer, "GPT blocks")->capture_default_str();
  app.add_option("--n_head", gpt.n_head, "GPT heads (only checked)")->capture_default_str();
  app.add_option("--n_embd", gpt.n_embd, "GPT width")->capture_default_str();
  app.add_option("--vocab_size", gpt.vocab_size, "GPT vocabulary")->capture_default_str();
  app.add_option("--block_size", gpt.block_size, "GPT context")->capture_default_str();
  app.add_option("--config", config_text,
                 "DeepSpeed config (file or JSON text): dtype, optimizer, sub_group_size, ...");
  app.add_option("--num_procs", num_procs, "ranks in all")->check(CLI::PositiveNumber);
  app.add_option("--num_nodes", num_nodes, "hosts the ranks are spread over")
      ->check(CLI::PositiveNumber);
  NetworkOptions net;
  app.add_option("--net_gbit", net.gbit,
                 "each host's link, Gbit/s: adds the step time across the hosts")
      ->check(CLI::PositiveNumber);
  app.add_option("--net_latency_ms", net.latency_ms, "one message between hosts")
      ->capture_default_str();
  app.add_option("--shm_gbyte", net.shm_gbyte, "GB/s a rank copies through shared memory")
      ->capture_default_str();
  app.add_option("--compute_s", net.compute_s,
                 "compute of one step on one rank, network aside (e.g. measured on one host)");
  app.add_option("--rank_gflops", net.rank_gflops,
                 "else: one rank's training GFLOP/s (6 per parameter and token, and attention)")
      ->capture_default_str();
  app.add_option("--overlap", net.overlap,
                 "share of the compute time that communication hides behind")
      ->capture_default_str();
  app.add_option("--scaling", net.scaling, "host counts for a scaling table, e.g. 8,32,128")
      ->delimiter(',')
      ->check(CLI::Range(1, 1 << 20));
  double gpu_gb = 0;
  app.add_option("--gpu_gb", gpu_gb,
                 "the model on GPUs of this many GiB each: per-GPU and host-memory columns, and "
                 "the cpu offload rows")
      ->check(CLI::PositiveNumber);
  bool checkpointing = false;
  app.add_flag("--checkpoint_activations", checkpointing,
               "the GPT recomputes each block in backward (dscpp train's flag)");
  app.add_option("--log_level", level, "debug|info|warning|error");
  CLI11_PARSE(app, argc, argv);
  set_log_level(parse_log_level(level));

  Config config = Config::parse(config_text);
  if (config.optimizer.type.empty()) config.optimizer.type = "AdamW";  // DeepSpeed's estimators
  engine::EstimateInput in;
  if (model == "gpt") {
    gpt.validate();
    in = engine::gpt_estimate_input(gpt, config, num_procs, gpu_gb > 0, checkpointing);
  } else {
    DSCPP_CHECK(params > 0, ConfigError,
                "dscpp estimate needs --params N or --model gpt with its shape");
    in.params = params;
    in.world = num_procs;
    in.on_gpu = gpu_gb > 0;
  }
  // The program as dscpp train runs it: this process, the same binary and libtorch (the data
  // and the runtime's threads come on top, a few MiB).
  in.process = current_rss_bytes();
  in.local = (num_procs + num_nodes - 1) / num_nodes;
  const int per_host = (num_procs + num_nodes - 1) / num_nodes;
  std::string source;
  const int64_t avail = engine::available_memory(&source);
  const char* dtype = config.bf16.enabled ? "bf16" : config.fp16.enabled ? "fp16" : "fp32";

  std::cout << fmt::format(
      "dscpp estimate: {} trainable parameters{}, {} rank(s) on {} host(s) ({} per host), {} "
      "with {} (fp32 master weights and optimizer states), sub_group_size {}\n",
      in.params, model == "gpt" ? " (GPT " + gpt.to_string() + ")" : "", num_procs, num_nodes,
      per_host, dtype, config.optimizer.type, config.zero_optimization.sub_group_size);
  std::cout << fmt::format("this machine: {} available ({})\n\n", engine::format_bytes(avail),
                           source);
  auto gib = [](int64_t b) { return fmt::format("{:.2f}", b / double(int64_t{1} << 30)); };
  if (!in.on_gpu) {
    std::cout
        << "| setting | params | grads | fp32 master | optimizer | gathered units | gradient "
           "staging | swap buffers | step and collective buffers | activations | program | runtime "
           "and allocator | peak RSS per rank | per host | disk per rank | fits here |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for (const engine::Estimate& e : engine::estimate_all(in, config)) {
      const int64_t host = e.peak() * per_host;
      std::cout << fmt::format(
          "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
          e.describe(), gib(e.params), gib(e.grads), gib(e.master), gib(e.optimizer_state),
          gib(e.gathered), gib(e.staging), gib(e.swap_buffers),
          gib(e.step_scratch + e.comm_buffers), e.activations_known ? gib(e.activations) : "?",
          gib(e.process), gib(e.runtime + e.slack), gib(e.peak()), gib(host), gib(e.peak_disk()),
          host <= avail ? "yes" : "no");
    }
    std::cout << fmt::format(
        "\n(GiB. {} (NOTE [a bound on the peak] in src/engine/estimate.h). It counts the model "
        "states; stage 3's "
        "units gathered at once as its schedule keeps them (stage3_prefetch_bucket_size, "
        "stage3_max_live_parameters, stage3_max_reuse_distance){}; stages 2-3's gradient staging "
        "slots (one bucket, two with overlap_comm); offload's swap pipeline buffers (3 sub-groups "
        "at most), with the parameters on nvme the pool of unit shards (offload_param.buffer_count "
        "read ahead, and the all-gathers' inputs in flight), with both on nvme the gradient "
        "shard's blocks "
        "in flight and two read buffers; under mixed precision the step's fp32 gradients (a "
        "sub-group offloaded, a 4M-element piece in memory unless a bf16 step fuses them); with "
        "ranks sharing a host the collectives' shared-memory segment and sums; {}; and the "
        "program, {:.0f} MiB (this process: the "
        "same binary and libtorch; dscpp train measures its own after reading its data), with "
        "{:.0f} MiB for what training pages in beside it and {}% of the rest for what the "
        "allocator keeps. Disk: "
        "the swap files at their largest; with the parameters on nvme zero::Init's spill of the "
        "fp32 shards (4 bytes per element of the part) empties during set-up as the optimizer's "
        "file fills, in one folder.)\n",
        model == "gpt"
            ? "peak RSS per rank bounds each rank's peak resident memory, set-up and training"
            : "peak RSS per rank is each rank's peak resident memory without the model's "
              "activations (?) and stage 3's gathered units: add them for a bound",
        model == "gpt" ? "" : " (none without --model: the units are unknown)",
        in.activations >= 0
            ? fmt::format("the GPT's activations at micro-batch {}{} (NOTE [GPT activations])",
                          engine::configured_batch(config, num_procs).micro,
                          checkpointing ? " with checkpointing" : "")
            : "activations not counted (?: a model of your own; dscpp cannot know them: add "
              "what your forward keeps)",
        static_cast<double>(in.process) / (1 << 20),
        static_cast<double>(engine::kRuntimeBytes) / (1 << 20), engine::kSlackPercent);
  } else {
    // A model on GPUs: "cpu" offload moves bytes into host memory, a tier of its own.
    const auto gpu = static_cast<int64_t>(gpu_gb * double(int64_t{1} << 30));
    std::cout << fmt::format("each rank on a GPU of {} GiB\n\n", gpu_gb);
    std::cout << "| setting | params | grads | fp32 master | optimizer | gathered units | gradient "
                 "staging | swap and copy buffers | per GPU | host memory per rank | per host | "
                 "disk per rank | fits the GPU | fits host memory |\n"
                 "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for (const engine::Estimate& e : engine::estimate_all(in, config)) {
      const int64_t host = (e.host() + e.process) * per_host;
      std::cout << fmt::format(
          "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", e.describe(),
          gib(e.params), gib(e.grads), gib(e.master), gib(e.optimizer_state), gib(e.gathered),
          gib(e.staging), gib(e.swap_buffers), gib(e.gpu()), gib(e.host() + e.process), gib(host),
          gib(e.peak_disk()), e.gpu() <= gpu ? "yes" : "no", host <= avail ? "yes" : "no");
    }
    std::cout
        << "\n(GiB. Per GPU: the model states, the engine's buffers, the gathered units and "
           "the activations (the GPT's; ? for a model of your own); CUDA's context and the "
           "caching allocator's slack come on top (not measured here: no GPU). Host memory: the "
           "program (this process) and, with the optimizer on cpu, its fp32 weights, states, the "
           "gradients' host buffer and the sub-groups going up; with the parameters on cpu every "
           "unit shard, offload_param.buffer_count of them on the GPU in transit.)\n";
  }
  if (net.gbit > 0) {
    DSCPP_CHECK(num_procs % num_nodes == 0, ConfigError, "--num_procs ", num_procs,
                " is not a multiple of --num_nodes ", num_nodes,
                ": the step-time model takes hosts of equal size");
    print_step_times(model == "gpt" ? &gpt : nullptr, in.params, config, num_procs, num_nodes, net);
  }
  return 0;
}

}  // namespace dscpp::tools
