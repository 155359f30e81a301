// The engine's set-up: EngineImpl's constructor runs these steps in order.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>

#include "dscpp/device_link.h"
#include "dscpp/error.h"
#include "engine/check_supported.h"
#include "engine/engine_impl.h"
#include "engine/estimate.h"
#include "offload/device_shards.h"
#include "offload/grad_swapper.h"
#include "offload/optimizer_swapper.h"
#include "offload/param_swapper.h"
#include "util/fault_inject.h"
#include "util/log.h"
#include "util/memory.h"
#include "zero/presharded.h"
#include "zero/reducer.h"
#include "zero/stage3.h"
#include "zero/unit_functions.h"
#include "zero/unit_policy.h"

namespace dscpp::engine {

EngineImpl::EngineImpl(std::shared_ptr<torch::nn::Module> model, Config config, InitOptions options)
    : model_(std::move(model)),
      config_(std::move(config)),
      comm_(options.comm),
      client_optimizer_(std::move(options.optimizer)),
      client_lr_scheduler_(std::move(options.lr_scheduler)),
      zero_units_(std::move(options.zero_units)),
      file_system_(options.file_system),
      async_io_(options.async_io),
      device_link_(options.device_link),
      detail_log_level_(options.detail_log_level),
      config_log_level_(options.config_log_level),
      activation_bytes_(options.activation_bytes) {
  DSCPP_CHECK(model_, ConfigError, "initialize() was given a null model");
  for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
    DSCPP_CHECK(!zero::is_shapes_only(item.value()), ConfigError, "parameter '", item.key(),
                "' has no values: the model was built for its shapes only (zero::ShapesOnly), "
                "which dscpp::check judges but nothing can train. HINT: build the model outside "
                "that scope to train it");
  }
  // The config's log_level first, as DeepSpeed's engine sets its logger's.
  if (config_.log_level)
    set_log_level(parse_log_level(*config_.log_level == "critical" ? "error" : *config_.log_level));
  fault::check_environment();
  // NOTE [allocator for training]: from the start, so set-up's own allocations already follow
  // it (what set-up frees in bulk is handed back explicitly, return_freed_memory).
  bool cpu_model = true;
  std::string model_device = "cpu";
  for (const auto& p : model_->parameters()) {
    if (!p.is_cpu() && cpu_model) model_device = p.device().str();
    cpu_model = cpu_model && p.is_cpu();
  }
  if (cpu_model) keep_freed_memory_for_reuse();
  SupportContext support{client_optimizer_ != nullptr, client_lr_scheduler_ != nullptr,
                         !cpu_model || device_link_ != nullptr, model_device,
                         device_link_ != nullptr};
  std::vector<std::string> ignored = check_supported(config_, support);
  engine::check_optimizer_sources(config_, client_optimizer_ != nullptr,
                                  client_lr_scheduler_ != nullptr);
  // DeepSpeed's engine configures its checkpointing module the same way, process-wide.
  zero::set_cpu_checkpointing(config_.activation_checkpointing.cpu_checkpointing);
  if (!comm_) comm_ = comm::init_from_env(comm::CommOptions::from_config(&config_));
  if (comm_->rank() == 0) {
    for (const auto& w : ignored) DSCPP_LOG_WARN("{}", w);
  }
  resolve_batch();
  check_same_model_on_every_rank();
  std::vector<std::string> model_warnings;
  on_every_rank(
      "the model check",
      [&] { model_warnings = check_model(config_, *model_, zero_units_, comm_->world_size()); },
      /*checkpoint_error=*/false);
  for (const auto& w : model_warnings) {
    if (comm_->rank() == 0) DSCPP_LOG_WARN("{}", w);
  }
  choose_precision();
  check_memory_fits();
  build_strategy();
  cast_the_rest();
  build_optimizer();
  open_monitors();
  if (config_.dump_state) dump_state();
  start_profiler_if_due();
  start_op_times();
  comm_->set_step(global_steps_);  // sync reports say at which step a collective was issued
  window_start_ = std::chrono::steady_clock::now();
}

EngineImpl::~EngineImpl() { finish_pending_save_at_exit(); }

void EngineImpl::log_detail(const std::string& text) const {
  if (detail_log_level_ == LogLevel::debug) {
    DSCPP_LOG_DEBUG("{}", text);
  } else {
    DSCPP_LOG_INFO("{}", text);
  }
}

void EngineImpl::resolve_batch() {
  ProcessEnv pe = detect_process_env();
  config_.resolve_batch(comm_->world_size(), comm_->world_size() == pe.world_size
                                                 ? pe.source
                                                 : "the communicator passed to initialize()");
  if (comm_->rank() == 0) {
    DSCPP_LOG_AT(config_log_level_, "resolved config (values in force):\n" + config_.describe());
  }
}

