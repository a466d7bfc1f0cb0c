// Logging through spdlog, level from GW_LOG_LEVEL (default warn), to stderr.
// Lines look like "[gradwire 3] INFO allreduce: ring, 4 channels, 64 MiB".
// Log once, where the error is understood; lower layers return a Status instead.
#pragma once

#include <spdlog/spdlog.h>

namespace gw::log {

// Returns the process-wide logger, created on first use from GW_LOG_LEVEL.
spdlog::logger& get();
// Adds the rank to every later line; called once the rank is known.
void set_rank(int rank);
// Re-reads GW_LOG_LEVEL (tests change it).
void reload_level();

// The process-wide logger itself, and a way to log through another's: a loadable module that
// carries its own copy of this file (dpdk/port_module.h) adopts its loader's logger, so its lines
// have the same level, rank and sink.
std::shared_ptr<spdlog::logger> shared();
void adopt(std::shared_ptr<spdlog::logger> logger);

}  // namespace gw::log

#define GW_LOG_TRACE(...) SPDLOG_LOGGER_TRACE(&::gw::log::get(), __VA_ARGS__)
#define GW_LOG_DEBUG(...) ::gw::log::get().debug(__VA_ARGS__)
#define GW_LOG_INFO(...) ::gw::log::get().info(__VA_ARGS__)
#define GW_LOG_WARN(...) ::gw::log::get().warn(__VA_ARGS__)
#define GW_LOG_ERROR(...) ::gw::log::get().error(__VA_ARGS__)
