#include "daemon/notifier.h"

#include <cstdio>
#include <cstdlib>

#include "core/sys/time.h"

#if defined(GW_HAVE_SYSTEMD)
#include <systemd/sd-daemon.h>
#endif

namespace gw::daemon {

Notifier::Notifier() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  if (socket == nullptr || socket[0] == '\0') return;
#if defined(GW_HAVE_SYSTEMD)
  active_ = true;
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) > 0) watchdog_usec_ = static_cast<int64_t>(usec);
#else
  std::fprintf(stderr,
               "gradwired: NOTIFY_SOCKET is set but this build has no libsystemd: no readiness or "
               "watchdog notifications (install libsystemd-dev and rebuild, or use Type=simple)\n");
#endif
}

void Notifier::send(const std::string& state) {
#if defined(GW_HAVE_SYSTEMD)
  if (!active_) return;
  const int rc = sd_notify(0, state.c_str());
  if (rc < 0) std::fprintf(stderr, "gradwired: sd_notify(%s): error %d\n", state.c_str(), -rc);
#else
  (void)state;
#endif
}

void Notifier::ready(const std::string& status) { send("READY=1\nSTATUS=" + status); }

void Notifier::watchdog() {
  if (!active_ || watchdog_usec_ <= 0) return;
  const int64_t now = sys::now_ns();
  if (last_ping_ns_ != 0 && now - last_ping_ns_ < watchdog_usec_ * 1000 / 2) return;
  last_ping_ns_ = now;
  send("WATCHDOG=1");
}

void Notifier::stopping() { send("STOPPING=1"); }

}  // namespace gw::daemon
