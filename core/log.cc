#include "core/log.h"

#include <spdlog/sinks/stdout_sinks.h>

#include <cctype>
#include <mutex>

#include "core/config.h"
#include "core/core_config.h"

namespace gw::log {

namespace {

spdlog::level::level_enum level_from_config() {
  // Case-insensitive (NCCL users write INFO). The row's validator refuses unknown names at
  // start-up; get_string then yields the default, so errors are never silenced.
  std::string v = config::get_string(core_config::kLogLevel);
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (v == "warning") v = "warn";
  return spdlog::level::from_str(v);
}

std::shared_ptr<spdlog::logger> make_logger() {
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>("gradwire", sink);
  logger->set_pattern("[gradwire %P] %^%l%$ %v");
  logger->set_level(level_from_config());
  logger->flush_on(spdlog::level::trace);
  return logger;
}

// Never destroyed: objects held by statics (a DPDK engine, a daemon's transports) log from their
// destructors at exit, after a function-local static logger would already be gone.
std::shared_ptr<spdlog::logger>& instance() {
  static auto* logger = new std::shared_ptr<spdlog::logger>(make_logger());
  return *logger;
}

}  // namespace

spdlog::logger& get() { return *instance(); }

void set_rank(int rank) { get().set_pattern(fmt::format("[gradwire {} %P] %^%l%$ %v", rank)); }

void reload_level() { get().set_level(level_from_config()); }

std::shared_ptr<spdlog::logger> shared() { return instance(); }

void adopt(std::shared_ptr<spdlog::logger> logger) {
  if (logger) instance() = std::move(logger);
}

}  // namespace gw::log
