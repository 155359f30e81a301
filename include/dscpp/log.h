// Process-wide logging. Every line carries the time, the rank and the level:
//   [2026-11-29 22:30:01.123] [rank 0] [info] message
// The level comes from set_log_level(), else the environment variable DSCPP_LOG_LEVEL
// (debug|info|warning|error), else info.
#pragma once

#include <string>

namespace dscpp {

enum class LogLevel { debug, info, warning, error };

// Parses "debug", "info", "warning" (or "warn"), "error". Throws ConfigError naming the
// accepted values otherwise.
LogLevel parse_log_level(const std::string& name);

void set_log_level(LogLevel level);
LogLevel log_level();

// The rank shown in each line; -1 shows "launcher" (the process that starts ranks).
void set_log_rank(int rank);

}  // namespace dscpp