void EngineImpl::check_same_model_on_every_rank() {
  // Per rank: an FNV-1a hash (52 bits: exact in a double) of every parameter's name, shape,
  // dtype and trainability, its tensor count and its element count.
  auto fnv = [](uint64_t h, const std::string& s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
    return h;
  };
  constexpr uint64_t kFnvBasis = 14695981039346656037ULL;
  uint64_t hash = kFnvBasis;
  std::vector<double> each;  // per parameter, its own hash
  int64_t elements = 0;
  std::optional<at::Device> device;
  for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    const std::string key = fmt::format("{}|{}|{}|{};", item.key(), fmt::join(p.sizes(), ","),
                                        c10::toString(p.scalar_type()), p.requires_grad());
    hash = fnv(hash, key);
    each.push_back(static_cast<double>(fnv(kFnvBasis, key) >> 12));
    elements += p.numel();
    if (!device) device = p.device();
  }
  const auto tensors = static_cast<int64_t>(each.size());
  const int world = comm_->world_size();
  if (world == 1) return;
  const at::Device dev = device.value_or(at::kCPU);
  at::Tensor all = rank_values(3 * world, dev);
  all[3 * comm_->rank()] = static_cast<double>(hash >> 12);
  all[3 * comm_->rank() + 1] = static_cast<double>(tensors);
  all[3 * comm_->rank() + 2] = static_cast<double>(elements);
  comm_->all_reduce(all)->wait();
  all = all.cpu();
  const double* v = all.data_ptr<double>();
  std::string differ;
  int64_t longest = 0;
  for (int q = 0; q < world; ++q) {
    longest = std::max(longest, static_cast<int64_t>(v[3 * q + 1]));
    if (q > 0 && (v[3 * q] != v[0] || v[3 * q + 1] != v[1] || v[3 * q + 2] != v[2])) {
      differ += fmt::format("; rank {}: {} tensors, {} elements", q,
                            static_cast<int64_t>(v[3 * q + 1]), static_cast<int64_t>(v[3 * q + 2]));
    }
  }
  if (differ.empty()) return;
  // Every rank knows now that the models differ: two more collectives find the first parameter
  // (in named_parameters() order) where a rank's differs from rank 0's, and what each rank has
  // there.
  at::Tensor hashes = rank_values(world * longest, dev);
  hashes.narrow(0, comm_->rank() * longest, tensors).copy_(at::tensor(each, at::kDouble));
  comm_->all_reduce(hashes)->wait();
  hashes = hashes.cpu();
  const double* h = hashes.data_ptr<double>();
  int64_t first = longest;
  for (int q = 1; q < world; ++q) {
    const int64_t n = std::min(static_cast<int64_t>(v[3 * q + 1]), static_cast<int64_t>(v[1]));
    int64_t i = 0;
    while (i < n && h[q * longest + i] == h[i]) ++i;
    if (i < n || v[3 * q + 1] != v[1]) first = std::min(first, i);
  }
  constexpr int64_t kChars = 160;
  std::string mine = "nothing (it has no more parameters)";
  if (first < tensors) {
    const auto item = model_->named_parameters(/*recurse=*/true)[static_cast<size_t>(first)];
    const at::Tensor& p = item.value();
    mine = fmt::format("'{}' [{}] {}{}", item.key(), fmt::join(p.sizes(), ", "),
                       c10::toString(p.scalar_type()), p.requires_grad() ? "" : " frozen");
  }
  mine = mine.substr(0, kChars);
  at::Tensor names = rank_values(world * kChars, dev);
  std::vector<double> chars(mine.begin(), mine.end());
  if (!chars.empty()) {
    names.narrow(0, comm_->rank() * kChars, static_cast<int64_t>(chars.size()))
        .copy_(at::tensor(chars, at::kDouble));
  }
  comm_->all_reduce(names)->wait();
  names = names.cpu();
  auto name_of = [&](int q) {
    std::string out;
    for (int64_t i = 0; i < kChars; ++i) {
      const auto c = static_cast<char>(names.data_ptr<double>()[q * kChars + i]);
      if (c == '\0') break;
      out += c;
    }
    return out;
  };
  std::string at_first = "rank 0 has " + name_of(0);
  for (int q = 1; q < world; ++q) {
    const std::string theirs = name_of(q);
    if (theirs != name_of(0)) at_first += fmt::format(", rank {} has {}", q, theirs);
  }
  DSCPP_FAIL(ConfigError,
             "the model passed to initialize() differs across ranks (parameter names, shapes, "
             "dtypes or requires_grad): rank 0: ",
             static_cast<int64_t>(v[1]), " tensors, ", static_cast<int64_t>(v[2]), " elements",
             differ, ". The first parameter that differs is number ", first + 1,
             " in named_parameters() order: ", at_first,
             ". HINT: every rank must build the same model, in the same dtype, before "
             "initialize()");
}

