// Implements the checkpoint manifest (manifest.h).
#include "checkpoint/manifest.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <set>

#include "dscpp/error.h"

namespace dscpp::checkpoint {
namespace {

constexpr const char* kFormatName = "dscpp-checkpoint";

// Reads manifest fields with errors that name the file and the field.
class Fields {
 public:
  explicit Fields(const std::string& source) : source_(source) {}

  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    DSCPP_FAIL(CheckpointError, "checkpoint manifest ", source_, ": ", where, ": ", what);
  }
  const nlohmann::json& at(const nlohmann::json& obj, const std::string& key,
                           const std::string& where) const {
    if (!obj.is_object() || !obj.contains(key)) fail(where, "missing \"" + key + "\"");
    return obj.at(key);
  }
  template <typename T>
  T get(const nlohmann::json& obj, const std::string& key, const std::string& where) const {
    const nlohmann::json& v = at(obj, key, where);
    try {
      return v.get<T>();
    } catch (const nlohmann::json::exception&) {
      fail(where + "." + key, "has the wrong type (" + std::string(v.type_name()) + ")");
    }
  }
  // An integer in [lo, hi]: a float, a boolean or an out-of-range value is an error (nlohmann
  // would truncate or wrap them silently).
  int64_t integer(const nlohmann::json& v, const std::string& where, int64_t lo, int64_t hi) const {
    if (!v.is_number_integer() ||
        (v.is_number_unsigned() &&
         v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())))
      fail(where, "must be an integer, got " + v.dump());
    const auto x = v.get<int64_t>();
    if (x < lo || x > hi) {
      fail(where, "is " + std::to_string(x) + ", outside [" + std::to_string(lo) + ", " +
                      std::to_string(hi) + "]");
    }
    return x;
  }
  int64_t integer(const nlohmann::json& obj, const std::string& key, const std::string& where,
                  int64_t lo = 0, int64_t hi = std::numeric_limits<int64_t>::max()) const {
    return integer(at(obj, key, where), where + "." + key, lo, hi);
  }
  // obj["shape"]: non-negative integers whose product fits in int64; `name` is for errors.
  std::vector<int64_t> shape(const nlohmann::json& obj, const std::string& where,
                             const std::string& name) const {
    const nlohmann::json& js = at(obj, "shape", where);
    if (!js.is_array()) fail(where + ".shape", "must be an array");
    std::vector<int64_t> out;
    int64_t numel = 1;
    for (size_t d = 0; d < js.size(); ++d) {
      out.push_back(integer(js[d], where + ".shape[" + std::to_string(d) + "]", 0,
                            std::numeric_limits<int64_t>::max()));
      if (__builtin_mul_overflow(numel, out.back(), &numel))
        fail(where, "'" + name + "' has more than 2^63 elements");
    }
    return out;
  }
  nlohmann::json object(const nlohmann::json& obj, const std::string& key) const {
    if (!obj.contains(key)) return nlohmann::json::object();
    if (!obj.at(key).is_object()) fail(key, "must be an object");
    return obj.at(key);
  }

 private:
  std::string source_;
};

}  // namespace

int64_t ParamEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string crc32c_hex(uint32_t crc) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", crc);
  return buf;
}

std::string rank_file_name(int rank, int world_size) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "rank%05d-of-%05d.safetensors", rank, world_size);
  return buf;
}

std::string slice_tensor_name(const std::string& group, const std::string& state) {
  return group + "/" + state;
}

std::string replicated_tensor_name(const std::string& name) { return "module/" + name; }

std::string Manifest::to_json() const {
  nlohmann::json j;
  j["format"] = kFormatName;
  j["version"] = kFormatVersion;
  j["tag"] = tag;
  j["saved_with"] = {
      {"world_size", world_size}, {"stage", stage}, {"dtype", dtype}, {"optimizer", optimizer}};
  nlohmann::json gs = nlohmann::json::array();
  for (const auto& g : groups) {
    nlohmann::json ps = nlohmann::json::array();
    for (const auto& p : g.parameters)
      ps.push_back({{"name", p.name}, {"shape", p.shape}, {"offset", p.offset}});
    gs.push_back({{"name", g.name}, {"numel", g.numel}, {"padded", g.padded}, {"parameters", ps}});
  }
  j["groups"] = gs;
  j["states"] = states;
  nlohmann::json fs = nlohmann::json::array();
  for (const auto& f : files) {
    fs.push_back(
        {{"path", f.path}, {"rank", f.rank}, {"bytes", f.bytes}, {"crc32c", crc32c_hex(f.crc32c)}});
  }
  j["files"] = fs;
  nlohmann::json rs = nlohmann::json::array();
  for (const auto& r : replicated) rs.push_back({{"name", r.name}, {"shape", r.shape}});
  j["replicated"] = rs;
  j["counters"] = counters;
  j["lr_scheduler"] = lr_scheduler;
  j["loss_scaler"] = loss_scaler;
  j["rng"] = rng;
  j["data"] = data;
  j["client_state"] = client_state;
  j["config"] = config;
  return j.dump(1) + "\n";
}

