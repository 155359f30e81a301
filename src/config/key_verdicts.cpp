// kKeyVerdicts (NOTE [key verdicts] in key_verdicts.h): DeepSpeed 0.19.8's keys that dscpp knows
// and does not act on, in the order a config lists them. Read from DeepSpeed 0.19.8's
// runtime/config.py, zero/config.py and the section configs they load.
#include "config/key_verdicts.h"

namespace dscpp::config {
namespace {

constexpr auto R = KeyClass::refused;
constexpr auto O = KeyClass::observes;
constexpr auto N = KeyClass::no_effect;
constexpr auto U = KeyClass::unused;

// DeepSpeed 0.19.8 refuses these keys whatever their value (_REMOVED_*_CONFIG_KEYS): so does
// dscpp, with DeepSpeed's reason.
constexpr std::string_view kRemoved = "DeepSpeed 0.19.8 removed this feature and refuses the key";

// The why of a key and its alias (DeepSpeed reads either spelling).
constexpr std::string_view kPersistenceCap =
    "it caps the elements stage 3 keeps whole on every rank; dscpp keeps every parameter below "
    "stage3_param_persistence_threshold whole, without a cap";
constexpr std::string_view kModuleGranularity =
    "it fetches small modules as one (fewer Python hooks); dscpp's units are declared "
    "(zero_units, leaf_module)";
constexpr std::string_view kFetchByAllReduce =
    "it gathers parameters with an all-reduce instead of an all-gather; the parameters are the "
    "same";

const std::vector<KeyVerdict> kKeyVerdicts = {
    // ----- the top level
    {"managed_gradient_accumulation", R, "[true]",
     "false hands the accumulation boundary to the caller (every step() updates); dscpp's engine "
     "counts micro-steps and steps at the gradient_accumulation_steps boundary",
     "remove it, or set gradient_accumulation_steps to 1 and call step() where you want updates"},
    {"sequence_parallel_size", R, "[1]",
     "sequence parallelism splits each sequence over ranks and divides the data-parallel world "
     "by it; dscpp has none, so every rank would train another micro-batch than in DeepSpeed",
     "remove it (1)"},
    {"data_parallel_size", R, "[null]",
     "with sequence_parallel_size it builds DeepSpeed's (data, sequence) device mesh; dscpp's "
     "data-parallel world is every rank it launches",
     "remove it"},
    {"seq_parallel_communication_data_type", N, "[\"fp32\"]",
     "the dtype of sequence parallelism's all-to-alls; dscpp has no sequence parallelism", ""},
    {"seq_parallel_comm_data_type", N, "",
     "DeepSpeed 0.19.8 no longer reads this spelling (it reads "
     "seq_parallel_communication_data_type), and dscpp has no sequence parallelism",
     ""},
    {"disable_python_gc", N, "[false]",
     "it turns off Python's garbage collector; a C++ program has none", ""},
    {"memory_breakdown", O, "[false]",
     "it prints memory use at points of the step; dscpp prints nothing more (Engine::"
     "memory_stats() and dscpp train's memory report say where the bytes are)",
     ""},
    {"disable_allgather", U, "", "DeepSpeed 0.19.8 reads it and uses it nowhere", ""},
    {"allgather_size", U, "",
     "DeepSpeed reads it only with the boolean form \"zero_optimization\": true, which dscpp "
     "refuses (write {\"stage\": 1, \"allgather_bucket_size\": ...})",
     ""},
    {"dataloader_drop_last", N, "[false]",
     "it is drop_last of the data loader DeepSpeed builds from initialize()'s training_data; "
     "dscpp's engine builds no data loader (dscpp train never yields a partial batch)",
     ""},
    {"vocabulary_size", O, "[null]",
     "DeepSpeed only warns when it is not a multiple of 8; dscpp does not look at it", ""},
    {"zero_force_ds_cpu_optimizer", N, "[true]",
     "it makes DeepSpeed refuse an optimizer other than its CPU Adam under CPU offload; dscpp "
     "always offloads its own optimizer",
     ""},
    {"use_data_before_expert_parallelism", N, "[false]",
     "it orders ranks for mixture-of-experts groups; dscpp has no expert parallelism", ""},
    {"datastates_ckpt", R, "[false]",
     "it selects the DataStates-LLM checkpoint engine (any value but false, {} and null too); "
     "dscpp writes its own checkpoints (docs/checkpoint.md)",
     "remove it; checkpoint.writer.decoupled saves in the background"},
    {"nebula", R, "", kRemoved, "remove it; dscpp writes its own checkpoints"},
    {"compression_training", R, "", kRemoved, "remove it; the model trains unquantized"},
    {"amp", R, "", kRemoved, "remove it; use bf16 or fp16"},
    {"quantize_training", R, "", kRemoved, "remove it"},
    {"sparse_gradients", R, "", kRemoved, "remove it; embedding gradients are reduced dense"},
    {"eigenvalue", R, "", kRemoved, "remove it"},
    {"sparse_attention", R, "", kRemoved, "remove it"},
    {"graph_harvesting", R, "", kRemoved, "remove it"},
    {"curriculum_learning", R, "", kRemoved,
     "remove it (DeepSpeed's replacement is data_efficiency.data_sampling.curriculum_learning, "
     "which dscpp does not implement either)"},
    {"progressive_layer_drop", R, "", kRemoved, "remove it"},
    // Sections for features dscpp does not have: inert while off.
    {"pipeline", N, "",
     "DeepSpeed reads it only for a PipelineModule model; dscpp has no pipeline parallelism, so "
     "none of its keys changes anything",
     ""},
    {"data_efficiency", R, "{\"enabled\": false}",
     "data efficiency (curriculum sampling, random layer-wise token dropping) changes which "
     "samples and tokens are trained on; dscpp does not implement it",
     "set data_efficiency.enabled to false or remove the section"},
    {"autotuning", R, "{\"enabled\": false}",
     "autotuning runs experiments through DeepSpeed's launcher, and its engine exits after the "
     "profile steps; dscpp has no autotuner",
     "set autotuning.enabled to false or remove the section"},
    {"hybrid_engine", R, "{\"enabled\": false}",
     "the hybrid engine generates with DeepSpeed's inference kernels between training steps "
     "(RLHF); dscpp has no inference engine",
     "set hybrid_engine.enabled to false or remove the section"},
    {"compile", R, "{\"deepcompile\": false}",
     "DeepCompile rewrites the ZeRO step as torch.compile passes; dscpp's step is C++ already",
     "set compile.deepcompile to false or remove the section"},
    {"tensor_parallel", R,
     "{\"autotp_size\": 0, \"tp\": {\"tp_size\": 1}, \"tensor_parallel\": {\"tp_size\": 1}}",
     "tensor parallelism (AutoTP) splits layers over ranks; dscpp has none",
     "remove the section (autotp_size 0, tp_size 1)"},
    {"expert_parallel", R, "{\"enabled\": false}",
     "expert parallelism (AutoEP) spreads a mixture of experts over ranks; dscpp has none",
     "set expert_parallel.enabled to false or remove the section"},
    {"weight_quantization", R, "{\"quantized_initialization\": {}, \"post_init_quant\": {}}",
     "quantized_initialization / post_init_quant store linear weights quantized (lossy); dscpp "
     "keeps them in the training dtype",
     "remove quantized_initialization and post_init_quant"},
    {"timers", O, "{\"throughput\": {\"enabled\": true, \"synchronized\": true}}",
     "they switch DeepSpeed's throughput timer; dscpp's step line always reports throughput and "
     "never synchronizes a device for it",
     ""},
    {"data_types.param_dtype", U, "",
     "DeepSpeed only asserts that it matches fp16/bf16.enabled; the precision sections decide", ""},
    {"data_types.buffer_dtype", R, "[null]",
     "it casts the model's buffers to this dtype; dscpp leaves buffers as the model made them",
     "remove it"},
    {"data_types.keep_in_fp32_modules", N, "[\"auto\"]",
     "it names the modules whose buffers stay fp32 (auto: Hugging Face's list); dscpp never casts "
     "buffers",
     ""},
    {"optimizer.legacy_fusion", N, "[false]",
     "it picks DeepSpeed's legacy fused Adam kernel for fp16 without ZeRO; dscpp has one Adam", ""},
    {"optimizer.params.per_head_muon", R, "[false]",
     "Muon: orthogonalise each attention head's rows of a projection separately (the heads "
     "found from a Hugging Face model's config); dscpp orthogonalises whole matrices",
     "remove it or set false"},
    // ----- fp16 and bf16
    {"fp16.fp16_master_weights_and_grads", R, "[false]",
     "fp16 master weights and gradients (DeepSpeed: ZeRO 1-3 with its CPU Adam) change the "
     "update's precision; dscpp keeps fp32 master weights",
     "remove it or set false"},
    {"bf16.check_grad_overflow", R, "[true]",
     "false applies updates without looking for inf and NaN; dscpp always looks, and stops with "
     "an error naming the first parameter they came from (DeepSpeed 0.19.8 skips the step)",
     "remove it (true)"},
    // ----- zero_optimization
    {"zero_optimization.compute_grad_norm", N, "[true]",
     "false skips the gradient norm where nothing clips (DeepSpeed: stages 1-2, "
     "gradient_clipping 0); dscpp computes it anyway for its step line",
     ""},
    {"zero_optimization.parameter_alignment", N, "[false]",
     "it pads stage 1-2's flat buffers so every parameter starts 16-byte aligned; dscpp's "
     "buffers are laid out by its own rule (NOTE [flat partition] in src/zero/stage1_2.cpp)",
     ""},
    {"zero_optimization.enable_sanity_checks", N, "[false]",
     "it turns on stage 3's internal debug assertions; dscpp's are always on", ""},
    {"zero_optimization.save_muon_momentum_buffer_in_memory", N, "[false, true]",
     "it keeps the Muon optimizer's momentum in memory under NVMe offload; dscpp's Muon always "
     "keeps it in memory (Muon with offload to nvme is refused)",
     ""},
    {"zero_optimization.use_multi_rank_bucket_allreduce", N, "[true]",
     "it merges ranks' reduce buckets into one all-reduce (stages 1-2); dscpp's reduce is its "
     "own and the result the same",
     ""},
    {"zero_optimization.load_from_fp32_weights", R, "[true]",
     "false rebuilds the fp32 master weights from the 16-bit weights of a checkpoint (losing "
     "precision); dscpp always loads the saved fp32 weights",
     "remove it or set true"},
    {"zero_optimization.elastic_checkpoint", N, "[false]",
     "it selects DeepSpeed's legacy world-size-agnostic stage 1-2 checkpoint layout; every dscpp "
     "checkpoint loads at any world size and stage",
     ""},
    {"zero_optimization.legacy_stage1", R, "[false]",
     "DeepSpeed refuses it too (legacy ZeRO-1 was removed after 0.5.8)", "remove it"},
    {"zero_optimization.zenflow", R, "[null]",
     "ZenFlow updates only the important gradient columns each step and the rest later, on the "
     "CPU; dscpp updates every parameter each step",
     "remove it"},
    {"zero_optimization.memory_efficient_linear", N, "[true]",
     "it swaps Python's linear autograd function under zero.Init; dscpp's stage 3 frees gathered "
     "weights through its own unit hooks",
     ""},
    {"zero_optimization.pipeline_loading_checkpoint", N, "[false]",
     "it loads a checkpoint the way a PipelineModule does; dscpp has no pipeline parallelism", ""},
    {"zero_optimization.override_module_apply", N, "[true]",
     "it wraps Python's nn.Module.apply to gather parameters under zero.Init; libtorch's "
     "Module::apply is not wrapped (zero::GatheredParameters gathers explicitly)",
     ""},
    {"zero_optimization.stage3_model_persistence_threshold", R, "[9223372036854775807]",
     kPersistenceCap, "remove it"},
    {"zero_optimization.model_persistence_threshold", R, "[9223372036854775807]", kPersistenceCap,
     "remove it"},
    {"zero_optimization.stage3_module_granularity_threshold", N, "[0]", kModuleGranularity, ""},
    {"zero_optimization.module_granularity_threshold", N, "[0]", kModuleGranularity, ""},
    {"zero_optimization.stage3_use_all_reduce_for_fetch_params", N, "[false]", kFetchByAllReduce,
     ""},
    {"zero_optimization.use_all_reduce_for_fetch_params", N, "[false]", kFetchByAllReduce, ""},
    {"zero_optimization.log_trace_cache_warnings", O, "[false]",
     "it logs when stage 3's trace of module order is invalidated; dscpp's schedule is declared, "
     "not traced",
     ""},
    {"zero_optimization.mics_shard_size", R, "", kRemoved, "remove it"},
    {"zero_optimization.mics_hierarchical_params_gather", R, "", kRemoved, "remove it"},
    {"zero_optimization.zeropp_loco_param", R, "", kRemoved,
     "remove it (zero_quantized_gradients then runs without LoCo's error feedback)"},
    {"zero_optimization.offload_optimizer.super_offload", R, "[false]",
     "SuperOffload (for Grace-Hopper superchips) overlaps the CPU optimizer with the GPU "
     "differently; dscpp's offload has its own pipeline",
     "remove it or set false"},
    {"zero_optimization.offload_optimizer.cpuadam_cores_perc", N, "[0.8]",
     "the share of cores SuperOffload's CPU Adam uses; dscpp's CPU optimizer uses libtorch's "
     "intra-op threads (OMP_NUM_THREADS)",
     ""},
    // ----- activation_checkpointing: DeepSpeed's deepspeed.checkpointing module, which a model
    // calls itself; dscpp's checkpointed activations are zero::checkpoint's (a unit recomputed
    // in backward), kept whole where the model runs
    {"activation_checkpointing.partition_activations", N, "[false]",
     "it splits each checkpointed activation across the model-parallel ranks; without model "
     "parallelism (dscpp has none) DeepSpeed's part is the whole tensor, as dscpp keeps it",
     ""},
    {"activation_checkpointing.contiguous_memory_optimization", R, "[false]",
     "it copies checkpointed activations into one preallocated buffer; dscpp does not",
     "remove it or set false"},
    {"activation_checkpointing.number_checkpoints", R, "[null]",
     "it sizes contiguous_memory_optimization's buffer", "remove it"},
    {"activation_checkpointing.synchronize_checkpoint_boundary", N, "[false]",
     "it synchronizes the device at each checkpoint boundary (a debugging aid); dscpp does not",
     ""},
    {"activation_checkpointing.profile", O, "[false]",
     "it times the checkpointed functions; dscpp does not time them (wall_clock_breakdown "
     "times the step's phases)",
     ""},
    // ----- checkpoint (tag_validation and writer are honoured)
    {"checkpoint.load_universal", R, "[false]",
     "it loads DeepSpeed's universal checkpoints (ds_to_universal), which dscpp cannot read; "
     "dscpp's own checkpoints load at any world size and ZeRO stage without it",
     "remove it"},
    {"checkpoint.use_node_local_storage", R, "[false]",
     "every rank writes its file into the one checkpoint folder, which must be visible to all "
     "ranks",
     "remove it and save to a shared file system"},
    {"checkpoint.parallel_write.pipeline_stage", R, "[false]",
     "dscpp has no pipeline parallelism (every rank already writes its own slice in parallel)",
     "remove it"},
    // ----- monitors that log through a Python client and a service
    {"wandb", R, "{\"enabled\": false}",
     "Weights & Biases logs through its Python client and service, which a C++ program does "
     "not have",
     "enable tensorboard or csv_monitor (same tags as DeepSpeed's), and upload the event files "
     "with `wandb sync DIR`, which reads TensorBoard logs"},
    {"comet", R, "{\"enabled\": false}",
     "Comet logs through its Python client and service, which a C++ program does not have",
     "enable tensorboard or csv_monitor (same tags as DeepSpeed's) and import those files into "
     "Comet"},
    // ----- the other sections
    {"flops_profiler.recompute_fwd_factor", O, "[0.0]",
     "it adds recomputed forwards to the profiler's count; dscpp's profiler counts what runs", ""},
    {"checkpoint.checkpoint_serialization", N, "[true]",
     "false writes torch.save's legacy format; dscpp writes safetensors", ""},
};

}  // namespace

const std::vector<KeyVerdict>& key_verdicts() { return kKeyVerdicts; }

const KeyVerdict* find_key_verdict(std::string_view path) {
  for (const KeyVerdict& v : kKeyVerdicts)
    if (v.path == path) return &v;
  return nullptr;
}

const char* class_name(KeyClass cls) {
  switch (cls) {
    case KeyClass::honoured:
      return "honoured";
    case KeyClass::refused:
      return "refused unless inert";
    case KeyClass::observes:
      return "observes: warning unless inert";
    case KeyClass::no_effect:
      return "no effect: warning unless inert";
    case KeyClass::unused:
      return "unused (DeepSpeed reads it, nothing uses it)";
  }
  return "?";
}

}  // namespace dscpp::config
