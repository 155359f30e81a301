// OpDesc: what one collective is (operation, dtype, element count, peer/root), as recorded
// with its sequence number for the sync report, the debug shape check and the comms logger.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

#include "dscpp/error.h"

namespace dscpp::comm {

enum class OpKind : int { all_reduce = 1, reduce_scatter, all_gather, broadcast, barrier, send, recv };

const char* op_kind_name(OpKind kind);
// PyTorch-style dtype names: float32, bfloat16, int64, ...
std::string dtype_name(c10::ScalarType dtype);

struct OpDesc {
  OpKind kind = OpKind::barrier;
  c10::ScalarType dtype = c10::ScalarType::Float;
  int64_t numel = 0;   // elements this rank contributes (all_gather: its input; reduce_scatter: input)
  int64_t peer = -1;   // root for broadcast, peer for send/recv, -1 otherwise
  int64_t bytes() const { return numel * static_cast<int64_t>(c10::elementSize(dtype)); }
  // "all_reduce(float32, 1000 elements)", "broadcast(float32, 10 elements, root 0)"
  std::string to_string() const;
};

// Bytes this rank sent over TCP during one operation, by where the receiving rank runs (comms
// logger). `counted` is false when the backend's own algorithm moved them (Gloo's broadcast and
// barrier; its all-reduce on one host), which dscpp does not see.
struct Traffic {
  int64_t own_host = 0;
  int64_t other_hosts = 0;
  bool counted = true;
  void add(bool to_other_host, int64_t bytes) { (to_other_host ? other_hosts : own_host) += bytes; }
};

// Raised by the debug shape check (debug_sync) when ranks entered different collectives. The
// message already names both sides on every rank, so no sync report is added.
class CollectiveMismatch final : public CommError {
 public:
  using CommError::CommError;
};

// Raised when a peer on this host is seen to have exited (shared-memory collectives): the sync
// report then does not wait for that rank's answer.
class PeerExited final : public CommError {
 public:
  PeerExited(int rank, const std::string& what) : CommError(what), rank_(rank) {}
  int rank() const { return rank_; }

 private:
  int rank_;
};

}  // namespace dscpp::comm
