// What a background save (checkpoint.writer.decoupled) reads of the training state: the writer
// thread writes each tensor a piece at a time straight from the memory training uses, so a save
// whose file is written before the next optimizer step costs neither a copy nor memory. Before
// that step changes the memory, the training thread calls copy_unwritten(): what the writer has
// not reached yet is copied into memory of the snapshot's own, and the writer goes on from the
// copy. The step then waits only for that copy, and for the piece being written (a piece is
// handed to the file where it lies, so its write holds the lock; at most
// checkpoint.writer.io_buffer_size).
#pragma once

#include <ATen/core/Tensor.h>

#include <deque>
#include <mutex>
#include <string>

#include "dscpp/safetensors.h"

namespace dscpp::checkpoint {

class LiveSnapshot {
 public:
  // A streamed tensor whose bytes are `source`'s (contiguous, on the CPU) at the time of the
  // write, or at the time of copy_unwritten() for what was not written by then. The snapshot
  // must outlive the write.
  safetensors::StreamedTensor add(std::string name, const at::Tensor& source);

  // Copies what the writer has not read yet of every source, so that the training state may
  // change; later calls copy nothing. Returns the bytes copied.
  int64_t copy_unwritten();

 private:
  struct Source {
    at::Tensor memory;    // elements [base, numel) of the tensor: the live one, or a copy
    int64_t base = 0;     // the element memory[0] is
    int64_t numel = 0;    // the tensor's length
    int64_t read = 0;     // elements [0, read) are in the writer's hands
    bool copied = false;  // memory is the snapshot's own
  };
  std::mutex mutex_;  // held while a piece is copied out of a source, or a source replaced
  std::deque<Source> sources_;  // a deque: the writer's fills keep pointers to its elements
};

}  // namespace dscpp::checkpoint
