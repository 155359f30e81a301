// Consolidated weights from a checkpoint (DeepSpeed's zero_to_fp32, with no conversion step
// beforehand): every trainable parameter whole in fp32 under its model name, assembled from the
// rank files' slices through the manifest (reads_for), and the frozen parameters and buffers.
// `dscpp zero-to-fp32` writes the result as safetensors, which `dscpp train --init`, Python's
// safetensors and PyTorch's load_state_dict read.
#pragma once

#include <string>

#include "checkpoint/manifest.h"
#include "dscpp/safetensors.h"

namespace dscpp::io {
class FileSystem;
}

namespace dscpp::checkpoint {

// The parameters of `m` (a verified checkpoint in DIR/m.tag) in manifest order, each [shape]
// fp32 on the CPU, then its frozen parameters and buffers as saved (floating ones as fp32).
// Holds the whole model in memory. Throws IoError / CheckpointError naming the file.
safetensors::TensorList consolidate_fp32(const std::string& dir, const Manifest& m,
                                         io::FileSystem* fs = nullptr);

}  // namespace dscpp::checkpoint
