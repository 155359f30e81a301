// Implements StoreServer: one thread polls the listening socket and every connection
// (non-blocking), so a connection that stalls, sends garbage or never proves itself costs the
// others nothing; it owns all of the server's state. refusals() is the only other entry point
// and takes the lock.
//
// NOTE [rendezvous handshake]: a connection is admitted in three messages (store_wire.h):
//   server -> client  "DSCPP-S1", whether a proof is required, nonce_s (32 random bytes)
//   client -> server  "DSCPP-C1", nonce_c, HMAC-SHA-256(secret, "dscpp rendezvous client" | nonce_s
//                     | nonce_c)
//   server -> client  verdict (1 admitted, 0 refused), HMAC-SHA-256(secret, "dscpp rendezvous
//                     server" | nonce_s | nonce_c)
// The secret never crosses the wire; fresh nonces on both sides make every proof good for one
// connection only, and the server's proof lets a rank check that it reached its own job's
// server. Until the verdict, the server reads at most the 72 bytes of the client's message: a
// peer that sends anything else, the wrong proof, or nothing within handshake_timeout is closed,
// logged with its address and counted. Only admitted connections may read or write keys. What
// it does not do: encrypt or sign the requests that follow, so an attacker who can inject into
// an established TCP connection is not stopped (docs/launch.md, "Who can join a job").
#include "comm/store_server.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <thread>

#include "comm/store_wire.h"
#include "dscpp/error.h"
#include "util/log.h"

namespace dscpp::comm {

using Clock = std::chrono::steady_clock;
using wire::Op;
using wire::Status;

namespace {

// A value's largest size: its reply must fit a frame.
constexpr size_t kMaxValueBytes = wire::kMaxFrameBytes - 64;
constexpr int64_t kOneYearMs = int64_t{365} * 24 * 3600 * 1000;

// Printable first bytes of what a stranger sent, for the log.
std::string sample(const std::string& bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size() && i < 16; ++i) {
    unsigned char c = static_cast<unsigned char>(bytes[i]);
    if (c >= 32 && c < 127) {
      out.push_back(static_cast<char>(c));
    } else {
      char hex[5];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      out += hex;
    }
  }
  return out;
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

}  // namespace

struct StoreServer::Impl {
  struct Conn {
    int fd = -1;
    std::string peer;
    bool admitted = false;
    bool closed = false;
    Clock::time_point since;
    wire::Nonce nonce{};
    std::string in;
    std::string out;
    // A get or wait that waits for its keys.
    bool waiting = false;
    Op wait_op = Op::kWait;
    std::vector<std::string> keys;
    bool has_deadline = false;
    Clock::time_point deadline;
  };

  Options options;
  std::vector<int> listen_fds;
  bool only_loopback = true;
  int wake[2] = {-1, -1};
  int bound_port = 0;
  Clock::time_point accept_paused_until;
  std::thread thread;
  std::list<Conn> conns;
  std::map<std::string, std::string> kv;

  mutable std::mutex mu;  // guards the two below
  int64_t refused_count = 0;
  std::vector<Refusal> refusal_log;

  void listen_on_address();
  void run();
  void accept_all(int listen_fd);
  void make_room_for(const std::string& peer);
  void read_from(Conn& c);
  void check_proof(Conn& c);
  bool serve_one(Conn& c);
  void finish_waits();
  void expire(Clock::time_point now);
  void send(Conn& c, const std::string& bytes);
  void flush(Conn& c);
  void close(Conn& c) {
    if (c.fd >= 0) ::close(c.fd);
    c.fd = -1;
    c.closed = true;
  }
  void refuse(Conn& c, const std::string& why, bool tell_client);
  void reply(Conn& c, Status s, const wire::Writer& body = {});
  int poll_timeout_ms(Clock::time_point now) const;

