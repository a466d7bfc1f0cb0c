// TcpStore: the client (a small pool of connections, one per call in flight), and on rank 0 the
// server it starts (store_server.cc). Wire format: docs/wire-store.md, codec in store_wire.cc.
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <type_traits>

#include "core/config.h"
#include "core/core_config.h"
#include "core/log.h"
#include "core/net/handshake.h"
#include "core/store.h"
#include "core/store_server.h"
#include "core/store_socket.h"
#include "core/store_wire.h"

namespace gw {

using store_wire::Op;
using store_wire::ReplyCode;
using store_wire::Request;
using store_wire::Response;
using sys::Fd;

namespace {
// Extra time a client waits for the server's own "not found" answer to a get.
constexpr auto kReplyGrace = std::chrono::milliseconds(500);

}  // namespace

struct TcpStore::Impl {
  TcpStoreOptions options;
  std::string connect_host;
  int port = 0;
  TcpStoreServerPtr server;
  // Idle connections. A call takes one (or opens one) for its request/reply and gives it back,
  // so a get parked on the server never blocks other threads' calls through the same TcpStore.
  std::mutex mu;
  std::vector<Fd> idle;

  std::string where() const { return store_socket::format_addr(connect_host, port); }

  // One connection plus the hello exchange: each side proves the job token over the other's
  // fresh challenge (docs/wire-store.md). A refusal either way is final (kPeer); other failures
  // may be retried.
  // *answered: a connection was made (something listens there), for the start-up's reports.
  Result<Fd> connect_once(Deadline deadline, bool* refused, bool* answered = nullptr) {
    namespace hs = net::handshake;
    *refused = false;
    GW_ASSIGN_OR_RETURN(Fd c, store_socket::connect_tcp(connect_host, port, deadline));
    if (answered != nullptr) *answered = true;
    Request hello;
    hello.op = Op::kHello;
    GW_RETURN_IF_ERROR(hs::fresh_nonce(&hello.challenge));
    bool undecodable = false;
    auto hr = exchange(c.get(), hello, deadline, "hello", &undecodable);
    if (undecodable) {
      // Bytes came back that no gradwire store sends: waiting cannot help.
      *refused = true;
      return peer_error(
          "something other than a gradwire store answers at {} ({}): is GW_STORE or "
          "MASTER_PORT the port of another service (torchrun's own store, for one)? rank 0 "
          "hosts gradwire's store there and must be able to bind it",
          where(), hr.status().message());
    }
    GW_ASSIGN_OR_RETURN(Response r, std::move(hr));
    if (r.code != ReplyCode::kOk) {
      *refused = true;
      return peer_error("store at {} refused this client: {}", where(), r.message);
    }
    const hs::Transcript t = store_wire::transcript(hello.challenge, r.challenge);
    // A client with a token accepts only a server that proves it: no one else can pose as the
    // store and hand out handles.
    if (!options.token.empty() &&
        !hs::verify(options.token, hs::Role::kListener, t, r.proof.data())) {
      *refused = true;
      return peer_error(
          "store at {} did not prove the job token: it belongs to another job, or it is not "
          "this job's store",
          where());
    }
    Request auth;
    auth.op = Op::kAuth;
    auth.proof = hs::prove(options.token, hs::Role::kConnector, t);
    GW_ASSIGN_OR_RETURN(Response a, exchange(c.get(), auth, deadline, "auth"));
    if (a.code != ReplyCode::kOk) {
      *refused = true;
      return peer_error("store at {} refused this client: {}", where(), a.message);
    }
    return c;
  }

