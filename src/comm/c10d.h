// The c10d headers dscpp's communicator uses, in one place: the Gloo and (with CUDA) NCCL
// backends, the stores, and c10d::Backend / c10d::Work, the base classes dscpp talks to (it holds
// the backend object directly, not a ProcessGroup wrapping it).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#if defined(DSCPP_HAVE_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
