// The job's rendezvous secret (issue 32): `dscpp launch` makes one per start of a job and hands
// it only to the ranks it starts (their environment; over the node agents' stdin to other
// hosts, never on a command line); every rank proves it to the rendezvous server (NOTE
// [rendezvous handshake], store_server.cpp). A job started some other way may set the same
// secret in every rank, or none (then the rendezvous admits anyone who connects, as c10d's
// TCPStore does; docs/launch.md, "Who can join a job").
#pragma once

#include <string>

namespace dscpp::comm {

inline constexpr const char* kSecretEnv = "DSCPP_RENDEZVOUS_SECRET";
inline constexpr const char* kSecretFileEnv = "DSCPP_RENDEZVOUS_SECRET_FILE";
inline constexpr size_t kMinSecretBytes = 16;

// 32 random bytes from the kernel, as 64 hexadecimal digits.
std::string make_job_secret();

// The secret this process was given: DSCPP_RENDEZVOUS_SECRET, else the first line of the file
// DSCPP_RENDEZVOUS_SECRET_FILE names, else "" (none). It is read as the program starts (before
// main, while no other thread runs), and DSCPP_RENDEZVOUS_SECRET is then removed from the
// environment, so programs this one starts do not inherit it. Throws ConfigError for a file that
// cannot be read or that group or others may read, and for a secret shorter than kMinSecretBytes.
std::string job_secret();

// Checks a secret's form (also for the one a node agent reads from its stdin); `from` names
// where it came from in the message.
void check_secret(const std::string& secret, const std::string& from);

}  // namespace dscpp::comm
