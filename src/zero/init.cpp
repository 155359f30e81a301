// zero::Init and zero::built (include/dscpp/zero.h): a model built already sharded, and the
// registry of its units waiting for the engine (presharded.h).
#include <ATen/ATen.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <torch/nn/module.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "dscpp/comm.h"
#include "dscpp/config.h"
#include "dscpp/error.h"
#include "dscpp/zero.h"
#include "util/log.h"
#include "util/memory.h"
#include "zero/fetcher.h"
#include "zero/presharded.h"
#include "zero/unit_policy.h"

namespace dscpp::zero {

// NOTE [spilled shards] (presharded.h): an unlinked file that units' fp32 shards are appended
// to and read back from, plain pread/pwrite (each range is written once and read once; the
// written pages are dropped from the page cache so they do not stay in memory either).
class ShardSpill {
 public:
  explicit ShardSpill(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    DSCPP_CHECK(fd_ >= 0, IoError, "zero::Init cannot create its spill file '", path_,
                "' (offload_param.nvme_path): ", std::strerror(errno),
                ". HINT: point offload_param.nvme_path at a writable folder on every host");
    ::unlink(path_.c_str());  // a killed run leaves nothing behind
  }
  ~ShardSpill() { ::close(fd_); }
  ShardSpill(const ShardSpill&) = delete;
  ShardSpill& operator=(const ShardSpill&) = delete;

  // Appends fp32 `values` (contiguous, CPU); returns where they start.
  int64_t write(const at::Tensor& values) {
    const int64_t at = end_;
    transfer(/*write=*/true, values.data_ptr(), values.nbytes(), at);
    ::posix_fadvise(fd_, at, static_cast<off_t>(values.nbytes()), POSIX_FADV_DONTNEED);
    end_ += static_cast<int64_t>(values.nbytes());
    return at;
  }
  // Reads n fp32 values back from `at` and frees their blocks (each range is read once: the
  // spill shrinks as the engine's swap files grow).
  at::Tensor read(int64_t at, int64_t n) const {
    at::Tensor out = at::empty({n}, at::kFloat);
    const_cast<ShardSpill*>(this)->transfer(/*write=*/false, out.data_ptr(), out.nbytes(), at);
    // A file system without hole punching keeps the blocks until the file closes (said once).
    if (::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, at,
                    static_cast<off_t>(out.nbytes())) != 0 &&
        !punch_warned_) {
      punch_warned_ = true;
      DSCPP_LOG_WARN(
          "zero::Init's spill file '{}': its blocks cannot be freed as they are read back ({}), "
          "so until set-up ends the disk holds them beside the swap files",
          path_, std::strerror(errno));
    }
    return out;
  }

 private:
  void transfer(bool write, void* data, size_t bytes, int64_t at) {
    auto* p = static_cast<char*>(data);
    while (bytes > 0) {
      const ssize_t n = write ? ::pwrite(fd_, p, bytes, at) : ::pread(fd_, p, bytes, at);
      if (n < 0 && errno == EINTR) continue;
      DSCPP_CHECK(n > 0, IoError, "zero::Init's spill file '", path_,
                  "': ", write ? "writing " : "reading ", bytes, " bytes at ", at,
                  " failed: ", n < 0 ? std::strerror(errno) : "end of file");
      p += n;
      at += n;
      bytes -= static_cast<size_t>(n);
    }
  }
  std::string path_;
  int fd_ = -1;
  int64_t end_ = 0;
  mutable bool punch_warned_ = false;
};

struct Init::State {
  std::shared_ptr<comm::Communicator> comm;
  UnitPolicy units;
  int64_t persistence_threshold = 0;
  c10::Device device = c10::Device(c10::kCPU);
  std::shared_ptr<ShardSpill> spill;  // offload_param nvme
};

at::Tensor PreSharded::take_fp32() {
  if (fp32_shard.defined()) return fp32_shard;
  DSCPP_CHECK(spill, Error, "internal: unit '", path, "' has no fp32 shard left");
  at::Tensor out = spill->read(spill_offset, layout.shard);  // its blocks are freed
  spill.reset();
  return out;
}

