// Implements ShmGroup (see shm.h and NOTE [shared-memory collectives] there): setting up the
// segment over the store, the generation-counter barrier, and the pieces of each collective.
#include "comm/shm.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <csignal>
#include <climits>
#include <cstring>
#include <fstream>
#include <random>

#include "comm/ring.h"
#include "dscpp/error.h"
#include "util/shm_names.h"

namespace dscpp::comm {
namespace {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "the barrier's futex word must be a plain lock-free 32-bit atomic");

constexpr int64_t kAlign = 64;
constexpr uint64_t kMagic = 0x6473637070736d31ULL;  // "dscppsm1"

struct Header {
  uint64_t magic;
  int64_t world_size;
  int64_t slot_bytes;
};

// What a rank entered: compared across ranks at each collective's first barrier.
struct Stamp {
  int64_t seq;    // the communicator's sequence number
  int32_t kind;   // OpKind
  int32_t dtype;  // c10::ScalarType
  int32_t op;     // ReduceOp, -1 when there is none
  int32_t unused;
  int64_t numel;
  int64_t extra;  // broadcast: root; reduce_scatter, all_gather: a hash of the per-rank counts
};

// Per rank: the barrier generation on a cache line of its own (others poll it), who the rank
// is (to notice that it exited), and the stamps of its last two collectives (collective c uses
// stamp c % 2, for the same reason pieces alternate sets).
struct alignas(64) RankArea {
  std::atomic<uint32_t> generation;
  int32_t pid;
  uint64_t pid_namespace;
  alignas(64) Stamp stamp[2];
};

int64_t round_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }
int64_t flags_offset() { return round_up(sizeof(Header), kAlign); }
int64_t data_offset(int world) { return flags_offset() + static_cast<int64_t>(sizeof(RankArea)) * world; }
int64_t segment_size(int world, int64_t slot_bytes) {
  return data_offset(world) + 2 * world * slot_bytes;
}

int64_t counts_hash(const std::vector<int64_t>& counts) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a over the counts
  for (int64_t c : counts) h = (h ^ static_cast<uint64_t>(c)) * 1099511628211ULL;
  return static_cast<int64_t>(h);
}

uint64_t pid_namespace() {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

std::string errno_text(const char* what) { return fmt::format("{}: {}", what, std::strerror(errno)); }

std::string store_get(c10d::Store& store, const std::string& key) {
  auto v = store.get(key);
  return {v.begin(), v.end()};
}

void store_set(c10d::Store& store, const std::string& key, const std::string& value) {
  store.set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

bool reached(uint32_t value, uint32_t generation) {
  return static_cast<int32_t>(value - generation) >= 0;
}

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void futex_wait(std::atomic<uint32_t>* word, uint32_t value, std::chrono::nanoseconds limit) {
  timespec ts{static_cast<time_t>(limit.count() / 1000000000), static_cast<long>(limit.count() % 1000000000)};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, value, &ts, nullptr, 0);
}

// Maps `name` (rank 0 creates it, the others open it). Returns the mapping or an error text.
void* map_segment(const std::string& name, bool create, int64_t bytes, std::string* error) {
  int fd = create ? ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600)
                  : ::shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    *error = errno_text(create ? "shm_open (create)" : "shm_open");
    return nullptr;
  }
  if (create) {
    // Reserve the pages now: on a full tmpfs, ftruncate succeeds and the first touch of a
    // missing page is a SIGBUS; posix_fallocate reports ENOSPC instead.
    if (int rc = ::posix_fallocate(fd, 0, bytes); rc != 0) {
      errno = rc;
      *error = errno_text("posix_fallocate") + fmt::format(" ({} bytes)", bytes);
      ::close(fd);
      ::shm_unlink(name.c_str());
      return nullptr;
    }
  } else {
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_size != bytes) {
      *error = fmt::format("segment {} has {} bytes, expected {}", name, st.st_size, bytes);
      ::close(fd);
      return nullptr;
    }
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) {
    *error = errno_text("mmap");
    if (create) ::shm_unlink(name.c_str());
    return nullptr;
  }
  return base;
}

}  // namespace

