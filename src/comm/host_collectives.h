// HostCollectives: collectives on CPU tensors that dscpp carries itself instead of handing them
// to the backend: ShmGroup when every rank shares one host (comm/shm.h), HostHierarchy when the
// ranks span several hosts with several ranks on each (comm/hierarchy.h). The communicator
// routes every collective on a tensor that supports() accepts here; send/recv and the rest stay
// on the backend. Calls run on the communicator's thread and block until done or throw.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "comm/op_desc.h"
#include "dscpp/comm.h"

namespace dscpp::comm {

class HostCollectives {
 public:
  virtual ~HostCollectives() = default;

  // Contiguous CPU tensors of a dtype this transport reduces.
  virtual bool supports(const at::Tensor& t) const = 0;
  // What the communicator's backend name gets after '+': "shm", "shm+hosts".
  virtual std::string name() const = 0;

  // The Communicator's semantics (see dscpp/comm.h); arguments were checked by the caller.
  // `seq` is the communicator's sequence number of the collective, the same on every rank.
  virtual void all_reduce(const at::Tensor& tensor, ReduceOp op, int64_t seq) = 0;
  virtual void reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                              const std::vector<int64_t>& counts, ReduceOp op, int64_t seq) = 0;
  // reduce_scatter with what crosses hosts quantized (NOTE [quantized reduce-scatter]); on one
  // host, reduce_scatter itself.
  virtual void reduce_scatter_quantized(const at::Tensor& output, const at::Tensor& input,
                                        const std::vector<int64_t>& counts, ReduceOp op,
                                        int64_t seq) {
    reduce_scatter(output, input, counts, op, seq);
  }
  // outputs[r] receives rank r's input; input may be outputs[rank].
  virtual void all_gather(const std::vector<at::Tensor>& outputs, const at::Tensor& input,
                          int64_t seq) = 0;
  // The ranks that share this rank's memory (Communicator::host_group_size), and all_gather
  // among them only: outputs[l] receives local rank l's input.
  virtual int host_size() const = 0;
  virtual void host_all_gather(const std::vector<at::Tensor>& outputs, const at::Tensor& input,
                               int64_t seq) = 0;
  virtual void broadcast(const at::Tensor& tensor, int root, int64_t seq) = 0;
  virtual void barrier(int64_t seq) = 0;

  // The bytes this rank sent over TCP since the last call (shared memory sends none).
  virtual Traffic take_traffic() { return {}; }
};

}  // namespace dscpp::comm
