// The communicator: the collectives the engine and the ZeRO stages need, over c10d (Gloo on CPU,
// NCCL on CUDA), each asynchronous with a handle whose wait() rethrows the failure it stored.
//
// Every collective a rank issues gets a sequence number (1, 2, 3, ... in call order). A
// collective that does not complete within CommOptions::timeout never hangs the job: the ranks
// publish their last collective to the store and every surviving rank throws a CommTimeout whose
// message is a table of who reached what, naming the rank that is behind and the collective it
// never entered. See NOTE [sync report] in src/comm/sync_monitor.h.
//
// Threading: collectives run in call order on one communication thread per communicator, so a
// caller may issue them from the training thread and keep computing (backward overlaps the
// reduction of the buckets it already filled). Calls must be issued in the same order on every
// rank, as with c10d.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dscpp/config.h"
#include "dscpp/process_env.h"

namespace dscpp::comm {

enum class ReduceOp { sum, avg, max, min };

// Handle of an asynchronous collective.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the collective has completed. Throws CommTimeout (with the sync report) or
  // CommError when it failed; a failed communicator fails every later wait() the same way.
  virtual void wait() = 0;
  // True once the collective has finished, successfully or not.
  virtual bool is_completed() const = 0;
};
using WorkHandle = std::shared_ptr<Work>;

struct CommOptions {
  // How long one collective may take before the job is declared out of sync. DeepSpeed's default
  // is 30 minutes for NCCL and c10d's is 30; dscpp uses 10 minutes, like DeepSpeed's
  // init_distributed default. Env DSCPP_COMM_TIMEOUT (seconds, may be fractional) overrides.
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
  // How long ranks wait for each other at start-up (reaching the master, all ranks joining).
  // Env DSCPP_RENDEZVOUS_TIMEOUT (seconds) overrides.
  std::chrono::milliseconds rendezvous_timeout{std::chrono::minutes(5)};
  // Before each collective, check that every rank entered the same operation with the same
  // dtype and element count, and fail at once with both sides named. Costs one small all-gather
  // per collective. On with env DSCPP_DEBUG_SYNC=1 or comms_logger.debug.
  bool debug_sync = false;
  // Per-operation counts, sizes, latency and bandwidth (DeepSpeed's comms_logger).
  CommsLoggerConfig comms_logger;
  // "gloo", "nccl" or "auto" (nccl when CUDA is available and libtorch has NCCL, else gloo).
  std::string backend = "auto";
  // Shared-memory collectives for CPU tensors when every rank is on one host (Gloo backend
  // only; NOTE [shared-memory collectives] in src/comm/shm.h): "auto" uses them when the ranks
  // share a host and warns when the segment cannot be made, "on" makes that an error, "off"
  // keeps every collective on Gloo's TCP transport. Env DSCPP_COMM_SHM overrides.
  std::string shm = "auto";
  // Bytes of one rank's slot in the segment (the segment is 2 x world size x this). A collective
  // larger than a slot runs in pieces.
  int64_t shm_slot_bytes = int64_t{4} << 20;
  // Ranks on several hosts with several on each (H hosts of R consecutive ranks): "auto" carries
  // collectives on CPU tensors through shared memory inside each host and Gloo between hosts
  // (NOTE [hierarchical collectives] in src/comm/hierarchy.h); "off" keeps them on flat Gloo.
  // Needs shm not "off". Env DSCPP_COMM_HIERARCHY overrides.
  std::string hierarchy = "auto";
  // The host this rank runs on as the collectives tell hosts apart; ranks with the same value
  // share memory. Empty: the host name and kernel boot id. Env DSCPP_HOST_ID overrides (ranks in
  // containers that share a kernel but not /dev/shm, or hosts simulated with network namespaces).
  std::string host;

  // Defaults, then the config's comms_logger section, then the environment variables above.
  static CommOptions from_config(const Config* config = nullptr);
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string backend_name() const = 0;

  // In place on every rank: tensor = op over ranks of tensor. Any dtype the backend supports.
  virtual WorkHandle all_reduce(at::Tensor tensor, ReduceOp op = ReduceOp::sum) = 0;