// Containers with separate /dev/shm but one kernel are caught when the segment does not open.
std::string host_identity() {
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  return std::string(host) + " " + boot;
}

std::unique_ptr<ShmGroup> ShmGroup::create(c10d::Store& store, const std::string& prefix, int rank,
                                           int world_size, bool off, const std::string& host,
                                           int64_t slot_bytes,
                                           std::chrono::milliseconds setup_timeout,
                                           std::chrono::milliseconds timeout, Setup* setup) {
  DSCPP_CHECK(world_size >= 2, CommError, "a shared-memory group needs at least 2 ranks");
  slot_bytes = round_up(std::max(slot_bytes, kAlign * world_size), kAlign);
  const int64_t bytes = segment_size(world_size, slot_bytes);
  const std::string key = prefix + "/shm/";
  auto wait_all = [&](const std::string& what) {
    std::vector<std::string> keys;
    for (int r = 0; r < world_size; ++r) keys.push_back(key + what + std::to_string(r));
    try {
      store.wait(keys, setup_timeout);
    } catch (const std::exception& e) {
      std::string missing;
      for (auto& k : keys) {
        if (!store.check({k})) missing += (missing.empty() ? "" : ",") + k.substr(k.rfind('/') + 1);
      }
      DSCPP_FAIL(CommError, "setting up shared-memory collectives: ranks ", missing,
                 " did not answer within ", setup_timeout.count() / 1000.0, " s (",
                 std::string(e.what()).substr(0, std::string(e.what()).find('\n')),
                 "). HINT: a rank failed during start-up (look at its output); "
                 "DSCPP_COMM_SHM=off skips this step");
    }
    std::vector<std::string> values;
    for (auto& k : keys) values.push_back(store_get(store, k));
    return values;
  };

  // 1. Every rank says whether it wants shared memory and where it runs; all decide alike.
  store_set(store, key + "host/" + std::to_string(rank), (off ? "off " : "on ") + host);
  auto hosts = wait_all("host/");
  setup->hosts.clear();
  for (auto& h : hosts) setup->hosts.push_back(h.substr(h.find(' ') + 1));
  for (int r = 0; r < world_size; ++r) {
    if (hosts[r].rfind("off ", 0) == 0) {
      setup->result = Setup::kOff;
      setup->why = fmt::format("DSCPP_COMM_SHM=off on rank {}", r);
      return nullptr;
    }
  }
  for (int r = 1; r < world_size; ++r) {
    if (hosts[r] != hosts[0]) {
      auto name_of = [](const std::string& h) { return h.substr(3, h.find(' ', 3) - 3); };
      setup->result = Setup::kSeveralHosts;
      setup->why =
          fmt::format("the ranks are on more than one host (rank 0 on '{}', rank {} on '{}')",
                      name_of(hosts[0]), r, name_of(hosts[r]));
      return nullptr;
    }
  }

  // 2. Rank 0 creates and publishes the name ("!" + reason when it could not); the rest map it.
  // Until step 3 has succeeded, leaving this scope (an error, or a store timeout) unmaps and,
  // on rank 0, unlinks: nothing stays in /dev/shm.
  struct Segment {
    void* base = nullptr;
    int64_t bytes = 0;
    std::string unlink;  // rank 0: the name to unlink
    ~Segment() {
      if (!unlink.empty()) ::shm_unlink(unlink.c_str());
      if (base) ::munmap(base, bytes);
    }
  } seg;
  seg.bytes = bytes;
  std::string error;
  if (rank == 0) {
    std::string name;
    try {
      static std::atomic<uint64_t> serial{0};
      // NOTE [shared-memory names] in util/shm_names.h.
      name = fmt::format("/{}{}-{}-{:x}", shm_segment_prefix(::getpgrp()), ::getpid(), serial++,
                         std::random_device{}());
      seg.base = map_segment(name, true, bytes, &error);
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (seg.base) {
      seg.unlink = name;
      auto* h = static_cast<Header*>(seg.base);
      h->magic = kMagic;
      h->world_size = world_size;
      h->slot_bytes = slot_bytes;
      for (int r = 0; r < world_size; ++r) {
        new (static_cast<char*>(seg.base) + flags_offset() + sizeof(RankArea) * r) RankArea{};
      }
    }
    store_set(store, key + "name", seg.base ? name : "!" + error);
  } else {
    std::string name;
    try {
      store.wait({key + "name"}, setup_timeout);
      name = store_get(store, key + "name");
    } catch (const std::exception&) {
      DSCPP_FAIL(CommError, "setting up shared-memory collectives: rank 0 did not publish the "
                 "segment within ", setup_timeout.count() / 1000.0, " s. HINT: look at rank 0's "
                 "output; DSCPP_COMM_SHM=off skips this step");
    }
    if (name.rfind('!', 0) == 0) {
      error = "rank 0 could not create it: " + name.substr(1);
    } else {
      seg.base = map_segment(name, false, bytes, &error);
      auto* h = static_cast<Header*>(seg.base);
      if (seg.base && (h->magic != kMagic || h->world_size != world_size || h->slot_bytes != slot_bytes)) {
        error = "segment " + name + " does not hold this job's header";
      }
    }
  }
  if (seg.base && error.empty()) {
    auto* area = reinterpret_cast<RankArea*>(static_cast<char*>(seg.base) + flags_offset() +
                                             sizeof(RankArea) * rank);
    area->pid = static_cast<int32_t>(::getpid());
    area->pid_namespace = pid_namespace();
  }

  // 3. Everyone reports; rank 0 unlinks once all have answered (mapped or not).
  store_set(store, key + "ok/" + std::to_string(rank), error.empty() ? "1" : "0" + error);
  auto answers = wait_all("ok/");
  if (!seg.unlink.empty()) ::shm_unlink(seg.unlink.c_str());
  seg.unlink.clear();
  for (int r = 0; r < world_size; ++r) {
    if (answers[r] != "1") {
      setup->result = Setup::kFailed;
      setup->why = fmt::format("rank {} could not map the shared-memory segment: {}", r,
                               answers[r].substr(1));
      return nullptr;
    }
  }
  setup->result = Setup::kReady;
  setup->why.clear();
  void* base = seg.base;
  seg.base = nullptr;
  return std::unique_ptr<ShmGroup>(new ShmGroup(base, bytes, rank, world_size, slot_bytes, timeout));
}

ShmGroup::ShmGroup(void* base, int64_t bytes, int rank, int world_size, int64_t slot_bytes,
                   std::chrono::milliseconds timeout)
    : base_(base),
      bytes_(bytes),
      rank_(rank),
      world_(world_size),
      slot_bytes_(slot_bytes),
      timeout_(timeout) {}

ShmGroup::~ShmGroup() { ::munmap(base_, bytes_); }

bool ShmGroup::supports(const at::Tensor& t) const {
  if (!t.device().is_cpu() || !t.is_contiguous()) return false;
  switch (t.scalar_type()) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16:
    case at::kLong: case at::kInt: case at::kShort: case at::kChar: case at::kByte:
      return true;
    default:
      return false;
  }
}

