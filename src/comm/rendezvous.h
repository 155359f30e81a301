// Building communicators: from the job's environment (the rendezvous store at MASTER_ADDR:
// MASTER_PORT, store_server.h, then Gloo or NCCL), or over a store the caller already has (the tests run ranks
// as threads in one process over a shared HashStore, as c10d's own tests do).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>
#include <string>

#include "dscpp/comm.h"

namespace dscpp::comm {

// A Gloo communicator for `rank` of `world_size` over `store`. `monitor_store` is used by the
// sync monitor's thread and must tolerate concurrent use; null means `store` itself (fine for a
// HashStore, not for a StoreClient, which serves one call at a time). `prefix` keeps several communicators on one store apart.
// `local_address`: the address the Gloo transport binds to.
std::shared_ptr<Communicator> make_gloo_communicator(
    c10::intrusive_ptr<c10d::Store> store, int rank, int world_size, const CommOptions& options,
    const std::string& prefix = "dscpp", const std::string& local_address = "127.0.0.1",
    c10::intrusive_ptr<c10d::Store> monitor_store = {});

// The address of this host's interface that routes to `remote` (the master), so Gloo listens
// where the other ranks can reach it, in containers and network namespaces alike. Throws
// CommError when `remote` does not resolve.
std::string local_address_towards(const std::string& remote);

}  // namespace dscpp::comm
