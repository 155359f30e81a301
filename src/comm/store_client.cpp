// Implements StoreClient: connecting with retries, the client's half of NOTE [rendezvous
// handshake] (store_server.cpp), and one request/reply per call under the lock.
#include "comm/store_client.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "comm/store_wire.h"
#include "dscpp/error.h"

namespace dscpp::comm {

using Clock = std::chrono::steady_clock;
using wire::Op;
using wire::Status;

namespace {

// A little longer than the limit it gives the server: the server answers a timed-out wait
// itself; the client gives up only when the server does not answer at all.
constexpr auto kReplyGrace = std::chrono::seconds(30);

// A socket connected to one of the addresses host:port resolves to (in the resolver's order),
// or -1 with `why` set.
int connect_once(const std::string& host, int port, Clock::time_point deadline, std::string* why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0 || !res) {
    *why = std::string("the address does not resolve: ") + gai_strerror(rc);
    return -1;
  }
  int connected = -1;
  for (addrinfo* a = res; a && connected < 0; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      *why = std::strerror(errno);
      continue;
    }
    rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      rc = ::poll(&p, 1, static_cast<int>(std::clamp<int64_t>(ms.count(), 0, 1 << 30)));
      int err = ETIMEDOUT;
      if (rc > 0) {
        socklen_t len = sizeof(err);
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      }
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc != 0) {
      *why = std::strerror(errno);
      ::close(fd);
      continue;
    }
    connected = fd;
  }
  ::freeaddrinfo(res);
  if (connected >= 0) {
    int one = 1;
    ::setsockopt(connected, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  return connected;
}

std::vector<uint8_t> to_vec(const std::string& s) { return {s.begin(), s.end()}; }

wire::Writer request(Op op) {
  wire::Writer w;
  w.u8(static_cast<uint8_t>(op));
  return w;
}

wire::Writer& keys(wire::Writer& w, const std::vector<std::string>& ks) {
  w.u32(static_cast<uint32_t>(ks.size()));
  for (const auto& k : ks) w.bytes(k);
  return w;
}

}  // namespace

StoreClient::StoreClient(Options options, std::shared_ptr<StoreServer> server)
    : options_(std::move(options)), server_(std::move(server)) {
  connect();
}

StoreClient::~StoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