namespace {
RankArea& area_of(void* base, int r) {
  return *reinterpret_cast<RankArea*>(static_cast<char*>(base) + flags_offset() +
                                      sizeof(RankArea) * r);
}
}  // namespace

std::atomic<uint32_t>& ShmGroup::flag(int r) const { return area_of(base_, r).generation; }

void ShmGroup::begin(OpDesc desc, int64_t seq, int op, int64_t extra) {
  deadline_ = std::chrono::steady_clock::now() + timeout_;
  stamp_ ^= 1;
  stamp_checked_ = false;
  area_of(base_, rank_).stamp[stamp_] =
      Stamp{seq, static_cast<int32_t>(desc.kind), static_cast<int32_t>(desc.dtype), op, 0,
            desc.numel, extra};
}

void ShmGroup::check_stamps() {
  // Published by each rank's release store of its generation, seen through the acquire loads.
  auto describe = [](const Stamp& s) {
    OpDesc d{static_cast<OpKind>(s.kind), static_cast<c10::ScalarType>(s.dtype), s.numel,
             s.kind == static_cast<int32_t>(OpKind::broadcast) ? s.extra : -1};
    std::string text = fmt::format("#{} {}", s.seq, d.to_string());
    if (s.op >= 0) text += fmt::format(" op {}", reduce_op_name(static_cast<ReduceOp>(s.op)));
    if (s.kind == static_cast<int32_t>(OpKind::reduce_scatter) ||
        s.kind == static_cast<int32_t>(OpKind::all_gather)) {
      text += fmt::format(" counts {:016x}", static_cast<uint64_t>(s.extra));
    }
    return text;
  };
  const Stamp first = area_of(base_, 0).stamp[stamp_];
  std::string diffs;
  for (int r = 1; r < world_; ++r) {
    const Stamp s = area_of(base_, r).stamp[stamp_];
    if (s.seq != first.seq || s.kind != first.kind || s.dtype != first.dtype || s.op != first.op ||
        s.numel != first.numel || s.extra != first.extra) {
      diffs += fmt::format("  rank 0 entered {} but rank {} entered {}\n", describe(first), r,
                           describe(s));
    }
  }
  stamp_checked_ = true;
  DSCPP_CHECK(diffs.empty(), CollectiveMismatch, "collective mismatch in shared memory, seen on "
              "rank ", rank_, ":\n", diffs, "HINT: every rank must issue the same collectives, "
              "with the same dtype, size, reduce op and counts, in the same order (#N is the "
              "collective's sequence number: ranks at different numbers skipped or added one)");
}

