// The rendezvous store (comm/store_server.h, comm/store_client.h): c10d's Store semantics over
// an admitted connection; the handshake that admits only holders of the job's secret (NOTE
// [rendezvous handshake]); strangers (garbage, a wrong proof, silence, a flood of silent
// connections, a server that cannot prove itself) refused, logged with their address and unable
// to hold the job up beyond the handshake's limit; and the server listening on its address only.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/store_client.h"
#include "comm/store_server.h"
#include "comm/store_wire.h"
#include "dscpp/error.h"

namespace dscpp::comm {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

const std::string kSecret = "0123456789abcdef0123456789abcdef";

std::shared_ptr<StoreServer> server(const std::string& secret = kSecret,
                                    std::chrono::milliseconds handshake = 5000ms,
                                    int max_unproven = 64) {
  StoreServer::Options o;
  o.address = "127.0.0.1";
  o.secret = secret;
  o.handshake_timeout = handshake;
  o.max_unproven = max_unproven;
  return std::make_shared<StoreServer>(o);
}

c10::intrusive_ptr<StoreClient> client(int port, const std::string& secret = kSecret,
                                       std::chrono::milliseconds connect = 10000ms) {
  StoreClient::Options o;
  o.host = "127.0.0.1";
  o.port = port;
  o.secret = secret;
  o.connect_timeout = connect;
  o.rank = 3;
  auto c = c10::make_intrusive<StoreClient>(o);
  c->setTimeout(10000ms);
  return c;
}

// A raw TCP connection to 127.0.0.1:port, or -1.
int raw_connect(int port, const char* address = "127.0.0.1") {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, address, &a.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// True when the server closes `fd` within `limit` (reads until end of stream).
bool closed_within(int fd, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  char buf[256];
  for (;;) {
    if (!wire::recv_all(fd, buf, 1, deadline)) {
      // The end of the stream, or a reset (the server closed with bytes of ours unread).
      return errno == 0 || errno == ECONNRESET;
    }
  }
}

std::string str(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }
std::vector<uint8_t> vec(const std::string& s) { return {s.begin(), s.end()}; }

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(RendezvousStore, HasC10dStoreSemantics) {
  auto srv = server();
  auto a = client(srv->port());
  auto b = client(srv->port());
  a->set("k", vec("v1"));
  EXPECT_EQ(str(b->get("k")), "v1");
  EXPECT_EQ(a->add("n", 5), 5);
  EXPECT_EQ(b->add("n", -2), 3);
  EXPECT_EQ(str(a->get("n")), "3");  // counters are decimal text, as in c10d's stores
  EXPECT_TRUE(a->check({"k", "n"}));
  EXPECT_FALSE(a->check({"k", "missing"}));
  EXPECT_EQ(a->getNumKeys(), 2);
  // compareSet: c10d's rule for a missing key, then a match and a mismatch.
  EXPECT_EQ(str(a->compareSet("c", vec("x"), vec("y"))), "x");
  EXPECT_FALSE(a->check({"c"}));
  EXPECT_EQ(str(a->compareSet("c", {}, vec("first"))), "first");
  EXPECT_EQ(str(a->compareSet("c", vec("first"), vec("second"))), "second");
  EXPECT_EQ(str(a->compareSet("c", vec("first"), vec("third"))), "second");
  a->append("log", vec("ab"));
  b->append("log", vec("cd"));
  EXPECT_EQ(str(a->get("log")), "abcd");
  EXPECT_TRUE(a->deleteKey("log"));
  EXPECT_FALSE(a->deleteKey("log"));
  EXPECT_NE(error_of([&] { a->add("k", 1); }).find("not a number"), std::string::npos);
  a->add("big_counter", INT64_MAX - 1);
  EXPECT_NE(error_of([&] { a->add("big_counter", 2); }).find("would overflow"), std::string::npos);
  EXPECT_EQ(a->add("big_counter", 0), INT64_MAX - 1);  // the connection serves on
  a->deleteKey("big_counter");
  // Large values pass whole.
  std::string big(3 << 20, 'z');
  a->set("big", vec(big));
  EXPECT_EQ(b->get("big").size(), big.size());
}

TEST(RendezvousStore, GetAndWaitBlockUntilAnotherClientSetsTheKeys) {
  auto srv = server();
  auto a = client(srv->port());
  auto b = client(srv->port());
  std::thread setter([&] {
    std::this_thread::sleep_for(200ms);
    b->set("late", vec("here"));
    std::this_thread::sleep_for(100ms);
    b->set("later", vec("too"));
  });
  const auto t0 = Clock::now();
  EXPECT_EQ(str(a->get("late")), "here");
  a->wait({"late", "later"});
  EXPECT_GE(Clock::now() - t0, 250ms);
  setter.join();
  // The clone is a second connection for another thread, to the same keys.
  auto c = a->clone();
  EXPECT_EQ(str(c->get("later")), "too");
}

TEST(RendezvousStore, TimedOutGetAndWaitThrowCommTimeout) {
  auto srv = server();
  auto a = client(srv->port());
  a->setTimeout(300ms);
  const auto t0 = Clock::now();
  EXPECT_THROW(a->get("never"), CommTimeout);
  EXPECT_THROW(a->wait({"never"}, 200ms), CommTimeout);
  EXPECT_LT(Clock::now() - t0, 5s);
  // The connection still serves after a timeout.
  a->set("after", vec("ok"));
  EXPECT_EQ(str(a->get("after")), "ok");
}

TEST(RendezvousStore, ClientsWithoutTheSecretAreRefusedWithTheReason) {
  auto srv = server();
  std::string wrong = error_of([&] { client(srv->port(), "another-secret-of-16+"); });
  EXPECT_TRUE(contains(wrong, "rank 3: the rendezvous server at 127.0.0.1:")) << wrong;
  EXPECT_TRUE(contains(wrong, "refused this rank: its secret is not this job's")) << wrong;
  std::string none = error_of([&] { client(srv->port(), ""); });
  EXPECT_TRUE(contains(none, "asks for the job's secret, and this rank has none")) << none;
  EXPECT_TRUE(contains(none, "DSCPP_RENDEZVOUS_SECRET")) << none;
  auto open = server("");
  std::string extra = error_of([&] { client(open->port(), kSecret); });
  EXPECT_TRUE(contains(extra, "does not ask for a secret, but this rank has one")) << extra;
  // Without a secret on either side, a connection is admitted (a job not started by the launcher).
  auto c = client(open->port(), "");
  c->set("k", vec("v"));
  EXPECT_EQ(str(c->get("k")), "v");
  // Rank 0's side: the wrong proof, and the secretless rank that left without one.
  for (int i = 0; i < 100 && srv->refused() < 2; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(srv->refused(), 2);
  EXPECT_TRUE(contains(srv->refusals()[0].why, "proof is wrong")) << srv->refusals()[0].why;
  EXPECT_TRUE(contains(srv->refusals()[1].why, "closed the connection")) << srv->refusals()[1].why;
  EXPECT_TRUE(contains(srv->refusals()[0].peer, "127.0.0.1:")) << srv->refusals()[0].peer;
}

TEST(RendezvousStore, StrangersAreRefusedLoggedAndCannotTouchKeys) {
  auto srv = server(kSecret, 400ms);
  auto rank = client(srv->port());
  rank->set("job", vec("ours"));
  // 1. Garbage: an HTTP request.
  int fd = raw_connect(srv->port());
  ASSERT_GE(fd, 0);
  const std::string http = "GET / HTTP/1.0\r\n\r\n";
  ASSERT_EQ(::send(fd, http.data(), http.size(), 0), static_cast<ssize_t>(http.size()));
  EXPECT_TRUE(closed_within(fd, 2000ms));
  ::close(fd);
  // 2. The right magic with a wrong proof, followed by a request to set a key.
  fd = raw_connect(srv->port());
  char hello[wire::kServerHelloBytes];
  ASSERT_TRUE(wire::recv_all(fd, hello, sizeof(hello), Clock::now() + 2s));
  EXPECT_EQ(hello[8], 1) << "the server asks for a proof";
  std::string forged(wire::kClientMagic, sizeof(wire::kClientMagic));
  forged += std::string(64, '\x42');
  forged += wire::Writer().u8(1).bytes("job").bytes("theirs").frame();
  ASSERT_EQ(::send(fd, forged.data(), forged.size(), 0), static_cast<ssize_t>(forged.size()));
  EXPECT_TRUE(closed_within(fd, 2000ms));
  ::close(fd);
  // 3. Silence: closed after the handshake's limit.
  fd = raw_connect(srv->port());
  const auto t0 = Clock::now();
  EXPECT_TRUE(closed_within(fd, 3000ms));
  EXPECT_GE(Clock::now() - t0, 350ms);
  ::close(fd);
  // 4. A port scan: connect and leave.
  ::close(raw_connect(srv->port()));
  for (int i = 0; i < 100 && srv->refused() < 4; ++i) std::this_thread::sleep_for(20ms);

  EXPECT_EQ(str(rank->get("job")), "ours");
  EXPECT_EQ(rank->getNumKeys(), 1);
  ASSERT_EQ(srv->refused(), 4);
  auto why = srv->refusals();
  EXPECT_TRUE(contains(why[0].why, "not a dscpp rank (it sent 'GET / HTTP/1.0\\x0d")) << why[0].why;
  EXPECT_TRUE(contains(why[1].why, "sent more than a proof") ||
              contains(why[1].why, "proof is wrong"))
      << why[1].why;
  EXPECT_TRUE(contains(why[2].why, "did not prove itself within 0.4 s")) << why[2].why;
  EXPECT_TRUE(contains(why[3].why, "closed the connection")) << why[3].why;
  for (const auto& r : why) EXPECT_TRUE(contains(r.peer, "127.0.0.1:")) << r.peer;
}

TEST(RendezvousStore, AFloodOfSilentConnectionsDelaysARankOnlyBriefly) {
  // 40 silent strangers hold every unproven place (8) over and over; ranks still join and work.
  auto srv = server(kSecret, 2000ms, /*max_unproven=*/8);
  std::vector<int> strangers;
  for (int i = 0; i < 40; ++i) strangers.push_back(raw_connect(srv->port()));
  const auto t0 = Clock::now();
  auto a = client(srv->port());
  auto b = client(srv->port());
  a->set("x", vec("1"));
  EXPECT_EQ(str(b->get("x")), "1");
  EXPECT_LT(Clock::now() - t0, 3s);
  for (int fd : strangers) ::close(fd);
  EXPECT_GE(srv->refused(), 32);
}

TEST(RendezvousStore, ListensOnTheMasterAddressOnly) {
  auto srv = server();
  // 127.0.0.2 is this host too (all of 127/8 is loopback), but not the address listened on.
  EXPECT_EQ(raw_connect(srv->port(), "127.0.0.2"), -1);
  int fd = raw_connect(srv->port(), "127.0.0.1");
  EXPECT_GE(fd, 0);
  ::close(fd);
  StoreServer::Options o;
  o.address = "192.0.2.1";  // reserved for documentation: never an address of this host
  std::string msg = error_of([&] { StoreServer s(o); });
  EXPECT_TRUE(contains(msg, "MASTER_ADDR is not an address of this host")) << msg;
  o.address = "127.0.0.1";
  o.port = srv->port();
  msg = error_of([&] { StoreServer s(o); });
  EXPECT_TRUE(
      contains(msg, "could not start the rendezvous server on port " + std::to_string(srv->port())))
      << msg;
  EXPECT_TRUE(contains(msg, "--master_port")) << msg;
}

TEST(RendezvousStore, AServerThatCannotProveTheSecretIsNotTrusted) {
  // A fake server that greets like ours and admits anyone with a made-up proof.
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(lfd, 4), 0);
  socklen_t len = sizeof(a);
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
  std::thread fake([lfd] {
    int fd = ::accept(lfd, nullptr, nullptr);
    std::string hello(wire::kServerMagic, sizeof(wire::kServerMagic));
    hello.push_back('\x01');
    hello.append(32, '\x07');
    (void)!::send(fd, hello.data(), hello.size(), 0);
    char theirs[wire::kClientHelloBytes];
    wire::recv_all(fd, theirs, sizeof(theirs), Clock::now() + 5s);
    std::string verdict(1, '\x01');
    verdict.append(32, '\x09');
    (void)!::send(fd, verdict.data(), verdict.size(), 0);
    std::this_thread::sleep_for(200ms);
    ::close(fd);
  });
  std::string msg = error_of([&] { client(ntohs(a.sin_port)); });
  fake.join();
  ::close(lfd);
  EXPECT_TRUE(contains(msg, "could not prove that it holds this job's secret")) << msg;
}

TEST(RendezvousStore, ALostServerIsNamed) {
  auto srv = server();
  auto a = client(srv->port());
  srv.reset();  // the client holds no reference: the server stops
  std::string msg = error_of([&] { a->get("k"); });
  EXPECT_TRUE(contains(msg, "rank 3 lost its connection to the rendezvous server at 127.0.0.1:"))
      << msg;
  // The broken connection is closed: a later call cannot read an earlier call's reply.
  msg = error_of([&] { a->check({"k"}); });
  EXPECT_TRUE(contains(msg, "was closed by an earlier failure")) << msg;
}

}  // namespace
}  // namespace dscpp::comm
