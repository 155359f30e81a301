// Implements the job secret's making and reading (job_secret.h).
#include "comm/job_secret.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "comm/store_wire.h"
#include "dscpp/error.h"
#include "util/strings.h"

namespace dscpp::comm {

std::string make_job_secret() {
  const wire::Nonce bytes = wire::random_nonce();  // 32 bytes from the kernel
  return to_hex(bytes.data(), bytes.size());
}

void check_secret(const std::string& secret, const std::string& from) {
  DSCPP_CHECK(secret.size() >= kMinSecretBytes, ConfigError, "the rendezvous secret from ", from,
              " has ", secret.size(), " characters; at least ", kMinSecretBytes,
              " are needed. HINT: use 32 random bytes, e.g. the output of "
              "'head -c 32 /dev/urandom | od -An -tx1 | tr -d \" \\n\"'");
  for (char c : secret) {
    DSCPP_CHECK(c != '\n' && c != '\r' && c != '\0', ConfigError, "the rendezvous secret from ",
                from, " holds a line break or a NUL byte. HINT: give it on one line");
  }
}

namespace {

std::string mode_text(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "%03o", static_cast<unsigned>(mode & 0777));
  return buf;
}

std::string read_secret_file(const std::string& path) {
  struct stat st {};
  DSCPP_CHECK(::stat(path.c_str(), &st) == 0, ConfigError, kSecretFileEnv, "=", path,
              ": cannot read it (", std::strerror(errno), ")");
  DSCPP_CHECK((st.st_mode & (S_IRWXG | S_IRWXO)) == 0, ConfigError, kSecretFileEnv, "=", path,
              " may be read by other users (mode ", mode_text(st.st_mode), "). HINT: chmod 600 ",
              path);
  std::ifstream in(path);
  std::string line;
  DSCPP_CHECK(in && std::getline(in, line), ConfigError, kSecretFileEnv, "=", path,
              ": cannot read a line from it");
  return line;
}

}  // namespace

namespace {

// The secret given to this process, read once; error: why it could not be used.
struct GivenSecret {
  std::string secret;
  std::string error;
  GivenSecret() {
    try {
      if (const char* v = std::getenv(kSecretEnv); v && *v) {
        secret = v;
        check_secret(secret, kSecretEnv);
      } else if (const char* f = std::getenv(kSecretFileEnv); f && *f) {
        secret = read_secret_file(f);
        check_secret(secret, std::string(kSecretFileEnv) + "=" + f);
      }
    } catch (const Error& e) {
      error = e.what();
    }
    ::unsetenv(kSecretEnv);
  }
};

GivenSecret& given() {
  static GivenSecret g;
  return g;
}

// Read while the program starts, before any thread runs: unsetenv is not safe beside threads
// that read the environment.
[[maybe_unused]] const bool kReadAtStart = (given(), true);

}  // namespace

std::string job_secret() {
  if (!given().error.empty()) throw ConfigError(given().error);
  return given().secret;
}

}  // namespace dscpp::comm