void ShmGroup::end() {
  // A collective with no pieces still meets the others once, so sizes that differ (0 here,
  // more elsewhere) are caught instead of shifting every later barrier.
  if (!stamp_checked_) arrive_and_wait();
}

at::Tensor ShmGroup::slot(int r, int64_t n, c10::ScalarType dtype) const {
  char* p = static_cast<char*>(base_) + data_offset(world_) + (set_ * world_ + r) * slot_bytes_;
  return at::from_blob(p, {n}, at::TensorOptions().dtype(dtype));
}

void ShmGroup::arrive_and_wait() {
  uint32_t g = ++generation_;
  flag(rank_).store(g, std::memory_order_release);
  futex_wake_all(&flag(rank_));
  for (int r = 0; r < world_; ++r) {
    if (r != rank_) wait_for(r, g);
  }
  if (!stamp_checked_) check_stamps();
}

void ShmGroup::wait_for(int r, uint32_t generation) const {
  auto& f = flag(r);
  // Spin briefly: ranks usually arrive within microseconds of each other.
  auto spin_end = std::chrono::steady_clock::now() + std::chrono::microseconds(20);
  for (int i = 1;; ++i) {
    if (reached(f.load(std::memory_order_acquire), generation)) return;
    cpu_relax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() >= spin_end) break;
  }
  for (;;) {
    uint32_t v = f.load(std::memory_order_acquire);
    if (reached(v, generation)) return;
    DSCPP_CHECK(std::chrono::steady_clock::now() < deadline_, CommTimeout, "rank ", r,
                " did not reach the shared-memory barrier within ", timeout_.count() / 1000.0,
                " s (rank ", rank_, " was waiting for it)");
    check_alive(r);
    futex_wait(&f, v, std::chrono::milliseconds(10));
  }
}

void ShmGroup::check_alive(int r) const {
  // Only a process of this PID namespace can be looked up by its pid (ranks that are threads of
  // one process share it and are alive by definition).
  const RankArea& peer = area_of(base_, r);
  if (peer.pid == ::getpid() || peer.pid_namespace != area_of(base_, rank_).pid_namespace) return;
  if (::kill(peer.pid, 0) == 0 || errno != ESRCH) return;
  throw PeerExited(r, fmt::format("rank {} (pid {}) exited while rank {} waited for it in a "
                                  "shared-memory collective. HINT: its output says why",
                                  r, peer.pid, rank_));
}

