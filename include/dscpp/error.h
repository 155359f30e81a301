// Error model for dscpp: every failure at the public API is an exception derived from
// dscpp::Error, raised through DSCPP_CHECK. Types are split where a caller may act on them
// (a config error is fixed by editing JSON, a comm timeout by looking at the other ranks).
// Messages say what failed, where (key path, rank, file) and, after "HINT:", what to do.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace dscpp {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The DeepSpeed JSON config is malformed, inconsistent or names an unknown key.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A collective, the rendezvous or the process group failed.
class CommError : public Error {
 public:
  using Error::Error;
};

// A collective did not complete within the configured timeout. The message carries the
// table of which rank reached which collective.
class CommTimeout : public CommError {
 public:
  using CommError::CommError;
};

// A file could not be read or written.
class IoError : public Error {
 public:
  using Error::Error;
};

// A checkpoint is missing, torn or does not match the model.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

// The launcher could not start or keep a job running (bad hostfile, missing program, ...).
class LaunchError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

}  // namespace dscpp

// DSCPP_CHECK(cond, ErrorType, parts...): throws ErrorType(concatenation of parts) when cond
// is false. Parts are streamed, so numbers and strings mix freely.
#define DSCPP_CHECK(cond, ErrorType, ...)                         \
  do {                                                            \
    if (!(cond)) {                                                \
      throw ErrorType(::dscpp::detail::str_cat(__VA_ARGS__));     \
    }                                                             \
  } while (0)

#define DSCPP_FAIL(ErrorType, ...) throw ErrorType(::dscpp::detail::str_cat(__VA_ARGS__))