void EngineImpl::open_monitors() {
  const auto& report = config_.flops_profiler.output_file;
  const bool report_file = config_.flops_profiler.enabled && report.has_value();
  if (!config_.tensorboard.enabled && !config_.csv_monitor.enabled && !report_file) return;
  on_every_rank(
      "opening the monitors (tensorboard, csv_monitor) or flops_profiler.output_file",
      [&] {
        monitors_ = monitor::from_config(config_, comm_->rank(), file_system_);
        if (report_file && comm_->rank() == 0) {
          // Opened now (not emptied: a resumed run past profile_step keeps the earlier report),
          // so a folder that cannot hold it stops every rank before training.
          std::ofstream f(*report, std::ios::app);
          DSCPP_CHECK(f.good(), IoError, "flops_profiler.output_file: cannot write '", *report,
                      "'. HINT: create its folder, or leave output_file out to print the report");
        }
      },
      /*checkpoint_error=*/false);
  for (const auto& m : monitors_) DSCPP_LOG_INFO("monitor: {}", m->describe());
}

void EngineImpl::choose_precision() {
  dtype_ = engine::training_dtype(config_);
  if (config_.torch_autocast.enabled) {  // NOTE [autocast]
    c10::DeviceType device = c10::DeviceType::CPU;
    for (const auto& p : model_->parameters()) device = p.device().type();
    autocast_ = precision::autocast_on(device, engine::autocast_dtype(config_, device));
  }
  if (config_.fp16.enabled) {
    scaler_ = std::make_unique<precision::LossScaler>(
        precision::LossScalerOptions::from_config(config_.fp16));
  }
}

void EngineImpl::check_memory_fits() {
  ModelFit fit;
  fit.world = comm_->world_size();
  fit.local = std::max(1, detect_process_env().local_world_size);
  fit.device_link = device_link_ != nullptr;
  fit.activation_bytes = activation_bytes_;
  on_every_rank(
      "the pre-flight memory check", [&] { model_fits(config_, *model_, fit); },
      /*checkpoint_error=*/false);
}

zero::StrategyOptions EngineImpl::strategy_options(const zero::FlatLayout& layout) const {
  const int stage = config_.zero_optimization.stage;
  const auto& zc = config_.zero_optimization;
  // NOTE [bucket cap]: buckets above a sixteenth of the model help nothing.
  zero::StrategyOptions so;
  so.stage = stage;
  so.reduce.dtype = dtype_;
  so.reduce.check_finite = scaler_ == nullptr;
  so.reduce.reduce_bucket_size = zero::capped_bucket_size(zc.reduce_bucket_size, layout.numel);
  so.reduce.prescale_gradients = config_.prescale_gradients;
  so.reduce.gradient_predivide_factor = config_.gradient_predivide_factor;
  so.reduce.average = config_.gradient_allreduce_op == "mean";
  so.reduce.overlap_comm = zc.overlap_comm;
  so.reduce.contiguous_gradients = zc.contiguous_gradients;
  so.reduce.reduce_scatter = zc.reduce_scatter;
  so.reduce.quantize_gradients = stage == 3 && zc.zero_quantized_gradients;
  // NOTE [wire dtype] in zero/reducer.h.
  // data_types.grad_accum_dtype: stage 1's full gradient buffer in fp32 (NOTE [accumulation
  // dtype] in zero/grad_buffer.h).
  const at::ScalarType grads = engine::gradient_dtype(config_, stage);
  if (grads != dtype_) so.reduce.accumulate_dtype = grads;
  const at::ScalarType wire = engine::communication_dtype(config_, stage);
  if (wire != grads) so.reduce.wire_dtype = wire;
  if (autocast_) {
    // NOTE [autocast]: at stages 1-3 the safe modules' parameters in the autocast dtype, the rest
    // as trained; at stage 0 the wire dtype above, as DeepSpeed's engine all-reduce. The names
    // are checked against the model at every stage.
    const at::ScalarType low = autocast_->cpu ? autocast_->cpu_dtype : autocast_->cuda_dtype;
    const auto& modules = config_.torch_autocast.lower_precision_safe_modules;
    const auto safe = precision::lower_precision_parameters(
        *model_, modules ? *modules : precision::default_lower_precision_modules());
    if (stage > 0) {
      so.reduce.wire_dtype.reset();
      for (const std::string& name : safe) so.reduce.wire_dtype_of[name] = low;
    }
  }
  so.allgather_bucket_size = zero::capped_bucket_size(zc.allgather_bucket_size, layout.numel);
  // Stage 0 in fp32: the statistics ride in the gradient all-reduce (NOTE [side channel] in
  // zero/all_reduce.h): [0] the window's loss sum, [1] its micro-steps, [2 + r] rank r's flags
  // (window_flags()). Otherwise one small all-reduce at the boundary carries them.
  so.side_channel =
      stage == 0 && dtype_ == at::kFloat && !so.reduce.wire_dtype && so.reduce.wire_dtype_of.empty()
          ? 2 + comm_->world_size()
          : 0;
  std::string capped;
  if (so.reduce.reduce_bucket_size < zc.reduce_bucket_size) {
    capped = fmt::format("reduce_bucket_size {} -> {}", zc.reduce_bucket_size,
                         so.reduce.reduce_bucket_size);
  }
  if (stage > 0 && so.allgather_bucket_size < zc.allgather_bucket_size) {
    capped += fmt::format("{}allgather_bucket_size {} -> {}", capped.empty() ? "" : ", ",
                          zc.allgather_bucket_size, so.allgather_bucket_size);
  }
  if (comm_->rank() == 0 && !capped.empty()) {
    DSCPP_LOG_INFO(
        "zero_optimization.{} elements: buckets are capped at 1/{} of the model's {} "
        "trainable elements, since a larger one only delays the first reduction (and "
        "at stage 2 enlarges the staging buffers); bucket sizes do not change what is "
        "trained (docs/zero.md)",
        capped, zero::kBucketsPerModel, layout.numel);
  }
  return so;
}

