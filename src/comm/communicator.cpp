// Pieces of the communicator shared by every implementation: names, even splits, the
// equal-chunk overloads, and CommOptions from config and environment.
#include <ATen/core/Tensor.h>
#include <fmt/format.h>

#include <cstdlib>

#include "comm/op_desc.h"
#include "dscpp/comm.h"
#include "dscpp/error.h"

namespace dscpp::comm {

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::all_reduce: return "all_reduce";
    case OpKind::reduce_scatter: return "reduce_scatter";
    case OpKind::all_gather: return "all_gather";
    case OpKind::broadcast: return "broadcast";
    case OpKind::barrier: return "barrier";
    case OpKind::send: return "send";
    case OpKind::recv: return "recv";
  }
  return "unknown";
}

std::string dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Float: return "float32";
    case c10::ScalarType::Double: return "float64";
    case c10::ScalarType::Half: return "float16";
    case c10::ScalarType::BFloat16: return "bfloat16";
    case c10::ScalarType::Long: return "int64";
    case c10::ScalarType::Int: return "int32";
    case c10::ScalarType::Short: return "int16";
    case c10::ScalarType::Char: return "int8";
    case c10::ScalarType::Byte: return "uint8";
    case c10::ScalarType::Bool: return "bool";
    default: return c10::toString(dtype);
  }
}

std::string OpDesc::to_string() const {
  if (kind == OpKind::barrier) return "barrier";
  std::string s = fmt::format("{}({}, {} elements", op_kind_name(kind), dtype_name(dtype), numel);
  if (kind == OpKind::broadcast) s += fmt::format(", root {}", peer);
  if (kind == OpKind::send) s += fmt::format(", to rank {}", peer);
  if (kind == OpKind::recv) s += fmt::format(", from rank {}", peer);
  return s + ")";
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "unknown";
}

std::vector<int64_t> split_evenly(int64_t n, int world_size) {
  std::vector<int64_t> counts(world_size, n / world_size);
  for (int64_t i = 0; i < n % world_size; ++i) counts[i]++;
  return counts;
}

WorkHandle Communicator::reduce_scatter(at::Tensor output, at::Tensor input, ReduceOp op) {
  DSCPP_CHECK(input.numel() == output.numel() * world_size(), CommError,
              "reduce_scatter: input has ", input.numel(), " elements, expected world size ",
              world_size(), " * output ", output.numel(),
              ". HINT: pad the buffer to a multiple of the world size, or pass counts");
  return reduce_scatter(output, input, std::vector<int64_t>(world_size(), output.numel()), op);
}

WorkHandle Communicator::all_gather(at::Tensor output, at::Tensor input) {
  DSCPP_CHECK(output.numel() == input.numel() * world_size(), CommError,
              "all_gather: output has ", output.numel(), " elements, expected world size ",
              world_size(), " * input ", input.numel(),
              ". HINT: pad the buffer to a multiple of the world size, or pass counts");
  return all_gather(output, input, std::vector<int64_t>(world_size(), input.numel()));
}

namespace {
std::chrono::milliseconds env_seconds(const char* name, std::chrono::milliseconds fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  double s = std::strtod(v, &end);
  DSCPP_CHECK(end && *end == '\0' && s > 0, ConfigError, "environment variable ", name, "='", v,
              "' is not a positive number of seconds");
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
}
}  // namespace

CommOptions CommOptions::from_config(const Config* config) {
  CommOptions o;
  if (config) {
    o.comms_logger = config->comms_logger;
    o.debug_sync = config->comms_logger.debug;
  }
  o.timeout = env_seconds("DSCPP_COMM_TIMEOUT", o.timeout);
  o.rendezvous_timeout = env_seconds("DSCPP_RENDEZVOUS_TIMEOUT", o.rendezvous_timeout);
  if (const char* d = std::getenv("DSCPP_DEBUG_SYNC"); d && *d) {
    std::string v = d;
    DSCPP_CHECK(v == "0" || v == "1", ConfigError, "DSCPP_DEBUG_SYNC='", v,
                "' must be 0 or 1");
    o.debug_sync = v == "1";
  }
  if (const char* b = std::getenv("DSCPP_COMM_BACKEND"); b && *b) o.backend = b;
  if (const char* m = std::getenv("DSCPP_COMM_SHM"); m && *m) o.shm = m;
  DSCPP_CHECK(o.shm == "auto" || o.shm == "on" || o.shm == "off", ConfigError,
              "DSCPP_COMM_SHM='", o.shm, "' must be auto, on or off");
  if (const char* h = std::getenv("DSCPP_COMM_HIERARCHY"); h && *h) o.hierarchy = h;
  DSCPP_CHECK(o.hierarchy == "auto" || o.hierarchy == "off", ConfigError,
              "DSCPP_COMM_HIERARCHY='", o.hierarchy, "' must be auto or off");
  if (const char* id = std::getenv("DSCPP_HOST_ID"); id && *id) o.host = id;
  return o;
}

}  // namespace dscpp::comm
