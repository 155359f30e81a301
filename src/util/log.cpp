// Implements the process-wide logger: one stderr sink, a pattern that carries the rank,
// and the level from set_log_level() or DSCPP_LOG_LEVEL. Thread-safe (spdlog _mt sink). The only
// file that includes spdlog (NOTE [two fmts] in log.h).
#include "util/log.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <mutex>

#include "dscpp/error.h"

namespace dscpp {
namespace {

spdlog::level::level_enum to_spd(LogLevel l) {
  switch (l) {
    case LogLevel::debug: return spdlog::level::debug;
    case LogLevel::info: return spdlog::level::info;
    case LogLevel::warning: return spdlog::level::warn;
    case LogLevel::error: return spdlog::level::err;
  }
  return spdlog::level::info;
}

std::string pattern_for(int rank) {
  std::string who = rank < 0 ? "launcher" : "rank " + std::to_string(rank);
  return "[%Y-%m-%d %H:%M:%S.%e] [" + who + "] [%l] %v";
}

int initial_rank() {
  const char* r = std::getenv("RANK");
  if (!r) r = std::getenv("OMPI_COMM_WORLD_RANK");
  if (!r) r = std::getenv("SLURM_PROCID");
  return r ? std::atoi(r) : 0;
}

LogLevel g_level = LogLevel::info;

}  // namespace

LogLevel parse_log_level(const std::string& name) {
  if (name == "debug") return LogLevel::debug;
  if (name == "info") return LogLevel::info;
  if (name == "warning" || name == "warn") return LogLevel::warning;
  if (name == "error") return LogLevel::error;
  DSCPP_FAIL(ConfigError, "unknown log level '", name,
             "'. HINT: use one of debug, info, warning, error");
}

namespace log {
namespace {
spdlog::logger& get() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    auto l = std::make_shared<spdlog::logger>("dscpp", sink);
    l->set_pattern(pattern_for(initial_rank()));
    if (const char* env = std::getenv("DSCPP_LOG_LEVEL"); env && *env) {
      try {
        g_level = parse_log_level(env);
      } catch (const ConfigError&) {
        // An unusable DSCPP_LOG_LEVEL is reported once, at warning level, and info is used.
        l->warn("DSCPP_LOG_LEVEL='{}' is not one of debug, info, warning, error; using info",
                env);
      }
    }
    l->set_level(to_spd(g_level));
    l->flush_on(spdlog::level::debug);
    return l;
  }();
  return *logger;
}
}  // namespace

bool enabled(LogLevel level) { return get().should_log(to_spd(level)); }

void write(LogLevel level, std::string_view message) { get().log(to_spd(level), message); }
}  // namespace log

void set_log_level(LogLevel level) {
  g_level = level;
  log::get().set_level(to_spd(level));
}

LogLevel log_level() {
  log::get();
  return g_level;
}

void set_log_rank(int rank) { log::get().set_pattern(pattern_for(rank)); }

}  // namespace dscpp