void StoreClient::connect() {
  const std::string where = options_.host + ":" + std::to_string(options_.port);
  const auto t0 = Clock::now();
  const auto deadline = t0 + options_.connect_timeout;
  auto fail = [&](const std::string& what, const std::string& hint) {
    DSCPP_FAIL(CommError, "rank ", options_.rank, ": the rendezvous server at ", where, " ", what,
               ". HINT: ", hint);
  };
  std::string last = "nothing tried";
  for (auto pause = std::chrono::milliseconds(50);;
       pause = std::min(pause * 2, std::chrono::milliseconds(1000))) {
    if (Clock::now() >= deadline) {
      DSCPP_FAIL(CommError, "rank ", options_.rank, " could not reach the master at ", where,
                 server_ ? " (its own rendezvous server)" : "", " after trying for ",
                 std::chrono::duration<double>(Clock::now() - t0).count(), " s: ", last,
                 ". HINT: check that rank 0 is running, that MASTER_ADDR=", options_.host,
                 " is an address of rank 0's host that this host can reach, and that no firewall "
                 "blocks port ",
                 options_.port, " ('dscpp check --hostfile ...' tests this from every host)");
    }
    int fd = connect_once(options_.host, options_.port,
                          std::min(deadline, Clock::now() + std::chrono::seconds(5)), &last);
    if (fd < 0) {
      std::this_thread::sleep_for(pause);
      continue;
    }
    // NOTE [rendezvous handshake] (store_server.cpp), the client's half.
    const auto step_deadline = std::min(deadline, Clock::now() + kReplyGrace);
    char hello[wire::kServerHelloBytes];
    if (!wire::recv_all(fd, hello, sizeof(hello), step_deadline)) {
      last = "the connection closed before the server greeted this rank";
      ::close(fd);
      std::this_thread::sleep_for(pause);
      continue;
    }
    if (std::memcmp(hello, wire::kServerMagic, sizeof(wire::kServerMagic)) != 0) {
      ::close(fd);
      fail("is not a dscpp rendezvous server (another program answers on that port)",
           "choose a free port with 'dscpp launch --master_port N' or MASTER_PORT");
    }
    const bool proof_required = hello[8] != 0;
    if (proof_required && options_.secret.empty()) {
      ::close(fd);
      fail("asks for the job's secret, and this rank has none",
           "start every rank with one 'dscpp launch', or give every rank the same "
           "DSCPP_RENDEZVOUS_SECRET (or DSCPP_RENDEZVOUS_SECRET_FILE)");
    }
    if (!proof_required && !options_.secret.empty()) {
      ::close(fd);
      fail("does not ask for a secret, but this rank has one: rank 0 was started without it",
           "give every rank the same DSCPP_RENDEZVOUS_SECRET (or DSCPP_RENDEZVOUS_SECRET_FILE), "
           "or none");
    }
    wire::Nonce server_nonce;
    std::memcpy(server_nonce.data(), hello + 9, server_nonce.size());
    const wire::Nonce nonce = wire::random_nonce();
    Sha256Digest proof{};
    if (proof_required) proof = wire::client_proof(options_.secret, server_nonce, nonce);
    std::string mine(wire::kClientMagic, sizeof(wire::kClientMagic));
    mine.append(reinterpret_cast<const char*>(nonce.data()), nonce.size());
    mine.append(reinterpret_cast<const char*>(proof.data()), proof.size());
    uint8_t verdict[wire::kVerdictBytes];
    if (!wire::send_all(fd, mine.data(), mine.size(), step_deadline) ||
        !wire::recv_all(fd, verdict, sizeof(verdict), step_deadline)) {
      // Closed without a verdict: the server dropped it among too many unproven connections.
      last = "the server closed the connection during the handshake";
      ::close(fd);
      std::this_thread::sleep_for(pause);
      continue;
    }
    if (verdict[0] != 1) {
      ::close(fd);
      fail("refused this rank: its secret is not this job's",
           "every rank of a job must come from the same 'dscpp launch' (or hold the same "
           "DSCPP_RENDEZVOUS_SECRET); a rank of another job may be using this master address and "
           "port");
    }
    Sha256Digest theirs;
    std::memcpy(theirs.data(), verdict + 1, theirs.size());
    if (proof_required &&
        !digests_equal(theirs, wire::server_proof(options_.secret, server_nonce, nonce))) {
      ::close(fd);
      fail("could not prove that it holds this job's secret: it is not this job's server",
           "another job's rank 0 may listen on this master address and port; choose another "
           "with 'dscpp launch --master_port N'");
    }
    fd_ = fd;
    return;
  }
}

std::string StoreClient::call(const std::string& frame, std::chrono::milliseconds timeout,
                              const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string where = options_.host + ":" + std::to_string(options_.port);
  // A limit beyond a year is no limit (and cannot overflow the clock).
  const bool limited = timeout.count() > 0 && timeout < std::chrono::hours(24 * 365);
  const auto deadline = limited ? Clock::now() + timeout + kReplyGrace : Clock::time_point::max();
  // Any failure below leaves the stream in an unknown place (half a request or reply): the
  // connection is closed, so no later call reads another call's reply.
  auto drop = [&] {
    ::close(fd_);
    fd_ = -1;
  };
  auto lost = [&] {
    const int err = errno;
    drop();
    DSCPP_FAIL(CommError, "rank ", options_.rank,
               " lost its connection to the rendezvous server at ", where, " during ", what, " (",
               err ? std::strerror(err) : "closed by the server",
               "). HINT: rank 0, which runs the server, has exited or its host is gone; look at "
               "rank 0's output");
  };
  DSCPP_CHECK(fd_ >= 0, CommError, "rank ", options_.rank,
              ": the connection to the rendezvous "
              "server at ",
              where, " was closed by an earlier failure");
  if (!wire::send_all(fd_, frame.data(), frame.size(), deadline)) lost();
  uint8_t head[4];
  if (!wire::recv_all(fd_, head, sizeof(head), deadline)) lost();
  wire::Reader r(reinterpret_cast<const char*>(head), sizeof(head));
  const uint32_t n = r.u32();
  if (n < 1 || n > wire::kMaxFrameBytes) {
    drop();
    DSCPP_FAIL(CommError, "rank ", options_.rank, ": the rendezvous server at ", where,
               " sent a reply of ", n, " bytes to ", what);
  }
  std::string body(n, '\0');
  if (!wire::recv_all(fd_, body.data(), n, deadline)) lost();
  const auto status = static_cast<Status>(body[0]);
  if (status == Status::kTimeout) {
    DSCPP_FAIL(CommTimeout, "rank ", options_.rank, ": ", what, " in the rendezvous store at ",
               where, " timed out after ", timeout.count() / 1000.0, " s");
  }
  if (status != Status::kOk) {
    wire::Reader e(body.data() + 1, body.size() - 1);
    DSCPP_FAIL(CommError, "rank ", options_.rank, ": the rendezvous store at ", where, " refused ",
               what, ": ", e.bytes());
  }
  return body.substr(1);
}

