// NOTE [torch 1.x vs 2.x]: the one place where libtorch versions differ for dscpp.
// libtorch 1.13 (Debian): ProcessGroupGloo derives from c10d::ProcessGroup; work handles are
// c10d::ProcessGroup::Work (aliased to c10d::Work in Work.hpp). libtorch 2.x: backends derive
// from c10d::Backend and the process group wraps them. dscpp talks to the backend object
// directly, so only the base class name differs. Everything else dscpp uses (TCPStore options,
// PrefixStore, send/recv with tags, allreduce/allgather/broadcast/barrier, Work::wait(timeout))
// has the same signature in both.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>

#if defined(DSCPP_HAVE_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace dscpp::comm::compat {

#if TORCH_VERSION_MAJOR >= 2
using Backend = ::c10d::Backend;
#else
using Backend = ::c10d::ProcessGroup;
#endif
using C10dWork = ::c10d::Work;

}  // namespace dscpp::comm::compat
