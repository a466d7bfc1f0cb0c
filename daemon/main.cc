// gradwired: the per-host daemon (docs/daemon.md).
//
//   gradwired [--socket PATH] [--config FILE] [--foreground] [--transport NAME] [--host-id ID]
//             [--metrics [HOST:]PORT] [--group NAME]
//
// Settings come from the layered configuration (core/config.h): --config names the TOML file
// (GW_CONFIG_FILE; the daemon's keys live in its [daemon] table), the environment overrides it, and
// the command line overrides both. Without --foreground the daemon detaches once it listens (the
// parent exits 0 then, or 1 with the reason when it could not start).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/config.h"
#include "core/core_config.h"
#include "core/log.h"
#include "daemon/daemon_config.h"
#include "daemon/metrics.h"
#include "daemon/notifier.h"
#include "daemon/server.h"

namespace {

gw::daemon::Server* g_server = nullptr;

void on_signal(int) {
  if (g_server != nullptr) g_server->stop();
}

int fail(int ready_fd, const std::string& why) {
  const bool named = why.rfind("gradwired", 0) == 0;
  std::fprintf(stderr, "%s%s\n", named ? "" : "gradwired: ", why.c_str());
  if (ready_fd >= 0) {
    ssize_t n = ::write(ready_fd, why.data(), why.size());
    (void)n;
  }
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gradwired: the gradwire per-host daemon (docs/daemon.md)"};
  std::string socket_path, config_file, transport, host_id, metrics, group;
  bool foreground = false;
  app.add_option("--socket", socket_path, "the trainers' unix socket (GW_DAEMON_SOCKET)");
  app.add_option("--config", config_file, "TOML settings file (GW_CONFIG_FILE)");
  app.add_option("--transport", transport, "backend between daemons (GW_DAEMON_TRANSPORT)");
  app.add_option("--host-id", host_id, "this host's identity (GW_HOSTID)");
  app.add_option("--metrics", metrics,
                 "[HOST:]PORT of the Prometheus endpoint; no HOST: 127.0.0.1 (GW_DAEMON_METRICS)");
  app.add_option("--group", group,
                 "a group whose members may use the daemon whatever their uid (GW_DAEMON_GROUP)");
  app.add_flag("--foreground", foreground, "stay attached to the terminal");
  CLI11_PARSE(app, argc, argv);

  using namespace gw;
  if (!config_file.empty()) {
    Status s = config::set(core_config::kConfigFile, config_file);
    if (!s.ok()) return fail(-1, s.message());
  }
  if (!socket_path.empty()) (void)config::set(daemon_config::kSocket, socket_path);
  if (!transport.empty()) (void)config::set(daemon_config::kTransport, transport);
  if (!host_id.empty()) (void)config::set(core_config::kHostId, host_id);
  if (!metrics.empty()) (void)config::set(daemon_config::kMetrics, metrics);
  if (!group.empty()) {
    // Refused here, not wrapped: --group 4294967296 would be gid 0.
    Status s = config::set(daemon_config::kGroup, group);
    if (!s.ok()) return fail(-1, fmt::format("--group: {}", s.message()));
  }
  Status valid = config::validate();
  if (!valid.ok()) return fail(-1, valid.message());

  daemon::ServerOptions o;
  o.socket_path = config::get_string(daemon_config::kSocket);
  o.transport = config::get_string(daemon_config::kTransport);
  o.max_arena_bytes = static_cast<uint64_t>(config::get_int(daemon_config::kMaxArena));
  o.max_clients = static_cast<int>(config::get_int(daemon_config::kMaxClients));
  o.spin_us = config::get_int(daemon_config::kPollUs);
  o.reduce_threads = static_cast<int>(config::get_int(daemon_config::kReduceThreads));
  o.group = config::get_string(daemon_config::kGroup);
  // Under systemd (Type=notify): readiness once listening, the watchdog from the server's loop.
  daemon::Notifier notifier;
  if (notifier.watchdog_usec() > 0) {
    o.tick_ms = std::max<int64_t>(1, notifier.watchdog_usec() / 2000);
    o.on_tick = [&notifier] { notifier.watchdog(); };
  }
  o.on_stopping = [&notifier] { notifier.stopping(); };

  // Detach: the parent waits on a pipe for "listening" (EOF) or the reason it could not start.
  int ready_fd = -1;
  if (!foreground) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return fail(-1, "pipe2 failed");
    pid_t pid = ::fork();
    if (pid < 0) return fail(-1, "fork failed");
    if (pid > 0) {
      ::close(p[1]);
      char buf[512];
      ssize_t n = ::read(p[0], buf, sizeof(buf));
      if (n > 0) return 1;  // the child printed the reason
      return 0;
    }
    ::close(p[0]);
    ready_fd = p[1];
    ::setsid();
  }

  auto server = daemon::Server::create(o);
  if (!server.ok()) return fail(ready_fd, server.status().message());
  g_server = server->get();
  std::unique_ptr<daemon::MetricsEndpoint> endpoint;
  const std::string metrics_addr = config::get_string(daemon_config::kMetrics);
  if (!metrics_addr.empty()) {
    auto m = daemon::MetricsEndpoint::start(metrics_addr, **server);
    if (!m.ok()) return fail(ready_fd, m.status().message());
    endpoint = std::move(*m);
    std::printf("gradwired: metrics on http://%s/metrics\n", endpoint->bound_address().c_str());
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  // The one line that says it listens (the server logs none of its own: it would be a second).
  std::printf("gradwired: listening on %s (host %s, pid %d); between daemons: %s\n",
              o.socket_path.c_str(), (*server)->host_id().c_str(), static_cast<int>(::getpid()),
              (*server)->transport_note().c_str());
  std::fflush(stdout);
  notifier.ready(fmt::format("listening on {} (host {})", o.socket_path, (*server)->host_id()));
  notifier.watchdog();
  if (ready_fd >= 0) {
    ::close(ready_fd);
    int devnull = ::open("/dev/null", O_RDWR);
    if (devnull >= 0) {
      ::dup2(devnull, 0);
      ::dup2(devnull, 1);
      ::close(devnull);
    }
  }
  Status s = (*server)->run();
  g_server = nullptr;
  endpoint.reset();
  if (!s.ok()) {
    std::fprintf(stderr, "gradwired: %s\n", s.message().c_str());
    return 1;
  }
  return 0;
}