  // Runs `f` for one connection; an exception closes that connection only (the server thread
  // must not die: rank 0 would be terminated with it).
  template <typename F>
  void guarded(Conn& c, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      DSCPP_LOG_WARN("rendezvous: closing the connection from {}: {}", c.peer, e.what());
      close(c);
    }
  }
};

// Listens on every address MASTER_ADDR resolves to here (a name may have an IPv4 and an IPv6
// address, or several interfaces); addresses this host does not hold are skipped, and none at
// all is an error.
void StoreServer::Impl::listen_on_address() {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string where =
      "port " + std::to_string(options.port) + " (MASTER_ADDR=" + options.address + ")";
  int rc =
      ::getaddrinfo(options.address.c_str(), std::to_string(options.port).c_str(), &hints, &res);
  DSCPP_CHECK(rc == 0 && res, CommError, "rank 0 could not start the rendezvous server on ", where,
              ": MASTER_ADDR does not resolve (", gai_strerror(rc),
              "). HINT: use an IP address or a host name of rank 0's host");
  int err = EADDRNOTAVAIL;
  bool in_use = false;
  for (addrinfo* a = res; a; a = a->ai_next) {
    sockaddr_storage addr{};
    std::memcpy(&addr, a->ai_addr, a->ai_addrlen);
    if (bound_port != 0) {  // port 0 (tests): every address gets the port the first one got
      if (addr.ss_family == AF_INET6) {
        reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = htons(bound_port);
      } else {
        reinterpret_cast<sockaddr_in*>(&addr)->sin_port = htons(bound_port);
      }
    }
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (a->ai_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), a->ai_addrlen) != 0 ||
        ::listen(fd, 1024) != 0) {
      err = errno;
      in_use |= err == EADDRINUSE;
      ::close(fd);
      continue;
    }
    set_nonblocking(fd);
    listen_fds.push_back(fd);
    if (a->ai_family == AF_INET6) {
      only_loopback &= IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr);
    } else {
      only_loopback &= (ntohl(reinterpret_cast<sockaddr_in*>(&addr)->sin_addr.s_addr) >> 24) == 127;
    }
    sockaddr_storage got{};
    socklen_t len = sizeof(got);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&got), &len);
    bound_port = got.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&got)->sin6_port)
                                           : ntohs(reinterpret_cast<sockaddr_in*>(&got)->sin_port);
  }
  ::freeaddrinfo(res);
  if (in_use || listen_fds.empty()) {
    for (int fd : listen_fds) ::close(fd);
    listen_fds.clear();
    DSCPP_CHECK(!in_use, CommError, "rank 0 could not start the rendezvous server on ", where,
                ": the address is in use. HINT: the port is probably in use by another "
                "job; choose a free one with 'dscpp launch --master_port N' or MASTER_PORT");
    DSCPP_CHECK(err != EADDRNOTAVAIL, CommError, "rank 0 could not start the rendezvous server on ",
                where,
                ": MASTER_ADDR is not an address of this host, and the server listens on "
                "the master address only. HINT: set MASTER_ADDR (or --master_addr) to an address "
                "of rank 0's host that every host reaches");
    DSCPP_FAIL(CommError, "rank 0 could not start the rendezvous server on ", where, ": ",
               std::strerror(err));
  }
}

void StoreServer::Impl::send(Conn& c, const std::string& bytes) {
  c.out += bytes;
  flush(c);
}

void StoreServer::Impl::flush(Conn& c) {
  while (!c.out.empty() && !c.closed) {
    ssize_t w = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      c.out.erase(0, static_cast<size_t>(w));
    } else if (w < 0 && errno == EINTR) {
      continue;
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;  // the rest goes when poll says the socket is writable
    } else {
      close(c);  // the peer is gone
    }
  }
}

void StoreServer::Impl::reply(Conn& c, Status s, const wire::Writer& body) {
  wire::Writer w;
  w.u8(static_cast<uint8_t>(s)).raw(body.payload());
  send(c, w.frame());
}

