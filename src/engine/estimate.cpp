// Implements the model-state estimates (estimate.h).
#include "engine/estimate.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>

#include "dscpp/async_io.h"
#include "dscpp/error.h"
#include "dscpp/optim.h"
#include "util/log.h"

namespace dscpp::engine {

std::string Estimate::describe() const {
  const bool o = offload_optimizer == "nvme", p = offload_param == "nvme";
  return fmt::format("stage {}{}", stage,
                     o && p ? ", optimizer and parameters on nvme"
                     : o    ? ", optimizer on nvme"
                     : p    ? ", parameters on nvme"
                            : "");
}

Estimate estimate(const EstimateInput& in, const Config& c, int stage,
                  const std::string& offload_optimizer, const std::string& offload_param) {
  Estimate e;
  e.stage = stage;
  e.offload_optimizer = stage > 0 ? offload_optimizer : "none";
  e.offload_param = stage == 3 ? offload_param : "none";
  const bool mixed = c.bf16.enabled || c.fp16.enabled;
  const int64_t b = mixed ? 2 : 4;  // bytes per element in the training dtype
  const int64_t psi = in.params;
  const int64_t part = stage == 0 ? psi : (psi + in.world - 1) / in.world;
  // fp32 numbers per element of the part beside the parameters: the master weight (mixed
  // precision) and each optimizer state. A fresh optimizer of one element shows how many.
  const int64_t states =
      c.optimizer.type.empty()
          ? 0
          : static_cast<int64_t>(optim::make_optimizer(c.optimizer, 1, at::kFloat)->state().size());
  e.params = (stage == 3 ? part : psi) * b;
  e.grads = (stage >= 2 ? part : psi) * b;
  if (e.offload_param == "nvme") {
    // NOTE [stage 3 parameter offload]: the shards past max_in_cpu on disk, one aligned run per
    // unit; the pool holds the shards read ahead (buffer_count), the one being written and the
    // gathers' own, about buffer_count + 2 unit shards.
    const auto& op = c.zero_optimization.offload_param;
    const int64_t kept = std::min(part, op.max_in_cpu);
    const int64_t shard = (in.largest_unit + in.world - 1) / in.world;
    e.params = kept * b;
    e.param_disk = (part - kept) * b;
    if (shard > 0) {
      const int64_t units = (part - kept + shard - 1) / shard;
      e.param_disk = units * static_cast<int64_t>(io::align_up(shard * b));
      e.swap_buffers +=
          std::min(units, op.buffer_count + 2) * static_cast<int64_t>(io::align_up(shard * b));
    }
  }
  if (e.offload_optimizer == "nvme") {
    // The fp32 weights are swapped with the states under mixed precision or with the
    // parameters on disk.
    const int64_t T = states + (mixed || e.offload_param == "nvme" ? 1 : 0);
    const int64_t sub = std::min<int64_t>(c.zero_optimization.sub_group_size, part);
    const int64_t groups = sub > 0 ? (part + sub - 1) / sub : 0;
    const auto& oo = c.zero_optimization.offload_optimizer;
    const int64_t wanted = 1 + (oo.pipeline_read ? 1 : 0) + (oo.pipeline_write ? 1 : 0);
    const int64_t slots =
        std::min<int64_t>({std::max<int64_t>(oo.buffer_count, 1), wanted, groups});
    e.swap_buffers += slots * T * static_cast<int64_t>(io::align_up(4 * sub));
    for (int64_t g = 0; g < groups; ++g) {
      e.disk += T * static_cast<int64_t>(io::align_up(4 * std::min(sub, part - g * sub)));
    }
  } else {
    e.master = mixed ? part * 4 : 0;
    e.optimizer_state = states * part * 4;
  }
  if (stage == 3) e.live_unit = in.largest_unit * b;
  return e;
}

Estimate estimate(const EstimateInput& in, const Config& c) {
  // cpu offload of a CPU model moves nothing: as without.
  const auto& z = c.zero_optimization;
  return estimate(in, c, z.stage, z.offload_optimizer.device == "nvme" ? "nvme" : "none",
                  z.offload_param.device == "nvme" ? "nvme" : "none");
}

std::vector<Estimate> estimate_all(const EstimateInput& in, const Config& c) {
  std::vector<Estimate> out;
  for (int stage = 0; stage <= 3; ++stage) {
    out.push_back(estimate(in, c, stage, "none"));
    if (stage > 0) out.push_back(estimate(in, c, stage, "nvme"));
  }
  out.push_back(estimate(in, c, 3, "nvme", "nvme"));
  return out;
}

namespace {

// A value of /proc/meminfo in bytes ("MemAvailable"), or -1.
int64_t meminfo(const std::string& key) {
  std::ifstream f("/proc/meminfo");
  std::string name, unit;
  int64_t kib = 0;
  while (f >> name >> kib) {
    std::getline(f, unit);
    if (name == key + ":") return kib * 1024;
  }
  return -1;
}

// A number in a cgroup v2 file ("max" or missing: -1).
int64_t cgroup_value(const std::string& file) {
  std::ifstream f("/sys/fs/cgroup/" + file);
  std::string v;
  if (!(f >> v) || v == "max") return -1;
  return std::strtoll(v.c_str(), nullptr, 10);
}

int64_t parse_bytes(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  int shift = 0;
  switch (end && *end ? std::toupper(*end) : 0) {
    case 0:
      break;
    case 'K':
      shift = 10;
      break;
    case 'M':
      shift = 20;
      break;
    case 'G':
      shift = 30;
      break;
    case 'T':
      shift = 40;
      break;
    default:
      shift = -1;
  }
  DSCPP_CHECK(v > 0 && shift >= 0 &&
                  (!*end || !end[1] || std::toupper(end[1]) == 'B' || std::toupper(end[1]) == 'I'),
              ConfigError, "DSCPP_MEMORY_LIMIT='", text,
              "' is not a number of bytes. HINT: for example 3G, 512M or 3221225472");
  return static_cast<int64_t>(v * static_cast<double>(int64_t{1} << shift));
}

}  // namespace

int64_t available_memory(std::string* source) {
  if (const char* env = std::getenv("DSCPP_MEMORY_LIMIT"); env && *env) {
    if (source) *source = std::string("DSCPP_MEMORY_LIMIT=") + env;
    return parse_bytes(env);
  }
  int64_t avail = meminfo("MemAvailable");
  if (source) *source = "MemAvailable";
  const int64_t max = cgroup_value("memory.max"), current = cgroup_value("memory.current");
  if (max > 0 && current >= 0 && (avail < 0 || max - current < avail)) {
    avail = std::max<int64_t>(0, max - current);
    if (source) *source = "the cgroup's memory.max";
  }
  return avail;
}

void check_fits(const EstimateInput& in, const Config& config, int64_t held, int local) {
  if (const char* skip = std::getenv("DSCPP_SKIP_MEMORY_CHECK"); skip && std::string(skip) == "1") {
    static std::once_flag said;
    std::call_once(said, [] {
      DSCPP_LOG_WARN("DSCPP_SKIP_MEMORY_CHECK=1: the pre-flight memory check is off");
    });
    return;
  }
  const Estimate e = estimate(in, config);
  std::string source;
  const int64_t avail = available_memory(&source);
  const int64_t needed = std::max<int64_t>(0, e.memory() - held) * local;
  if (avail >= 0 && needed > avail) {
    std::string fits;
    auto fit = [&](const Estimate& o) {
      return std::max<int64_t>(0, o.memory() - held) * local <= avail;
    };
    // Offload with the config's sub-groups, or else with small pipelined ones (the default
    // sub_group_size makes one buffer as large as the state it replaces).
    Config small = config;
    small.zero_optimization.sub_group_size = 10000000;
    small.zero_optimization.offload_optimizer.pipeline_read = true;
    small.zero_optimization.offload_optimizer.pipeline_write = true;
    for (const Estimate& o : estimate_all(in, config)) {
      if (fit(o)) {
        fits += fmt::format("\n  {}: {} per rank", o.describe(), format_bytes(o.memory()));
      } else if (o.offload_optimizer == "nvme") {
        const Estimate s = estimate(in, small, o.stage, "nvme", o.offload_param);
        if (fit(s)) {
          fits += fmt::format(
              "\n  {} with sub_group_size 10000000, pipeline_read and pipeline_write: {} per rank",
              s.describe(), format_bytes(s.memory()));
        }
      }
    }
    DSCPP_FAIL(
        ConfigError, "the model states of ", in.params, " trainable parameters at ", e.describe(),
        " need ", format_bytes(e.memory()), " per rank (parameters ", format_bytes(e.params),
        ", gradients ", format_bytes(e.grads), ", fp32 master weights ", format_bytes(e.master),
        ", optimizer state ", format_bytes(e.optimizer_state),
        e.swap_buffers ? ", swap buffers " + format_bytes(e.swap_buffers) : "",
        e.live_unit ? ", largest unit " + format_bytes(e.live_unit) : "", "); with ", local,
        " rank(s) on this host that is ", format_bytes(needed),
        held ? " beyond what the model holds already" : "", ", but ", format_bytes(avail),
        " is available (", source,
        "). Settings that fit:", fits.empty() ? std::string("\n  none on this many ranks") : fits,
        "\nHINT: choose one of those (docs/offload.md), add ranks or hosts, or set "
        "DSCPP_SKIP_MEMORY_CHECK=1 to start anyway (dscpp estimate prints the table)");
  }
  // The swap files against the free space of their folders (both in one folder: together).
  const auto& z = config.zero_optimization;
  const std::string odir = z.offload_optimizer.nvme_path.value_or("");
  const std::string pdir = z.offload_param.nvme_path.value_or("");
  const bool together = e.disk > 0 && e.param_disk > 0 && odir == pdir;
  auto check_disk = [&](int64_t bytes, const std::string& dir, const std::string& what,
                        const char* key) {
    struct statvfs fs {};
    if (bytes <= 0 || ::statvfs(dir.c_str(), &fs) != 0) return;
    const int64_t free = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
    DSCPP_CHECK(bytes * local <= free, ConfigError, what, " need ", format_bytes(bytes),
                " per rank x ", local, " rank(s) on this host = ", format_bytes(bytes * local),
                " in '", dir, "', which has ", format_bytes(free),
                " free. HINT: free space there, point ", key,
                " at a larger disk, or add ranks on other hosts");
  };
  if (together) {
    check_disk(e.disk + e.param_disk, odir, "the optimizer's and the parameters' swap files",
               "nvme_path");
  } else {
    check_disk(e.disk, odir, "the optimizer's swap files", "offload_optimizer.nvme_path");
    check_disk(e.param_disk, pdir, "the parameters' swap files", "offload_param.nvme_path");
  }
}

std::string format_bytes(int64_t bytes) {
  if (bytes < (int64_t{1} << 30)) return fmt::format("{:.1f} MiB", bytes / double(1 << 20));
  return fmt::format("{:.2f} GiB", bytes / double(int64_t{1} << 30));
}

}  // namespace dscpp::engine
