#include "kv/server.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/log.h"
#include "kv/io.h"
#include "kv/push_codec.h"

namespace gw::kv {

namespace {
constexpr int64_t kProbeMs = 500;  // serve(): how often it asks whether the job is still there

Result<sys::Fd> make_eventfd() {
  sys::Fd fd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!fd.valid()) return system_error("kv server eventfd()", errno);
  return fd;
}

void signal_fd(int fd) {
  const uint64_t one = 1;
  // Only EAGAIN (the counter full) can fail here, and then the fd is readable anyway.
  (void)!::write(fd, &one, sizeof(one));
}

void drain_fd(int fd) {
  uint64_t v = 0;
  (void)!::read(fd, &v, sizeof(v));
}
}  // namespace

Server::Server(const ServerOptions& options) : options_(options) {}

Result<std::unique_ptr<Server>> Server::start(const ServerOptions& options) {
  std::unique_ptr<Server> s(new Server(options));
  int port = 0;
  GW_ASSIGN_OR_RETURN(s->listen_fd_, listen_any(&port));
  GW_ASSIGN_OR_RETURN(s->stop_efd_, make_eventfd());
  GW_ASSIGN_OR_RETURN(s->reap_efd_, make_eventfd());
  s->address_ = advertised_address(options.route_host, port);
  s->last_store_ = sys::Clock::now();
  s->accept_thread_ = std::thread([p = s.get()] { p->accept_loop(); });
  return s;
}

Server::~Server() { stop(); }

void Server::stop() {
  stop_.store(true, std::memory_order_release);
  if (stop_efd_.valid()) signal_fd(stop_efd_.get());
  if (accept_thread_.joinable()) accept_thread_.join();
  std::map<uint64_t, std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    threads.swap(conn_threads_);
    ended_.clear();
  }
  for (auto& [n, t] : threads) t.join();
  cv_.notify_all();
}

size_t Server::connection_threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return conn_threads_.size();
}

void Server::reap_ended() {
  std::vector<std::thread> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint64_t n : ended_) {
      auto it = conn_threads_.find(n);
      if (it == conn_threads_.end()) continue;
      done.push_back(std::move(it->second));
      conn_threads_.erase(it);
    }
    ended_.clear();
  }
  // Each has pushed its number as its last act: the joins wait for the thread's return only.
  for (auto& t : done) t.join();
}

