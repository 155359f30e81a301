// The engine's checkpoints (docs/checkpoint.md): save_checkpoint() and load_checkpoint(), each
// reading top to bottom in the order its events happen. The folder steps are
// src/checkpoint/publish.h, the proof that a checkpoint is whole src/checkpoint/verify.h, the
// resharding arithmetic reads_for() in src/checkpoint/manifest.h; what this rank's part holds
// comes from its strategy (NOTE [checkpoint groups] in src/zero/strategy.h).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <fmt/format.h>
#include <time.h>

#include <algorithm>
#include <exception>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <unordered_set>

#include "checkpoint/manifest.h"
#include "checkpoint/publish.h"
#include "checkpoint/rank_files.h"
#include "checkpoint/verify.h"
#include "dscpp/error.h"
#include "dscpp/file_system.h"
#include "dscpp/safetensors.h"
#include "engine/engine_impl.h"
#include "util/log.h"

namespace dscpp::engine {
namespace {

using Clock = std::chrono::steady_clock;
using NamedShapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;
using precision::kValues;

constexpr const char* kRngCpu = "rng/cpu";
constexpr const char* kRngCuda = "rng/cuda";

std::string broadcast_string(comm::Communicator& c, const std::string& s, const at::Device& dev) {
  at::Tensor len = rank_values(1, dev);
  len.fill_(static_cast<double>(s.size()));
  c.broadcast(len, 0)->wait();
  const auto n = static_cast<int64_t>(len.item<double>());
  at::Tensor chars = rank_values(n, dev);
  if (c.rank() == 0) {
    std::vector<double> v(s.begin(), s.end());
    chars.copy_(at::tensor(v, at::kDouble));
  }
  if (n > 0) c.broadcast(chars, 0)->wait();
  at::Tensor host = chars.cpu();
  std::string out(static_cast<size_t>(n), '\0');
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<char>(host.data_ptr<double>()[i]);
  return out;
}

// The frozen parameters and the buffers, each once, by name: what every rank holds whole.
std::vector<std::pair<std::string, at::Tensor>> replicated_tensors(torch::nn::Module& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  std::unordered_set<const void*> seen;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    if (item.value().requires_grad() || !seen.insert(item.value().unsafeGetTensorImpl()).second)
      continue;
    out.emplace_back(item.key(), item.value());
  }
  for (const auto& item : model.named_buffers(/*recurse=*/true)) {
    if (!item.value().defined() || !seen.insert(item.value().unsafeGetTensorImpl()).second)
      continue;
    out.emplace_back(item.key(), item.value());
  }
  return out;
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// CPU time of the calling thread so far, seconds.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

const char* dtype_label(at::ScalarType t) {
  return t == at::kBFloat16 ? "bf16" : t == at::kHalf ? "fp16" : "fp32";
}

}  // namespace

void EngineImpl::check_checkpointable(const char* what) const {
  DSCPP_CHECK(window_micro_steps_ == 0 && no_sync_depth_ == 0, CheckpointError, what,
              "() in the middle of a gradient accumulation window (", window_micro_steps_, " of ",
              gradient_accumulation_steps(),
              " micro-steps taken): the gradients accumulated so far are not part of a "
              "checkpoint, so resuming from it could not continue this window exactly. HINT: "
              "call it after the step() that completes the window (is_gradient_accumulation_"
              "boundary() was true before it)");
  DSCPP_CHECK(!strategy_->gathered_scope_open(), CheckpointError, what,
              "() inside a zero::GatheredParameters scope: the gathered parameters may still be "
              "written back when it closes. HINT: close the scope first");
  DSCPP_CHECK(optimizer_ && !client_lr_scheduler_, CheckpointError, what,
              "() with a client optimizer or LR scheduler passed to initialize(): dscpp cannot "
              "shard and restore a torch::optim object's state yet. HINT: use the config's "
              "optimizer and scheduler sections");
}

std::string EngineImpl::agree_on_tag(const std::string& tag) {
  // Every rank saves under rank 0's tag, so the files always land in one folder;
  // tag_validation decides what a rank that asked for another one gets.
  const std::string& mode = config_.checkpoint.tag_validation;
  const std::string agreed = broadcast_string(*comm_, tag, strategy_->options().device());
  if (mode == "Ignore") return agreed;
  at::Tensor differs = rank_values(1, strategy_->options().device());
  differs.fill_(tag != agreed ? 1.0 : 0.0);
  comm_->all_reduce(differs)->wait();
  const auto n = static_cast<int>(differs.item<double>());
  if (n == 0) return agreed;
  DSCPP_CHECK(mode != "Fail", CheckpointError, n,
              " rank(s) asked save_checkpoint() for another tag than rank 0's '", agreed,
              "' (this rank: '", tag,
              "') and checkpoint.tag_validation is Fail. HINT: pass the same tag on every rank");
  if (comm_->rank() == 0) {
    DSCPP_LOG_WARN(
        "{} rank(s) asked save_checkpoint() for another tag than rank 0's '{}'; every rank "
        "saves under '{}' (checkpoint.tag_validation Warn; Fail makes this an error)",
        n, agreed, agreed);
  }
  return agreed;
}

std::vector<safetensors::StreamedTensor> EngineImpl::checkpoint_tensors(
    checkpoint::LiveSnapshot* live) {
  std::vector<safetensors::StreamedTensor> out;
  // What the next step changes in place (the values, the optimizer's states): read from its
  // memory as the file is written when the save is in the background, unless it had to be
  // copied anyway (another device, a piece of a part).
  auto held = [&](std::string name, const at::Tensor& t) {
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    if (live && c.is_alias_of(t)) {
      out.push_back(live->add(std::move(name), c));
    } else {
      out.push_back({std::move(name), std::move(c), 0, nullptr});
    }
  };
  // What anything may change (buffers in forward, a generator): copied now.
  auto copied = [&](std::string name, const at::Tensor& t) {
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    if (live && c.is_alias_of(t)) c = c.clone();
    out.push_back({std::move(name), std::move(c), 0, nullptr});
  };
  const std::vector<zero::Part> parts = strategy_->parts();
  const std::vector<std::string> states = optimizer_->state_names();
  const int rank = comm_->rank();
  for (const zero::CheckpointGroup& g : strategy_->checkpoint_groups()) {
    // This rank's slice [rank * S, (rank + 1) * S) of the group, from what the part holds
    // ([begin, begin + length)): the part itself at stages 1-3, a piece of it at stage 0.
    const int64_t S = g.layout.shard, lo = rank * S;
    auto slice = [&](const at::Tensor& held) {
      if (g.begin == lo && g.length == S) return held;
      at::Tensor s = at::zeros({S}, held.options());
      const int64_t a = std::max(lo, g.begin), b = std::min(lo + S, g.begin + g.length);
      if (a < b) s.narrow(0, a - lo, b - a).copy_(held.narrow(0, a - g.begin, b - a));
      return s;
    };
    // What lives in the swap file (offload: stages 1-3, where the part is exactly the slice) is
    // streamed from it into the file, a piece at a time.
    auto swapped = [&](const std::string& what) {
      DSCPP_CHECK(g.begin == lo && g.length == S, Error,
                  "internal: an offloaded part is not this rank's slice");
      DSCPP_CHECK(!live, Error, "internal: a background save of a swap file");
      out.push_back({checkpoint::slice_tensor_name(g.name, what), at::Tensor(), S,
                     [this, what, base = g.part_offset](int64_t off, const at::Tensor& dst) {
                       store_->read(what, base + off, dst);
                     }});
    };
    if (store_->on_disk(kValues)) {
      swapped(kValues);
    } else {
      held(checkpoint::slice_tensor_name(g.name, kValues),
           slice(store_->values(parts, g.part_offset, g.length)));
    }
    for (size_t i = 0; i < states.size(); ++i) {
      const std::string& name = states[i];
      if (store_->on_disk(name)) {
        swapped(name);
        continue;
      }
      // bf16 states live in the store (written as bf16 and read back as any dtype, as bf16
      // values are), the others in the optimizer.
      at::Tensor in_store = store_->state_view(name, g.part_offset, g.length);
      held(checkpoint::slice_tensor_name(g.name, name),
           slice(in_store.defined() ? in_store
                                    : optimizer_->state_values(i, g.part_offset, g.length)));
    }
  }
  {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    copied(kRngCpu, gen.get_state());
  }
  const at::Device device = strategy_->options().device();
  if (device.is_cuda()) {
    at::Generator gen = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    copied(kRngCuda, gen.get_state());
  }
  if (rank == 0) {
    for (auto& [name, t] : replicated_tensors(*model_))
      copied(checkpoint::replicated_tensor_name(name), t);
  }
  return out;
}

checkpoint::Manifest EngineImpl::describe_checkpoint(const std::string& tag,
                                                     const nlohmann::json& client_state) {
  checkpoint::Manifest m;
  m.tag = tag;
  m.world_size = comm_->world_size();
  m.stage = config_.zero_optimization.stage;
  m.dtype = dtype_label(dtype_);
  m.optimizer = optimizer_->name();
  for (const zero::CheckpointGroup& g : strategy_->checkpoint_groups()) {
    checkpoint::Group cg{g.name, g.layout.numel, g.layout.padded, {}};
    for (size_t i = 0; i < g.names.size(); ++i)
      cg.parameters.push_back({g.names[i], g.shapes[i], g.layout.segments[i].first});
    m.groups.push_back(std::move(cg));
  }
  m.states.push_back(kValues);
  for (const std::string& name : optimizer_->state_names()) m.states.push_back(name);
  for (auto& [name, t] : replicated_tensors(*model_))
    m.replicated.push_back({name, t.sizes().vec()});
  m.counters = {{"global_steps", global_steps_},
                {"micro_steps", micro_steps_},
                {"global_samples", global_samples_},
                {"skipped_steps", skipped_steps_}};
  m.lr_scheduler = {{"type", lr_schedule_->name()},
                    {"last_batch_iteration", lr_schedule_->last_batch_iteration()}};
  if (scaler_) {
    const auto st = scaler_->state();
    m.loss_scaler = {{"scale", st.scale},
                     {"iter", st.iter},
                     {"last_overflow_iter", st.last_overflow_iter},
                     {"hysteresis", st.hysteresis},
                     {"overflows", st.overflows}};
  }
  m.rng = {{"per_rank", strategy_->options().device().is_cuda()
                            ? std::vector<std::string>{kRngCpu, kRngCuda}
                            : std::vector<std::string>{kRngCpu}}};
  m.data = {{"global_samples", global_samples_}, {"train_batch_size", train_batch_size()}};
  m.client_state = client_state;
  m.config = {{"source", config_.source}, {"resolved", config_.describe()}};
  return m;
}

// NOTE [background save]: with checkpoint.writer.decoupled, save_checkpoint() does step 1 on a
// thread of its own and returns. That thread reads the values and optimizer states straight from
// the memory training uses (checkpoint/live_snapshot.h); before the next optimizer step changes
// them (release_live_state, or a stage 3 write-back), what it has not written yet is copied, so
// a write that ends within one step costs no copy at all. Steps 2-3 need every rank's file
// durable: at the end of each optimizer step one small all-reduce asks whether every rank's
// write ended, and when it has the checkpoint is published there, at the same step on every
// rank. Until then `latest` names the previous checkpoint, so a crash mid-write loses only this
// one. A second save, a load, wait_for_checkpoint() and the engine's destructor finish (wait for
// and publish) the save in flight first.
std::string EngineImpl::save_checkpoint(const std::string& dir, const std::string& tag_given,
                                        const nlohmann::json& client_state) {
  const auto t0 = Clock::now();
  check_checkpointable("save_checkpoint");
  DSCPP_CHECK(client_state.is_object(), CheckpointError,
              "save_checkpoint(): client_state must be a JSON object, got ",
              client_state.type_name());
  wait_for_checkpoint();  // one save at a time: the one in flight is published first
  const int rank = comm_->rank(), world = comm_->world_size();
  const std::string tag =
      agree_on_tag(tag_given.empty() ? fmt::format("global_step{}", global_steps_) : tag_given);
  const auto& writer = config_.checkpoint.writer;
  const bool background = writer.decoupled;
  PendingSave save;
  save.dir = dir;
  save.folder = dir + "/" + tag;
  save.started = t0;
  if (rank == 0) save.manifest = describe_checkpoint(tag, client_state);

  // 1. Every rank writes its slice of every state into its own file, durably (temporary name,
  // fsync, rename, directory fsync), all at once: before returning, or in the background.
  WrittenFile mine;
  on_every_rank("writing checkpoint '" + save.folder + "'", [&] {
    if (checkpoint::begin_save(dir, tag, file_system_).replaced && rank == 0) {
      DSCPP_LOG_WARN(
          "replacing checkpoint {}: complete, but not the one {}/latest names (a save "
          "whose update of latest was cut off, or an earlier run's)",
          save.folder, dir);
    }
    if (rank == 0) checkpoint::clear_other_world_sizes(save.folder, world, file_system_);
    if (background) save.live = std::make_unique<checkpoint::LiveSnapshot>();
    auto write = [path = save.folder + "/" + checkpoint::rank_file_name(rank, world),
                  tensors = checkpoint_tensors(save.live.get()), fs = file_system_,
                  piece = writer.given ? writer.io_buffer_size : int64_t{16} << 20] {
      const auto t = Clock::now();
      const double cpu = thread_cpu_seconds();
      WrittenFile f{safetensors::save_streamed(path, tensors, {}, fs, piece)};
      f.seconds = seconds_since(t);
      f.cpu_seconds = thread_cpu_seconds() - cpu;
      return f;
    };
    if (background) {
      save.write = std::async(std::launch::async, std::move(write));
    } else {
      mine = write();
    }
  });
  if (!background) return publish_checkpoint(save, mine);
  save.stall_s = seconds_since(t0);
  if (rank == 0) {
    DSCPP_LOG_INFO(
        "writing checkpoint {} in the background (optimizer step {}; {:.3f} s to start); "
        "{}/latest moves to it once every rank's file is durable",
        save.folder, global_steps_, save.stall_s, dir);
  }
  const std::string folder = save.folder;
  pending_save_ = std::move(save);
  return folder;
}

std::string EngineImpl::publish_checkpoint(PendingSave& save, const WrittenFile& mine) {
  const int rank = comm_->rank(), world = comm_->world_size();
  const auto t_publish = Clock::now();
  // 2. The ranks exchange their files' sizes and CRC-32Cs: every file is durable now.
  at::Tensor m = rank_values(2, strategy_->options().device());
  m[0] = static_cast<double>(mine.digest.bytes);
  m[1] = static_cast<double>(mine.digest.crc32c);
  at::Tensor all = rank_values(2 * world, strategy_->options().device());
  comm_->all_gather(all, m)->wait();
  all = all.cpu();

  // 3. Rank 0 writes the manifest, then points `latest` at the tag; a failure there leaves
  // `latest` on the previous checkpoint, and every rank reports it.
  uint64_t total_bytes = 0;
  for (int q = 0; q < world; ++q)
    total_bytes += static_cast<uint64_t>(all.data_ptr<double>()[2 * q]);
  on_every_rank("publishing checkpoint '" + save.folder + "'", [&] {
    if (rank != 0) return;
    for (int q = 0; q < world; ++q) {
      const auto bytes = static_cast<uint64_t>(all.data_ptr<double>()[2 * q]);
      const auto crc = static_cast<uint32_t>(all.data_ptr<double>()[2 * q + 1]);
      save.manifest.files.push_back({checkpoint::rank_file_name(q, world), q, bytes, crc});
    }
    checkpoint::publish(save.dir, save.manifest, file_system_);
  });
  const double s = seconds_since(save.started);
  const double mib = total_bytes / 1048576.0;
  const bool background = save.live != nullptr;
  if (background) save.stall_s += seconds_since(t_publish);
  if (background && config_.checkpoint.writer.show_statistics) {
    DSCPP_LOG_INFO(
        "checkpoint {}: this rank wrote {:.1f} MiB in {:.2f} s ({:.0f} MiB/s; the writing thread "
        "on a core {:.2f} s) in the background; training waited {:.3f} s for it, {:.1f} MiB "
        "copied before a step changed them",
        save.folder, mine.digest.bytes / 1048576.0, mine.seconds,
        mine.seconds > 0 ? mine.digest.bytes / 1048576.0 / mine.seconds : 0.0, mine.cpu_seconds,
        save.stall_s, save.copied_bytes / 1048576.0);
  }
  if (rank == 0 && background) {
    DSCPP_LOG_INFO(
        "published checkpoint {} at optimizer step {}: {} ranks, {:.1f} MiB written in the "
        "background ({:.2f} s on rank 0, {:.0f} MiB/s); {:.2f} s after the save began, training "
        "waited {:.3f} s on rank 0",
        save.folder, global_steps_, world, mib, mine.seconds,
        mine.seconds > 0 ? mine.digest.bytes / 1048576.0 / mine.seconds : 0.0, s, save.stall_s);
  } else if (rank == 0) {
    DSCPP_LOG_INFO(
        "saved checkpoint {} at optimizer step {}: {} ranks, {:.1f} MiB in {:.2f} s ({:.0f} MiB/s)",
        save.folder, global_steps_, world, mib, s, s > 0 ? mib / s : 0.0);
  }
  return save.folder;
}

void EngineImpl::release_live_state() {
  if (!pending_save_ || pending_save_->released) return;
  PendingSave& save = *pending_save_;
  save.released = true;
  if (save.write.wait_for(std::chrono::seconds(0)) == std::future_status::ready) return;
  const auto t = Clock::now();
  save.copied_bytes += save.live->copy_unwritten();
  save.stall_s += seconds_since(t);
}

void EngineImpl::publish_written_checkpoint() {
  if (!pending_save_) return;
  const auto t = Clock::now();
  at::Tensor writing = rank_values(1, strategy_->options().device());
  if (pending_save_->write.wait_for(std::chrono::seconds(0)) != std::future_status::ready)
    writing.fill_(1.0);
  comm_->all_reduce(writing)->wait();
  pending_save_->stall_s += seconds_since(t);
  if (writing.item<double>() == 0) finish_pending_save();
}

std::string EngineImpl::finish_pending_save() {
  PendingSave save = std::move(*pending_save_);
  pending_save_.reset();
  const auto t = Clock::now();
  WrittenFile mine;
  on_every_rank("writing checkpoint '" + save.folder + "'", [&] { mine = save.write.get(); });
  save.stall_s += seconds_since(t);
  return publish_checkpoint(save, mine);
}

std::string EngineImpl::wait_for_checkpoint() {
  return pending_save_ ? finish_pending_save() : std::string();
}

void EngineImpl::finish_pending_save_at_exit() noexcept {
  if (!pending_save_) return;
  const std::string folder = pending_save_->folder;
  try {
    if (std::uncaught_exceptions() > 0) {
      // Another rank may be gone: no collective. The file is completed; `latest` stays.
      pending_save_->write.wait();
      DSCPP_LOG_WARN(
          "checkpoint {} was being written in the background when the engine was destroyed by "
          "an error: its file is written but the checkpoint is not published, and latest still "
          "names the previous one",
          folder);
      pending_save_.reset();
      return;
    }
    finish_pending_save();
  } catch (const std::exception& e) {
    DSCPP_LOG_ERROR("checkpoint {} written in the background was not published: {}", folder,
                    e.what());
  }
  pending_save_.reset();
}

LoadResult EngineImpl::load_checkpoint(const std::string& dir, const std::string& tag_given,
                                       const LoadOptions& opts) {
  // Nothing of this engine's state changes until every rank has found the checkpoint, checked it
  // fits, and proven every file whole (1-2).
  const auto t0 = Clock::now();
  check_checkpointable("load_checkpoint");
  wait_for_checkpoint();  // a save in flight is published before the state changes
  const LoadSource src = find_checkpoint(dir, tag_given, opts);  // 1.
  check_whole(src);                                              // 2.
  const uint64_t bytes_read = read_rank_state(src, opts);        // 3.
  publish_loaded_values();                                       // 4.
  restore_counters(src.manifest, opts);                          // 5.
  abandon_window();                                              // the next window starts now
  const checkpoint::Manifest& m = src.manifest;
  const int world = comm_->world_size();
  if (comm_->rank() == 0) {
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    DSCPP_LOG_INFO(
        "loaded checkpoint {} (saved at {} rank(s), ZeRO stage {}, {}) at {} rank(s), stage {}: "
        "optimizer step {}; rank 0 read {:.1f} MiB in {:.2f} s{}",
        src.folder, m.world_size, m.stage, m.dtype, world, config_.zero_optimization.stage,
        global_steps_, bytes_read / 1048576.0, s,
        !opts.load_module_only && m.world_size != world
            ? "; random generators start afresh (other world size)"
            : "");
  }
  // The step counter moved: profile the window flops_profiler.profile_step names from here.
  profiler_.reset();
  start_profiler_if_due();
  return LoadResult{src.folder, m.client_state};
}

EngineImpl::LoadSource EngineImpl::find_checkpoint(const std::string& dir,
                                                   const std::string& tag_given,
                                                   const LoadOptions& opts) {
  // Find the checkpoint (rank 0 resolves the tag, so every rank loads the same one even if
  // `latest` moves or they were given different tags), read its manifest, and check that it
  // fits this model and optimizer, before a byte of state is read.
  std::string tag;
  on_every_rank("finding a checkpoint in '" + dir + "'", [&] {
    if (comm_->rank() == 0) tag = checkpoint::resolve_tag(dir, tag_given, file_system_);
  });
  tag = broadcast_string(*comm_, tag, strategy_->options().device());
  LoadSource src{dir, dir + "/" + tag, {}};
  on_every_rank("loading checkpoint '" + src.folder + "'", [&] {
    src.manifest = checkpoint::read_manifest(dir, tag, file_system_);
    check_checkpoint_fits(src, opts);
  });
  return src;
}

void EngineImpl::check_checkpoint_fits(const LoadSource& src, const LoadOptions& opts) {
  const std::string& folder = src.folder;
  const checkpoint::Manifest& m = src.manifest;
  const bool load_states = opts.load_optimizer_states && !opts.load_module_only;
  const std::vector<zero::CheckpointGroup> groups = strategy_->checkpoint_groups();
  const auto replicated = replicated_tensors(*model_);
  const std::string source = folder + "/manifest.json";
  NamedShapes wanted, held;
  for (const auto& g : groups)
    for (size_t i = 0; i < g.names.size(); ++i) wanted.emplace_back(g.names[i], g.shapes[i]);
  for (const auto& [name, t] : replicated) wanted.emplace_back(name, t.sizes().vec());
  for (const auto& g : m.groups)
    for (const auto& p : g.parameters) held.emplace_back(p.name, p.shape);
  for (const auto& r : m.replicated) held.emplace_back(r.name, r.shape);
  if (!opts.load_module_strict) {
    // Only the names both have must agree in shape.
    std::map<std::string, std::vector<int64_t>> held_shapes(held.begin(), held.end());
    NamedShapes common_wanted, common_held;
    for (const auto& [name, shape] : wanted) {
      auto it = held_shapes.find(name);
      if (it == held_shapes.end()) continue;
      common_wanted.emplace_back(name, shape);
      common_held.emplace_back(name, it->second);
    }
    wanted = std::move(common_wanted);
    held = std::move(common_held);
  }
  safetensors::check_matches(wanted, held, source);
  // A name that is trainable on one side and frozen or a buffer on the other is kept apart by
  // the layout (flat groups vs rank 0's module/ tensors): refused rather than left unloaded.
  std::set<std::string> trainable_now, trainable_saved;
  for (const auto& g : groups) trainable_now.insert(g.names.begin(), g.names.end());
  for (const auto& g : m.groups)
    for (const auto& p : g.parameters) trainable_saved.insert(p.name);
  std::string moved;
  for (const auto& [name, t] : replicated)
    if (trainable_saved.count(name))
      moved += "\n  '" + name + "': trainable when saved, frozen or a buffer now";
  for (const auto& r : m.replicated)
    if (trainable_now.count(r.name))
      moved += "\n  '" + r.name + "': frozen or a buffer when saved, trainable now";
  DSCPP_CHECK(moved.empty(), CheckpointError, "checkpoint '", folder,
              "' does not fit this model: parameters changed between trainable and frozen:", moved,
              "\nHINT: load it with the model as it was saved, then freeze or unfreeze; or "
              "consolidate it with dscpp zero-to-fp32 and load that with safetensors::load_into");
  if (load_states) {
    DSCPP_CHECK(m.optimizer == optimizer_->name(), CheckpointError, "checkpoint '", folder,
                "' holds the state of optimizer ", m.optimizer, ", this engine runs ",
                optimizer_->name(),
                ". HINT: pass LoadOptions::load_optimizer_states = false to start the "
                "optimizer's state afresh from the loaded weights");
    for (const std::string& name : optimizer_->state_names()) {
      DSCPP_CHECK(std::find(m.states.begin(), m.states.end(), name) != m.states.end(),
                  CheckpointError, "checkpoint '", folder, "' has no optimizer state '", name, "'");
    }
  }
  if (opts.load_lr_scheduler_states && !opts.load_module_only && !m.lr_scheduler.empty()) {
    const std::string saved = m.lr_scheduler.value("type", "");
    DSCPP_CHECK(saved == lr_schedule_->name(), CheckpointError, "checkpoint '", folder,
                "' holds the position of LR schedule ", saved, ", this engine runs ",
                lr_schedule_->name(),
                ". HINT: pass LoadOptions::load_lr_scheduler_states = false to start the "
                "schedule over");
  }
}

void EngineImpl::check_whole(const LoadSource& src) {
  const std::string& dir = src.dir;
  const std::string& folder = src.folder;
  const checkpoint::Manifest& m = src.manifest;
  const int rank = comm_->rank(), world = comm_->world_size();
  // Prove every file whole (size and CRC-32C against the manifest). The ranks share the
  // reading: rank r checks files r, r + world, ...; all then know every damaged file.
  // Each file's checkpoint::FileCheck::Problem, summed over ranks (one rank checks each file).
  at::Tensor damaged =
      rank_values(static_cast<int64_t>(m.files.size()), strategy_->options().device());
  std::map<size_t, std::string> details;
  on_every_rank("checking checkpoint '" + folder + "'", [&] {
    for (size_t i = rank; i < m.files.size(); i += world) {
      checkpoint::FileCheck c = checkpoint::check_file(dir, m, i, file_system_);
      details[i] = c.detail;
      damaged[static_cast<int64_t>(i)] = static_cast<double>(c.problem);
    }
  });
  comm_->all_reduce(damaged)->wait();
  damaged = damaged.cpu();
  std::string listed;
  for (size_t i = 0; i < m.files.size(); ++i) {
    const auto problem = static_cast<checkpoint::FileCheck::Problem>(
        static_cast<int>(damaged.data_ptr<double>()[i]));
    if (problem == checkpoint::FileCheck::Problem::none) continue;
    listed += "\n  " + folder + "/" + m.files[i].path + ": " +
              (details.count(i) ? details[i]
                                : std::string(checkpoint::FileCheck::describe(problem)) +
                                      " (rank " + std::to_string(i % world) + " has the details)");
  }
  DSCPP_CHECK(listed.empty(), CheckpointError, "checkpoint '", folder,
              "' is damaged; nothing was loaded:", listed);
}

uint64_t EngineImpl::read_rank_state(const LoadSource& src, const LoadOptions& opts) {
  const std::string& dir = src.dir;
  const std::string& folder = src.folder;
  const checkpoint::Manifest& m = src.manifest;
  const int rank = comm_->rank(), world = comm_->world_size();
  const bool module_only = opts.load_module_only;
  const bool load_states = opts.load_optimizer_states && !module_only;
  const std::vector<zero::CheckpointGroup> groups = strategy_->checkpoint_groups();
  const auto replicated = replicated_tensors(*model_);
  const std::vector<std::string> states = optimizer_->state_names();
  // Read what this rank now holds: for each parameter, the elements of it in this rank's
  // part, from whichever files the manifest says hold them (reads_for). Padding stays zero.
  uint64_t bytes_read = 0;
  on_every_rank("reading checkpoint '" + folder + "'", [&] {
    at::NoGradGuard no_grad;
    checkpoint::RankFiles reader(dir, m, file_system_);
    const std::vector<zero::Part> parts = strategy_->parts();
    for (const zero::CheckpointGroup& g : groups) {
      // Where each loaded tensor goes: a view of the group in memory, or, through a buffer of
      // the slice read, the swap file (offload) or an optimizer state held for part of the
      // elements (Muon's exp_avg_sq).
      using Write = std::function<void(int64_t part_offset, const at::Tensor& values)>;
      struct Target {
        std::string name;
        at::Tensor memory;  // [g.length]; undefined: written through `write`
        Write write;
      };
      auto target = [&](const std::string& name, auto memory) {
        if (!store_->on_disk(name)) return Target{name, memory(), nullptr};
        return Target{name, at::Tensor(), [this, name](int64_t off, const at::Tensor& v) {
                        store_->write(name, off, v);
                      }};
      };
      std::vector<Target> targets{
          target(kValues, [&] { return store_->values(parts, g.part_offset, g.length); })};
      if (load_states) {
        for (size_t s = 0; s < states.size(); ++s) {
          at::Tensor in_store = store_->state_view(states[s], g.part_offset, g.length);
          if (in_store.defined()) {
            targets.push_back({states[s], in_store, nullptr});
          } else if (store_->on_disk(states[s]) || optimizer_->state_values_are_views(s)) {
            targets.push_back(target(
                states[s], [&] { return optimizer_->state_values(s, g.part_offset, g.length); }));
          } else {
            targets.push_back(
                {states[s], at::Tensor(), [this, s](int64_t off, const at::Tensor& v) {
                   optimizer_->load_state_values(s, off, v);
                 }});
          }
        }
      }
      for (size_t i = 0; i < g.names.size(); ++i) {
        const auto [off, n] = g.layout.segments[i];
        const int64_t lo = std::max(off, g.begin), hi = std::min(off + n, g.begin + g.length);
        const auto [mg, mp] = m.find(g.names[i]);
        if (lo >= hi || mg < 0) continue;  // not held here, or absent (load_module_strict off)
        for (const checkpoint::SliceRead& r :
             checkpoint::reads_for(m, g.names[i], lo - off, hi - off)) {
          for (const Target& t : targets) {
            const std::string name = checkpoint::slice_tensor_name(m.groups[mg].name, t.name);
            const int64_t at_ = lo - g.begin + r.dst;
            if (t.memory.defined()) {
              reader[r.rank].read(name, r.position, t.memory.narrow(0, at_, r.numel));
            } else {
              at::Tensor buffer = at::empty({r.numel}, at::kFloat);
              reader[r.rank].read(name, r.position, buffer);
              t.write(g.part_offset + at_, buffer);
            }
          }
        }
      }
    }
    std::map<std::string, std::vector<int64_t>> saved_replicated;
    for (const auto& r : m.replicated) saved_replicated[r.name] = r.shape;
    for (auto& [name, t] : replicated) {
      if (!saved_replicated.count(name)) continue;
      at::Tensor values = at::empty({t.numel()}, t.options());
      reader[0].read(checkpoint::replicated_tensor_name(name), 0, values);
      t.detach().copy_(values.view(t.sizes()));
    }
    if (!module_only && m.world_size == world) {
      // Each rank continues its own random streams (at another world size they start afresh).
      for (const auto& [name, shape] : reader[rank].shapes()) {
        if (name != kRngCpu && !(name == kRngCuda && strategy_->options().device().is_cuda()))
          continue;
        at::Tensor st = at::empty(shape, at::kByte);
        reader[rank].read(name, 0, st);
        at::Generator gen =
            name == kRngCpu ? at::detail::getDefaultCPUGenerator()
                            : at::globalContext().defaultGenerator(strategy_->options().device());
        std::lock_guard<std::mutex> lock(gen.mutex());
        gen.set_state(st);
      }
    }
    bytes_read = reader.bytes_read();
  });
  return bytes_read;
}

void EngineImpl::publish_loaded_values() {
  // The training-dtype parameters from the loaded values, on every rank (stages 1-3: the
  // shards are all-gathered, as after an optimizer step).
  at::NoGradGuard no_grad;
  const std::vector<zero::Part> parts = strategy_->parts();
  on_every_rank("casting the loaded values into the parameters", [&] {
    try {
      store_->publish(parts);
      zero::finish_stores(parts);  // parameters on disk (offload_param)
    } catch (...) {
      try {
        zero::finish_stores(parts);  // nothing may still be writing from a buffer
      } catch (...) {
      }
      throw;
    }
  });
  strategy_->before_update();
  strategy_->publish_params();
}

void EngineImpl::restore_counters(const checkpoint::Manifest& m, const LoadOptions& opts) {
  // The counters, the schedule's position and the loss scale.
  if (!opts.load_module_only) {
    const auto& c = m.counters;
    global_steps_ = c.value("global_steps", int64_t{0});
    comm_->set_step(global_steps_);
    skipped_steps_ = c.value("skipped_steps", int64_t{0});
    global_samples_ = c.value("global_samples", global_steps_ * train_batch_size());
    const int64_t micro = c.value("micro_steps", int64_t{0});
    // A window starts at a multiple of this run's GAS (the saved one may differ).
    micro_steps_ = micro % gradient_accumulation_steps() == 0
                       ? micro
                       : global_steps_ * gradient_accumulation_steps();
    if (opts.load_lr_scheduler_states && !m.lr_scheduler.empty()) {
      const int64_t it = m.lr_scheduler.value("last_batch_iteration", int64_t{-1});
      lr_schedule_->set_last_batch_iteration(it);
      if (adam_lr_schedule_) adam_lr_schedule_->set_last_batch_iteration(it);
    }
    if (scaler_ && !m.loss_scaler.empty()) {
      precision::LossScaler::State st;
      st.scale = m.loss_scaler.value("scale", 0.0);
      st.iter = m.loss_scaler.value("iter", int64_t{0});
      st.last_overflow_iter = m.loss_scaler.value("last_overflow_iter", int64_t{-1});
      st.hysteresis = m.loss_scaler.value("hysteresis", 0);
      st.overflows = m.loss_scaler.value("overflows", int64_t{0});
      scaler_->load_state(st);
    }
  }
}

}  // namespace dscpp::engine
