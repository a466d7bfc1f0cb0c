// TcpStore: the server (one thread, poll() over every client) and the client (a small pool of
// connections, one per call in flight). Wire format: docs/wire-store.md, codec in store_wire.cc.
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
#include "core/store_socket.h"
#include "core/store_wire.h"

namespace gw {

using store_wire::Op;
using store_wire::ReplyCode;
using store_wire::Request;
using store_wire::Response;
using sys::Fd;

namespace {

constexpr size_t kReadChunk = 256 * 1024;
// When accept() fails for want of descriptors, the listener is left alone this long (the
// connection stays in the kernel's backlog) instead of waking poll() again at once.
constexpr int kDescriptorBackoffMs = 100;

// What a counter (created by add) counts against the byte limits: at most 20 digits.
constexpr size_t kCounterBytes = 20;

// Extra time a client waits for the server's own "not found" answer to a get.
constexpr auto kReplyGrace = std::chrono::milliseconds(500);

}  // namespace

class TcpStoreServer;

namespace {
// The options' limits, each 0 taken from its configuration row (whose defaults are the only
// ones), so every field of the result is set; an error names a bad one.
Result<TcpStoreLimits> server_limits(const TcpStoreOptions& o) {
  TcpStoreLimits l;
  auto pick = [](auto given, const config::Row& row, auto* out) -> Status {
    using T = std::remove_pointer_t<decltype(out)>;
    int64_t v = given != 0 ? static_cast<int64_t>(given) : config::get_int(row);
    if (v < 1) return invalid_arg("TcpStore: {} must be > 0 (got {})", row.name, v);
    *out = static_cast<T>(v);
    return ok_status();
  };
  GW_RETURN_IF_ERROR(
      pick(o.hello_timeout_ms, core_config::kStoreHelloTimeoutMs, &l.hello_timeout_ms));
  GW_RETURN_IF_ERROR(pick(o.max_clients, core_config::kStoreMaxClients, &l.max_clients));
  GW_RETURN_IF_ERROR(
      pick(o.max_pending_hello, core_config::kStoreMaxPendingHello, &l.max_pending_hello));
  GW_RETURN_IF_ERROR(pick(o.max_value_bytes, core_config::kStoreMaxValueBytes, &l.max_value_bytes));
  GW_RETURN_IF_ERROR(
      pick(o.max_keys_per_client, core_config::kStoreMaxKeysPerClient, &l.max_keys_per_client));
  GW_RETURN_IF_ERROR(
      pick(o.max_bytes_per_client, core_config::kStoreMaxBytesPerClient, &l.max_bytes_per_client));
  GW_RETURN_IF_ERROR(pick(o.max_bytes_total, core_config::kStoreMaxBytes, &l.max_bytes_total));
  if (l.max_value_bytes > store_wire::kMaxValue) {
    return invalid_arg("TcpStore: {} {} exceeds the wire's limit of {} bytes",
                       core_config::kStoreMaxValueBytes.name, l.max_value_bytes,
                       store_wire::kMaxValue);
  }
  return l;
}
}  // namespace

class TcpStoreServer {
 public:
  static Result<std::unique_ptr<TcpStoreServer>> start(const std::string& host, int port,
                                                       std::string token, TcpStoreLimits limits,
                                                       int* failed_errno) {
    sys::raise_descriptor_limit();
    int bound = 0;
    GW_ASSIGN_OR_RETURN(Fd listen_fd, store_socket::listen_tcp(host, port, &bound, failed_errno));
    Fd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!wake.valid()) return system_error("store server: eventfd", errno);
    std::unique_ptr<TcpStoreServer> s(
        new TcpStoreServer(std::move(listen_fd), std::move(wake), bound, std::move(token), limits));
    s->thread_ = std::thread([p = s.get()] { p->run(); });
    return s;
  }

  ~TcpStoreServer() {
    stop_.store(true);
    uint64_t one = 1;
    ssize_t ignored = ::write(wake_.get(), &one, sizeof(one));
    (void)ignored;
    if (thread_.joinable()) thread_.join();
    // Client sockets close with conns_; connected clients see EOF and fail with kPeer.
  }

  int port() const { return port_; }