  // Start-up: the server may come up after its clients, so refused connections are retried (a
  // refusal says only that rank 0 is not listening yet: it may start seconds after the others),
  // and what is awaited is said at WARN every kReportEvery. A listener that takes the connection
  // and closes it on the hello kClosedLimit times in a row is not a gradwire store (a gradwire
  // store answers every hello, if only to refuse it); one that answers with bytes no store
  // sends is refused at once (connect_once).
  Result<Fd> connect_with_retries(Deadline deadline) {
    constexpr auto kReportEvery = std::chrono::seconds(5);
    constexpr int kClosedLimit = 3;
    auto backoff = std::chrono::milliseconds(10);
    const auto start = Clock::now();
    auto report_at = start + kReportEvery;
    int closed_in_a_row = 0;
    Status last;
    for (;;) {
      bool refused = false, answered = false;
      // Each attempt gets at most a few seconds so a silently dropped SYN is retried.
      Deadline attempt = std::min(deadline, Clock::now() + std::chrono::seconds(5));
      auto c = connect_once(attempt, &refused, &answered);
      if (c.ok() || refused || c.status().code() == Code::kInvalidArg) return c;
      last = c.status();
      closed_in_a_row = answered && (last.message().find("closed") != std::string::npos ||
                                     last.message().find("reset") != std::string::npos)
                            ? closed_in_a_row + 1
                            : 0;
      if (closed_in_a_row >= kClosedLimit) {
        return peer_error(
            "something other than a gradwire store listens at {}: it closed the connection on "
            "the store's hello {} times in a row ({}); is GW_STORE or MASTER_PORT the port of "
            "another service (torchrun's own store, for one)?",
            where(), kClosedLimit, last.message());
      }
      auto now = Clock::now();
      if (now >= deadline) break;
      if (now >= report_at) {
        GW_LOG_WARN(
            "store: waiting for the store at {} (rank 0 hosts it; {} s of the {} s deadline): {}",
            where(), std::chrono::duration_cast<std::chrono::seconds>(now - start).count(),
            options.connect_timeout_ms / 1000, last.message());
        report_at = now + kReportEvery;
      }
      std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
      backoff = std::min(backoff * 2, std::chrono::milliseconds(250));
    }
    return timeout_error("could not reach the store at {} within {} ms: {}", where(),
                         options.connect_timeout_ms, last.message());
  }

  // *undecodable (when given): the reply arrived but is not the store protocol's.
  Result<Response> exchange(int sock, const Request& req, Deadline deadline, std::string_view op,
                            bool* undecodable = nullptr) {
    std::string what = fmt::format("store {} at {}", op, where());
    GW_ASSIGN_OR_RETURN(Bytes frame, store_wire::encode_request(req));
    GW_RETURN_IF_ERROR(store_socket::send_all(sock, frame.data(), frame.size(), deadline, what));
    Deadline reply_deadline = req.op == Op::kGet ? deadline + kReplyGrace : deadline;
    uint8_t header[store_wire::kHeaderSize];
    GW_RETURN_IF_ERROR(store_socket::recv_all(sock, header, sizeof(header), reply_deadline, what));
    auto len = store_wire::decode_length(header);
    if (!len.ok()) {
      if (undecodable != nullptr) *undecodable = true;
      return len.status().with_context(what);
    }
    Bytes body(*len);
    GW_RETURN_IF_ERROR(
        store_socket::recv_all(sock, body.data(), body.size(), reply_deadline, what));
    auto r = store_wire::decode_response(req.op, body.data(), body.size());
    if (!r.ok()) {
      if (undecodable != nullptr) *undecodable = true;
      return r.status().with_context(what);
    }
    return r;
  }

  // One request/reply. A connection that failed is closed (its stream position is unknown);
  // new connections after start-up are tried once, without the start-up retries, so a dead
  // server is reported at once.
  Result<Response> call(const Request& req, Deadline deadline) {
    std::string op = fmt::format("{} '{}'", store_wire::op_name(req.op), req.key);
    Fd conn;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!idle.empty()) {
        conn = std::move(idle.back());
        idle.pop_back();
      }
    }
    if (!conn.valid()) {
      bool refused = false;
      auto c = connect_once(deadline, &refused);
      if (!c.ok()) {
        return Status(c.status().code() == Code::kTimeout ? Code::kTimeout : Code::kPeer,
                      fmt::format("store {}: store at {} is unreachable: {}", op, where(),
                                  c.status().message()));
      }
      conn = std::move(*c);
    }
    auto r = exchange(conn.get(), req, deadline, op);
    if (!r.ok()) return r.status();  // conn closes here
    if (r->code == ReplyCode::kError) {
      // The server closes the connection after a protocol error; drop ours too.
      return Status(Code::kInvalidArg, fmt::format("store {} at {}: {}", op, where(), r->message));
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      if (idle.size() < kMaxIdle) idle.push_back(std::move(conn));
    }
    return r;
  }

  static constexpr size_t kMaxIdle = 8;
};

TcpStore::TcpStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TcpStore::~TcpStore() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->idle.clear();
  }
  impl_->server.reset();
}