void ShmGroup::reduce(const at::Tensor& out, const std::vector<at::Tensor>& ins, ReduceOp op) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const auto dtype = out.scalar_type();
  const bool extremum = op == ReduceOp::max || op == ReduceOp::min;
  // Sums of 16-bit floats accumulate in fp32 and round once; max/min are exact in any dtype.
  const bool widen = !extremum && (dtype == at::kHalf || dtype == at::kBFloat16);
  const auto acc_type = widen ? at::kFloat : dtype;
  if (!scratch_.defined() || scratch_.scalar_type() != acc_type || scratch_.numel() < n) {
    scratch_ = at::empty({std::max(n, slot_elements(dtype))},
                         at::TensorOptions().dtype(acc_type));
  }
  at::Tensor acc = scratch_.narrow(0, 0, n);
  if (extremum) {
    acc.copy_(ins[0]);
    for (size_t j = 1; j < ins.size(); ++j) {
      if (op == ReduceOp::max) at::maximum_out(acc, acc, ins[j]);
      else at::minimum_out(acc, acc, ins[j]);
    }
  } else {
    // NOTE [tree order]: a balanced binary tree over the ranks, neighbours first, as the
    // hierarchy's and the tree reduce-scatter's sums; the right halves go through `partial`, one
    // level of it per depth.
    const int depth = static_cast<int>(std::ceil(std::log2(static_cast<double>(ins.size()))));
    if (!partial_.defined() || partial_.scalar_type() != acc_type ||
        partial_.numel() < n * std::max(depth, 1)) {
      partial_ = at::empty({std::max(n, slot_elements(dtype)) * std::max(depth, 1)},
                           at::TensorOptions().dtype(acc_type));
    }
    sum_tree(acc, ins, 0, static_cast<int>(ins.size()), 0, widen);
    if (op == ReduceOp::avg) acc.div_(world_);
  }
  out.copy_(acc);
}

void ShmGroup::sum_tree(const at::Tensor& dst, const std::vector<at::Tensor>& ins, int lo, int hi,
                        int level, bool widen) {
  const int64_t n = dst.numel();
  if (hi - lo == 1) {
    dst.copy_(ins[lo]);
    return;
  }
  if (hi - lo == 2 && !widen) {  // the leaves' pairs in one pass
    at::Tensor out = dst;
    at::add_out(out, ins[lo], ins[lo + 1]);
    return;
  }
  const int mid = lo + (hi - lo + 1) / 2;
  sum_tree(dst, ins, lo, mid, level + 1, widen);
  if (hi - mid == 1) {
    dst.add_(ins[mid]);  // widened: fp32 += a 16-bit value, summed in fp32
    return;
  }
  at::Tensor right = partial_.narrow(0, level * n, n);
  sum_tree(right, ins, mid, hi, level + 1, widen);
  dst.add_(right);
}

void ShmGroup::all_reduce(const at::Tensor& tensor, ReduceOp op, int64_t seq) {
  begin({OpKind::all_reduce, tensor.scalar_type(), tensor.numel(), -1}, seq, static_cast<int>(op), 0);
  const auto dtype = tensor.scalar_type();
  const int64_t per = slot_elements(dtype);
  at::Tensor flat = tensor.view({-1});
  for_each_piece(flat.numel(), per, [&](int64_t off, int64_t len) {
    at::Tensor piece = flat.narrow(0, off, len);
    slot(rank_, len, dtype).copy_(piece);
    arrive_and_wait();
    auto counts = split_evenly(len, world_);
    auto at_ = offsets_of(counts);
    std::vector<at::Tensor> parts;
    for (int r = 0; r < world_; ++r) {
      parts.push_back(slot(r, len, dtype).narrow(0, at_[rank_], counts[rank_]));
    }
    reduce(parts[rank_], parts, op);  // the result goes back into this rank's own slot
    arrive_and_wait();
    for (int r = 0; r < world_; ++r) {
      if (counts[r] == 0) continue;
      piece.narrow(0, at_[r], counts[r]).copy_(slot(r, len, dtype).narrow(0, at_[r], counts[r]));
    }
  });
  end();
}

