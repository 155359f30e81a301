// GradShard: where this rank's shard of the averaged gradient is summed over a window's
// micro-steps (the gradient path of stages 2-3, SlotReducer in reduce_scatter.h). In memory it is
// one tensor the step reads through Part::grads; on disk (offload/grad_swapper.h, NOTE [gradients
// on disk] there) it has none, and the step reads it sub-group by sub-group through
// Part::grads_on_disk. zero/ owns the interface; offload/ implements the disk, so zero/ never
// includes offload/.
//
// Threading: the reducer calls the backward side under its lock (an autograd thread or the
// caller of finish_backward); the step side runs on the training thread between backwards.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

namespace dscpp::zero {

class GradShard {
 public:
  virtual ~GradShard() = default;

  // Elements of the shard.
  virtual int64_t numel() const = 0;
  // The shard [numel] in the training dtype, when it is in memory; undefined on disk.
  virtual at::Tensor tensor() const = 0;

  // ----- backward side (the reducer)
  // Elements [pos, pos + n) are filled by a reduction in every reducing backward (called once per
  // bucket at set-up): the rest of the shard (padding) stays zero.
  virtual void expect(int64_t /*pos*/, int64_t /*n*/) {}
  // A reducing backward begins; `final`: its reductions complete the window.
  virtual void begin_backward(bool /*final*/) {}
  // Adds factor * piece into elements [pos, pos + piece.numel()) (the shard's dtype, as
  // dst.add_(piece, factor) on the shard in memory would).
  virtual void add(int64_t pos, const at::Tensor& piece, double factor) = 0;
  // Every reduction of the backward was added. Throws (an IoError) when the shard could not be
  // kept; the window is then incomplete.
  virtual void end_backward() {}
  // A new window: the shard is zeros again.
  virtual void zero() = 0;
  // Bytes of the shard held in memory (0 on disk), and of the disk's buffers.
  virtual int64_t bytes() const = 0;
  virtual int64_t buffer_bytes() const { return 0; }

  // ----- step side (a shard on disk; the window's backwards are over)
  // Starts reading elements [pos, pos + n) for a later read() of the same range.
  virtual void read_ahead(int64_t /*pos*/, int64_t /*n*/) {}
  // Elements [pos, pos + n) [n] in the training dtype, valid until the read_ahead() (or read())
  // that follows the next read() (two buffers take turns).
  virtual at::Tensor read(int64_t pos, int64_t n) = 0;
  // The squared norm of the shard in fp64: chunks of optim::kSquaresChunk elements from its
  // start, summed in order, each as optim::squared_norm sums it (the bits of the norm of the shard
  // in memory).
  virtual double squared_norm() = 0;
  // What the shard's disk did since the last call, for the step line; empty in memory.
  virtual std::string take_report() { return {}; }
};

// The shard in memory: zeros [numel] with `options`.
std::unique_ptr<GradShard> make_memory_grad_shard(int64_t numel, const at::TensorOptions& options);

}  // namespace dscpp::zero
