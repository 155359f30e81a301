// Logging macros for dscpp's own code. A macro formats its message with fmt syntax in the
// caller's translation unit and hands the finished line to log.cpp, the only file that sees the
// logger behind it (spdlog). NOTE [two fmts]: a PyTorch wheel ships its own fmt (12.x) among
// libtorch's headers, ahead of Debian's fmt 9 on every include path that has libtorch's, while
// Debian's spdlog is built against fmt 9. So no header dscpp includes next to libtorch may
// include spdlog: files that see libtorch format with the wheel's fmt, the others with Debian's,
// both header-only (FMT_HEADER_ONLY, set for the whole build), in fmt's versioned namespaces
// (fmt::v12, fmt::v9), so the two never meet.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>
#include <utility>

#include "dscpp/log.h"

namespace dscpp::log {

// Whether a line at `level` would be written (the level from set_log_level / DSCPP_LOG_LEVEL).
bool enabled(LogLevel level);
// Writes one finished line at `level` (time, rank and level are prefixed). Thread-safe.
void write(LogLevel level, std::string_view message);

// One argument is the message itself, braces and all; more are a format string and its values.
template <typename T>
std::string message(const T& text) {
  return std::string(std::string_view(text));
}
template <typename... Args>
std::string message(fmt::format_string<Args...> format, Args&&... args) {
  return fmt::format(format, std::forward<Args>(args)...);
}

}  // namespace dscpp::log

#define DSCPP_LOG_AT(level, ...)                                                 \
  do {                                                                           \
    if (::dscpp::log::enabled(level))                                            \
      ::dscpp::log::write(level, ::dscpp::log::message(__VA_ARGS__));            \
  } while (0)
#define DSCPP_LOG_DEBUG(...) DSCPP_LOG_AT(::dscpp::LogLevel::debug, __VA_ARGS__)
#define DSCPP_LOG_INFO(...) DSCPP_LOG_AT(::dscpp::LogLevel::info, __VA_ARGS__)
#define DSCPP_LOG_WARN(...) DSCPP_LOG_AT(::dscpp::LogLevel::warning, __VA_ARGS__)
#define DSCPP_LOG_ERROR(...) DSCPP_LOG_AT(::dscpp::LogLevel::error, __VA_ARGS__)