c10::intrusive_ptr<c10d::Store> StoreClient::clone() {
  auto other = c10::make_intrusive<StoreClient>(options_, server_);
  other->setTimeout(timeout_);
  return other;
}

void StoreClient::set(const std::string& key, const std::vector<uint8_t>& value) {
  call(request(Op::kSet).bytes(key).bytes(value).frame(), timeout_, "set '" + key + "'");
}

std::vector<uint8_t> StoreClient::compareSet(const std::string& key,
                                             const std::vector<uint8_t>& expected,
                                             const std::vector<uint8_t>& desired) {
  std::string body =
      call(request(Op::kCompareSet).bytes(key).bytes(expected).bytes(desired).frame(), timeout_,
           "compareSet '" + key + "'");
  wire::Reader r(body.data(), body.size());
  return to_vec(r.bytes());
}

std::vector<uint8_t> StoreClient::get(const std::string& key) {
  std::string body = call(request(Op::kGet).bytes(key).i64(timeout_.count()).frame(), timeout_,
                          "get '" + key + "'");
  wire::Reader r(body.data(), body.size());
  return to_vec(r.bytes());
}

int64_t StoreClient::add(const std::string& key, int64_t value) {
  std::string body =
      call(request(Op::kAdd).bytes(key).i64(value).frame(), timeout_, "add '" + key + "'");
  wire::Reader r(body.data(), body.size());
  return r.i64();
}

bool StoreClient::deleteKey(const std::string& key) {
  std::string body =
      call(request(Op::kDelete).bytes(key).frame(), timeout_, "delete '" + key + "'");
  return !body.empty() && body[0] == 1;
}

bool StoreClient::check(const std::vector<std::string>& ks) {
  auto w = request(Op::kCheck);
  std::string body = call(keys(w, ks).frame(), timeout_, "check");
  return !body.empty() && body[0] == 1;
}

int64_t StoreClient::getNumKeys() {
  std::string body = call(request(Op::kNumKeys).frame(), timeout_, "getNumKeys");
  wire::Reader r(body.data(), body.size());
  return r.i64();
}

void StoreClient::wait(const std::vector<std::string>& ks) { wait(ks, timeout_); }

void StoreClient::wait(const std::vector<std::string>& ks,
                       const std::chrono::milliseconds& timeout) {
  auto w = request(Op::kWait);
  keys(w, ks).i64(timeout.count());
  std::string what = "wait for";
  for (size_t i = 0; i < ks.size() && i < 4; ++i) what += " '" + ks[i] + "'";
  if (ks.size() > 4) what += " and " + std::to_string(ks.size() - 4) + " more";
  call(w.frame(), timeout, what);
}

void StoreClient::append(const std::string& key, const std::vector<uint8_t>& value) {
  call(request(Op::kAppend).bytes(key).bytes(value).frame(), timeout_, "append '" + key + "'");
}

}  // namespace dscpp::comm
