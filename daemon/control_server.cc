// gradwired's control socket (Server::Impl, daemon/server_impl.h): gradwirectl's requests and
// their answers (daemon/control.h), read without blocking the serve loop.
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "core/config.h"
#include "core/log.h"
#include "core/sys/unix_socket.h"
#include "daemon/daemon_config.h"
#include "daemon/server_impl.h"

namespace gw::daemon {

namespace {
constexpr int64_t kControlTimeoutMs = 2000;
}  // namespace

void answer_control(sys::Fd& sock, const std::string& body) {
  const std::vector<uint8_t> frame = frame_control(body);
  // Bounded: a gradwirectl that does not read its answer costs the main loop this long at most.
  Status s = sys::send_with_fds(sock.get(), frame.data(), frame.size(), {},
                                sys::deadline_after_ms(500), "control answer");
  if (!s.ok()) GW_LOG_WARN("gradwired: control answer: {}", s.message());
  sock.reset();
}

void Server::Impl::accept_control() {
  // At most kMaxControlConns a round, and a newcomer evicts only a connection that has had its
  // grace period to send its request (the rest wait in the backlog).
  for (size_t accepted = 0; accepted < kMaxControlConns; ++accepted) {
    if (full_of_young(ctl_pending, kMaxControlConns)) return;
    auto fd = sys::accept_unix(ctl_listen.get());
    if (!fd.ok()) {
      GW_LOG_WARN("gradwired: control accept: {}", fd.status().message());
      return;
    }
    if (!fd->valid()) return;
    PendingConn p;
    p.sock = std::move(*fd);
    p.deadline = sys::deadline_after_ms(kControlTimeoutMs);
    p.evictable = sys::deadline_after_ms(sys::kEvictGraceMs);
    auto cred = sys::peer_credentials(p.sock.get());
    Status ok = cred.ok() ? check_peer(p.sock.get(), *cred) : cred.status();
    if (!ok.ok()) {
      GW_LOG_WARN("gradwired: refusing a control connection of pid {}: {}",
                  cred.ok() ? cred->pid : 0, ok.message());
      answer_control(p.sock, encode_control_error(ok));
      continue;
    }
    p.pid = cred->pid;
    p.uid = cred->uid;
    if (ctl_pending.size() >= kMaxControlConns) {  // the oldest makes room for the newcomer
      PendingConn& oldest = ctl_pending.front();
      GW_LOG_WARN("gradwired: evicting the control connection of pid {}: {} are open", oldest.pid,
                  kMaxControlConns);
      answer_control(oldest.sock, encode_control_error(no_memory(
                                      "evicted: {} control connections were waiting for their "
                                      "request and this was the oldest",
                                      kMaxControlConns)));
      ctl_pending.erase(ctl_pending.begin());
    }
    ctl_pending.push_back(std::move(p));
  }
}

bool Server::Impl::step_control(PendingConn& p) {
  if (p.trace) return step_trace(p);  // asked already: only a close is expected
  uint8_t tmp[512];
  std::vector<sys::Fd> fds;
  auto n = sys::recv_with_fds(p.sock.get(), tmp, sizeof(tmp), &fds, sys::kNoWait, "control");
  Status bad;
  if (!fds.empty()) {
    bad = peer_error("control request came with descriptors");
  } else if (!n.ok()) {
    if (n.status().code() == Code::kTimeout) return false;
    bad = n.status();
  } else if (*n == 0) {
    return true;  // gone without asking
  } else {
    p.buf.insert(p.buf.end(), tmp, tmp + *n);
    if (p.buf.size() < kFrameHeaderBytes) return false;
    uint32_t len = 0;
    std::memcpy(&len, p.buf.data(), sizeof(len));
    if (len > kMaxControlRequestBytes) {
      bad = peer_error("control request of {} bytes (at most {})", len, kMaxControlRequestBytes);
    } else if (p.buf.size() < kFrameHeaderBytes + len) {
      return false;
    } else if (p.buf.size() > kFrameHeaderBytes + len) {
      bad = peer_error("bytes after the control request");
    } else {
      auto command = decode_control_request(p.buf.data() + kFrameHeaderBytes, len);
      if (command.ok() && *command == ControlCommand::kTrace) {
        return start_trace(p, p.buf.data() + kFrameHeaderBytes, len);  // answered at its end
      }
      if (command.ok()) {
        answer_control(p.sock, encode_control_result(*command, answer(*command)));
        return true;
      }
      bad = command.status();
    }
  }
  GW_LOG_WARN("gradwired: control connection of pid {}: {}", p.pid, bad.message());
  answer_control(p.sock, encode_control_error(bad));
  return true;
}

nlohmann::json Server::Impl::answer(ControlCommand command) const {
  using nlohmann::json;
  switch (command) {
    case ControlCommand::kStatus: {
      json r;
      r["version"] = GW_VERSION_STRING;
      r["pid"] = static_cast<int64_t>(::getpid());
      r["uptime_s"] = static_cast<double>(sys::now_ns() - started_ns) / 1e9;
      r["socket"] = opt.socket_path;
      r["control_socket"] = ctl_path;
      r["transport"] = encode_offer(job_offer());
      r["device_buffers"] = device_buffers.yes;
      r["device_buffers_why"] = device_buffers.why;
      {
        std::lock_guard<std::mutex> lock(dpdk_port->mu);
        r["dpdk_port"] =
            dpdk_port->text.empty() ? "none: this daemon offers no dpdk" : dpdk_port->text;
      }
      r["host_id"] = host_id;
      r["clients"] = counters.live_clients.load();
      r["jobs"] = counters.live_jobs.load();
      r["arenas"] = counters.live_arenas.load();
      r["imports"] = counters.live_imports.load();
      r["accepted"] = counters.accepted.load();
      r["refused"] = counters.refused.load();
      r["collectives"] = counters.collectives.load();
      r["failed"] = counters.failed.load();
      return r;
    }
    case ControlCommand::kJobs: {
      json rows = json::array();
      for (const auto& [key, job] : jobs) {
        const Hello& h = job->first;
        json r;
        r["job"] = job_name(h);
        r["world"] = h.world_size;
        r["hosts"] = h.num_hosts;
        r["host_index"] = h.host_index;
        r["local_trainers"] = job->joined;
        r["local_size"] = h.local_size;
        r["state"] = !job->started          ? "joining"
                     : job->finished.load() ? "ended"
                     : job->failed.load()   ? "failed"
                     : job->ended.load()    ? "ended"
                                            : "running";
        r["collectives"] = job->done.load();
        r["errors"] = job->errors.load();
        r["imports"] = job->imports->load();
        // A connection of the NCCL plugin's daemon mode: its NCCL job and the bytes it carried.
        if (!job->nccl_job.empty()) {
          r["nccl_job"] = job->nccl_job;
          r["nccl_bytes"] = job->nccl_bytes.load();
        }
        // Between the job's daemons: agreed when they met; none for a job of one host.
        r["transport"] = h.num_hosts == 1 ? std::string("local") : job->transport_name();
        rows.push_back(std::move(r));
      }
      return rows;
    }
    case ControlCommand::kClients: {
      json rows = json::array();
      for (const auto& [id, c] : clients) {
        json r;
        r["id"] = id;
        r["pid"] = static_cast<int64_t>(c->pid);
        r["uid"] = static_cast<int64_t>(c->uid);
        r["job"] = job_name(c->hello);
        r["rank"] = c->hello.rank;
        r["local_rank"] = c->hello.local_rank;
        r["arena_bytes"] = c->hello.arena_bytes;
        r["requests"] = c->requests.load(std::memory_order_relaxed);
        rows.push_back(std::move(r));
      }
      return rows;
    }
    case ControlCommand::kKv: {
      json rows = json::array();
      for (const KvStoreStats& k : counters.kv_stores()) {
        json r;
        r["job"] = k.job;
        r["host_index"] = k.host_index;
        r["store"] = k.store;
        r["mode"] = k.mode;
        r["update"] = k.update;
        r["codec"] = k.codec;
        r["workers"] = k.workers;
        r["live"] = k.live;
        r["keys"] = k.keys;
        r["partitions"] = k.partitions;
        r["bytes"] = k.bytes;
        r["min_clock"] = k.min_clock;
        r["max_clock"] = k.max_clock;
        r["lag"] = k.max_clock - std::min(k.min_clock, k.max_clock);
        r["dropped"] = k.dropped;
        r["lost"] = k.lost;
        r["state"] = k.state;
        rows.push_back(std::move(r));
      }
      return rows;
    }
    case ControlCommand::kConfig: {
      (void)daemon_config::rows();  // the daemon's own rows are registered wherever it runs
      json rows = json::array();
      for (const config::Row* row : config::table()) {
        const config::Value v = config::resolve(*row);
        json r;
        r["name"] = row->name;
        r["key"] = config::toml_key(*row);
        r["value"] = config::shown(*row, v);  // a secret only as set or unset
        r["default"] = row->default_value;
        // gradwired's command-line options are the only API-layer values in the daemon.
        r["source"] =
            v.source == config::Source::kApi ? std::string("command line") : config::source_text(v);
        rows.push_back(std::move(r));
      }
      return rows;
    }
    case ControlCommand::kTrace:  // answered by finish_trace (job_trace.cc)
      break;
  }
  return json::object();
}

void Server::Impl::expire_control(PendingConn& p) {
  if (p.trace) return finish_trace(p);
  answer_control(p.sock, encode_control_error(timeout_error(
                             "no complete control request within {} ms", kControlTimeoutMs)));
}

}  // namespace gw::daemon