Manifest Manifest::parse(const std::string& text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    DSCPP_FAIL(CheckpointError, "checkpoint manifest ", source, " is not valid JSON (", e.what(),
               "): the file is torn or not a manifest");
  }
  Fields f(source);
  if (!j.is_object()) f.fail("(top level)", "must be a JSON object");
  if (f.get<std::string>(j, "format", "(top level)") != kFormatName)
    f.fail("format", std::string("is not \"") + kFormatName + "\"");
  const int64_t version =
      f.integer(j, "version", "(top level)", std::numeric_limits<int64_t>::min());
  if (version > kFormatVersion || version < 1) {
    f.fail("version", "is " + std::to_string(version) + ", but this dscpp reads versions 1.." +
                          std::to_string(kFormatVersion) +
                          ". HINT: load it with the dscpp that wrote it, or a newer one");
  }

  Manifest m;
  m.tag = f.get<std::string>(j, "tag", "(top level)");
  const nlohmann::json& sw = f.at(j, "saved_with", "(top level)");
  m.world_size = static_cast<int>(f.integer(sw, "world_size", "saved_with", 1, 1 << 20));
  m.stage = static_cast<int>(f.integer(sw, "stage", "saved_with", 0, 3));
  m.dtype = f.get<std::string>(sw, "dtype", "saved_with");
  m.optimizer = f.get<std::string>(sw, "optimizer", "saved_with");

  std::set<std::string> names, group_names;
  const nlohmann::json& gs = f.at(j, "groups", "(top level)");
  if (!gs.is_array()) f.fail("groups", "must be an array");
  for (size_t gi = 0; gi < gs.size(); ++gi) {
    const std::string where = "groups[" + std::to_string(gi) + "]";
    Group g;
    g.name = f.get<std::string>(gs[gi], "name", where);
    if (g.name.empty() || !group_names.insert(g.name).second)
      f.fail(where, "group name '" + g.name + "' is empty or appears twice");
    g.numel = f.integer(gs[gi], "numel", where);
    g.padded = f.integer(gs[gi], "padded", where);
    if (g.padded != (g.numel + m.world_size - 1) / m.world_size * m.world_size) {
      f.fail(where, "padded " + std::to_string(g.padded) + " is not numel " +
                        std::to_string(g.numel) + " rounded up to a multiple of world size " +
                        std::to_string(m.world_size));
    }
    const nlohmann::json& ps = f.at(gs[gi], "parameters", where);
    if (!ps.is_array()) f.fail(where + ".parameters", "must be an array");
    int64_t next = 0;  // parameters tile [0, numel) in order
    for (size_t pi = 0; pi < ps.size(); ++pi) {
      const std::string pw = where + ".parameters[" + std::to_string(pi) + "]";
      ParamEntry p;
      p.name = f.get<std::string>(ps[pi], "name", pw);
      p.shape = f.shape(ps[pi], pw, p.name);
      const int64_t numel = p.numel();
      p.offset = f.integer(ps[pi], "offset", pw);
      if (p.offset != next) {
        f.fail(pw, "'" + p.name + "' starts at " + std::to_string(p.offset) + ", expected " +
                       std::to_string(next) + " (parameters tile the group in order)");
      }
      if (!names.insert(p.name).second) f.fail(pw, "'" + p.name + "' appears twice");
      if (__builtin_add_overflow(next, numel, &next))
        f.fail(pw, "the group holds more than 2^63 elements");
      g.parameters.push_back(std::move(p));
    }
    if (next != g.numel) {
      f.fail(where, "its parameters hold " + std::to_string(next) + " elements, numel says " +
                        std::to_string(g.numel));
    }
    m.groups.push_back(std::move(g));
  }

  m.states = f.get<std::vector<std::string>>(j, "states", "(top level)");
  std::set<std::string> state_names;
  for (const auto& st : m.states) {
    if (st.empty() || !state_names.insert(st).second)
      f.fail("states", "state name '" + st + "' is empty or appears twice");
  }
  const nlohmann::json& fs = f.at(j, "files", "(top level)");
  if (!fs.is_array() || fs.size() != static_cast<size_t>(m.world_size)) {
    f.fail("files", "must list one file per rank (" + std::to_string(m.world_size) + ")");
  }
  for (size_t i = 0; i < fs.size(); ++i) {
    const std::string where = "files[" + std::to_string(i) + "]";
    FileEntry e;
    e.path = f.get<std::string>(fs[i], "path", where);
    e.rank = static_cast<int>(f.integer(fs[i], "rank", where, 0, m.world_size - 1));
    e.bytes = static_cast<uint64_t>(f.integer(fs[i], "bytes", where));
    const std::string crc = f.get<std::string>(fs[i], "crc32c", where);
    if (e.rank != static_cast<int>(i) || e.path != rank_file_name(e.rank, m.world_size)) {
      f.fail(where, "expected rank " + std::to_string(i) + "'s file " +
                        rank_file_name(static_cast<int>(i), m.world_size) + ", got rank " +
                        std::to_string(e.rank) + " '" + e.path + "'");
    }
    if (crc.size() != 8 || crc.find_first_not_of("0123456789abcdef") != std::string::npos)
      f.fail(where + ".crc32c", "must be 8 lowercase hex digits, got \"" + crc + "\"");
    e.crc32c = static_cast<uint32_t>(std::stoul(crc, nullptr, 16));
    m.files.push_back(std::move(e));
  }
  if (j.contains("replicated")) {
    const nlohmann::json& rs = j.at("replicated");
    if (!rs.is_array()) f.fail("replicated", "must be an array");
    std::set<std::string> seen;
    for (size_t i = 0; i < rs.size(); ++i) {
      const std::string where = "replicated[" + std::to_string(i) + "]";
      ReplicatedEntry r;
      r.name = f.get<std::string>(rs[i], "name", where);
      if (r.name.empty() || !seen.insert(r.name).second)
        f.fail(where, "name '" + r.name + "' is empty or appears twice");
      r.shape = f.shape(rs[i], where, r.name);
      m.replicated.push_back(std::move(r));
    }
  }
  m.counters = f.object(j, "counters");
  m.lr_scheduler = f.object(j, "lr_scheduler");
  m.loss_scaler = f.object(j, "loss_scaler");
  m.rng = f.object(j, "rng");
  m.data = f.object(j, "data");
  m.client_state = f.object(j, "client_state");
  m.config = f.object(j, "config");
  return m;
}

