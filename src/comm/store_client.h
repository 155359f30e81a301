// StoreClient: a c10d::Store over one connection to the rendezvous server (store_server.h), so
// that Gloo, NCCL, the shared-memory setup and the sync monitor use it as they used c10d's
// TCPStore. The connection proves the job's secret before any key is touched (NOTE [rendezvous
// handshake] in store_server.cpp) and checks the server's proof in turn. One call at a time per
// client (a lock); clone() opens another connection for another thread. Rank 0's client owns
// the server, so the server lives as long as any of rank 0's clients.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "comm/store_server.h"

namespace dscpp::comm {

class StoreClient : public c10d::Store {
 public:
  struct Options {
    std::string host;  // the master address
    int port = 0;
    std::string secret;  // the job's secret; empty: the server must not ask for one
    // How long to keep trying to connect and be admitted (the server may start later).
    std::chrono::milliseconds connect_timeout{std::chrono::minutes(5)};
    // The rank, for messages.
    int rank = 0;
  };

  // Connects and proves the secret, retrying refused or dropped connections until
  // connect_timeout. Throws CommError: the server refused this rank's proof, the server's own
  // proof was wrong, one side has a secret and the other none, or nobody answered in time.
  explicit StoreClient(Options options, std::shared_ptr<StoreServer> server = {});
  ~StoreClient() override;

  c10::intrusive_ptr<c10d::Store> clone() override;
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;
  void append(const std::string& key, const std::vector<uint8_t>& value) override;

 private:
  void connect();
  // Sends one request and returns its reply's body; a timeout reply throws CommTimeout naming
  // `what`. `timeout` is the server's limit (0: none); the client waits that long plus a grace.
  std::string call(const std::string& request, std::chrono::milliseconds timeout,
                   const std::string& what);

  Options options_;
  std::shared_ptr<StoreServer> server_;
  std::mutex mu_;
  int fd_ = -1;
};

}  // namespace dscpp::comm
