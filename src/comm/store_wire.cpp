// The rendezvous store's framing, proofs and blocking socket helpers (store_wire.h).
#include "comm/store_wire.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dscpp/error.h"

namespace dscpp::comm::wire {
namespace {

Sha256Digest proof(const char* role, const std::string& secret, const Nonce& server,
                   const Nonce& client) {
  std::string msg = role;
  msg.append(reinterpret_cast<const char*>(server.data()), server.size());
  msg.append(reinterpret_cast<const char*>(client.data()), client.size());
  return hmac_sha256(secret, msg);
}

int remaining_ms(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  if (left.count() <= 0) return 0;
  return left.count() > (1 << 30) ? (1 << 30) : static_cast<int>(left.count());
}

// Waits until `fd` is ready for `events`; false once the deadline has passed.
bool wait_ready(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int ms = remaining_ms(deadline);
    int rc = ::poll(&p, 1, ms);
    if (rc > 0) return true;
    if (rc == 0) {
      errno = ETIMEDOUT;
      return false;
    }
    if (errno != EINTR) return false;
  }
}

}  // namespace

Sha256Digest client_proof(const std::string& secret, const Nonce& server, const Nonce& client) {
  return proof("dscpp rendezvous client", secret, server, client);
}

Sha256Digest server_proof(const std::string& secret, const Nonce& server, const Nonce& client) {
  return proof("dscpp rendezvous server", secret, server, client);
}

Nonce random_nonce() {
  Nonce n;
  size_t got = 0;
  while (got < n.size()) {
    ssize_t r = ::getrandom(n.data() + got, n.size() - got, 0);
    if (r < 0 && errno == EINTR) continue;
    DSCPP_CHECK(r > 0, CommError, "getrandom failed: ", std::strerror(errno));
    got += static_cast<size_t>(r);
  }
  return n;
}

Writer& Writer::u8(uint8_t v) {
  out_.push_back(static_cast<char>(v));
  return *this;
}

Writer& Writer::u32(uint32_t v) {
  for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>(v >> (8 * i)));
  return *this;
}

Writer& Writer::i64(int64_t v) {
  const auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>(u >> (8 * i)));
  return *this;
}

Writer& Writer::bytes(const std::string& s) {
  u32(static_cast<uint32_t>(s.size()));
  out_ += s;
  return *this;
}

Writer& Writer::bytes(const std::vector<uint8_t>& v) {
  u32(static_cast<uint32_t>(v.size()));
  out_.append(v.begin(), v.end());
  return *this;
}

Writer& Writer::raw(const std::string& s) {
  out_ += s;
  return *this;
}

std::string Writer::frame() const {
  DSCPP_CHECK(out_.size() <= kMaxFrameBytes, CommError, "a rendezvous store message of ",
              out_.size(), " bytes is over the limit of ", kMaxFrameBytes,
              " bytes. HINT: the store holds small values (addresses, names); keep keys and values "
              "small");
  Writer w;
  w.u32(static_cast<uint32_t>(out_.size()));
  return w.out_ + out_;
}

bool Reader::take(void* out, size_t n) {
  if (!ok_ || static_cast<size_t>(end_ - p_) < n) {
    ok_ = false;
    return false;
  }
  std::memcpy(out, p_, n);
  p_ += n;
  return true;
}

uint8_t Reader::u8() {
  uint8_t v = 0;
  take(&v, 1);
  return v;
}

uint32_t Reader::u32() {
  uint8_t b[4] = {0, 0, 0, 0};
  take(b, 4);
  return uint32_t{b[0]} | uint32_t{b[1]} << 8 | uint32_t{b[2]} << 16 | uint32_t{b[3]} << 24;
}

int64_t Reader::i64() {
  uint8_t b[8] = {0};
  take(b, 8);
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{b[i]} << (8 * i);
  return static_cast<int64_t>(v);
}

std::string Reader::bytes() {
  uint32_t n = u32();
  if (!ok_ || static_cast<size_t>(end_ - p_) < n) {
    ok_ = false;
    return {};
  }
  std::string s(p_, n);
  p_ += n;
  return s;
}

bool send_all(int fd, const void* data, size_t n, Deadline deadline) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_ready(fd, POLLOUT, deadline)) return false;
      continue;
    }
    return false;
  }
  return true;
}

bool recv_all(int fd, void* data, size_t n, Deadline deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (r == 0) {
      errno = 0;
      return false;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_ready(fd, POLLIN, deadline)) return false;
      continue;
    }
    return false;
  }
  return true;
}

std::string peer_name(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "an unknown peer";
  char host[INET6_ADDRSTRLEN] = {0};
  int port = 0;
  if (addr.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  if (addr.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
    return "[" + std::string(host) + "]:" + std::to_string(port);
  }
  return "an unknown peer";
}

}  // namespace dscpp::comm::wire
