#include "capi/setup_checks.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <thread>

#include "capi/direct_session.h"
#include "core/bootstrap.h"
#include "core/config.h"
#include "core/sys/time.h"
#include "core/sys/unix_socket.h"
#include "daemon/client.h"

namespace gw::capi {

Status fail_before_rendezvous(const SessionOptions& options, const Status& why) {
  // Long enough for the other ranks to read it (each reads rank 0's entry first); short enough
  // that a rank whose store is not there either does not wait on it.
  constexpr int64_t kFailureNoticeMs = 2000;
  if (options.store_host.empty() || options.world_size <= 1) return why;
  SessionOptions brief = options;
  brief.timeout_ms = std::min(options.timeout_ms, kFailureNoticeMs);
  auto store = open_job_store(brief);
  if (store.ok()) {
    (void)publish_setup_failure(**store, options.rank, options.world_size, why,
                                sys::deadline_after_ms(kFailureNoticeMs));
  }
  return why;
}

Status check_daemon_locally(const std::string& address) {
  GW_RETURN_IF_ERROR(config::validate());
  if (address.rfind("unix:", 0) != 0 || address.size() <= 5) {
    return invalid_arg("GW_DAEMON '{}': expected unix:/path/to/gradwired.sock", address);
  }
  const std::string path = address.substr(5);
  auto addr = sys::UnixAddress::path(path);
  if (!addr.ok()) return addr.status().with_context("GW_DAEMON");
  // A daemon started just before its trainers may not have made its socket yet.
  constexpr int64_t kStartGraceMs = 1000;
  const sys::Deadline until = sys::deadline_after_ms(kStartGraceMs);
  for (;;) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
      if (S_ISSOCK(st.st_mode)) return ok_status();
      return invalid_arg(
          "GW_DAEMON=unix:{}: {} is not a socket (gradwired's is where its "
          "--socket or GW_DAEMON_SOCKET says)",
          path, path);
    }
    const int err = errno;
    // (ENOTDIR: a directory of the path is a file; no socket there either.)
    if (err == ENOTDIR || (err == ENOENT && sys::expired(until))) {
      return daemon::no_daemon_error(path);
    }
    if (err != ENOENT) {
      return system_error(fmt::format("GW_DAEMON=unix:{}: stat {}", path, path), err);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace gw::capi