void EngineImpl::check_offload_devices() {
  // "cpu" offload of a model on the CPU: nothing moves. Of a model on a device: the optimizer
  // steps in host memory through a DeviceLink (NOTE [host step] in src/precision/part_store.cpp).
  const int stage = config_.zero_optimization.stage;
  const auto& zc = config_.zero_optimization;
  const auto& oo = zc.offload_optimizer;
  const auto& op = zc.offload_param;
  const bool optimizer_to_host = stage > 0 && oo.device == "cpu";
  const bool params_off_device = stage == 3 && op.device != "none";
  if (device_link_) {
    check_device_link(device_link_->device(), device_);
  } else if (((stage > 0 && oo.device != "none") || params_off_device) && !device_.is_cpu()) {
    // check_supported refused a device without a link of dscpp's.
    own_device_link_ = offload::make_device_link(device_);
    device_link_ = own_device_link_.get();
  }
  if (optimizer_to_host && comm_->rank() == 0) {
    if (device_link_) {
      DSCPP_LOG_INFO(
          "zero_optimization.offload_optimizer.device \"cpu\": the fp32 weights and optimizer "
          "state live in host memory ({}pinned) and the optimizer steps there, {} elements per "
          "sub-group; copies through {}",
          oo.pin_memory ? "" : "not ", zc.sub_group_size, device_link_->describe());
      if (!oo.pin_memory) {
        DSCPP_LOG_INFO(
            "zero_optimization.offload_optimizer.pin_memory false (DeepSpeed's default): the "
            "gradients come down to pageable memory, which CUDA copies only once the GPU's "
            "queued work is done, so they go down when the step begins; true page-locks them "
            "(and in fp32 the weights) and lets the copies run beside backward and the step");
      }
    } else {
      DSCPP_LOG_INFO(
          "zero_optimization.offload_optimizer.device \"cpu\": the model is on the CPU, so its "
          "optimizer state and fp32 weights already live in CPU memory; nothing moves");
    }
  }
  // offload_param (stage 3; check_supported refuses what cannot work): nvme puts the units'
  // shards in a swap file (NOTE [stage 3 parameter offload]); the optimizer's fp32 weights then
  // come from the master weights or from the optimizer's swap file, never from the parameters.
  // With a model on a device the shards wait in host memory (cpu) or behind the swap file
  // (nvme) and go up for their all-gathers (NOTE [shards off the device]).
  if (stage == 3 && op.device == "cpu" && !device_link_ && comm_->rank() == 0) {
    DSCPP_LOG_INFO(
        "zero_optimization.offload_param.device \"cpu\": the model is on the CPU, so its "
        "parameter shards already live in CPU memory; nothing moves");
  }
}