void Server::accept_loop() {
  enum { kListen, kStop, kReap };
  pollfd pfds[3] = {
      {listen_fd_.get(), POLLIN, 0}, {stop_efd_.get(), POLLIN, 0}, {reap_efd_.get(), POLLIN, 0}};
  while (!stop_.load(std::memory_order_acquire)) {
    // No timeout: stop() writes stop_efd_, so the wait ends with the server, and an idle server
    // (a daemon's job that never makes a store) is never woken.
    const int n = ::poll(pfds, 3, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      GW_LOG_WARN("kv server {}: poll: {}", options_.rank, std::strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    if (pfds[kStop].revents != 0) break;
    if (pfds[kReap].revents != 0) {
      drain_fd(reap_efd_.get());
      reap_ended();
    }
    if (pfds[kListen].revents == 0) continue;
    auto fd = accept_one(listen_fd_.get(), 0);
    if (!fd.ok()) {
      GW_LOG_WARN("kv server {}: {}", options_.rank, fd.status().message());
      continue;
    }
    if (!fd->valid()) continue;
    auto conn = std::make_shared<Conn>();
    conn->fd = std::move(*fd);
    std::lock_guard<std::mutex> lock(mu_);
    ++open_conns_;
    const uint64_t id = next_conn_++;
    conn_threads_.emplace(id, std::thread([this, conn, id] {
                            serve_conn(conn);
                            {
                              std::lock_guard<std::mutex> l(mu_);
                              --open_conns_;
                              ended_.push_back(id);
                              cv_.notify_all();
                            }
                            signal_fd(reap_efd_.get());
                          }));
  }
}

void Server::send_error(Conn& conn, const Header& h, const Status& s) {
  Header r;
  r.type = Type::kError;
  r.req_id = h.req_id;
  r.key = h.key;
  r.worker = static_cast<uint32_t>(options_.rank);
  r.aux = static_cast<uint64_t>(s.code());
  std::string m = s.message().substr(0, kMaxErrorBytes);
  r.payload = static_cast<uint32_t>(m.size());
  std::lock_guard<std::mutex> lock(conn.write_mu);
  (void)write_frame(conn.fd.get(), r, m.data(), sys::deadline_after_ms(options_.timeout_ms));
}

Status Server::join(Conn& conn, const Header& h, const std::vector<uint8_t>& payload) {
  StoreConfig c;
  std::string token;
  GW_RETURN_IF_ERROR(decode_hello(payload.data(), payload.size(), &c, &token));
  if (token != options_.token) {
    return invalid_arg("kv server {}: worker {} presented another job token", options_.rank,
                       h.worker);
  }
  if (h.worker >= c.workers) {
    return invalid_arg("kv hello: worker {} out of range for {} workers", h.worker, c.workers);
  }
  std::lock_guard<std::mutex> lock(mu_);
  StoreEntry& e = stores_[h.aux];
  if (!e.rules) {
    if (!c.codec.empty()) {
      GW_ASSIGN_OR_RETURN(coll::CodecSpec spec, check_codec_spec(c.codec));
      GW_ASSIGN_OR_RETURN(std::unique_ptr<coll::Codec> codec, coll::Codec::create(spec));
      e.codec = std::move(codec);
    }
    e.rules = std::make_unique<StoreRules>(c, options_.rank);
    last_store_ = sys::Clock::now();
  } else if (!(e.rules->config() == c)) {
    return invalid_arg(
        "kv store {}: worker {} created it with other settings than the first worker (mode, "
        "staleness, sync_k, update, lr, momentum, partition_bytes, chunk_bytes "
        "(GW_KV_CHUNK_BYTES), "
        "codec and the number of workers must agree)",
        h.aux, h.worker);
  }
  if (e.conns.count(h.worker) != 0 || e.rules->said_bye(h.worker) || !e.rules->alive(h.worker)) {
    return invalid_arg("kv store {}: worker {} joined twice", h.aux, h.worker);
  }
  conn.store = h.aux;
  conn.worker = h.worker;
  conn.joined = true;
  return ok_status();
}

void Server::dispatch_locked(uint64_t store, std::vector<Answer>& answers) {
  auto it = stores_.find(store);
  for (Answer& a : answers) {
    if (it == stores_.end()) break;
    auto c = it->second.conns.find(a.worker);
    if (c == it->second.conns.end()) continue;
    Conn& to = *c->second;
    Outgoing o;
    o.h = a.reply;
    if (!a.payload.empty()) o.payload = a.payload.shared();
    std::lock_guard<std::mutex> lock(to.q_mu);
    if (to.broken || to.closing) continue;
    to.queue.push_back(std::move(o));
    to.q_cv.notify_one();
  }
  answers.clear();
}

void Server::write_loop(Conn* conn) {
  for (;;) {
    Outgoing o;
    {
      std::unique_lock<std::mutex> lock(conn->q_mu);
      conn->q_cv.wait(lock, [&] { return !conn->queue.empty() || conn->closing; });
      if (conn->queue.empty()) return;  // closing and nothing left
      o = std::move(conn->queue.front());
      conn->queue.pop_front();
    }
    Status s;
    {
      std::lock_guard<std::mutex> lock(conn->write_mu);
      s = write_frame(conn->fd.get(), o.h, o.payload ? o.payload->data() : nullptr,
                      sys::deadline_after_ms(options_.timeout_ms));
    }
    if (!s.ok()) {
      // The worker's reader sees the broken connection and reports the worker dead.
      shutdown(conn->fd.get(), SHUT_RDWR);
      std::lock_guard<std::mutex> lock(conn->q_mu);
      conn->broken = true;
      conn->queue.clear();
      return;
    }
  }
}

void Server::close_writer(Conn& conn) {
  {
    std::lock_guard<std::mutex> lock(conn.q_mu);
    conn.closing = true;
    conn.q_cv.notify_all();
  }
  // Stopping: a worker that reads nothing must not hold the writer for timeout_ms.
  if (stop_.load(std::memory_order_acquire)) shutdown(conn.fd.get(), SHUT_RDWR);
  if (conn.writer.joinable()) conn.writer.join();
}

void Server::serve_conn(std::shared_ptr<Conn> conn) {
  const int fd = conn->fd.get();
  std::vector<uint8_t> payload;
  std::vector<Answer> answers;
  Header h;
  Status why;
  // The hello: within the deadline.
  why = read_header(fd, &h, sys::deadline_after_ms(options_.timeout_ms), &stop_, stop_efd_.get());
  if (why.ok() && h.type != Type::kHello) why = invalid_arg("kv: first frame is not a hello");
  if (why.ok()) why = check_request(h, kMaxWorkers);
  if (why.ok()) {
    payload.resize(h.payload);
    why = read_exact(fd, payload.data(), payload.size(),
                     sys::deadline_after_ms(options_.timeout_ms), &stop_, false, stop_efd_.get());
  }
  if (why.ok()) why = join(*conn, h, payload);
  if (!why.ok()) {
    if (why.code() == Code::kInvalidArg) {
      GW_LOG_WARN("kv server {}: refused a connection: {}", options_.rank, why.message());
      send_error(*conn, h, why);
    }
  } else {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stores_[conn->store].conns[conn->worker] = conn;
    }
    Header ok;  // the hello's answer: joined
    ok.type = Type::kReply;
    ok.req_id = h.req_id;
    ok.worker = static_cast<uint32_t>(options_.rank);
    {
      std::lock_guard<std::mutex> lock(conn->write_mu);
      why = write_frame(fd, ok, nullptr, sys::deadline_after_ms(options_.timeout_ms));
    }
    conn->writer = std::thread([this, c = conn.get()] { write_loop(c); });
    uint32_t workers = 0;
    std::shared_ptr<const coll::Codec> codec;
    {
      std::lock_guard<std::mutex> lock(mu_);
      workers = stores_[conn->store].rules->config().workers;
      codec = stores_[conn->store].codec;
    }
    std::vector<uint8_t> decoded;  // an encoded push's values (kv/push_codec.h)
    while (why.ok()) {
      why = read_header(fd, &h, sys::Deadline::max(), &stop_, stop_efd_.get());
      if (!why.ok()) break;
      why = check_request(h, workers, codec.get());
      if (why.ok() && h.worker != conn->worker) {
        why = invalid_arg("kv: worker {} sent a frame as worker {}", conn->worker, h.worker);
      }
      if (why.ok() && h.type == Type::kHello) why = invalid_arg("kv: a second hello");
      if (!why.ok()) {
        send_error(*conn, Header{}, why);
        break;
      }
      payload.resize(h.payload);
      why = read_exact(fd, payload.data(), payload.size(),
                       sys::deadline_after_ms(options_.timeout_ms), &stop_, false, stop_efd_.get());
      if (!why.ok()) break;
      const uint8_t* data = payload.data();
      if (h.flags != 0) {  // outside mu_: other connections go on while this one decodes
        why = decode_push(*codec, &h, payload.data(), &decoded);
        if (!why.ok()) {
          send_error(*conn, h, why);
          break;
        }
        data = decoded.data();
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        StoreRules& rules = *stores_[conn->store].rules;
        if (h.type == Type::kBye) {
          rules.on_bye(conn->worker, &answers);
        } else {
          rules.on_frame(h, data, &answers);
        }
        dispatch_locked(conn->store, answers);
      }
      if (h.type == Type::kBye) break;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      StoreEntry& e = stores_[conn->store];
      e.conns.erase(conn->worker);
      if (!e.rules->said_bye(conn->worker) && !stop_.load(std::memory_order_acquire)) {
        e.rules->on_dead(conn->worker, why.ok() ? "closed" : why.message(), &answers);
      }
      dispatch_locked(conn->store, answers);
    }
    close_writer(*conn);
  }
  conn->fd.reset();
}

Status Server::serve(const std::function<bool()>& job_alive) {
  std::unique_lock<std::mutex> lock(mu_);
  bool was_done = false;
  sys::Deadline next_probe{};
  for (;;) {
    bool all_done = !stores_.empty() && open_conns_ == 0;
    for (auto& [id, e] : stores_) all_done = all_done && e.rules->finished();
    const auto now = sys::Clock::now();
    if (all_done && !was_done) last_store_ = now;  // idle from here
    was_done = all_done;
    if (all_done) {
      if (now >= last_store_ + std::chrono::milliseconds(options_.timeout_ms)) return ok_status();
      if (now >= next_probe) {
        next_probe = now + std::chrono::milliseconds(kProbeMs);
        lock.unlock();
        const bool alive = job_alive();
        lock.lock();
        if (!alive) return ok_status();
        continue;  // re-check: a worker may have come meanwhile
      }
    }
    if (stores_.empty() && now >= last_store_ + std::chrono::milliseconds(options_.timeout_ms)) {
      return timeout_error("kv server {} at {}: no worker came within GW_TIMEOUT_MS ({} ms)",
                           options_.rank, address_, options_.timeout_ms);
    }
    // Asleep until something it decides on can have changed: a connection ending (the only way
    // a store finishes and all_done turns true; it notifies cv_), the idle deadline, or the next
    // probe of the job. While stores are in use it is never woken by a timer.
    if (all_done) {
      cv_.wait_until(
          lock, std::min(next_probe, last_store_ + std::chrono::milliseconds(options_.timeout_ms)));
    } else if (stores_.empty()) {
      cv_.wait_until(lock, last_store_ + std::chrono::milliseconds(options_.timeout_ms));
    } else {
      cv_.wait(lock);
    }
  }
}

Status Server::wait_finished(uint64_t id, sys::Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    auto it = stores_.find(id);
    if (it != stores_.end() && it->second.rules->finished()) return ok_status();
    if (sys::expired(deadline)) {
      std::string missing;
      if (it != stores_.end()) {
        for (uint32_t w = 0; w < it->second.rules->config().workers; ++w) {
          if (it->second.rules->alive(w) && !it->second.rules->said_bye(w)) {
            missing += fmt::format("{}{}", missing.empty() ? "" : ", ", w);
          }
        }
      }
      return timeout_error("kv server {}: workers [{}] did not destroy store {} in time",
                           options_.rank, missing.empty() ? "all" : missing, id);
    }
    cv_.wait_for(lock, std::chrono::milliseconds(50));
  }
}

Status Server::wait_all_finished(sys::Deadline deadline, const std::atomic<bool>* stop) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    std::string open;
    for (const auto& [id, e] : stores_) {
      if (!e.rules->finished()) open += fmt::format("{}{}", open.empty() ? "" : ", ", id);
    }
    if (open.empty()) return ok_status();
    if (stop != nullptr && stop->load()) {
      return aborted_error("kv server {}: stopped with stores [{}] in use", options_.rank, open);
    }
    if (sys::expired(deadline)) {
      return timeout_error("kv server {}: stores [{}] still in use at the deadline", options_.rank,
                           open);
    }
    cv_.wait_for(lock, std::chrono::milliseconds(50));
  }
}

std::vector<Server::StoreInfo> Server::stores() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<StoreInfo> out;
  out.reserve(stores_.size());
  for (const auto& [id, e] : stores_) {
    if (e.rules) out.push_back({id, e.rules->summary()});
  }
  return out;
}

}  // namespace gw::kv
