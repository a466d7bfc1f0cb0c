// gradwired's systemd integration: readiness, status, stopping and the watchdog through sd_notify
// (libsystemd), when the daemon runs under a unit that set NOTIFY_SOCKET (Type=notify) and, for the
// watchdog, WATCHDOG_USEC (WatchdogSec=). Built when libsystemd (Debian: libsystemd-dev) is present
// (GW_HAVE_SYSTEMD); without it, or without NOTIFY_SOCKET, every call does nothing (a build without
// libsystemd says so once, at start-up, when NOTIFY_SOCKET is set).
//
// Thread-compatible: main() owns it; watchdog() is called from the server's main loop.
#pragma once

#include <cstdint>
#include <string>

namespace gw::daemon {

class Notifier {
 public:
  // Reads NOTIFY_SOCKET / WATCHDOG_USEC / WATCHDOG_PID now.
  Notifier();

  // Whether a service manager listens (NOTIFY_SOCKET set and this build can tell it).
  bool active() const { return active_; }
  // The watchdog period the manager asked for (WATCHDOG_USEC, for this pid), 0 when none; the
  // daemon pings at half of it.
  int64_t watchdog_usec() const { return watchdog_usec_; }

  // READY=1 with a STATUS= line.
  void ready(const std::string& status);
  // WATCHDOG=1, at most once per half period (cheap to call more often).
  void watchdog();
  // STOPPING=1.
  void stopping();

 private:
  void send(const std::string& state);
  bool active_ = false;
  int64_t watchdog_usec_ = 0;
  int64_t last_ping_ns_ = 0;
};

}  // namespace gw::daemon