  // input: [sum(counts)] contiguous on every rank; output: [counts[rank]] receives the reduction
  // of this rank's chunk (chunks are consecutive, in rank order). Moves (n-1)/n of the input per
  // rank, half of what all_reduce moves. counts.size() must equal world_size(). output may be
  // the input's own chunk `rank` (in place); otherwise the input is left unchanged.
  virtual WorkHandle reduce_scatter(at::Tensor output, at::Tensor input,
                                    std::vector<int64_t> counts, ReduceOp op = ReduceOp::sum) = 0;
  // Equal chunks: input.numel() == world_size() * output.numel().
  WorkHandle reduce_scatter(at::Tensor output, at::Tensor input, ReduceOp op = ReduceOp::sum);

  // ZeRO++ qgZ (zero_quantized_gradients): reduce_scatter with op sum or avg, where what crosses
  // hosts travels as block-wise int4 codes and scales, each rank's chunk quantized once by its
  // sender (NOTE [quantized reduce-scatter] in src/comm/quantized_reduce.h). Inside a host the
  // sums are exact; with every rank on one host this is reduce_scatter.
  virtual WorkHandle reduce_scatter_quantized(at::Tensor output, at::Tensor input,
                                              std::vector<int64_t> counts, ReduceOp op) = 0;

  // input: [counts[rank]]; output: [sum(counts)] receives every rank's input in rank order.
  // input may be the output's own chunk `rank` (in place, as ZeRO gathers parameters).
  virtual WorkHandle all_gather(at::Tensor output, at::Tensor input,
                                std::vector<int64_t> counts) = 0;
  // Equal chunks: output.numel() == world_size() * input.numel().
  WorkHandle all_gather(at::Tensor output, at::Tensor input);
  // outputs[r] (one contiguous tensor per rank, anywhere) receives rank r's input; input may be
  // outputs[rank] (in place). ZeRO gathers piece j of every rank's shard this way, straight
  // into the parameter buffer (Gloo: no staging; NCCL's list all-gather stages world x piece
  // inside libtorch).
  virtual WorkHandle all_gather_into(std::vector<at::Tensor> outputs, at::Tensor input) = 0;

  // ZeRO++ hpZ (zero_hpz_partition_size): how many ranks form this rank's host group, the
  // ranks whose collectives go through shared memory with it: R under hierarchical collectives
  // (H >= 2 hosts of R consecutive ranks), the world when shared memory carries every rank on
  // one host, 1 when every pair of ranks talks over TCP or NCCL.
  virtual int host_group_size() const = 0;
  // all_gather_into among this rank's host group (ranks h*R .. h*R+R-1 for host h):
  // outputs[l] receives the input of the group's l-th rank; input may be outputs[own place].
  // A collective of the whole world: every rank calls it, each host gathering its own.
  virtual WorkHandle host_all_gather_into(std::vector<at::Tensor> outputs, at::Tensor input) = 0;

  virtual WorkHandle broadcast(at::Tensor tensor, int root) = 0;
  virtual WorkHandle barrier() = 0;
  virtual WorkHandle send(at::Tensor tensor, int dst) = 0;
  virtual WorkHandle recv(at::Tensor tensor, int src) = 0;

  // The training step recorded with each collective, so a sync report can say where ranks were.
  virtual void set_step(int64_t step) = 0;
  // Number of collectives issued so far by this rank (the last sequence number).
  virtual int64_t sequence_number() const = 0;
  // Writes the comms_logger summary (no-op when disabled). Also done at destruction.
  virtual void log_summary() = 0;
};

// Joins the job described by the environment (dscpp launch, mpirun or srun; see
// process_env.h): rendezvous at MASTER_ADDR:MASTER_PORT (rank 0's store, which admits only
// ranks holding the job's secret; docs/launch.md, "Who can join a job"), then a Gloo or NCCL
// process group. Throws CommError naming the address, port and time waited when the master cannot
// be reached, the port is taken, or not every rank joined (naming the missing ranks).
std::shared_ptr<Communicator> init_from_env(const CommOptions& options = CommOptions());

// Splits n elements into world_size consecutive chunks whose sizes differ by at most one
// (the first n % world_size chunks are one larger).
std::vector<int64_t> split_evenly(int64_t n, int world_size);

const char* reduce_op_name(ReduceOp op);

}  // namespace dscpp::comm
