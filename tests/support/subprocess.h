// Test helpers for running a command line through /bin/sh and capturing its exit status,
// combined output and wall time, and for finding a free TCP port.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>

namespace dscpp::testing {

struct RunResult {
  int status = -1;  // exit status, or 128 + signal
  std::string output;
  double seconds = 0;
};

inline RunResult run_command(const std::string& cmd) {
  RunResult r;
  auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// Whether a TCP port can be bound on every address right now.
inline bool port_is_free(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(port));
  bool free = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(fd);
  return free;
}

// A port that was free a moment ago, chosen at random below the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range): a port from that range can be taken, between the
// choice and a server's bind, as the local end of any outgoing connection of a test running
// beside this one (a rank's Gloo connections, say). Where the range leaves no room below it,
// the kernel's choice for port 0.
inline int free_port() {
  static std::mt19937 pick(std::random_device{}());
  int low = 32768, high = 60999;
  if (FILE* f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (fscanf(f, "%d %d", &low, &high) != 2) low = 32768;
    fclose(f);
  }
  if (low > 11000) {
    std::uniform_int_distribution<int> port(10000, low - 1);
    for (int tries = 0; tries < 1000; ++tries) {
      int p = port(pick);
      if (port_is_free(p)) return p;
    }
  }
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

}  // namespace dscpp::testing