namespace {

thread_local Init::State* current_scope = nullptr;
thread_local bool shapes_only = false;  // a ShapesOnly scope is open

struct Registry {
  std::mutex mu;
  std::unordered_map<const torch::nn::Module*, PreSharded> units;
  std::unordered_set<const void*> params;  // TensorImpls
  // zero::ShapesOnly's parameters: held weakly, so a tensor made later at a freed one's address
  // is not taken for one of them.
  std::unordered_map<const void*, c10::weak_intrusive_ptr<c10::TensorImpl>> shapes_only;
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

Init::Init(std::shared_ptr<comm::Communicator> comm, UnitPolicy units, const Config& config,
           c10::Device device)
    : state_(std::make_unique<State>()) {
  DSCPP_CHECK(comm, ConfigError, "zero::Init needs the job's communicator");
  DSCPP_CHECK(!current_scope && !shapes_only, Error,
              "zero::Init scopes do not nest, nor go inside a zero::ShapesOnly scope");
  units = with_leaf_modules(std::move(units), config.zero_optimization.leaf_module);
  DSCPP_CHECK(!units.empty(), ConfigError,
              "zero::Init without a unit policy would shard nothing. HINT: pass the policy "
              "InitOptions::zero_units will get (e.g. {\"h.*\"}), or name units in the config's "
              "zero_optimization.leaf_module");
  state_->comm = std::move(comm);
  state_->units = std::move(units);
  state_->persistence_threshold = config.zero_optimization.stage3_param_persistence_threshold;
  state_->device = device;
  const auto& op = config.zero_optimization.offload_param;
  if (config.zero_optimization.stage == 3 && op.device == "nvme" && op.nvme_path) {
    // NOTE [spilled shards]. Every rank learns whether any could not open its file (else the
    // others would wait for it in the first unit's broadcast).
    std::string error;
    try {
      state_->spill = std::make_shared<ShardSpill>(fmt::format(
          "{}/dscpp_init_rank{}_pid{}.swp", *op.nvme_path, state_->comm->rank(), ::getpid()));
    } catch (const std::exception& e) {
      error = e.what();
    }
    comm::Communicator& comm = *state_->comm;
    at::Tensor failed =
        at::zeros({comm.world_size()}, at::TensorOptions(device).dtype(at::kDouble));
    failed[comm.rank()] = error.empty() ? 0.0 : 1.0;
    comm.all_reduce(failed)->wait();
    failed = failed.cpu();
    std::string ranks;
    for (int q = 0; q < comm.world_size(); ++q) {
      if (failed.data_ptr<double>()[q] > 0) ranks += (ranks.empty() ? "" : ",") + std::to_string(q);
    }
    if (!error.empty()) throw IoError(error);
    DSCPP_CHECK(ranks.empty(), IoError, "zero::Init: rank(s) ", ranks,
                " could not create the spill file in offload_param.nvme_path '", *op.nvme_path,
                "' (their errors say why)");
  }
  current_scope = state_.get();
}

Init::~Init() {
  if (current_scope == state_.get()) current_scope = nullptr;
}

ShapesOnly::ShapesOnly() {
  DSCPP_CHECK(!current_scope && !shapes_only, Error,
              "zero::ShapesOnly does not nest, nor go inside a zero::Init scope");
  shapes_only = true;
}

ShapesOnly::~ShapesOnly() { shapes_only = false; }

void built(torch::nn::Module& module, const std::string& path) {
  if (shapes_only) {
    // Each parameter and buffer becomes one element broadcast to its shape: the shapes stay, the
    // values go (a move to the meta device would keep a built-in module's member tensors).
    Registry& r = registry();
    at::NoGradGuard no_grad;
    auto drop_values = [&](at::Tensor t, bool parameter) {
      if (!t.defined() || t.numel() <= 1) return;
      t.set_data(at::zeros({1}, t.options().requires_grad(false)).expand(t.sizes()));
      if (!parameter) return;
      std::lock_guard<std::mutex> g(r.mu);
      for (auto it = r.shapes_only.begin(); it != r.shapes_only.end();) {
        it = it->second.expired() ? r.shapes_only.erase(it) : std::next(it);
      }
      r.shapes_only.insert_or_assign(t.unsafeGetTensorImpl(),
                                     c10::weak_intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr()));
    };
    for (auto& p : module.parameters(/*recurse=*/true)) drop_values(p, true);
    for (auto& b : module.buffers(/*recurse=*/true)) drop_values(b, false);
    return_freed_memory();
    return;
  }
  Init::State* st = current_scope;
  if (!st) return;
  module.to(st->device);
  if (!matches(st->units, path, module.name())) return;
  comm::Communicator& comm = *st->comm;
  // The unit's trainable parameters that will be sharded (those at the persistence threshold or
  // above), each once, as the engine will choose them.
  std::vector<at::Tensor> params;
  std::unordered_set<const void*> seen;
  for (const auto& p : module.parameters(/*recurse=*/true)) {
    if (!p.requires_grad() || p.numel() < st->persistence_threshold) continue;
    if (!seen.insert(p.unsafeGetTensorImpl()).second || is_presharded(p)) continue;
    params.push_back(p);
  }
  if (params.empty()) return;
  // Rank 0's values are every rank's; then this rank keeps its fp32 shard and frees the rest.
  std::vector<comm::WorkHandle> works;
  for (auto& p : params) works.push_back(comm.broadcast(p.detach(), 0));
  for (auto& w : works) w->wait();
  PreSharded ps;
  ps.path = path;
  ps.layout = FlatLayout::of(params, comm.world_size());
  const int64_t begin = ps.layout.shard_offset(comm.rank()), len = ps.layout.shard;
  ps.fp32_shard = at::zeros({len}, params[0].options().dtype(at::kFloat).requires_grad(false));
  FetchUnit storage;
  storage.full = at::empty({ps.layout.padded}, ps.fp32_shard.options());
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor p = params[i];
    auto [off, n] = ps.layout.segments[i];
    const int64_t lo = std::max(off, begin), hi = std::min(off + n, begin + len);
    if (lo < hi) {
      ps.fp32_shard.narrow(0, lo - begin, hi - lo)
          .copy_(p.detach().reshape({-1}).narrow(0, lo - off, hi - lo));
    }
    p.set_data(storage.full.narrow(0, off, n).view(p.sizes()));
  }
  ParamFetcher::swap_out(storage);
  if (st->spill) {  // NOTE [spilled shards]
    try {
      ps.spill_offset = st->spill->write(ps.fp32_shard.to(at::kCPU).contiguous());
      ps.spill = st->spill;
      ps.fp32_shard = at::Tensor();
    } catch (const std::exception& e) {
      // Not collective: this rank keeps the shard in memory rather than fail alone (the others
      // would wait for it in the next unit's broadcast); said, and no further unit spilled.
      DSCPP_LOG_WARN("{}; unit '{}' and the units after it keep their fp32 shards in memory",
                     e.what(), path);
      st->spill.reset();
    }
  }
  return_freed_memory();  // the unit's full parameters (and its shard, when spilled)
  ps.params = std::move(params);
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  for (const auto& p : ps.params) r.params.insert(p.unsafeGetTensorImpl());
  r.units[&module] = std::move(ps);
}