int EngineImpl::secondary_partition_size() const {
  // NOTE [secondary partition]; dscpp check makes the same decision from the hosts it is given.
  std::vector<std::string> warnings;
  const int size = engine::secondary_partition_size(config_, comm_->host_group_size(),
                                                    comm_->world_size(), comm_->backend_name(),
                                                    &warnings);
  if (comm_->rank() == 0) {
    for (const auto& w : warnings) DSCPP_LOG_WARN("{}", w);
  }
  return size;
}

void EngineImpl::build_strategy() {
  // check_model refused what the model cannot train with (no trainable parameters, zero::Init's
  // shards below stage 3, units matching nothing, a shard larger than offload_param's buffers).
  zero::NamedParams np = zero::trainable_parameters(*model_);
  const int stage = config_.zero_optimization.stage;
  const int world = comm_->world_size();
  const bool mixed = dtype_ != at::kFloat;
  const auto& zc = config_.zero_optimization;
  const zero::FlatLayout layout = zero::FlatLayout::of(np.params, world);

  const zero::StrategyOptions so = strategy_options(layout);

  device_ = np.params[0].device();
  check_offload_devices();
  const auto& oo = zc.offload_optimizer;
  const auto& op = zc.offload_param;
  // The optimizer steps in host memory for a model on a device (NOTE [host step]): the store in
  // host memory, or the swap file with its copies.
  const bool host_step = stage > 0 && oo.device != "none" && device_link_;
  // Rank 0's fp32 values are every rank's before anything is cast or sharded (mixed precision,
  // stage 3) or copied to host memory; otherwise the flat buffer is broadcast below. The store
  // takes this rank's part of them (the master weights, the swap file, host memory), parameter
  // by parameter as the model is cast into its flat buffers.
  const bool broadcast_first = mixed || stage == 3 || host_step;
  if (broadcast_first) {
    std::vector<comm::WorkHandle> works;
    for (auto& p : np.params) {
      // zero::Init broadcast the units it sharded already; their values are no longer here.
      if (!zero::is_presharded(p)) works.push_back(comm_->broadcast(p.detach(), 0));
    }
    for (auto& w : works) w->wait();
  }
  const bool nvme = stage > 0 && oo.device == "nvme";
  const bool param_nvme = stage == 3 && op.device == "nvme";
  // offload_param cpu of a model on a device: the shards in host memory (NOTE [shards off the
  // device]); the optimizer's fp32 weights then never come from the parameters, as on disk.
  const bool param_host = stage == 3 && op.device == "cpu" && device_link_;
  // Where the part's fp32 values live (part_store.h), chosen once.
  precision::PartStoreOptions po;
  po.dtype = dtype_;
  po.bf16_master = config_.bf16.bf16_master_weights_and_grads;
  // bf16.bf16_optimizer_states: the store holds the states in bf16, except Muon's, which Muon
  // holds in bf16 itself (its momentum is folded before the step, NOTE [Muon across ranks]).
  if (config_.bf16.bf16_optimizer_states && config_.optimizer.type != "Muon")
    po.bf16_states = optimizer_state_starts();
  po.device = device_;
  po.nvme = nvme;
  po.sub_group_size = zc.sub_group_size;
  po.params_on_disk = param_nvme || param_host;
  if (host_step) {
    po.link = device_link_;
    po.pin_memory = oo.pin_memory;
    po.buffer_count = static_cast<int>(std::max<int64_t>(2, oo.buffer_count));
  }
  po.make_swapper = [this](int64_t numel, bool with_values) {
    return build_swapper(numel, with_values);
  };
  store_ = precision::make_part_store(po);
  zero::Stage3Options s3;
  if (stage == 3) {
    s3.units = zero::with_leaf_modules(zero_units_, zc.leaf_module);
    s3.persistence_threshold = zc.stage3_param_persistence_threshold;
    s3.prefetch_bucket_size = zc.stage3_prefetch_bucket_size;
    s3.max_live_parameters = zc.stage3_max_live_parameters;
    s3.max_reuse_distance = zc.stage3_max_reuse_distance;
    s3.debug = comm::CommOptions::from_config(&config_).debug_sync;
    s3.quantize_weights = zc.zero_quantized_weights;
    s3.secondary_group = secondary_partition_size();
    if (nvme && param_nvme && !device_link_) {
      // NOTE [gradients on disk]: with everything else on disk, the gradient shard would be the
      // largest thing a rank holds.
      s3.make_grad_shard = [this](int64_t numel,
                                  at::ScalarType dtype) -> std::unique_ptr<zero::GradShard> {
        return build_grad_swapper(numel, dtype);
      };
    }
    if (param_nvme) {
      s3.max_in_cpu = op.max_in_cpu;
      s3.make_param_swapper = [this](const std::vector<int64_t>& numels,
                                     at::ScalarType dtype) -> std::unique_ptr<zero::ShardSwap> {
        auto on_disk = build_param_swapper(numels, dtype);
        if (!device_link_) return on_disk;
        return std::make_unique<offload::DeviceShards>(
            *device_link_, std::move(on_disk), numels, dtype,
            static_cast<int>(config_.zero_optimization.offload_param.buffer_count));
      };
    } else if (param_host) {
      s3.max_in_cpu = 0;  // every shard in host memory (max_in_cpu is about the disk)
      s3.make_param_swapper = [this](const std::vector<int64_t>& numels,
                                     at::ScalarType dtype) -> std::unique_ptr<zero::ShardSwap> {
        const auto& p = config_.zero_optimization.offload_param;
        auto shards = std::make_unique<offload::DeviceShards>(
            *device_link_, numels, dtype, static_cast<int>(p.buffer_count), p.pin_memory);
        if (comm_->rank() == 0) {
          DSCPP_LOG_INFO(
              "zero_optimization.offload_param.device \"cpu\": each rank's {} parameter shard "
              "elements ({:.1f} MiB, {}pinned) wait in host memory; up to {} go up to {} ahead "
              "of their all-gathers",
              shards->numel(), shards->host_bytes() / double(1 << 20), p.pin_memory ? "" : "not ",
              p.buffer_count, device_link_->describe());
        }
        return shards;
      };
    }
  }
  strategy_ = zero::make_strategy(*model_, std::move(np), layout, *comm_, so, s3,
                                  [this](int64_t part_numel) { return store_->open(part_numel); });
  // The end of set-up's writes (a swap file reserves what set-up did not write yet: a full disk
  // fails here, on every rank).
  on_every_rank(
      "finishing set-up's writes to the optimizer's swap file", [this] { store_->flush(); },
      /*checkpoint_error=*/false);
  strategy_->set_before_values_change([this] { release_live_state(); });
  if (store_->takes_final_pieces()) {  // a part's offsets are its gradient shard's positions
    strategy_->reducer().set_on_final_piece(
        [s = store_.get()](int64_t pos, const at::Tensor& g) { s->gradient_piece_final(pos, g); });
  }
  if (stage > 0 && stage < 3) {
    DSCPP_LOG_INFO("ZeRO stage {}: {} parameters padded to {}, this rank updates [{}, {})", stage,
                   layout.numel, layout.padded, strategy_->part_begin(),
                   strategy_->part_begin() + strategy_->part_numel());
  }
  broadcast_initial_state(/*trainable_broadcast_done=*/broadcast_first);
}