void ShmGroup::reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                              const std::vector<int64_t>& counts, ReduceOp op, int64_t seq) {
  begin({OpKind::reduce_scatter, input.scalar_type(), input.numel(), -1}, seq,
        static_cast<int>(op), counts_hash(counts));
  const auto dtype = input.scalar_type();
  // A slot holds one segment of q elements of every rank's chunk.
  const int64_t q = slot_elements(dtype) / world_;
  const int64_t longest = *std::max_element(counts.begin(), counts.end());
  auto off = offsets_of(counts);
  at::Tensor in = input.view({-1});
  at::Tensor out = output.view({-1});
  auto segment = [&](int r, int64_t p) { return std::clamp<int64_t>(counts[r] - p, 0, q); };
  for_each_piece(longest, q, [&](int64_t p, int64_t) {
    at::Tensor mine = slot(rank_, q * world_, dtype);
    for (int r = 0; r < world_; ++r) {
      if (int64_t len = segment(r, p); len > 0) {
        mine.narrow(0, r * q, len).copy_(in.narrow(0, off[r] + p, len));
      }
    }
    arrive_and_wait();
    // In place is safe: this rank's input segment p is already in its slot, and later pieces
    // read later segments.
    if (int64_t len = segment(rank_, p); len > 0) {
      std::vector<at::Tensor> parts;
      for (int r = 0; r < world_; ++r) {
        parts.push_back(slot(r, q * world_, dtype).narrow(0, rank_ * q, len));
      }
      reduce(out.narrow(0, p, len), parts, op);
    }
  });
  end();
}

void ShmGroup::all_gather(const std::vector<at::Tensor>& outputs, const at::Tensor& input,
                          int64_t seq) {
  const auto dtype = input.scalar_type();
  const int64_t per = slot_elements(dtype);
  int64_t longest = 0, total = 0;
  std::vector<int64_t> counts;
  for (auto& o : outputs) {
    longest = std::max(longest, o.numel());
    total += o.numel();
    counts.push_back(o.numel());
  }
  begin({OpKind::all_gather, dtype, total, -1}, seq, -1, counts_hash(counts));
  at::Tensor in = input.view({-1});
  if (in.numel() > 0 && outputs[rank_].data_ptr() != in.data_ptr()) {
    outputs[rank_].view({-1}).copy_(in);
  }
  for_each_piece(longest, per, [&](int64_t p, int64_t) {
    if (int64_t len = std::clamp<int64_t>(in.numel() - p, 0, per); len > 0) {
      slot(rank_, len, dtype).copy_(in.narrow(0, p, len));
    }
    arrive_and_wait();
    for (int r = 0; r < world_; ++r) {
      int64_t len = std::clamp<int64_t>(outputs[r].numel() - p, 0, per);
      if (r == rank_ || len == 0) continue;
      outputs[r].view({-1}).narrow(0, p, len).copy_(slot(r, len, dtype));
    }
  });
  end();
}

void ShmGroup::broadcast(const at::Tensor& tensor, int root, int64_t seq) {
  begin({OpKind::broadcast, tensor.scalar_type(), tensor.numel(), root}, seq, -1, root);
  const auto dtype = tensor.scalar_type();
  const int64_t per = slot_elements(dtype);
  at::Tensor flat = tensor.view({-1});
  for_each_piece(flat.numel(), per, [&](int64_t off, int64_t len) {
    if (rank_ == root) slot(root, len, dtype).copy_(flat.narrow(0, off, len));
    arrive_and_wait();
    if (rank_ != root) flat.narrow(0, off, len).copy_(slot(root, len, dtype));
  });
  end();
}

void ShmGroup::barrier(int64_t seq) {
  begin({OpKind::barrier, at::kFloat, 0, -1}, seq, -1, 0);
  end();
}

}  // namespace dscpp::comm
