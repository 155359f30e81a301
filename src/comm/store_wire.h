// The rendezvous store's wire format, shared by its server (store_server.h) and its client
// (store_client.h): the handshake that admits a connection (NOTE [rendezvous handshake] in
// store_server.cpp), the framing of requests and replies, and the blocking socket helpers the
// client uses. No libtorch here.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "util/sha256.h"

namespace dscpp::comm::wire {

using Nonce = std::array<uint8_t, 32>;

// Server -> client at once: magic, whether a proof is required, the server's nonce.
constexpr char kServerMagic[8] = {'D', 'S', 'C', 'P', 'P', '-', 'S', '1'};
constexpr size_t kServerHelloBytes = 8 + 1 + 32;
// Client -> server: magic, the client's nonce, its proof (zeros when no secret is required).
constexpr char kClientMagic[8] = {'D', 'S', 'C', 'P', 'P', '-', 'C', '1'};
constexpr size_t kClientHelloBytes = 8 + 32 + 32;
// Server -> client: the verdict (1 admitted, 0 refused), then the server's own proof.
constexpr size_t kVerdictBytes = 1 + 32;

// The proofs: HMAC-SHA-256 under the job's secret of a role label and both nonces, so neither
// side's proof can be replayed as the other's or in another connection.
Sha256Digest client_proof(const std::string& secret, const Nonce& server, const Nonce& client);
Sha256Digest server_proof(const std::string& secret, const Nonce& server, const Nonce& client);

Nonce random_nonce();

// Requests and replies are frames: a little-endian u32 byte count, then that many bytes. A
// request starts with its Op; a reply with its Status.
constexpr uint32_t kMaxFrameBytes = 256u << 20;
enum class Op : uint8_t {
  kSet = 1,         // key, value                         -> ok
  kGet = 2,         // key, timeout ms (0: none)          -> ok value | timeout
  kAdd = 3,         // key, i64                           -> ok i64 (the new value)
  kCompareSet = 4,  // key, expected, desired             -> ok value (the value now)
  kCheck = 5,       // u32 n, n keys                      -> ok u8 (all exist)
  kDelete = 6,      // key                                -> ok u8 (it existed)
  kNumKeys = 7,     //                                    -> ok i64
  kWait = 8,        // u32 n, n keys, timeout ms (0: none) -> ok | timeout
  kAppend = 9,      // key, value                         -> ok
};
enum class Status : uint8_t { kOk = 0, kTimeout = 1, kError = 2 };

// Builds a frame's payload.
class Writer {
 public:
  Writer& u8(uint8_t v);
  Writer& u32(uint32_t v);
  Writer& i64(int64_t v);
  Writer& bytes(const std::string& s);
  Writer& bytes(const std::vector<uint8_t>& v);
  Writer& raw(const std::string& s);  // appended as is, no length
  const std::string& payload() const { return out_; }
  // The payload with its length in front.
  std::string frame() const;

 private:
  std::string out_;
};

// Reads a frame's payload; every read checks the bounds and sets ok() false past them.
class Reader {
 public:
  Reader(const char* data, size_t n) : p_(data), end_(data + n) {}
  uint8_t u8();
  uint32_t u32();
  int64_t i64();
  std::string bytes();
  bool ok() const { return ok_; }
  bool at_end() const { return p_ == end_; }

 private:
  bool take(void* out, size_t n);
  const char* p_;
  const char* end_;
  bool ok_ = true;
};

// Blocking helpers for the client's socket. Each returns false (with errno set, or 0 at end of
// stream) when the deadline passes, the peer closes or the socket fails.
using Deadline = std::chrono::steady_clock::time_point;
bool send_all(int fd, const void* data, size_t n, Deadline deadline);
bool recv_all(int fd, void* data, size_t n, Deadline deadline);

// "address:port" of a connected socket's peer, for messages.
std::string peer_name(int fd);

}  // namespace dscpp::comm::wire
