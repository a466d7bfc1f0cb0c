#include "collectives/connection_pool.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

#include "collectives/backoff.h"
#include "core/log.h"
#include "core/net/auto_backend.h"

namespace gw::coll {
namespace {

std::string alive_key(int rank) { return fmt::format("alive/{}", rank); }

// Linux's largest pid (PID_MAX_LIMIT, 2^22).
constexpr unsigned long long kMaxPid = 4194304;

// The pid namespace's inode: a pid means the same process only within one namespace.
unsigned long long pid_namespace() {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<unsigned long long>(st.st_ino) : 0;
}

// State and start time (clock ticks after boot: field 22 of /proc/PID/stat, which tells a process
// from a later one with its pid) of `pid`; false when there is no such process.
bool read_process(long pid, char* state, unsigned long long* start) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t name_end = text.rfind(')');  // the command name may hold spaces and parentheses
  if (name_end == std::string::npos) return false;
  std::istringstream fields(text.substr(name_end + 1));
  std::string skip;
  fields >> *state;
  for (int field = 4; field < 22; ++field) fields >> skip;
  fields >> *start;
  return !fields.fail();
}

}  // namespace

std::string format_announcement(const ProcessAnnouncement& a) {
  return fmt::format("{} {} {}", a.pid, a.start, a.pidns);
}

std::optional<ProcessAnnouncement> parse_announcement(std::string_view text) {
  // Three decimal fields split by single spaces, nothing else.
  unsigned long long v[3] = {0, 0, 0};
  size_t at = 0;
  for (int field = 0; field < 3; ++field) {
    if (field > 0) {
      if (at >= text.size() || text[at] != ' ') return std::nullopt;
      ++at;
    }
    const char* begin = text.data() + at;
    const auto [end, ec] = std::from_chars(begin, text.data() + text.size(), v[field]);
    if (ec != std::errc() || end == begin) return std::nullopt;
    at += static_cast<size_t>(end - begin);
  }
  if (at != text.size() || v[0] == 0 || v[0] > kMaxPid || v[2] == 0) return std::nullopt;
  ProcessAnnouncement a;
  a.pid = static_cast<long>(v[0]);
  a.start = v[1];
  a.pidns = v[2];
  return a;
}

Status ConnectionPool::announce(Deadline deadline) {
  char state = 0;
  unsigned long long start = 0;
  const long pid = static_cast<long>(::getpid());
  if (group_.store() == nullptr || !read_process(pid, &state, &start)) return ok_status();
  const std::string v = format_announcement({pid, start, pid_namespace()});
  return group_.store()->set(alive_key(group_.rank()), Bytes(v.begin(), v.end()), deadline);
}

std::string ConnectionPool::gone(int peer) {
  if (peer < 0 || peer >= group_.size() || !group_.same_host(peer) || group_.store() == nullptr) {
    return std::string();
  }
  auto it = announced_.find(peer);
  if (it == announced_.end()) {
    auto v = group_.store()->get(alive_key(peer), deadline_after_ms(20));
    if (!v.ok()) return std::string();  // not announced (yet): not known
    it = announced_.emplace(peer, std::string(v->begin(), v->end())).first;
  }
  const std::optional<ProcessAnnouncement> a = parse_announcement(it->second);
  if (!a || a->pidns != pid_namespace()) return std::string();  // another namespace: not judged
  const long pid = a->pid;
  char state = 0;
  unsigned long long now_start = 0;
  if (read_process(pid, &state, &now_start) && now_start == a->start && state != 'Z' &&
      state != 'X') {
    return std::string();
  }
  return fmt::format(
      "its process (pid {}, on this host) has exited since it set up this communicator", pid);
}

ConnectionPool::ConnectionPool(const Group& group, PoolOptions options,
                               const std::atomic<bool>* aborted)
    : group_(group), options_(std::move(options)), aborted_(aborted) {
  if (!options_.factory) options_.factory = &net::make_transport;
}

ConnectionPool::~ConnectionPool() { close_all(); }

void ConnectionPool::close_all() {
  send_.clear();
  recv_.clear();
}

Result<net::Transport*> ConnectionPool::transport_for_link(bool same_host, int peer) {
  const std::string& mode = options_.mode;
  std::string name = mode;
  if (mode == "auto") {
    GW_ASSIGN_OR_RETURN(net::AutoChoice choice, net::choose_auto_backend(same_host, auto_failed_));
    name = choice.name;
    if (transports_.find(name) == transports_.end()) GW_LOG_DEBUG("{}", choice.reason);
  }
  auto it = transports_.find(name);
  if (it != transports_.end()) return it->second.get();
  net::TransportOptions topts;
  topts.job_token = group_.token();
  topts.timeout_ms = options_.timeout_ms;
  topts.host_id = group_.host_id();
  topts.rank = group_.rank();
  topts.config = options_.config;
  topts.route_host = options_.route_host;
  auto t = options_.factory(name, topts);
  if (!t.ok() && mode == "auto" && t.status().code() == Code::kUnsupported) {
    // auto: a host without shared memory still works over loopback tcp.
    GW_LOG_WARN("transport {} unavailable ({}); auto chooses again without it", name,
                t.status().to_string());
    auto_failed_.push_back(name);
    return transport_for_link(same_host, peer);
  }
  if (!t.ok()) {
    if (peer < 0) return t.status().with_context(fmt::format("transport {}", name));
    return t.status().with_context(fmt::format("transport {} for rank {}", name, peer));
  }
  net::Transport* raw = t->get();
  transports_[name] = std::move(*t);
  return raw;
}

