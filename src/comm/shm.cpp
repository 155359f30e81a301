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
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <random>

#include "comm/ring.h"
#include "dscpp/error.h"

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
  int32_t kind;
  int32_t dtype;
  int64_t numel;
  int64_t root;
};

// One cache line per rank: its barrier generation and the stamps of its last two collectives
// (collective c uses stamp c % 2, for the same reason pieces alternate sets).
struct RankArea {
  std::atomic<uint32_t> generation;
  uint32_t unused;
  Stamp stamp[2];
};
static_assert(sizeof(RankArea) <= 64, "a rank's area must fit its cache line");

int64_t round_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }
int64_t flags_offset() { return round_up(sizeof(Header), kAlign); }
int64_t data_offset(int world) { return flags_offset() + kAlign * world; }
int64_t segment_size(int world, int64_t slot_bytes) {
  return data_offset(world) + 2 * world * slot_bytes;
}

// Host name and kernel boot id: ranks with the same pair share a kernel and can share memory
// (containers with separate /dev/shm are caught when the segment does not open).
std::string host_identity() {
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  return std::string(host) + " " + boot;
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

std::unique_ptr<ShmGroup> ShmGroup::create(c10d::Store& store, const std::string& prefix, int rank,
                                           int world_size, int64_t slot_bytes,
                                           std::chrono::milliseconds setup_timeout,
                                           std::chrono::milliseconds timeout, bool* one_host,
                                           std::string* why) {
  DSCPP_CHECK(world_size >= 2, CommError, "a shared-memory group needs at least 2 ranks");
  slot_bytes = round_up(std::max(slot_bytes, kAlign * world_size), kAlign);
  const std::string key = prefix + "/shm/";
  auto wait_all = [&](const std::string& what) {
    std::vector<std::string> keys;
    for (int r = 0; r < world_size; ++r) keys.push_back(key + what + std::to_string(r));
    store.wait(keys, setup_timeout);
    std::vector<std::string> values;
    for (auto& k : keys) values.push_back(store_get(store, k));
    return values;
  };

  // 1. One host? Every rank compares every identity with rank 0's, so all decide alike.
  store_set(store, key + "host/" + std::to_string(rank), host_identity());
  auto hosts = wait_all("host/");
  *one_host = false;
  for (int r = 1; r < world_size; ++r) {
    if (hosts[r] != hosts[0]) {
      *why = fmt::format("the ranks are on more than one host (rank 0 on '{}', rank {} on '{}')",
                         hosts[0].substr(0, hosts[0].find(' ')), r,
                         hosts[r].substr(0, hosts[r].find(' ')));
      return nullptr;
    }
  }
  *one_host = true;

  // 2. Rank 0 creates and publishes the name ("!" + reason when it could not); the rest map it.
  const int64_t bytes = segment_size(world_size, slot_bytes);
  std::string error;
  void* base = nullptr;
  std::string name;
  if (rank == 0) {
    static std::atomic<uint64_t> serial{0};
    name = fmt::format("/dscpp-{}-{}-{:x}", ::getpid(), serial++, std::random_device{}());
    base = map_segment(name, true, bytes, &error);
    if (base) {
      auto* h = static_cast<Header*>(base);
      h->magic = kMagic;
      h->world_size = world_size;
      h->slot_bytes = slot_bytes;
      for (int r = 0; r < world_size; ++r) {
        new (static_cast<char*>(base) + flags_offset() + kAlign * r) RankArea{};
      }
    }
    store_set(store, key + "name", base ? name : "!" + error);
  } else {
    store.wait({key + "name"}, setup_timeout);
    name = store_get(store, key + "name");
    if (name.rfind('!', 0) == 0) {
      error = "rank 0 could not create it: " + name.substr(1);
    } else {
      base = map_segment(name, false, bytes, &error);
      auto* h = static_cast<Header*>(base);
      if (base && (h->magic != kMagic || h->world_size != world_size || h->slot_bytes != slot_bytes)) {
        error = "segment " + name + " does not hold this job's header";
      }
    }
  }

  // 3. Everyone reports; rank 0 unlinks once all have answered (mapped or not).
  store_set(store, key + "ok/" + std::to_string(rank), error.empty() ? "1" : "0" + error);
  auto answers = wait_all("ok/");
  if (rank == 0 && base) ::shm_unlink(name.c_str());
  for (int r = 0; r < world_size; ++r) {
    if (answers[r] != "1") {
      *why = fmt::format("rank {} could not map the shared-memory segment: {}", r,
                         answers[r].substr(1));
      if (base && base != MAP_FAILED) ::munmap(base, bytes);
      return nullptr;
    }
  }
  return std::unique_ptr<ShmGroup>(
      new ShmGroup(base, bytes, rank, world_size, slot_bytes, timeout));
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

bool ShmGroup::supports(const at::Tensor& t) {
  if (!t.device().is_cpu() || !t.is_contiguous()) return false;
  switch (t.scalar_type()) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16:
    case at::kLong: case at::kInt: case at::kShort: case at::kChar: case at::kByte:
      return true;
    default:
      return false;
  }
}

std::atomic<uint32_t>& ShmGroup::flag(int r) const {
  return reinterpret_cast<RankArea*>(static_cast<char*>(base_) + flags_offset() + kAlign * r)
      ->generation;
}

void ShmGroup::begin(OpDesc desc) {
  deadline_ = std::chrono::steady_clock::now() + timeout_;
  stamp_ ^= 1;
  stamp_checked_ = false;
  auto* area = reinterpret_cast<RankArea*>(static_cast<char*>(base_) + flags_offset() + kAlign * rank_);
  area->stamp[stamp_] = Stamp{static_cast<int32_t>(desc.kind), static_cast<int32_t>(desc.dtype),
                              desc.numel, desc.peer};
}

void ShmGroup::check_stamps() {
  // Published by each rank's release store of its generation, seen through the acquire loads.
  auto stamp_of = [&](int r) {
    return reinterpret_cast<const RankArea*>(static_cast<char*>(base_) + flags_offset() +
                                             kAlign * r)->stamp[stamp_];
  };
  auto describe = [](const Stamp& s) {
    OpDesc d;
    d.kind = static_cast<OpKind>(s.kind);
    d.dtype = static_cast<c10::ScalarType>(s.dtype);
    d.numel = s.numel;
    d.peer = s.root;
    return d.to_string();
  };
  const Stamp first = stamp_of(0);
  std::string diffs;
  for (int r = 1; r < world_; ++r) {
    Stamp s = stamp_of(r);
    if (s.kind != first.kind || s.dtype != first.dtype || s.numel != first.numel || s.root != first.root) {
      diffs += fmt::format("  rank 0 entered {} but rank {} entered {}\n", describe(first), r, describe(s));
    }
  }
  stamp_checked_ = true;
  DSCPP_CHECK(diffs.empty(), CollectiveMismatch, "collective mismatch in shared memory, seen on "
              "rank ", rank_, ":\n", diffs, "HINT: every rank must issue the same collectives with "
              "the same dtype and size, in the same order");
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
    futex_wait(&f, v, std::chrono::milliseconds(10));
  }
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
    if (widen) {
      acc.copy_(ins[0]);
      for (size_t j = 1; j < ins.size(); ++j) acc.add_(ins[j]);
    } else {
      at::add_out(acc, ins[0], ins[1]);
      for (size_t j = 2; j < ins.size(); ++j) acc.add_(ins[j]);
    }
    if (op == ReduceOp::avg) acc.div_(world_);
  }
  out.copy_(acc);
}

void ShmGroup::all_reduce(const at::Tensor& tensor, ReduceOp op) {
  begin({OpKind::all_reduce, tensor.scalar_type(), tensor.numel(), -1});
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
                              const std::vector<int64_t>& counts, ReduceOp op) {
  begin({OpKind::reduce_scatter, input.scalar_type(), input.numel(), -1});
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

void ShmGroup::all_gather(const std::vector<at::Tensor>& outputs, const at::Tensor& input) {
  const auto dtype = input.scalar_type();
  const int64_t per = slot_elements(dtype);
  int64_t longest = 0, total = 0;
  for (auto& o : outputs) {
    longest = std::max(longest, o.numel());
    total += o.numel();
  }
  begin({OpKind::all_gather, dtype, total, -1});
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

void ShmGroup::broadcast(const at::Tensor& tensor, int root) {
  begin({OpKind::broadcast, tensor.scalar_type(), tensor.numel(), root});
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

void ShmGroup::barrier() {
  begin({OpKind::barrier, at::kFloat, 0, -1});
  end();
}

}  // namespace dscpp::comm