void StoreServer::Impl::refuse(Conn& c, const std::string& why, bool tell_client) {
  if (tell_client) {
    // One small write: a stranger that does not read gets nothing more.
    char verdict[wire::kVerdictBytes] = {0};
    (void)!::send(c.fd, verdict, sizeof(verdict), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  int64_t n;
  {
    std::lock_guard<std::mutex> lock(mu);
    n = ++refused_count;
    if (refusal_log.size() < 100) refusal_log.push_back({c.peer, why});
  }
  if (n <= 20 || n % 100 == 0) {
    DSCPP_LOG_WARN(
        "rendezvous: refused a connection from {}: {} ({} refused so far); the job "
        "goes on",
        c.peer, why, n);
  }
  close(c);
}

void StoreServer::Impl::accept_all(int listen_fd) {
  for (;;) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0 && errno == EINTR) continue;
    if (fd < 0) {
      // Out of descriptors: the pending connection stays queued and the socket readable, so
      // stop watching it for a moment rather than spin.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        accept_paused_until = Clock::now() + std::chrono::milliseconds(100);
      }
      return;  // EAGAIN, or a connection that went away before it was accepted
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::string peer = wire::peer_name(fd);
    make_room_for(peer);
    Conn& c = conns.emplace_back();
    c.fd = fd;
    c.peer = std::move(peer);
    c.since = Clock::now();
    c.nonce = wire::random_nonce();
    std::string hello(wire::kServerMagic, sizeof(wire::kServerMagic));
    hello.push_back(options.secret.empty() ? 0 : 1);
    hello.append(reinterpret_cast<const char*>(c.nonce.data()), c.nonce.size());
    send(c, hello);
  }
}

// With max_unproven connections unproven, closes the oldest one from the address that holds
// the most of them: a flood from one address makes room from itself, not from the ranks.
void StoreServer::Impl::make_room_for(const std::string& peer) {
  std::map<std::string, int> per_address;
  int unproven = 0;
  auto address = [](const std::string& p) { return p.substr(0, p.rfind(':')); };
  for (auto& c : conns) {
    if (c.closed || c.admitted) continue;
    ++unproven;
    ++per_address[address(c.peer)];
  }
  if (unproven < options.max_unproven) return;
  ++per_address[address(peer)];  // the newcomer counts for its address
  std::string busiest;
  int most = 0;
  for (const auto& [a, n] : per_address) {
    if (n > most) {
      busiest = a;
      most = n;
    }
  }
  for (auto& c : conns) {
    if (!c.closed && !c.admitted && address(c.peer) == busiest) {
      refuse(c,
             "too many connections from its address have not proved themselves; the oldest "
             "is closed",
             false);
      return;
    }
  }
  // The newcomer's address is the busiest and holds no other: the oldest unproven one goes.
  for (auto& c : conns) {
    if (!c.closed && !c.admitted) {
      refuse(c, "too many connections have not proved themselves; the oldest is closed", false);
      return;
    }
  }
}

void StoreServer::Impl::check_proof(Conn& c) {
  const size_t magic = sizeof(wire::kClientMagic);
  const size_t seen = std::min(c.in.size(), magic);
  if (std::memcmp(c.in.data(), wire::kClientMagic, seen) != 0) {
    refuse(c, "it is not a dscpp rank (it sent '" + sample(c.in) + "')", false);
    return;
  }
  if (c.in.size() > wire::kClientHelloBytes) {
    refuse(c, "it sent more than a proof before it was admitted", true);
    return;
  }
  if (c.in.size() < wire::kClientHelloBytes) return;
  wire::Nonce client;
  std::memcpy(client.data(), c.in.data() + magic, client.size());
  Sha256Digest proof;
  std::memcpy(proof.data(), c.in.data() + magic + client.size(), proof.size());
  if (!options.secret.empty() &&
      !digests_equal(proof, wire::client_proof(options.secret, c.nonce, client))) {
    refuse(c, "its proof is wrong (it does not hold this job's secret)", true);
    return;
  }
  c.in.clear();
  c.admitted = true;
  Sha256Digest mine{};
  if (!options.secret.empty()) mine = wire::server_proof(options.secret, c.nonce, client);
  std::string verdict(1, 1);
  verdict.append(reinterpret_cast<const char*>(mine.data()), mine.size());
  send(c, verdict);
}