Result<std::shared_ptr<TcpStore>> TcpStore::create(const TcpStoreOptions& options) {
  if (options.port < 0 || options.port > 65535) {
    return invalid_arg("TcpStore: port {} outside 0..65535", options.port);
  }
  if (!options.host_server && options.port == 0) {
    return invalid_arg("TcpStore: a client needs the server's port (got 0)");
  }
  if (options.host.empty()) return invalid_arg("TcpStore: empty host");
  if (options.token.size() > store_wire::kMaxToken) {
    return invalid_arg("TcpStore: job token longer than {} bytes", store_wire::kMaxToken);
  }
  if (options.hello_timeout_ms < 0) {
    return invalid_arg("TcpStore: hello_timeout_ms {} < 0", options.hello_timeout_ms);
  }
  TcpStoreLimits limits;
  if (options.host_server) {
    GW_ASSIGN_OR_RETURN(limits, server_limits(options));
  }
  if (options.connect_timeout_ms < 0) {
    return invalid_arg("TcpStore: connect_timeout_ms {} < 0", options.connect_timeout_ms);
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->connect_host = options.host;
  impl->port = options.port;
  if (options.host_server) {
    int bind_errno = 0;
    auto server =
        start_store_server(options.host, options.port, options.token, limits, &bind_errno);
    if (!server.ok() && options.host != "0.0.0.0" && options.host != "::" &&
        bind_errno == EADDRNOTAVAIL) {
      // The address names this host but not one of its interfaces (NAT, container): serve on
      // every interface instead, as torchrun does; the job token still guards the door.
      GW_LOG_WARN("store: cannot bind {} ({}); serving on 0.0.0.0 instead",
                  store_socket::format_addr(options.host, options.port), server.status().message());
      server = start_store_server("0.0.0.0", options.port, options.token, limits, nullptr);
      impl->connect_host = "127.0.0.1";
    }
    if (!server.ok() && bind_errno == EADDRINUSE) {
      // What the others will meet at this address instead (connect_once says so on their side).
      return server.status().with_context(
          "store server: another process holds the store's port (GW_STORE, MASTER_PORT); under "
          "torchrun MASTER_PORT is torch's own store: give gradwire another port with GW_STORE, "
          "or launch with gradwire-run");
    }
    if (!server.ok()) return server.status().with_context("store server");
    impl->server = std::move(*server);
    impl->port = store_server_port(*impl->server);
    if (options.host == "0.0.0.0") impl->connect_host = "127.0.0.1";
    if (options.host == "::") impl->connect_host = "::1";
  }
  auto conn = impl->connect_with_retries(deadline_after_ms(options.connect_timeout_ms));
  if (!conn.ok()) return conn.status();
  impl->idle.push_back(std::move(*conn));
  return std::shared_ptr<TcpStore>(new TcpStore(std::move(impl)));
}

int TcpStore::port() const { return impl_->port; }

Status TcpStore::set(const std::string& key, const Bytes& value, Deadline deadline) {
  GW_RETURN_IF_ERROR(store_wire::check_key(key));
  GW_RETURN_IF_ERROR(store_wire::check_value_size(value.size()));
  Request req;
  req.op = Op::kSet;
  req.key = key;
  req.value = value;
  return impl_->call(req, deadline).status();
}

Result<Bytes> TcpStore::get(const std::string& key, Deadline deadline) {
  GW_RETURN_IF_ERROR(store_wire::check_key(key));
  Request req;
  req.op = Op::kGet;
  req.key = key;
  int ms = sys::ms_until(deadline);
  req.wait_ms = static_cast<uint32_t>(ms);
  GW_ASSIGN_OR_RETURN(Response r, impl_->call(req, deadline));
  if (r.code == ReplyCode::kNotFound) {
    return timeout_error("store get '{}' at {}: key not set before the deadline", key,
                         impl_->where());
  }
  return std::move(r.value);
}

Result<int64_t> TcpStore::add(const std::string& key, int64_t delta, Deadline deadline) {
  GW_RETURN_IF_ERROR(store_wire::check_key(key));
  Request req;
  req.op = Op::kAdd;
  req.key = key;
  req.delta = delta;
  GW_ASSIGN_OR_RETURN(Response r, impl_->call(req, deadline));
  return r.number;
}

Status TcpStore::erase(const std::string& key, Deadline deadline) {
  GW_RETURN_IF_ERROR(store_wire::check_key(key));
  Request req;
  req.op = Op::kErase;
  req.key = key;
  return impl_->call(req, deadline).status();
}

}  // namespace gw