void EngineImpl::broadcast_initial_state(bool trainable_broadcast_done) {
  // Ranks start identical whatever their seeds: trainable parameters (mixed precision: done
  // before the cast), frozen parameters and buffers from rank 0 (in fp32: Gloo cannot move every
  // dtype).
  std::vector<comm::WorkHandle> works;
  if (!trainable_broadcast_done) works.push_back(comm_->broadcast(strategy_->flat_params(), 0));
  for (auto& p : model_->parameters(/*recurse=*/true)) {
    if (!p.requires_grad() && p.numel() > 0) works.push_back(comm_->broadcast(p.detach(), 0));
  }
  for (auto& b : model_->buffers(/*recurse=*/true)) {
    if (b.defined() && b.numel() > 0) works.push_back(comm_->broadcast(b, 0));
  }
  for (auto& w : works) w->wait();
}

void EngineImpl::cast_the_rest() {
  if (dtype_ == at::kFloat) return;
  // Everything else the forward touches trains in the same dtype (DeepSpeed casts the whole
  // module): frozen parameters and floating-point buffers.
  at::NoGradGuard no_grad;
  for (auto& p : model_->parameters(/*recurse=*/true)) {
    if (!p.requires_grad() && p.is_floating_point()) p.set_data(p.detach().to(dtype_));
  }
  for (auto& b : model_->buffers(/*recurse=*/true)) {
    if (b.defined() && b.is_floating_point()) b.set_data(b.detach().to(dtype_));
  }
}

namespace {
constexpr decltype(statfs::f_type) kTmpfsMagic = 0x01021994, kRamfsMagic = 0x858458f6;
}  // namespace

std::vector<std::pair<std::string, float>> EngineImpl::optimizer_state_starts() const {
  // A fresh optimizer of one element shows each state's name and starting value.
  std::vector<std::pair<std::string, float>> out;
  for (const auto& [name, t] : optim::make_optimizer(config_.optimizer, 1, at::kFloat)->state())
    out.emplace_back(name, t.item<float>());
  return out;
}