void StoreServer::Impl::read_from(Conn& c) {
  char buf[65536];
  // At most this much per wake-up, so one fast sender cannot hold the thread.
  for (size_t taken = 0; taken < (4u << 20);) {
    // Until it is admitted, a connection gets no more than the handshake's bytes (plus one, to
    // see that it sent too many).
    size_t want = c.admitted ? sizeof(buf) : wire::kClientHelloBytes + 1 - c.in.size();
    ssize_t r = ::recv(c.fd, buf, want, MSG_DONTWAIT);
    if (r > 0) {
      c.in.append(buf, static_cast<size_t>(r));
      taken += static_cast<size_t>(r);
      if (!c.admitted) {
        check_proof(c);
        if (c.closed || c.admitted) return;
      }
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    // The peer closed (or the connection broke). A rank that leaves is no news; a peer that
    // leaves without proving itself is a stranger (a port scanner, a probe).
    if (!c.admitted) {
      refuse(c,
             c.in.empty() ? "it closed the connection without a word"
                          : "it closed the connection before proving itself",
             false);
    } else {
      close(c);
    }
    return;
  }
}

namespace {

// A request as read from its frame.
struct Request {
  Op op = Op::kSet;
  std::string key, value, desired;  // value: the value, or compareSet's expected one
  std::vector<std::string> keys;
  int64_t number = 0;  // add's delta, or get's and wait's timeout in ms (0: none)
};

// Reads a request; false when it is malformed (unknown op, short, or bytes left over).
bool parse(const std::string& payload, Request* q) {
  wire::Reader r(payload.data(), payload.size());
  q->op = static_cast<Op>(r.u8());
  switch (q->op) {
    case Op::kSet:
    case Op::kAppend:
      q->key = r.bytes();
      q->value = r.bytes();
      break;
    case Op::kGet:
    case Op::kAdd:
      q->key = r.bytes();
      q->number = r.i64();
      break;
    case Op::kCompareSet:
      q->key = r.bytes();
      q->value = r.bytes();
      q->desired = r.bytes();
      break;
    case Op::kDelete:
      q->key = r.bytes();
      break;
    case Op::kCheck:
    case Op::kWait: {
      const uint32_t n = r.u32();
      for (uint32_t i = 0; r.ok() && i < n; ++i) q->keys.push_back(r.bytes());
      if (q->op == Op::kWait) q->number = r.i64();
      break;
    }
    case Op::kNumKeys:
      break;
    default:
      return false;
  }
  return r.ok() && r.at_end();
}

}  // namespace

// Serves the next whole request of an admitted connection; false when there is none (or the
// connection waits for keys).
bool StoreServer::Impl::serve_one(Conn& c) {
  if (c.closed || !c.admitted || c.waiting || c.in.size() < 4) return false;
  wire::Reader head(c.in.data(), 4);
  const uint32_t n = head.u32();
  if (n > wire::kMaxFrameBytes) {
    DSCPP_LOG_WARN("rendezvous: {} sent a request of {} bytes, over the limit; closing it", c.peer,
                   n);
    close(c);
    return false;
  }
  if (c.in.size() < 4 + size_t{n}) return false;
  Request q;
  const bool ok = parse(c.in.substr(4, n), &q);
  c.in.erase(0, 4 + size_t{n});
  if (!ok) {
    DSCPP_LOG_WARN("rendezvous: {} sent a malformed request (op {}); closing it", c.peer,
                   static_cast<int>(q.op));
    close(c);
    return false;
  }
  auto has_all = [&](const std::vector<std::string>& keys) {
    return std::all_of(keys.begin(), keys.end(), [&](const auto& k) { return kv.count(k) > 0; });
  };
  wire::Writer out;
  bool changed = false;
  switch (q.op) {
    case Op::kSet:
      kv[q.key] = q.value;
      changed = true;
      break;
    case Op::kAppend: {
      std::string& v = kv[q.key];
      if (v.size() + q.value.size() > kMaxValueBytes) {
        reply(c, Status::kError,
              wire::Writer().bytes("append: the value of '" + q.key + "' would exceed " +
                                   std::to_string(kMaxValueBytes) + " bytes"));
        return true;
      }
      v += q.value;
      changed = true;
      break;
    }
    case Op::kGet:
    case Op::kWait: {
      if (q.op == Op::kGet) q.keys = {q.key};
      if (!has_all(q.keys)) {
        c.waiting = true;
        c.wait_op = q.op;
        c.keys = std::move(q.keys);
        // A limit beyond a year is no limit (and cannot overflow the clock).
        c.has_deadline = q.number > 0 && q.number < kOneYearMs;
        if (c.has_deadline) c.deadline = Clock::now() + std::chrono::milliseconds(q.number);
        return true;
      }
      if (q.op == Op::kGet) out.bytes(kv[q.key]);
      break;
    }
    case Op::kAdd: {
      int64_t value = 0;
      if (auto it = kv.find(q.key); it != kv.end()) {
        size_t used = 0;
        try {
          value = std::stoll(it->second, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != it->second.size()) {
          reply(c, Status::kError,
                wire::Writer().bytes("add: the value of '" + q.key + "' is not a number"));
          return true;
        }
      }
      if (__builtin_add_overflow(value, q.number, &value)) {
        reply(c, Status::kError,
              wire::Writer().bytes("add: the value of '" + q.key + "' would overflow"));
        return true;
      }
      kv[q.key] = std::to_string(value);
      out.i64(value);
      changed = true;
      break;
    }
    case Op::kCompareSet: {
      // c10d's rule: a missing key is set only when `expected` is empty; the reply is the value
      // now (or `expected` when the key is missing and stays so).
      auto it = kv.find(q.key);
      if (it == kv.end()) {
        if (q.value.empty()) {
          kv[q.key] = q.desired;
          changed = true;
        }
        out.bytes(q.value.empty() ? q.desired : q.value);
      } else {
        if (it->second == q.value) {
          it->second = q.desired;
          changed = true;
        }
        out.bytes(it->second);
      }
      break;
    }
    case Op::kCheck:
      out.u8(has_all(q.keys) ? 1 : 0);
      break;
    case Op::kDelete:
      out.u8(kv.erase(q.key) ? 1 : 0);
      break;
    case Op::kNumKeys:
      out.i64(static_cast<int64_t>(kv.size()));
      break;
  }
  reply(c, Status::kOk, out);
  if (changed) finish_waits();
  return true;
}

void StoreServer::Impl::finish_waits() {
  for (auto& c : conns) {
    if (c.closed || !c.waiting) continue;
    bool all = true;
    for (const auto& k : c.keys) all &= kv.count(k) > 0;
    if (!all) continue;
    c.waiting = false;
    wire::Writer out;
    if (c.wait_op == Op::kGet) out.bytes(kv[c.keys[0]]);
    reply(c, Status::kOk, out);
  }
}

void StoreServer::Impl::expire(Clock::time_point now) {
  for (auto& c : conns) {
    if (c.closed) continue;
    if (!c.admitted && now - c.since >= options.handshake_timeout) {
      refuse(c,
             fmt::format("it did not prove itself within {:.1f} s",
                         options.handshake_timeout.count() / 1000.0),
             false);
    } else if (c.waiting && c.has_deadline && now >= c.deadline) {
      c.waiting = false;
      reply(c, Status::kTimeout);
    }
  }
}

int StoreServer::Impl::poll_timeout_ms(Clock::time_point now) const {
  auto next = Clock::time_point::max();
  for (const auto& c : conns) {
    if (c.closed) continue;
    if (!c.admitted) next = std::min(next, c.since + options.handshake_timeout);
    if (c.waiting && c.has_deadline) next = std::min(next, c.deadline);
  }
  if (next == Clock::time_point::max()) return -1;
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count() + 1;
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 1 << 30));
}

