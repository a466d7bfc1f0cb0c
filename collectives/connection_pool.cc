#include "collectives/connection_pool.h"

#include <algorithm>
#include <set>

#include "collectives/backoff.h"
#include "core/log.h"
#include "core/net/auto_backend.h"

namespace gw::coll {

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
  while (!listeners.empty() || !connectors.empty()) {
    bool any = false;
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
