// C10dCommunicator: the Communicator over a c10d backend (ProcessGroupGloo, or ProcessGroupNCCL
// for CUDA tensors). One communication thread runs the collectives in call order; each call
// returns at once with a handle. The thread numbers collectives, records them with the
// SyncMonitor, optionally checks shapes across ranks first (debug_sync), times them for the
// CommsLogger, and turns a timeout or failure into the sync report (NOTE [sync report]).
// After a failure the communicator is broken: every later collective fails with the same error.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "comm/comms_logger.h"
#include "comm/op_desc.h"
#include "comm/ring.h"
#include "comm/host_collectives.h"
#include "comm/sync_monitor.h"
#include "comm/c10d.h"
#include "dscpp/comm.h"

namespace dscpp::comm {

class C10dCommunicator final : public Communicator {
 public:
  // `monitor_store` must be safe to use from another thread (see SyncMonitor); it may be `store`
  // when that is thread-safe (HashStore). `prefix` separates this communicator's keys. `host`,
  // when given, carries the collectives on CPU tensors it supports (shared memory on one host,
  // NOTE [shared-memory collectives]; or the hierarchy across hosts, NOTE [hierarchical
  // collectives]); send/recv and anything it does not support stay on the backend. `hosts`:
  // each rank's host (ShmGroup::Setup::hosts), for the comms logger's bytes to other hosts and
  // the choice of dscpp's rings over Gloo's own algorithms across hosts; empty: unknown.
  C10dCommunicator(c10::intrusive_ptr<c10d::Backend> backend, std::string backend_name,
                   c10::intrusive_ptr<c10d::Store> monitor_store, std::string prefix, int rank,
                   int world_size, CommOptions options, std::unique_ptr<HostCollectives> host = nullptr,
                   std::vector<std::string> hosts = {});
  ~C10dCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend_name() const override {
    return host_ ? backend_name_ + "+" + host_->name() : backend_name_;
  }

  using Communicator::all_gather;
  using Communicator::reduce_scatter;
  WorkHandle all_reduce(at::Tensor tensor, ReduceOp op) override;
  WorkHandle reduce_scatter(at::Tensor output, at::Tensor input, std::vector<int64_t> counts,
                            ReduceOp op) override;
  WorkHandle reduce_scatter_quantized(at::Tensor output, at::Tensor input,
                                      std::vector<int64_t> counts, ReduceOp op) override;
  WorkHandle all_gather(at::Tensor output, at::Tensor input,
                        std::vector<int64_t> counts) override;
  WorkHandle all_gather_into(std::vector<at::Tensor> outputs, at::Tensor input) override;
  int host_group_size() const override { return host_ ? host_->host_size() : 1; }
  WorkHandle host_all_gather_into(std::vector<at::Tensor> outputs, at::Tensor input) override;
  WorkHandle broadcast(at::Tensor tensor, int root) override;
  WorkHandle barrier() override;
  WorkHandle send(at::Tensor tensor, int dst) override;
  WorkHandle recv(at::Tensor tensor, int src) override;
  void set_step(int64_t step) override { step_ = step; }
  int64_t sequence_number() const override { return seq_; }
  void log_summary() override;

 private:
  class State;
  struct Task {
    OpDesc desc;
    int64_t seq;      // sequence number of a collective; for send/recv, that of the last one
    bool collective;  // false for send/recv: no sequence number, no shape check
    int64_t step;     // the training step when it was issued (set_step)
    // Runs the operation. Collectives complete before returning null; send/recv only post and
    // return the backend's handle, which the caller's wait() waits on (NOTE [point-to-point]).
    std::function<c10::intrusive_ptr<c10d::Work>(int64_t seq)> body;
    std::shared_ptr<State> state;
  };

  WorkHandle enqueue(OpDesc desc, bool collective,
                     std::function<c10::intrusive_ptr<c10d::Work>(int64_t seq)> body);
  void run_loop();
  void run_task(Task& task);
  void check_same_op_everywhere(int64_t seq, const OpDesc& desc, int64_t step);
  void wait_c10d(const c10::intrusive_ptr<c10d::Work>& work);
  // reduce_scatter, exact or with what crosses hosts quantized (NOTE [quantized
  // reduce-scatter]); on NCCL and on one host `quantized` changes nothing.
  WorkHandle enqueue_reduce_scatter(at::Tensor output, at::Tensor input,
                                    std::vector<int64_t> counts, ReduceOp op, bool quantized);
  // Uneven all-gather on NCCL: outputs[r] (on every rank) from rank r's input, one broadcast
  // per non-empty output. Runs on the comm thread.
  void broadcast_from_owners(const std::vector<at::Tensor>& outputs, const at::Tensor& input);
  // A ring over the backend for collective `seq`, counting what it sends into traffic_.
  RingContext ring(int64_t seq);

  c10::intrusive_ptr<c10d::Backend> backend_;
  std::string backend_name_;
  int rank_;
  int world_size_;
  CommOptions options_;
  SyncMonitor monitor_;
  CommsLogger logger_;
  // NCCL's flat reduce_scatter/all_gather are used for equal shards; otherwise (and on Gloo) a
  // ring over send/recv (comm/ring.h).
  bool native_flat_;
  std::unique_ptr<HostCollectives> host_;  // null: every collective on the backend
  std::vector<std::string> hosts_;
  // Ranks on several hosts: Gloo's all-reduce and broadcast are replaced by dscpp's rings, whose
  // bytes are counted exactly (the same bytes as Gloo's ring).
  bool spans_hosts_ = false;
  Traffic traffic_;  // of the collective running now; comm thread only

  std::atomic<int64_t> seq_{0};   // collectives issued (call order)
  std::atomic<int64_t> step_{-1};

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stop_ = false;
  std::exception_ptr broken_;  // first failure; set and read on the comm thread only
  std::thread worker_;
};

}  // namespace dscpp::comm