 private:
  struct Conn {
    Fd fd;
    Bytes in;   // received, not yet parsed
    Bytes out;  // encoded replies not yet sent
    size_t out_off = 0;
    bool authenticated = false;
    bool challenged = false;  // hello answered; the client's proof (auth) is due
    net::handshake::Nonce client_challenge{};
    net::handshake::Nonce server_challenge{};
    Deadline hello_deadline;  // until authenticated
    bool waiting = false;     // a get is parked in waiters_; later frames wait their turn
    bool close_after_flush = false;
    size_t keys_created = 0;  // keys this connection created, against max_keys_per_client
    size_t bytes_stored = 0;  // their keys' and values' bytes, against max_bytes_per_client
    bool limit_logged = false;
  };
  using ConnIt = std::list<Conn>::iterator;
  struct Waiter {
    ConnIt conn;
    std::string key;
    Deadline deadline;
  };

  TcpStoreServer(Fd listen_fd, Fd wake, int port, std::string token, TcpStoreLimits limits)
      : listen_(std::move(listen_fd)),
        wake_(std::move(wake)),
        port_(port),
        token_(std::move(token)),
        limits_(limits),
        spare_(::open("/dev/null", O_RDONLY | O_CLOEXEC)) {}

  void run() {
    std::vector<pollfd> fds;
    std::vector<ConnIt> order;
    while (!stop_.load()) {
      fds.clear();
      order.clear();
      fds.push_back({wake_.get(), POLLIN, 0});
      const bool listening = Clock::now() >= listen_paused_until_;
      fds.push_back({listen_.get(), static_cast<short>(listening ? POLLIN : 0), 0});
      for (auto it = conns_.begin(); it != conns_.end(); ++it) {
        short ev = 0;
        bool backlog = it->out.size() - it->out_off > store_wire::kMaxBody;
        if (!it->waiting && !it->close_after_flush && !backlog) ev |= POLLIN;
        // A parked get reads nothing, but a client that goes away meanwhile must not hold its
        // connection until wait_ms (up to 49 days) passes.
        if (it->waiting) ev |= POLLRDHUP;
        if (it->out_off < it->out.size()) ev |= POLLOUT;
        fds.push_back({it->fd.get(), ev, 0});
        order.push_back(it);
      }
      int timeout = -1;
      auto until = [&timeout](Deadline d) {
        int t = sys::ms_until(d);
        timeout = timeout < 0 ? t : std::min(timeout, t);
      };
      for (const Waiter& w : waiters_) until(w.deadline);
      for (const Conn& c : conns_) {
        if (!c.authenticated) until(c.hello_deadline);
      }
      if (!listening) until(listen_paused_until_);
      int n = ::poll(fds.data(), fds.size(), timeout);
      if (n < 0 && errno != EINTR) {
        GW_LOG_ERROR("store server: poll failed: {}", strerror(errno));
        return;
      }
      if (stop_.load()) break;
      if (n > 0) {
        if (fds[1].revents & POLLIN) accept_all();
        for (size_t i = 0; i < order.size(); ++i) {
          short re = fds[i + 2].revents;
          if (re == 0) continue;
          ConnIt c = order[i];
          bool alive = true;
          if (re & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)) alive = read_conn(c);
          if (alive && (re & POLLOUT)) alive = flush(c);
          if (!alive) drop(c);
        }
      }
      expire_waiters();
      expire_hellos();
    }
  }

  void accept_all() {
    for (;;) {
      int fd = ::accept4(listen_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE) shed_one();
        return;  // EAGAIN, or a transient error: try at the next wake-up
      }
      size_t pending = 0;
      for (const Conn& c : conns_) pending += c.authenticated ? 0 : 1;
      if (pending >= limits_.max_pending_hello ||
          (conns_.size() >= limits_.max_clients && pending > 0)) {
        drop_oldest_pending();  // idle strangers make way for clients that may say hello
      }
      if (conns_.size() >= limits_.max_clients) {
        GW_LOG_WARN("store server: refusing a client, {} connections already", conns_.size());
        ::close(fd);
        continue;
      }
      conns_.emplace_back();
      conns_.back().fd.reset(fd);
      conns_.back().hello_deadline = deadline_after_ms(limits_.hello_timeout_ms);
    }
  }

  // Out of descriptors: accept the waiting connection with the spare descriptor and close it at
  // once (its client sees a reset and retries), then pause the listener briefly, so poll() does
  // not spin on a listener that stays readable.
  void shed_one() {
    GW_LOG_WARN("store server: out of file descriptors ({}); shedding a connection",
                strerror(errno));
    if (spare_.valid()) {
      spare_.reset();
      int fd = ::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) ::close(fd);
      spare_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    }
    listen_paused_until_ = Clock::now() + std::chrono::milliseconds(kDescriptorBackoffMs);
  }

  void drop_oldest_pending() {
    for (auto it = conns_.begin(); it != conns_.end(); ++it) {  // oldest first
      if (!it->authenticated) {
        GW_LOG_WARN("store server: dropping a client that has not said hello (too many pending)");
        drop(it);
        return;
      }
    }
  }

  // A client that has not completed its hello in time is dropped without an answer.
  void expire_hellos() {
    const auto now = Clock::now();
    for (auto it = conns_.begin(); it != conns_.end();) {
      auto next = std::next(it);
      if (!it->authenticated && it->hello_deadline <= now) {
        GW_LOG_WARN("store server: dropping a client whose hello did not arrive within {} ms",
                    limits_.hello_timeout_ms);
        drop(it);
      }
      it = next;
    }
  }

  // Returns false when the connection must be dropped now.
  bool read_conn(ConnIt c) {
    size_t old = c->in.size();
    // Before its hello a client gets room for one hello frame and no more.
    const size_t room =
        c->authenticated ? kReadChunk
                         : store_wire::kHeaderSize + store_wire::kMaxHelloBody -
                               std::min(old, store_wire::kHeaderSize + store_wire::kMaxHelloBody);
    if (room == 0) return process(c);
    c->in.resize(old + room);
    ssize_t k;
    do {
      k = ::recv(c->fd.get(), c->in.data() + old, room, 0);
    } while (k < 0 && errno == EINTR);
    if (k <= 0) {
      c->in.resize(old);
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      return false;  // EOF or error: the client went away
    }
    c->in.resize(old + static_cast<size_t>(k));
    return process(c);
  }

  bool process(ConnIt c) {
    size_t off = 0;
    bool ok = true;
    while (!c->waiting && !c->close_after_flush) {
      size_t avail = c->in.size() - off;
      if (avail < store_wire::kHeaderSize) break;
      auto len = store_wire::decode_length(c->in.data() + off);
      if (!len.ok()) {
        fail(c, Op::kHello, len.status().message());
        break;
      }
      if (!c->authenticated && *len > store_wire::kMaxHelloBody) {
        fail(
            c, Op::kHello,
            fmt::format("store protocol: a frame of {} bytes before hello (a hello has at most {})",
                        *len, store_wire::kMaxHelloBody));
        break;
      }
      if (avail < store_wire::kHeaderSize + *len) break;
      auto req = store_wire::decode_request(c->in.data() + off + store_wire::kHeaderSize, *len);
      off += store_wire::kHeaderSize + *len;
      if (!req.ok()) {
        fail(c, Op::kHello, req.status().message());
        break;
      }
      handle(c, *req);
    }
    if (off > 0) c->in.erase(c->in.begin(), c->in.begin() + static_cast<ptrdiff_t>(off));
    if (c->close_after_flush) c->in.clear();
    if (ok) ok = flush(c);
    return ok && !(c->close_after_flush && c->out_off == c->out.size());
  }

  // A protocol violation: tell the client why, then close the connection.
  void fail(ConnIt c, Op op, const std::string& why) {
    GW_LOG_WARN("store server: dropping a client: {}", why);
    Response r;
    r.code = ReplyCode::kError;
    r.message = why;
    reply(c, op, r);
    c->close_after_flush = true;
  }

  void reply(ConnIt c, Op op, const Response& r) {
    Bytes b = store_wire::encode_response(op, r);
    if (c->out_off == c->out.size()) {
      c->out.clear();
      c->out_off = 0;
    }
    c->out.insert(c->out.end(), b.begin(), b.end());
  }

  // Before authentication: hello (answered with this server's challenge and proof), then auth
  // (the client's proof). docs/wire-store.md.
  void handshake(ConnIt c, Request& req) {
    namespace hs = net::handshake;
    if (!c->challenged) {
      if (req.op != Op::kHello) {
        fail(c, req.op, "store protocol: the first message must be hello");
        return;
      }
      if (req.version != store_wire::kVersion) {
        fail(c, Op::kHello,
             fmt::format("store protocol version {} not supported (server speaks {})", req.version,
                         store_wire::kVersion));
        return;
      }
      Response r;
      Status fresh = hs::fresh_nonce(&r.challenge);
      if (!fresh.ok()) {
        fail(c, Op::kHello, fresh.message());
        return;
      }
      c->client_challenge = req.challenge;
      c->server_challenge = r.challenge;
      r.proof = hs::prove(token_, hs::Role::kListener,
                          store_wire::transcript(c->client_challenge, c->server_challenge));
      c->challenged = true;
      reply(c, Op::kHello, r);
      return;
    }
    if (req.op != Op::kAuth) {
      fail(c, req.op, "store protocol: after hello the client must send its proof (auth)");
      return;
    }
    // A server without a token accepts any client (docs/security.md says what that leaves open).
    if (!token_.empty() &&
        !hs::verify(token_, hs::Role::kConnector,
                    store_wire::transcript(c->client_challenge, c->server_challenge),
                    req.proof.data())) {
      fail(c, Op::kAuth, "job token mismatch: this client did not prove the job token");
      return;
    }
    c->authenticated = true;
    reply(c, Op::kAuth, Response{});
  }

  // Keys written by set are write-once: a second set, an add or an erase of one is refused, so no
  // client can replace a handle, host id or token another rank published.
  bool refuse_write_once(ConnIt c, const Request& req, Response* r) {
    if (written_once_.count(req.key) == 0 && (req.op != Op::kSet || data_.count(req.key) == 0)) {
      return false;
    }
    r->code = ReplyCode::kError;
    r->message = fmt::format(
        "store {} '{}': the key is already set and keys are write-once (a second write is "
        "refused)",
        store_wire::op_name(req.op), req.key);
    GW_LOG_WARN("store server: refused: {}", r->message);
    reply(c, req.op, *r);
    return true;
  }

  // A write that would take this connection past its limits is refused (the key is not created);
  // `value_bytes` is what the write stores. The first refusal per connection is logged.
  bool refuse_over_limit(ConnIt c, const Request& req, size_t value_bytes, Response* r) {
    std::string why;
    const bool creates = data_.count(req.key) == 0;
    if (value_bytes > limits_.max_value_bytes) {
      why = fmt::format("a value of {} bytes exceeds GW_STORE_MAX_VALUE_BYTES ({})", value_bytes,
                        limits_.max_value_bytes);
    } else if (creates && c->keys_created >= limits_.max_keys_per_client) {
      why = fmt::format("this client created {} keys already (GW_STORE_MAX_KEYS_PER_CLIENT)",
                        c->keys_created);
    } else if (creates &&
               c->bytes_stored + req.key.size() + value_bytes > limits_.max_bytes_per_client) {
      why = fmt::format("this client stores {} bytes already (GW_STORE_MAX_BYTES_PER_CLIENT {})",
                        c->bytes_stored, limits_.max_bytes_per_client);
    } else if (creates && bytes_total_ + req.key.size() + value_bytes > limits_.max_bytes_total) {
      why = fmt::format("the store holds {} bytes already (GW_STORE_MAX_BYTES {})", bytes_total_,
                        limits_.max_bytes_total);
    } else {
      if (creates) {
        ++c->keys_created;
        c->bytes_stored += req.key.size() + value_bytes;
        bytes_total_ += req.key.size() + value_bytes;
      }
      return false;
    }
    r->code = ReplyCode::kError;
    r->message =
        fmt::format("store {} '{}' refused: {}", store_wire::op_name(req.op), req.key, why);
    if (!c->limit_logged) {
      c->limit_logged = true;
      GW_LOG_WARN("store server: {}", r->message);
    }
    reply(c, req.op, *r);
    return true;
  }

  void handle(ConnIt c, Request& req) {
    if (!c->authenticated) {
      handshake(c, req);
      return;
    }
    Response r;
    switch (req.op) {
      case Op::kHello:
        fail(c, Op::kHello, "store protocol: hello sent twice");
        return;
      case Op::kAuth:
        fail(c, Op::kAuth, "store protocol: auth sent twice");
        return;
      case Op::kSet:
        if (refuse_write_once(c, req, &r)) return;
        if (refuse_over_limit(c, req, req.value.size(), &r)) return;
        data_[req.key] = std::move(req.value);
        written_once_.insert(req.key);
        reply(c, req.op, r);
        wake_waiters(req.key);
        return;
      case Op::kGet: {
        auto it = data_.find(req.key);
        if (it != data_.end()) {
          r.value = it->second;
          reply(c, req.op, r);
        } else {
          c->waiting = true;
          waiters_.push_back({c, req.key, deadline_after_ms(req.wait_ms)});
        }
        return;
      }
      case Op::kAdd: {
        if (refuse_write_once(c, req, &r)) return;
        if (refuse_over_limit(c, req, kCounterBytes, &r)) return;
        int64_t cur = 0;
        auto it = data_.find(req.key);
        if (it != data_.end() && !store_wire::parse_counter(it->second, &cur)) {
          r.code = ReplyCode::kError;
          r.message = fmt::format("store add '{}': existing value is not an integer", req.key);
        } else if (__builtin_add_overflow(cur, req.delta, &r.number)) {
          r.code = ReplyCode::kError;
          r.message = fmt::format("store add '{}': {} + {} overflows", req.key, cur, req.delta);
        } else {
          data_[req.key] = store_wire::format_counter(r.number);
        }
        reply(c, req.op, r);
        if (r.code == ReplyCode::kOk) wake_waiters(req.key);
        return;
      }
      case Op::kErase:
        if (refuse_write_once(c, req, &r)) return;
        // Only counters can be erased (set keys are write-once).
        if (data_.erase(req.key) > 0) {
          bytes_total_ -= std::min(bytes_total_, req.key.size() + kCounterBytes);
        }
        reply(c, req.op, r);
        return;
    }
  }

  void wake_waiters(const std::string& key) {
    std::vector<ConnIt> woken;
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->key == key) {
        Response r;
        r.value = data_[key];
        reply(it->conn, Op::kGet, r);
        it->conn->waiting = false;
        woken.push_back(it->conn);
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
    // Frames the woken clients sent meanwhile are processed at their next readable event; a
    // well-behaved client sends nothing while it waits, so nothing is buffered in practice.
    for (ConnIt c : woken) {
      if (!c->in.empty()) pending_process_.push_back(c);
    }
  }

  void expire_waiters() {
    auto now = Clock::now();
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->deadline <= now) {
        Response r;
        r.code = ReplyCode::kNotFound;
        reply(it->conn, Op::kGet, r);
        it->conn->waiting = false;
        if (!it->conn->in.empty()) pending_process_.push_back(it->conn);
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
    // Flush replies produced for connections other than the one being served.
    for (auto c = conns_.begin(); c != conns_.end();) {
      auto next = std::next(c);
      bool alive = flush(c);
      if (alive && std::find(pending_process_.begin(), pending_process_.end(), c) !=
                       pending_process_.end()) {
        alive = process(c);
      }
      if (!alive) drop(c);
      c = next;
    }
    pending_process_.clear();
  }

  // Writes what the socket takes now. Returns false when the connection is dead or finished.
  bool flush(ConnIt c) {
    while (c->out_off < c->out.size()) {
      ssize_t k =
          ::send(c->fd.get(), c->out.data() + c->out_off, c->out.size() - c->out_off, MSG_NOSIGNAL);
      if (k > 0) {
        c->out_off += static_cast<size_t>(k);
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      return false;
    }
    c->out.clear();
    c->out_off = 0;
    return !c->close_after_flush;
  }

  void drop(ConnIt c) {
    waiters_.erase(std::remove_if(waiters_.begin(), waiters_.end(),
                                  [&](const Waiter& w) { return w.conn == c; }),
                   waiters_.end());
    pending_process_.erase(std::remove(pending_process_.begin(), pending_process_.end(), c),
                           pending_process_.end());
    conns_.erase(c);
  }

  Fd listen_;
  Fd wake_;
  int port_;
  std::string token_;
  TcpStoreLimits limits_;
  Fd spare_;  // released to accept-and-close one connection when descriptors run out
  Clock::time_point listen_paused_until_{};
  std::atomic<bool> stop_{false};
  std::thread thread_;
  // Owned by the server thread only.
  std::list<Conn> conns_;
  std::vector<Waiter> waiters_;
  std::vector<ConnIt> pending_process_;
  std::map<std::string, Bytes> data_;
  size_t bytes_total_ = 0;              // keys' and values' bytes, against max_bytes_total
  std::set<std::string> written_once_;  // keys written by set (refuse_write_once)
};

struct TcpStore::Impl {
  TcpStoreOptions options;
  std::string connect_host;
  int port = 0;
  std::unique_ptr<TcpStoreServer> server;
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
        TcpStoreServer::start(options.host, options.port, options.token, limits, &bind_errno);
    if (!server.ok() && options.host != "0.0.0.0" && options.host != "::" &&
        bind_errno == EADDRNOTAVAIL) {
      // The address names this host but not one of its interfaces (NAT, container): serve on
      // every interface instead, as torchrun does; the job token still guards the door.
      GW_LOG_WARN("store: cannot bind {} ({}); serving on 0.0.0.0 instead",
                  store_socket::format_addr(options.host, options.port), server.status().message());
      server = TcpStoreServer::start("0.0.0.0", options.port, options.token, limits, nullptr);
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
    impl->port = impl->server->port();
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
