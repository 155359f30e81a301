// Runs `world_size` ranks as threads in one process over a shared HashStore, each with its own
// Gloo communicator (as c10d's own tests do). Collects each rank's exception, if any.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <vector>

#include "comm/rendezvous.h"
#include "dscpp/comm.h"

namespace dscpp::testing {

using RankFn = std::function<void(dscpp::comm::Communicator&)>;
using WrapFn = std::function<std::shared_ptr<dscpp::comm::Communicator>(
    std::shared_ptr<dscpp::comm::Communicator>)>;

using OptionsFn = std::function<dscpp::comm::CommOptions(int rank)>;

// Each rank with options of its own (a host name per rank, to simulate several hosts).
inline std::vector<std::exception_ptr> run_thread_ranks_with(const OptionsFn& options_of,
                                                             int world_size, const RankFn& fn,
                                                             const WrapFn& wrap = nullptr) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::exception_ptr> errors(world_size);
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      try {
        std::shared_ptr<dscpp::comm::Communicator> comm =
            dscpp::comm::make_gloo_communicator(store, r, world_size, options_of(r));
        if (wrap) comm = wrap(comm);
        fn(*comm);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

inline std::vector<std::exception_ptr> run_thread_ranks(int world_size, const RankFn& fn,
                                                        dscpp::comm::CommOptions options = {},
                                                        const WrapFn& wrap = nullptr) {
  return run_thread_ranks_with([&](int) { return options; }, world_size, fn, wrap);
}

// Options that place ranks [h * per_host, (h + 1) * per_host) on simulated host "hostH".
inline OptionsFn on_hosts(int per_host, dscpp::comm::CommOptions options = {}) {
  return [=](int rank) {
    auto o = options;
    o.host = "host" + std::to_string(rank / per_host);
    return o;
  };
}

inline std::string error_text(const std::exception_ptr& e) {
  if (!e) return "";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  }
  return "unknown exception";
}

}  // namespace dscpp::testing
