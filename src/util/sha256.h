// SHA-256 (FIPS 180-4) and HMAC-SHA-256 (RFC 2104): the rendezvous's challenge-response proves
// that a connecting rank knows the job's secret without sending it (NOTE [rendezvous
// handshake], src/comm/store_server.cpp). Portable code; a rendezvous hashes a few hundred bytes
// per connection, so speed does not matter here.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace dscpp {

using Sha256Digest = std::array<uint8_t, 32>;

// Incremental SHA-256: update() any number of times, then finish() once.
class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  Sha256Digest finish();

 private:
  void compress(const uint8_t* block);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t buffered_ = 0;
  uint64_t total_ = 0;
};

Sha256Digest sha256(const void* data, size_t n);

// HMAC-SHA-256 of `message` under `key` (any length; keys over 64 bytes are hashed first).
Sha256Digest hmac_sha256(const std::string& key, const std::string& message);

// Compares two digests in time independent of where they differ.
bool digests_equal(const Sha256Digest& a, const Sha256Digest& b);

}  // namespace dscpp