void StoreServer::Impl::run() {
  std::vector<pollfd> fds;
  std::vector<Conn*> owners;
  for (;;) {
    fds.clear();
    owners.clear();
    fds.push_back({wake[0], POLLIN, 0});
    const bool accepting = Clock::now() >= accept_paused_until;
    for (int fd : listen_fds) fds.push_back({accepting ? fd : -1, POLLIN, 0});
    const size_t first_conn = fds.size();
    for (auto& c : conns) {
      short events = POLLIN;
      if (!c.out.empty()) events |= POLLOUT;
      fds.push_back({c.fd, events, 0});
      owners.push_back(&c);
    }
    int timeout_ms = poll_timeout_ms(Clock::now());
    if (!accepting) timeout_ms = timeout_ms < 0 ? 100 : std::min(timeout_ms, 100);
    int rc = ::poll(fds.data(), fds.size(), timeout_ms);
    if (rc < 0 && errno != EINTR) {
      DSCPP_LOG_ERROR("rendezvous server: poll failed: {}", std::strerror(errno));
      return;
    }
    if (rc > 0 && fds[0].revents) return;  // the destructor asks us to stop
    for (size_t i = 1; rc > 0 && i < first_conn; ++i) {
      if (!fds[i].revents) continue;
      try {
        accept_all(fds[i].fd);
      } catch (const std::exception& e) {
        DSCPP_LOG_WARN("rendezvous: accepting a connection failed: {}", e.what());
      }
    }
    for (size_t i = 0; rc > 0 && i < owners.size(); ++i) {
      Conn& c = *owners[i];
      const short ev = fds[i + first_conn].revents;
      if (c.closed || !ev) continue;
      guarded(c, [&] {
        if (ev & POLLOUT) flush(c);
        if (!c.closed && (ev & (POLLIN | POLLHUP | POLLERR))) read_from(c);
      });
    }
    for (bool progress = true; progress;) {
      progress = false;
      for (auto& c : conns) guarded(c, [&] { progress |= serve_one(c); });
    }
    expire(Clock::now());
    conns.remove_if([](const Conn& c) { return c.closed; });
  }
}

StoreServer::StoreServer(Options options) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  DSCPP_CHECK(impl_->options.max_unproven >= 1, CommError,
              "StoreServer::Options::max_unproven must be at least 1");
  impl_->listen_on_address();
  if (::pipe2(impl_->wake, O_CLOEXEC) != 0) {
    for (int fd : impl_->listen_fds) ::close(fd);
    DSCPP_FAIL(CommError, "rendezvous server: pipe failed: ", std::strerror(errno));
  }
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

StoreServer::~StoreServer() {
  const char stop = 1;
  (void)!::write(impl_->wake[1], &stop, 1);
  impl_->thread.join();
  for (auto& c : impl_->conns) impl_->close(c);
  for (int fd : impl_->listen_fds) ::close(fd);
  ::close(impl_->wake[0]);
  ::close(impl_->wake[1]);
}

int StoreServer::port() const { return impl_->bound_port; }

bool StoreServer::listens_on_loopback_only() const { return impl_->only_loopback; }

int64_t StoreServer::refused() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->refused_count;
}

std::vector<StoreServer::Refusal> StoreServer::refusals() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->refusal_log;
}

}  // namespace dscpp::comm
