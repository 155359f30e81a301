// Implements check_supported (check_supported.h): one entry per decision, in the order a user
// reads a config.
#include "engine/check_supported.h"

#include "dscpp/device_link.h"
#include "dscpp/error.h"
#include "engine/estimate.h"
#include "monitor/monitor.h"
#include "precision/loss_scaler.h"

namespace dscpp::engine {

std::vector<std::string> check_config(Config& config, const SupportContext& context,
                                      const std::string& where) {
  const std::vector<std::string> engine = check_supported(config, context);
  DSCPP_CHECK(context.world > 0, ConfigError,
              "the world size is not known here (the hosts come from the launcher at run time). "
              "HINT: give --hostfile or --num_nodes and --num_procs to check the batch against it");
  config.resolve_batch(context.world, where);
  std::vector<std::string> warnings = config.warnings;
  warnings.insert(warnings.end(), engine.begin(), engine.end());
  return warnings;
}

std::vector<std::string> check_supported(const Config& c, const SupportContext& ctx) {
  std::vector<std::string> warnings;
  const auto& z = c.zero_optimization;
  const int stage = z.stage;
  const bool mixed = c.bf16.enabled || c.fp16.enabled;
  const std::string dtype = c.bf16.enabled ? "bf16" : c.fp16.enabled ? "fp16" : "fp32";

  // ----- ZeRO stage

  // ----- optimizer: a client optimizer, and the config's under ZeRO
  DSCPP_CHECK(!(stage > 0 && ctx.client_optimizer && !c.zero_allow_untested_optimizer), ConfigError,
              "You are using an untested ZeRO Optimizer. Please add "
              "<\"zero_allow_untested_optimizer\": true> in the configuration file to use it. "
              "(DeepSpeed's rule: a client optimizer with ZeRO stage ",
              stage, ")");
  DSCPP_CHECK(!(stage > 0 && ctx.client_optimizer), ConfigError,
              "a client optimizer with ZeRO stage ", stage,
              " is not implemented yet: ZeRO runs "
              "dscpp's own optimizer on each rank's shard. HINT: describe the optimizer in the "
              "config's optimizer section");
  DSCPP_CHECK(!(mixed && ctx.client_optimizer), ConfigError, "a client optimizer with ", dtype,
              " is not implemented: mixed precision keeps fp32 master weights that only dscpp's "
              "own optimizers update. HINT: describe the optimizer in the config's optimizer "
              "section, or train in fp32");
  DSCPP_CHECK(!(stage > 0 && c.optimizer.type == "Lamb"), ConfigError,
              "the Lamb optimizer needs per-parameter norms across shards and is not "
              "supported with ZeRO stage ",
              stage, ". HINT: use stage 0, or Adam/AdamW");
  // Muon keeps its momentum in memory and writes each matrix's update there before the part is
  // stepped (NOTE [Muon across ranks]): a store that swaps the state in piece by piece, or
  // parameters on disk, would need both passes through the file, and a store in host memory for
  // a model on a GPU its own copies. Offload to "cpu" of a model in host memory moves nothing
  // (its state is in host memory already), so Muon runs there as without it.
  const bool muon_offload =
      z.offload_optimizer.device == "nvme" || (stage == 3 && z.offload_param.device == "nvme") ||
      (ctx.model_on_device &&
       (z.offload_optimizer.device == "cpu" || (stage == 3 && z.offload_param.device == "cpu")));
  DSCPP_CHECK(!(c.optimizer.type == "Muon" && stage > 0 && muon_offload), ConfigError,
              "the Muon optimizer with offload to nvme, or to cpu of a model on a GPU "
              "(zero_optimization.offload_optimizer or offload_param), is not implemented yet: "
              "Muon's momentum and updates stay in the model's memory. HINT: remove the offload, "
              "or use AdamW");

  // ----- precision and communication
  // The loss scaler's own checks of the fp16 section (min_loss_scale above the initial scale,
  // ...), with the text set-up gives.
  if (c.fp16.enabled)
    precision::LossScaler scaler(precision::LossScalerOptions::from_config(c.fp16));
  DSCPP_CHECK(!(c.fp16.enabled && c.fp16.auto_cast), ConfigError,
              "fp16.auto_cast is not implemented: dscpp does not cast the model's inputs. HINT: "
              "set fp16.auto_cast to false and pass inputs in fp16 (or integer token ids)");

  // data_types.grad_accum_dtype as DeepSpeed 0.19.8 reads it (engine._do_optimizer_sanity_check):
  // stage 0 refuses a dtype other than the training one; stage 1 with bf16 and fp32 takes its
  // BF16 optimizer (fp32 accumulation, without offload: only offload_optimizer cpu sends it to
  // the ZeRO optimizer instead); its ZeRO optimizer never reads the key.
  if (c.data_types.grad_accum_dtype && *c.data_types.grad_accum_dtype != dtype) {
    const std::string& acc = *c.data_types.grad_accum_dtype;
    const bool bf16_optimizer = stage == 1 && c.bf16.enabled && acc == "fp32";
    DSCPP_CHECK(stage != 0, ConfigError, "data_types.grad_accum_dtype \"", acc, "\" with ", dtype,
                " training at ZeRO stage 0 is a mix DeepSpeed refuses (\"unsupported mix of "
                "model_dtype and grad_accum_dtype\"), and so does dscpp. HINT: remove it, or use "
                "ZeRO stage 1 with bf16 and \"fp32\" for fp32 gradient accumulation");
    DSCPP_CHECK(!(bf16_optimizer && z.offload_optimizer.device == "nvme"), ConfigError,
                "data_types.grad_accum_dtype \"fp32\" with offload_optimizer.device \"nvme\" "
                "at stage 1 is not implemented: DeepSpeed's BF16 optimizer, which it selects, "
                "does not offload, and dscpp's fp32 accumulation is in memory. HINT: remove one");
    if (!bf16_optimizer || z.offload_optimizer.device == "cpu") {
      warnings.push_back(
          "data_types.grad_accum_dtype \"" + acc + "\" has no effect at ZeRO stage " +
          std::to_string(stage) + " with " + dtype +
          (z.offload_optimizer.device == "cpu" ? " and offload_optimizer cpu" : "") +
          ": DeepSpeed 0.19.8 acts on it only at stage 1 with bf16 and \"fp32\" (its BF16 "
          "optimizer); its ZeRO optimizer accumulates gradients in the training dtype, as "
          "dscpp does here");
    }
  }

  // bf16 master weights (DeepSpeed 0.19.8's runtime/config.py and base_optimizer.py checks
  // first, with their text).
  const auto& b16 = c.bf16;
  if (b16.bf16_master_weights_and_grads) {
    DSCPP_CHECK(b16.enabled, ConfigError,
                "bf16.bf16_master_weights_and_grads needs bf16.enabled. HINT: enable bf16, or "
                "remove it");
    DSCPP_CHECK(stage > 0, ConfigError,
                "Bf16_master_weights_and_grads is only supported with ZeRO Stage 1, 2, or 3. "
                "(DeepSpeed's rule) HINT: set zero_optimization.stage");
    DSCPP_CHECK(gradient_dtype(c, stage) != at::kFloat, ConfigError,
                "bf16.bf16_master_weights_and_grads with data_types.grad_accum_dtype \"fp32\" "
                "at stage 1: the latter selects DeepSpeed's BF16 optimizer, which keeps fp32 "
                "master weights and does not read the former. HINT: remove one of them");
    // In memory only: a GPU model's optimizer or parameter shards in host memory, or anything
    // on disk, reach the step through copies this store does not make.
    const bool host_step = z.offload_optimizer.device == "cpu" && ctx.model_on_device;
    const bool host_params = stage == 3 && z.offload_param.device == "cpu" && ctx.model_on_device;
    DSCPP_CHECK(z.offload_optimizer.device != "nvme" && !host_step && !host_params &&
                    !(stage == 3 && z.offload_param.device == "nvme"),
                ConfigError,
                "bf16.bf16_master_weights_and_grads with ",
                host_step     ? "offload_optimizer \"cpu\" of a model on a device"
                : host_params ? "offload_param \"cpu\" of a model on a device"
                              : "offload to nvme",
                " is not implemented yet: dscpp updates the bf16 parameters where they are, in "
                "memory. HINT: remove the offload, or bf16_master_weights_and_grads");
  }
  if (b16.bf16_optimizer_states) {
    // DeepSpeed 0.19.8's runtime/config.py, in its order and words.
    DSCPP_CHECK(stage > 0, ConfigError,
                "bf16_optimizer_states is only supported with ZeRO Stage 1, 2, or 3. (DeepSpeed's "
                "rule) HINT: set zero_optimization.stage, or remove bf16.bf16_optimizer_states");
    DSCPP_CHECK(b16.bf16_master_weights_and_grads, ConfigError,
                "bf16_optimizer_states requires bf16_master_weights_and_grads to be enabled. "
                "(DeepSpeed's rule) HINT: set bf16.bf16_master_weights_and_grads true, or remove "
                "bf16.bf16_optimizer_states");
  }

  if (c.bf16.immediate_grad_update && gradient_dtype(c, stage) != at::kFloat) {
    warnings.push_back(
        "bf16.immediate_grad_update has no effect here: DeepSpeed 0.19.8 reads it only in its "
        "BF16 optimizer (bf16 at ZeRO stage 1 with data_types.grad_accum_dtype \"fp32\", no "
        "offload_optimizer), whose fp32 accumulation dscpp does as it asks; training is "
        "unchanged");
  }

  // torch_autocast (NOTE [autocast] in src/precision/autocast.h).
  const auto& ac = c.torch_autocast;
  if (ac.enabled) {
    DSCPP_CHECK(!c.fp16.enabled, ConfigError,
                "torch_autocast with fp16.enabled: the parameters would be fp16 under an "
                "autocast of their own. HINT: use one of them (torch_autocast keeps the "
                "parameters in fp32; fp16 casts them)");
    const c10::DeviceType device =
        ctx.device.rfind("cpu", 0) == 0 ? c10::DeviceType::CPU : c10::DeviceType::CUDA;
    const at::ScalarType low = autocast_dtype(c, device);
    DSCPP_CHECK(
        low == at::kBFloat16, ConfigError, "torch_autocast in ", low == at::kHalf ? "fp16" : "fp32",
        ac.dtype ? "" : " (libtorch's default on a GPU: torch_autocast.dtype is unset)",
        low == at::kHalf ? " is not implemented yet: fp16 needs a gradient scaler (DeepSpeed's "
                           "torch.amp.GradScaler), which dscpp's fp32 path does not have"
                         : " changes nothing: the parameters are fp32 already",
        ". HINT: set torch_autocast.dtype to \"bfloat16\"");
    DSCPP_CHECK(!z.zero_quantized_weights, ConfigError,
                "Cannot enable both torch autocast and zero quantized weights (DeepSpeed's "
                "rule). HINT: remove one of torch_autocast and zero_quantized_weights");
    if (c.communication_data_type && stage > 0) {
      warnings.push_back(
          "communication_data_type \"" + *c.communication_data_type +
          "\" is not read with torch_autocast at ZeRO stages 1-3: as in DeepSpeed 0.19.8, the "
          "gradients of the lower-precision-safe modules' parameters are reduced in the autocast "
          "dtype and the others in the parameters' own (at stage 0 it is read)");
    }
  }

  if (ctx.world > 0 && ctx.host_group > 0)
    secondary_partition_size(c, ctx.host_group, ctx.world, ctx.collectives, &warnings);

  // ZeRO++'s quantization (NOTE [block-wise quantization]) runs on the CPU only.
  for (const auto& [key, on] :
       {std::pair<const char*, bool>{"zero_quantized_weights", z.zero_quantized_weights},
        {"zero_quantized_gradients", z.zero_quantized_gradients}}) {
    DSCPP_CHECK(!(stage == 3 && on && ctx.device != "cpu"), ConfigError, "zero_optimization.", key,
                " with a model on ", ctx.device,
                " is not implemented yet: dscpp quantizes on the CPU only. HINT: remove it (NCCL "
                "then gathers and reduces the training dtype)");
  }

  // ----- offload (stage 0 ignores it, as DeepSpeed does: the config parser says so).
  // A model on a device offloads through a DeviceLink: dscpp's own copies CUDA memory, in a
  // build with CUDA (set-up makes it).
  const bool optimizer_off_device = stage > 0 && z.offload_optimizer.device != "none";
  if ((optimizer_off_device || (stage == 3 && z.offload_param.device != "none")) &&
      ctx.device != "cpu" && !ctx.device_link_given) {
    const bool cuda = ctx.device.rfind("cuda", 0) == 0;
    DSCPP_CHECK(cuda && offload::cuda_link_available(), ConfigError, "zero_optimization.",
                optimizer_off_device ? "offload_optimizer" : "offload_param", " with a model on ",
                ctx.device, ": ",
                cuda ? "this dscpp was built without CUDA"
                     : "dscpp copies to host memory from CUDA devices only",
                ". HINT: remove it, or build dscpp with -DDSCPP_CUDA=ON");
  }
  // offload_optimizer cpu and nvme are honoured at stages 1-3 (set-up: build_strategy).
  const auto& oo = z.offload_optimizer;
  if (stage > 0 && oo.device != "none") {
    DSCPP_CHECK(oo.ratio == 1.0, ConfigError, "zero_optimization.offload_optimizer.ratio ",
                oo.ratio,
                " is not implemented: dscpp offloads all of a rank's optimizer state or none "
                "of it. HINT: remove ratio (1.0)");
    if (oo.pin_memory && !(oo.device == "cpu" && ctx.model_on_device)) {
      warnings.push_back(
          "zero_optimization.offload_optimizer.pin_memory: pinned (page-locked) host memory "
          "only speeds up copies between host memory and a GPU (offload_optimizer.device "
          "\"cpu\" with a model on a GPU); here it changes nothing");
    }
  }
  // offload_param cpu and nvme are honoured at stage 3 (set-up: build_strategy; other stages
  // ignore it with the parser's warning, as DeepSpeed does).
  const auto& op = z.offload_param;
  if (stage == 3 && op.device == "nvme") {
    DSCPP_CHECK(mixed || oo.device == "nvme" || (oo.device == "cpu" && ctx.model_on_device),
                ConfigError,
                "zero_optimization.offload_param.device \"nvme\" in fp32 needs "
                "offload_optimizer.device \"nvme\" too (or \"cpu\" with a model on a GPU): in "
                "fp32 the optimizer updates the parameters themselves, so with the parameters on "
                "disk its fp32 weights must be off the device with its state. HINT: add \"offload_optimizer\": {\"device\": \"nvme\", "
                "\"nvme_path\": ...}, or train in bf16 (the fp32 master weights then stay in "
                "memory)");
  }
  if (stage == 3 && op.device == "cpu" && ctx.model_on_device) {
    DSCPP_CHECK(mixed || oo.device != "none", ConfigError,
                "zero_optimization.offload_param.device \"cpu\" in fp32 needs "
                "offload_optimizer.device \"cpu\" (or \"nvme\") too: in fp32 the optimizer "
                "updates the parameters themselves, so with the parameters in host memory its "
                "fp32 weights must be off the device with them. HINT: add \"offload_optimizer\": "
                "{\"device\": \"cpu\"}, or train in bf16 (the fp32 master weights then stay "
                "on the device)");
  }
  if (stage == 3 && op.device != "none") {
    DSCPP_CHECK(op.buffer_count >= 1, ConfigError,
                "zero_optimization.offload_param.buffer_count 0 leaves no buffer to read a "
                "parameter shard into. HINT: remove it (default 5)");
  }
  if (stage == 3 && op.device != "none" && op.pin_memory &&
      !(op.device == "cpu" && ctx.model_on_device)) {
    warnings.push_back(
        "zero_optimization.offload_param.pin_memory: pinned (page-locked) host memory only "
        "speeds up copies between host memory and a GPU (offload_param.device \"cpu\" with a "
        "model on a GPU); here it changes nothing");
  }
  if (c.activation_checkpointing.cpu_checkpointing && ctx.device == "cpu") {
    warnings.push_back(
        "activation_checkpointing.cpu_checkpointing has no effect with a model in host memory: "
        "the inputs zero::checkpoint keeps are in host memory already; training is unchanged");
  }
  if (z.stage3_gather_16bit_weights_on_model_save) {
    warnings.push_back(
        "zero_optimization.stage3_gather_16bit_weights_on_model_save is not implemented yet and "
        "is ignored: dscpp has no save_16bit_model; training runs as configured. HINT: "
        "zero::GatheredParameters with safetensors::save writes whole weights");
  }
  if (stage == 0 && !z.overlap_comm && !c.origins.count("zero_optimization.overlap_comm")) {
    warnings.push_back(
        "zero_optimization.overlap_comm false has no effect at stage 0: its all-reduces always "
        "overlap backward (the key applies to stages 1-3); training runs as configured");
  }
  if (!z.allgather_partitions) {
    warnings.push_back(
        "zero_optimization.allgather_partitions false: dscpp always all-gathers "
        "the updated shards (DeepSpeed would broadcast them one by one); the "
        "result is the same");
  }

  // checkpoint.writer: decoupled is honoured (save_checkpoint in the background), type FAST is
  // dscpp's writer, io_buffer_size the piece a background write copies and writes at a time.
  const auto& w = c.checkpoint.writer;
  DSCPP_CHECK(w.type == "FAST", ConfigError, "checkpoint.writer.type ", w.type,
              " is not implemented: ",
              w.type == "MOCK" ? "it writes nothing, so the checkpoint would be lost"
                               : "it writes torch.save pickles, which dscpp does not",
              ". HINT: use \"fast\" (the default): dscpp's writer of safetensors files");
  DSCPP_CHECK(w.data_parallel.empty(), ConfigError, "checkpoint.writer.data_parallel ",
              w.data_parallel,
              " is not implemented: it spreads the writing of replicated state over data-parallel "
              "ranks, and dscpp's replicated state (frozen parameters and buffers) is written by "
              "rank 0 alone while every rank writes its own slice of the rest. HINT: remove it");
  DSCPP_CHECK(w.io_multiplier == 1, ConfigError, "checkpoint.writer.io_multiplier ",
              w.io_multiplier,
              " is not implemented: dscpp writes each rank's file through one stream. HINT: remove "
              "it");
  if (w.io_buffer_double.value_or(false)) {
    warnings.push_back(
        "checkpoint.writer.io_buffer_double is not implemented: dscpp's writer fills one buffer "
        "of io_buffer_size at a time and writes it through the page cache, not FastPersist's two "
        "pinned O_DIRECT buffers");
  }
  if (w.decoupled) {
    DSCPP_CHECK(c.zero_optimization.offload_optimizer.device != "nvme" &&
                    c.zero_optimization.offload_param.device != "nvme",
                ConfigError,
                "checkpoint.writer.decoupled with offload to nvme is not implemented: the swap "
                "files the checkpoint streams from are rewritten by the next step, so a write in "
                "the background would need a second copy of them. HINT: remove decoupled (the "
                "save then streams the swap files before it returns)");
  }

  // ----- monitors: tensorboard and csv_monitor are written (src/monitor); wandb and comet are
  // refused by the parser (NOTE [key verdicts])
  if (c.tensorboard.enabled) monitor::require_tensorboard();
  return warnings;
}

int secondary_partition_size(const Config& c, int host, int world,
                             const std::string& collectives, std::vector<std::string>* warnings) {
  const int64_t hpz = c.zero_optimization.zero_hpz_partition_size;
  if (hpz <= 1 || c.zero_optimization.stage != 3) return 1;
  const std::string key = "zero_optimization.zero_hpz_partition_size " + std::to_string(hpz);
  DSCPP_CHECK(host > 1, ConfigError, key,
              ": hpZ keeps a secondary partition among the ranks of one host that share memory, "
              "and this job's collectives (",
              collectives,
              ") go over the network between every pair of ranks (a model on a GPU, one rank "
              "per host, hosts of different sizes, or shared memory off; docs/comm.md, "
              "\"Across hosts\"). HINT: remove it or set 1");
  if (host == world) {
    DSCPP_CHECK(hpz == world, ConfigError, key, ": all ", world,
                " ranks are on one host, so a secondary partition would be the primary one; "
                "partitions of fewer ranks than a host are not implemented. HINT: remove it or "
                "set 1");
    warnings->push_back(key + ": every rank is on one host, where every gather already stays; "
                              "no effect");
    return 1;
  }
  DSCPP_CHECK(hpz == host, ConfigError, key, ": the secondary partition is the ranks of one host, ",
              host, " here (", world / host,
              " hosts); partitions of another size are not implemented. HINT: set ", host,
              " or 1");
  return host;
}

}  // namespace dscpp::engine
