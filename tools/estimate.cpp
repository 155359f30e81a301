// dscpp estimate: the memory and disk per rank the model states take at every ZeRO stage, with
// and without the optimizer on disk (DeepSpeed's estimate_zero2/zero3_model_states_mem_needs,
// from the real config), and whether each fits this machine: the figures initialize()'s
// pre-flight check holds against the memory actually available.
#include "engine/estimate.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "dscpp/config.h"
#include "dscpp/error.h"
#include "dscpp/models/gpt.h"
#include "tools.h"
#include "util/log.h"

namespace dscpp::tools {

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
  app.add_option("--log_level", level, "debug|info|warning|error");
  CLI11_PARSE(app, argc, argv);
  set_log_level(parse_log_level(level));

  engine::EstimateInput in;
  in.world = num_procs;
  if (model == "gpt") {
    gpt.validate();
    in.params = gpt.num_parameters();
    in.largest_unit = gpt.block_parameters();  // stage 3's unit
  } else {
    DSCPP_CHECK(params > 0, ConfigError,
                "dscpp estimate needs --params N or --model gpt with its shape");
    in.params = params;
  }
  Config config = Config::parse(config_text);
  if (config.optimizer.type.empty()) config.optimizer.type = "AdamW";  // DeepSpeed's estimators
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
  std::cout << "| setting | params | grads | fp32 master | optimizer | largest unit | swap "
               "buffers | memory per rank | per host | disk per rank | fits here |\n"
               "|---|---|---|---|---|---|---|---|---|---|---|\n";
  auto gib = [](int64_t b) { return fmt::format("{:.2f}", b / double(int64_t{1} << 30)); };
  for (const engine::Estimate& e : engine::estimate_all(in, config)) {
    const int64_t host = e.memory() * per_host;
    std::cout << fmt::format(
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", e.describe(), gib(e.params),
        gib(e.grads), gib(e.master), gib(e.optimizer_state), gib(e.live_unit), gib(e.swap_buffers),
        gib(e.memory()), gib(host), gib(e.disk + e.param_disk), host <= avail ? "yes" : "no");
  }
  std::cout << "\n(GiB. Model states only: activations, communication buffers and the program "
               "itself come on top. Stage 3 adds the largest unit gathered whole; offload adds "
               "the swap pipeline's buffers, 3 sub-groups at most, and with the parameters on "
               "nvme the unit shards read ahead, offload_param.buffer_count + 2 at most.)\n";
  return 0;
}

}  // namespace dscpp::tools