std::unique_ptr<offload::OptimizerSwapper> EngineImpl::build_swapper(int64_t part_numel,
                                                                     bool with_values) {
  const auto& oo = config_.zero_optimization.offload_optimizer;
  offload::SwapperOptions so;
  so.path = fmt::format("{}/dscpp_optimizer_rank{}_pid{}.swp", oo.nvme_path.value_or(""),
                        comm_->rank(), getpid());
  so.numel = part_numel;
  if (with_values) {
    so.names.push_back("fp32 weights");
    so.initial.push_back(0.0f);  // written by the tap as the model is flattened
  }
  for (const auto& [name, initial] : optimizer_state_starts()) {
    so.names.push_back(name);
    so.initial.push_back(initial);
  }
  so.sub_group_size = config_.zero_optimization.sub_group_size;
  so.buffer_count = static_cast<int>(std::min<int64_t>(oo.buffer_count, 3));
  so.pipeline_read = oo.pipeline_read;
  so.pipeline_write = oo.pipeline_write;
  // zero::Init's spill file (NOTE [spilled shards]) empties as set-up fills this file: its blocks
  // are reserved as they are written, all of them at set-up's end.
  so.reserve_in_setup = zero::presharded_bytes_spilled() > 0;
  std::unique_ptr<offload::OptimizerSwapper> swapper;
  on_every_rank(
      "preparing the optimizer's swap file in offload_optimizer.nvme_path",
      [&] {
        prepare_swap_dir("offload_optimizer", *oo.nvme_path);
        swapper = std::make_unique<offload::OptimizerSwapper>(*async_io_, so);
      },
      /*checkpoint_error=*/false);
  if (comm_->rank() == 0) {
    DSCPP_LOG_INFO(
        "offload_optimizer nvme: each rank's {} ({} elements) in a {:.2f} GiB swap file in {}, "
        "{} sub-group(s) of up to {} elements through {:.1f} MiB of buffers (read ahead: {}, "
        "write behind: {}); {}",
        fmt::join(so.names, ", "), part_numel, swapper->file_bytes() / double(1 << 30),
        *oo.nvme_path, swapper->sub_groups(), so.sub_group_size,
        swapper->buffer_bytes() / double(1 << 20), oo.pipeline_read, oo.pipeline_write,
        async_io_->describe());
  }
  return swapper;
}

std::unique_ptr<offload::GradSwapper> EngineImpl::build_grad_swapper(int64_t numel,
                                                                     at::ScalarType dtype) {
  const auto& oo = config_.zero_optimization.offload_optimizer;
  offload::GradSwapperOptions go;
  go.path = fmt::format("{}/dscpp_gradients_rank{}_pid{}.swp", oo.nvme_path.value_or(""),
                        comm_->rank(), getpid());
  go.numel = numel;
  go.dtype = dtype;
  go.read_elements = config_.zero_optimization.sub_group_size;
  std::unique_ptr<offload::GradSwapper> swapper;
  on_every_rank(
      "preparing the gradients' swap file in offload_optimizer.nvme_path",
      [&] {
        prepare_swap_dir("offload_optimizer", *oo.nvme_path);
        swapper = std::make_unique<offload::GradSwapper>(*async_io_, go);
      },
      /*checkpoint_error=*/false);
  if (comm_->rank() == 0) {
    DSCPP_LOG_INFO(
        "offload_optimizer and offload_param nvme: each rank's gradient shard ({} elements of {}) "
        "in a {:.2f} GiB swap file in {}, written block by block as backward's reductions fill "
        "it and read by the step sub-group by sub-group; {}",
        numel, c10::toString(dtype), swapper->file_bytes() / double(1 << 30), *oo.nvme_path,
        async_io_->describe());
  }
  return swapper;
}

void EngineImpl::prepare_swap_dir(const std::string& key, const std::string& dir) {
  std::error_code ec;
  DSCPP_CHECK(std::filesystem::exists(dir, ec), ConfigError, "zero_optimization.", key,
              ".nvme_path '", dir, "' does not exist on rank ", comm_->rank(),
              ". HINT: create it (on a fast local disk) on every host");
  DSCPP_CHECK(std::filesystem::is_directory(dir, ec), ConfigError, "zero_optimization.", key,
              ".nvme_path '", dir,
              "' is not a directory. HINT: point it at a folder on a fast local disk");
  struct statfs fs {};
  if (::statfs(dir.c_str(), &fs) == 0 && (fs.f_type == kTmpfsMagic || fs.f_type == kRamfsMagic)) {
    DSCPP_LOG_WARN(
        "zero_optimization.{}.nvme_path '{}' is on a memory file system (tmpfs): what is "
        "swapped there still takes memory, so offloading there saves none",
        key, dir);
  }
  if (!async_io_) {
    own_async_io_ = io::make_async_io(io::AioOptions::from_config(config_.aio));
    async_io_ = own_async_io_.get();
  }
}