Status ConnectionPool::connect_all(const char* name, const std::vector<Plan>& plans,
                                   Deadline deadline) {
  const int rank = group_.rank();
  Store& store = *group_.store();
  auto aborted = [this] { return aborted_->load(); };
  std::set<std::pair<int, int>> need_send, need_recv;
  for (const auto& p : plans) {
    for (const auto& st : p.sched) {
      if (st.send_to >= 0 && !send_.count({st.send_to, p.chan}))
        need_send.insert({st.send_to, p.chan});
      if (st.recv_from >= 0 && !recv_.count({st.recv_from, p.chan}))
        need_recv.insert({st.recv_from, p.chan});
    }
  }
  if (need_send.empty() && need_recv.empty()) return ok_status();
  // 1. Listen and publish every handle we need first: this never blocks, so no rank can wait on
  //    a handle that its peer only publishes after waiting on ours.
  std::map<std::pair<int, int>, std::unique_ptr<net::Listener>> listeners;
  // (Plain names, not structured bindings: clang 14, the fuzz preset's compiler, cannot capture
  // those in a lambda.)
  for (const auto& link : need_recv) {
    const int peer = link.first, chan = link.second;
    auto ctx = [&] {
      return fmt::format("{}: connect from rank {} (channel {})", name, peer, chan);
    };
    auto t = transport_for(peer);
    if (!t.ok()) return t.status().with_context(ctx());
    net::Handle h;
    auto l = (*t)->listen(&h);
    if (!l.ok()) return l.status().with_context(ctx());
    (*l)->expect_peer(peer);  // only that rank may connect here
    Status s = store.set(key(peer, rank, chan), Bytes(h.bytes.begin(), h.bytes.end()), deadline);
    if (!s.ok()) return s.with_context(ctx());
    listeners[{peer, chan}] = std::move(*l);
  }
  // 2. Read the peers' handles (short waits so abort is noticed) and start connecting.
  std::map<std::pair<int, int>, std::unique_ptr<net::Connector>> connectors;
  for (const auto& link : need_send) {
    const int peer = link.first, chan = link.second;
    auto ctx = [&] { return fmt::format("{}: connect to rank {} (channel {})", name, peer, chan); };
    Result<Bytes> v = Status(Code::kTimeout, "not yet");
    while (true) {
      if (aborted()) return aborted_error("{}: communicator aborted", ctx());
      auto slice = std::min(deadline, deadline_after_ms(100));
      v = store.get(key(rank, peer, chan), slice);
      if (v.ok() || v.status().code() != Code::kTimeout || Clock::now() >= deadline) break;
      // A peer that left after set-up never publishes its handle: known only where it ran here.
      if (std::string why = gone(peer); !why.empty()) {
        return peer_error("{}: rank {} is gone: {}", ctx(), peer, why);
      }
    }
    if (!v.ok()) return v.status().with_context(ctx() + ": waiting for its handle");
    if (v->size() != net::kHandleSize) {
      return internal_error("{}: handle of {} bytes, expected {}", ctx(), v->size(),
                            net::kHandleSize);
    }
    net::Handle h;
    std::copy(v->begin(), v->end(), h.bytes.begin());
    auto t = transport_for(peer);
    if (!t.ok()) return t.status().with_context(ctx());
    auto c = (*t)->connect(h);
    if (!c.ok()) return c.status().with_context(ctx());
    connectors[{peer, chan}] = std::move(*c);
  }
  // 3. Poll connects and accepts alternately until all are up.
  Backoff backoff(options_.spin_us);
  auto check_at = Clock::now() + std::chrono::milliseconds(100);
  while (!listeners.empty() || !connectors.empty()) {
    bool any = false;
    if (Clock::now() >= check_at) {
      // A peer gone after publishing its handle (one that refuses, the connector sees itself).
      check_at = Clock::now() + std::chrono::milliseconds(100);
      std::set<int> waited;
      for (const auto& c : connectors) waited.insert(c.first.first);
      for (const auto& l : listeners) waited.insert(l.first.first);
      for (int peer : waited) {
        if (std::string why = gone(peer); !why.empty()) {
          return peer_error("{}: connecting with rank {}: rank {} is gone: {}", name, peer, peer,
                            why);
        }
      }
    }
    for (auto it = connectors.begin(); it != connectors.end();) {
      auto sc = it->second->poll();
      if (!sc.ok()) {
        return sc.status().with_context(fmt::format("{}: connect to rank {} (channel {})", name,
                                                    it->first.first, it->first.second));
      }
      if (*sc) {
        send_[it->first] = std::move(*sc);
        it = connectors.erase(it);
        any = true;
      } else {
        ++it;
      }
    }
    for (auto it = listeners.begin(); it != listeners.end();) {
      auto rc = it->second->accept();
      if (!rc.ok()) {
        return rc.status().with_context(fmt::format("{}: accept from rank {} (channel {})", name,
                                                    it->first.first, it->first.second));
      }
      if (*rc) {
        recv_[it->first] = std::move(*rc);
        it = listeners.erase(it);
        any = true;
      } else {
        ++it;
      }
    }
    if (aborted()) return aborted_error("{}: communicator aborted while connecting", name);
    if (Clock::now() >= deadline) {
      int peer =
          !listeners.empty() ? listeners.begin()->first.first : connectors.begin()->first.first;
      return timeout_error("{}: connecting with rank {}: not established within {} ms", name, peer,
                           options_.timeout_ms);
    }
    if (any) {
      backoff.reset();
    } else {
      backoff.idle();
    }
  }
  return ok_status();
}

}  // namespace gw::coll
