// Logging macros for dscpp's own code, on top of spdlog. The sink and pattern are set up
// once per process (see log.cpp); the macros format with fmt syntax.
#pragma once

#include <spdlog/spdlog.h>

#include "dscpp/log.h"

namespace dscpp::log {
// The logger all of dscpp writes to (stderr, rank-tagged pattern). Created on first use.
spdlog::logger& get();
}  // namespace dscpp::log

#define DSCPP_LOG_DEBUG(...) ::dscpp::log::get().debug(__VA_ARGS__)
#define DSCPP_LOG_INFO(...) ::dscpp::log::get().info(__VA_ARGS__)
#define DSCPP_LOG_WARN(...) ::dscpp::log::get().warn(__VA_ARGS__)
#define DSCPP_LOG_ERROR(...) ::dscpp::log::get().error(__VA_ARGS__)