std::unique_ptr<offload::ParamSwapper> EngineImpl::build_param_swapper(
    const std::vector<int64_t>& numels, at::ScalarType dtype) {
  const auto& op = config_.zero_optimization.offload_param;
  offload::ParamSwapperOptions po;
  po.path = fmt::format("{}/dscpp_params_rank{}_pid{}.swp", op.nvme_path.value_or(""),
                        comm_->rank(), getpid());
  po.numels = numels;
  po.dtype = dtype;
  po.buffer_count = static_cast<int>(std::min<int64_t>(op.buffer_count, 1 << 20));
  int64_t largest = 0, total = 0;
  for (int64_t n : numels) {
    largest = std::max(largest, n);
    total += n;
  }
  std::unique_ptr<offload::ParamSwapper> swapper;
  on_every_rank(
      "preparing the parameters' swap file in offload_param.nvme_path",
      [&] {
        prepare_swap_dir("offload_param", *op.nvme_path);
        swapper = std::make_unique<offload::ParamSwapper>(*async_io_, po);
      },
      /*checkpoint_error=*/false);
  if (comm_->rank() == 0) {
    DSCPP_LOG_INFO(
        "offload_param nvme: {} unit shard(s) per rank ({} elements of {}; the first "
        "max_in_cpu {} elements of shards stay in memory) in a {:.2f} GiB swap file in {}, read "
        "ahead of their all-gathers up to {} at a time through buffers of {:.1f} MiB; {}",
        numels.size(), total, c10::toString(dtype), op.max_in_cpu,
        swapper->file_bytes() / double(1 << 30), *op.nvme_path, po.buffer_count,
        io::align_up(largest * c10::elementSize(dtype)) / double(1 << 20), async_io_->describe());
  }
  return swapper;
}

void EngineImpl::build_optimizer() {
  if (!client_optimizer_) {
    // Over this rank's part: everything at stage 0, its shard at stages 1-3; none when the
    // state is swapped in from disk for each sub-group (StepContext::state); in host memory when
    // the store steps there (offload_optimizer cpu of a model on a device).
    at::TensorOptions state = strategy_->options().dtype(at::kFloat);
    if (store_->steps_on_host()) state = state.device(at::kCPU);
    std::vector<std::pair<int64_t, int64_t>> segments = strategy_->optimizer_segments();
    if (config_.optimizer.type == "Muon") {
      if (config_.bf16.bf16_optimizer_states) state = state.dtype(at::kBFloat16);
      muon_matrices_ = std::make_unique<zero::MuonMatrices>(strategy_->checkpoint_groups(),
                                                            strategy_->replicated(), *comm_);
      segments = muon_matrices_->local_ranges();
      if (comm_->rank() == 0) {
        DSCPP_LOG_INFO(
            "Muon: {} weight matrices take Muon's update (the other parameters Adam's), each "
            "orthogonalised on one rank ({} on rank 0)",
            muon_matrices_->num_matrices(), muon_matrices_->num_owned());
      }
    }
    optimizer_ = optim::make_optimizer(
        config_.optimizer, store_->holds_optimizer_states() ? 0 : strategy_->part_numel(), state,
        std::move(segments));
  }
  if (!client_lr_scheduler_ && optimizer_) {
    lr_schedule_ = make_lr_schedule(config_.scheduler, *optimizer_);
    if (const auto* muon = dynamic_cast<const optim::Muon*>(optimizer_.get()))
      adam_lr_schedule_ = make_lr_schedule(config_.scheduler, muon->adam_lr(), false);
  }
}

void EngineImpl::dump_state() const {
  // dump_state: the engine's state after initialisation, as DeepSpeed prints it (rank 0).
  if (comm_->rank() != 0) return;
  MemoryStats m = const_cast<EngineImpl*>(this)->memory_stats();
  DSCPP_LOG_INFO(
      "engine state: ZeRO stage {}, {} trainable elements, this rank updates {} of them; "
      "training dtype {}; optimizer {}; gradient buckets {}; model states {} bytes (params {}, "
      "grads {}, fp32 master {}, optimizer {}), staging {} bytes",
      config_.zero_optimization.stage, strategy_->numel(), strategy_->part_numel(),
      c10::toString(dtype_), optimizer_ ? optimizer_->name() : "client",
      strategy_->reducer().num_buckets(), m.model_states(), m.params, m.grads, m.master,
      m.optimizer_state, m.staging);
}

}  // namespace dscpp::engine
