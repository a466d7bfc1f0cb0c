// Daemon mode of the NCCL plugin: where a connection's two processes meet (daemon_meeting.h).
#include "plugin/daemon_meeting.h"

#include <arpa/inet.h>

#include <algorithm>
#include <vector>

#include "core/bootstrap.h"
#include "core/config.h"
#include "core/net/handshake.h"
#include "core/net/socket_util.h"
#include "core/net/tcp_config.h"
#include "core/sys/time.h"
#include "core/sys/unix_socket.h"
#include "daemon/control.h"
#include "daemon/daemon_config.h"

namespace gw::plugin {
namespace daemon_mode {

using daemon::Opcode;
using daemon::SqEntry;

Result<std::string> store_interface_address() {
  GW_ASSIGN_OR_RETURN(std::vector<net::Interface> all, net::list_interfaces());
  GW_ASSIGN_OR_RETURN(
      net::Interface i,
      net::select_interface(config::get_string(net::tcp_config::kSocketIfname), all, nullptr));
  char buf[INET6_ADDRSTRLEN] = {};
  const void* a =
      i.addr.ss_family == AF_INET
          ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(&i.addr)->sin_addr)
          : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(&i.addr)->sin6_addr);
  if (inet_ntop(i.addr.ss_family, a, buf, sizeof(buf)) == nullptr) {
    return system_error("inet_ntop", errno);
  }
  return std::string(buf);
}

Result<std::shared_ptr<TcpStore>> listen_store(const Shared& s, std::string* address) {
  ListenStore& ls = *s.listen_store;
  std::lock_guard<std::mutex> lock(ls.mu);
  if (!ls.store) {
    GW_ASSIGN_OR_RETURN(std::string ip, store_interface_address());
    TcpStoreOptions o;
    o.host = ip;
    o.port = 0;
    o.host_server = true;
    o.token = s.options.job_token;
    o.connect_timeout_ms = std::max<int64_t>(1, std::min<int64_t>(s.options.timeout_ms, 10000));
    auto made = TcpStore::create(o);
    if (!made.ok()) {
      return made.status().with_context(
          fmt::format("listen: the store of daemon mode's cross-host leg on {}", ip));
    }
    ls.store = *made;
    ls.address = fmt::format("{}:{}", ip, ls.store->port());
  }
  *address = ls.address;
  return ls.store;
}

std::string announce_key(const std::string& token) {
  return "gwp/" + token.substr(22) + "/connector";
}

std::string connection_token(const std::string& job_token, const std::array<uint8_t, 16>& nonce) {
  static constexpr uint8_t kJobLabel[] = {'g', 'w', '-', 'n', 'c', 'c', 'l', '-', 'j', 'o', 'b'};
  const net::handshake::Mac id =
      net::handshake::hmac_sha256(job_token, kJobLabel, sizeof(kJobLabel));
  std::vector<uint8_t> msg = {'g', 'w', '-', 'n', 'e', 't', '/'};
  msg.insert(msg.end(), nonce.begin(), nonce.end());
  const net::handshake::Mac mac = net::handshake::hmac_sha256(job_token, msg.data(), msg.size());
  return "nccl-" + to_hex(id.data(), 8) + "-" + to_hex(mac.data(), 16);
}

Result<std::unique_ptr<Client>> join(const Shared& s, const std::string& token, int rank,
                                     const StorePlace* xhost) {
  daemon::Hello h;
  h.rank = rank;
  h.world_size = 2;
  h.host_index = 0;
  h.num_hosts = 1;
  h.local_rank = rank;
  h.local_size = 2;
  if (xhost != nullptr) {
    h.host_index = rank;
    h.num_hosts = 2;
    h.local_rank = 0;
    h.local_size = 1;
    h.store_host = xhost->host;
    h.store_port = static_cast<uint16_t>(xhost->port);
    h.store_token = s.options.job_token;
  }
  h.timeout_ms = s.options.timeout_ms;
  h.arena_bytes = s.options.arena_bytes;
  h.job_token = token;
  h.host_id = s.host_id;
  return Client::connect(s.options.address.substr(5), h, s.spin_ns);
}

Result<Joining> join_and_post(const Shared& s, const std::string& token, bool sender,
                              const StorePlace* xhost) {
  Joining j;
  GW_ASSIGN_OR_RETURN(j.client, join(s, token, sender ? 0 : 1, xhost));
  SqEntry e{};
  e.opcode = static_cast<uint16_t>(sender ? Opcode::kSend : Opcode::kRecv);
  e.root = sender ? 1 : 0;
  GW_ASSIGN_OR_RETURN(j.seq, j.client->post(e, sender ? "connect" : "accept"));
  return j;
}

Result<bool> joined(Joining& j, const char* what) {
  bool done = false;
  Status st = j.client->wait_for(j.seq, sys::kNoWait, &done, what);
  if (!done) {
    GW_RETURN_IF_ERROR(j.client->check_alive(what));
    return false;
  }
  GW_RETURN_IF_ERROR(st);
  return true;
}

std::string conn_name(const std::string& token, const DaemonHandle& h, bool send) {
  return fmt::format("daemon connection {} ({} pid {})", token.substr(22, 8),
                     send ? "to listener" : "from connector of listener", h.pid);
}

}  // namespace daemon_mode

Result<std::string> plugin_daemon_address(std::string* note) {
  const std::string daemon = config::get_string(daemon_config::kDaemon);
  if (daemon.empty()) return daemon;
  if (daemon != "auto") {
    if (daemon.rfind("unix:", 0) != 0 || daemon.size() <= 5) {
      return invalid_arg("GW_DAEMON '{}': expected unix:/path/to/gradwired.sock or auto", daemon);
    }
    *note = fmt::format("GW_DAEMON={}", daemon);
    return daemon;
  }
  const std::string path = config::get_string(daemon_config::kSocket);
  auto addr = sys::UnixAddress::path(daemon::control_socket_path(path));
  Status why = addr.status();
  if (addr.ok()) {
    auto probe = sys::connect_unix(*addr, SOCK_STREAM);
    if (probe.ok()) {
      *note = fmt::format("GW_DAEMON=auto found gradwired at {}", path);
      return "unix:" + path;
    }
    why = probe.status();
  }
  *note = fmt::format("GW_DAEMON=auto: no gradwired answers at {} ({}): direct mode", path,
                      why.message());
  return std::string();
}

}  // namespace gw::plugin