std::optional<PreSharded> take_presharded(const torch::nn::Module& module) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  auto it = r.units.find(&module);
  if (it == r.units.end()) return std::nullopt;
  PreSharded ps = std::move(it->second);
  r.units.erase(it);
  for (const auto& p : ps.params) r.params.erase(p.unsafeGetTensorImpl());
  // A stale entry (a module that died and whose address was reused) holds other parameters.
  std::unordered_set<const void*> now;
  for (const auto& p : module.parameters(/*recurse=*/true)) now.insert(p.unsafeGetTensorImpl());
  for (const auto& p : ps.params) {
    if (!now.count(p.unsafeGetTensorImpl())) return std::nullopt;
  }
  return ps;
}

namespace {
// Bytes of fp32 shards the registry's units hold in memory (spilled: false) or in spill files.
int64_t presharded_bytes(bool spilled) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  int64_t bytes = 0;
  for (const auto& [module, ps] : r.units) {
    if (spilled && ps.spill) bytes += ps.layout.shard * static_cast<int64_t>(sizeof(float));
    if (!spilled && ps.fp32_shard.defined()) bytes += static_cast<int64_t>(ps.fp32_shard.nbytes());
  }
  return bytes;
}
}  // namespace

int64_t presharded_bytes_spilled() { return presharded_bytes(/*spilled=*/true); }
int64_t presharded_bytes_in_memory() { return presharded_bytes(/*spilled=*/false); }

bool is_shapes_only(const at::Tensor& param) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  auto it = r.shapes_only.find(param.unsafeGetTensorImpl());
  return it != r.shapes_only.end() && !it->second.expired();
}

bool is_presharded(const at::Tensor& param) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  return r.params.count(param.unsafeGetTensorImpl()) > 0;
}

}  // namespace dscpp::zero
