// The TCP store's server: one thread, poll() over every client (store_server.h). Wire format:
// docs/wire-store.md, codec in store_wire.cc.
#include "core/store_server.h"

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
#include <set>
#include <thread>
#include <type_traits>

#include "core/config.h"
#include "core/core_config.h"
#include "core/log.h"
#include "core/net/handshake.h"
#include "core/store_socket.h"
#include "core/store_wire.h"
#include "core/sys/fd.h"

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

}  // namespace

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
    Deadline evictable;       // its grace period's end (sys::kEvictGraceMs): not dropped before
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
      size_t pending = 0;
      ConnIt oldest_pending = conns_.end();  // conns_ is in order of arrival
      for (auto it = conns_.begin(); it != conns_.end(); ++it) {
        if (it->authenticated) continue;
        if (oldest_pending == conns_.end()) oldest_pending = it;
        ++pending;
      }
      const bool make_way = pending >= limits_.max_pending_hello ||
                            (conns_.size() >= limits_.max_clients && pending > 0);
      if (make_way && Clock::now() < oldest_pending->evictable) {
        // Every stranger is in its grace period: the newcomers wait in the backlog until the
        // oldest's ends, so a client whose hello comes a little after its connect is not pushed
        // out by the connections behind it.
        listen_paused_until_ = oldest_pending->evictable;
        return;
      }
      int fd = ::accept4(listen_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE) shed_one();
        return;  // EAGAIN, or a transient error: try at the next wake-up
      }
      if (make_way) {  // idle strangers make way for clients that may say hello
        GW_LOG_WARN("store server: dropping a client that has not said hello (too many pending)");
        drop(oldest_pending);
      }
      if (conns_.size() >= limits_.max_clients) {
        GW_LOG_WARN("store server: refusing a client, {} connections already", conns_.size());
        ::close(fd);
        continue;
      }
      conns_.emplace_back();
      conns_.back().fd.reset(fd);
      conns_.back().hello_deadline = deadline_after_ms(limits_.hello_timeout_ms);
      conns_.back().evictable = deadline_after_ms(sys::kEvictGraceMs);
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

void TcpStoreServerDeleter::operator()(TcpStoreServer* server) const { delete server; }

Result<TcpStoreServerPtr> start_store_server(const std::string& host, int port, std::string token,
                                             TcpStoreLimits limits, int* failed_errno) {
  GW_ASSIGN_OR_RETURN(std::unique_ptr<TcpStoreServer> s,
                      TcpStoreServer::start(host, port, std::move(token), limits, failed_errno));
  return TcpStoreServerPtr(s.release());
}

int store_server_port(const TcpStoreServer& server) { return server.port(); }

}  // namespace gw