std::pair<int, int> Manifest::find(const std::string& name) const {
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& ps = groups[g].parameters;
    for (size_t p = 0; p < ps.size(); ++p) {
      if (ps[p].name == name) return {static_cast<int>(g), static_cast<int>(p)};
    }
  }
  return {-1, -1};
}

std::vector<SliceRead> reads_for(const Manifest& m, const std::string& name, int64_t begin,
                                 int64_t end) {
  auto [g, p] = m.find(name);
  DSCPP_CHECK(g >= 0, CheckpointError, "checkpoint '", m.tag, "' has no parameter '", name, "'");
  const Group& group = m.groups[g];
  const ParamEntry& param = group.parameters[p];
  DSCPP_CHECK(0 <= begin && begin <= end && end <= param.numel(), CheckpointError, "elements [",
              begin, ", ", end, ") lie outside parameter '", name, "' (", param.numel(),
              " elements)");
  std::vector<SliceRead> reads;
  const int64_t shard = m.shard(group);
  for (int64_t i = param.offset + begin; i < param.offset + end;) {
    const int64_t rank = i / shard, position = i % shard;
    const int64_t n = std::min(shard - position, param.offset + end - i);
    reads.push_back(SliceRead{static_cast<int>(rank), position, i - param.offset - begin, n});
    i += n;
  }
  return reads;
}

}  // namespace dscpp::checkpoint
