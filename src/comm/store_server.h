// The rendezvous store's server: the key-value store every rank of a job meets at (MASTER_ADDR:
// MASTER_PORT), run by rank 0 in a thread of its own. It replaces c10d's TCPStore server for
// three reasons (issue 32): it listens on the master address only, not on every address; it
// admits a connection only after the client proved it knows the job's secret (NOTE [rendezvous
// handshake] in store_server.cpp), and it refuses and logs anyone else without letting them
// delay the job beyond a bounded time. Clients: StoreClient (store_client.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dscpp::comm {

class StoreServer {
 public:
  struct Options {
    // The address to listen on (a name or a numeric address; rank 0's MASTER_ADDR: every
    // address it resolves to that this host holds) and port (0: a free one, see port()).
    std::string address = "127.0.0.1";
    int port = 0;
    // The job's secret; empty: connections are admitted without a proof (a job started without
    // dscpp launch and without DSCPP_RENDEZVOUS_SECRET).
    std::string secret;
    // A connection that has not proved itself within this time is closed.
    std::chrono::milliseconds handshake_timeout{5000};
    // At most this many connections may be unproven at once; a newer one closes the oldest.
    int max_unproven = 64;
  };

  // A connection that was closed before it was admitted: who, and why.
  struct Refusal {
    std::string peer;
    std::string why;
  };

  // Listens and starts serving. Throws CommError naming the address and the cause (port in use,
  // not an address of this host) with what to do.
  explicit StoreServer(Options options);
  // Stops serving and closes every connection.
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const;
  // Whether every address MASTER_ADDR resolved to here is a loopback one (127.0.0.0/8, ::1):
  // then only ranks on this host can reach the server.
  bool listens_on_loopback_only() const;
  // Connections refused so far, and the first 100 of them.
  int64_t refused() const;
  std::vector<Refusal> refusals() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dscpp::comm
