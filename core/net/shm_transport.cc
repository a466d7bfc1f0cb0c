#include "core/net/shm_transport.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <optional>
#include <vector>

#include "core/config.h"
#include "core/core_config.h"
#include "core/log.h"
#include "core/net/comm_adapter.h"
#include "core/net/handshake.h"
#include "core/net/pending_accept.h"
#include "core/net/request.h"
#include "core/net/shm_cma.h"
#include "core/net/shm_comm.h"
#include "core/net/shm_config.h"
#include "core/net/shm_wire.h"
#include "core/net/socket_util.h"
#include "core/sys/fd.h"
#include "core/sys/memfd_region.h"
#include "core/sys/time.h"
#include "core/sys/unix_socket.h"

namespace gw::net {
namespace {

using handshake::kAccept;
using handshake::kRefuse;
using sys::Fd;
using sys::MemfdRegion;
using sys::now_ns;

using shm::Challenge;
using shm::Geometry;
using shm::HandleWire;
using shm::Hello;
using shm::kHostIdSize;
using shm::kLivenessNs;
using shm::kRetryNs;
using shm::kRingMagic;
using shm::kSockNameSize;
using shm::kVersion;
using shm::Proof;
using shm::Reply;
using shm::Ring;
using shm::RingCtrl;
using shm::SlotHeader;
using shm::transcript;

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// Host ids longer than the handle field travel as a hash.
std::string encode_host_id(const std::string& id) {
  if (id.size() <= kHostIdSize) return id;
  return fmt::format("#{:016x}", fnv1a(id));
}

std::string default_host_id() {
  std::string id = config::get_string(core_config::kHostId);
  if (!id.empty()) return id;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string boot;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot);
  return fmt::format("{}:{}", host, boot);
}

struct ShmConfig {
  Geometry geometry;
  uint64_t cma_min = 0;            // GW_SHM_CMA_MIN
  bool cma_inject_refuse = false;  // GW_SHM_CMA_INJECT_REFUSE
};

class ShmListener final : public Listener {
 public:
  ShmListener(Fd fd, uint64_t nonce, ShmConfig config, TransportOptions options)
      : fd_(std::move(fd)), nonce_(nonce), config_(config), options_(std::move(options)) {}

  Result<std::unique_ptr<RecvComm>> accept() override {
    // The handshakes already held move first, so a flood of new connections cannot push out one
    // that has spoken before it was read.
    const int64_t now = now_ns();
    std::vector<Pending>& pending = accepts_.held();
    for (size_t i = 0; i < pending.size(); ++i) {
      Result<std::unique_ptr<RecvComm>> comm = advance(pending[i], now);
      if (!comm.ok() || *comm != nullptr || !pending[i].fd.valid()) {
        pending.erase(pending.begin() + static_cast<ptrdiff_t>(i));
        if (!comm.ok() || *comm != nullptr) return comm;
        --i;
      }
    }
    accept_new(now);
    return std::unique_ptr<RecvComm>();
  }

 private:
  struct Pending {
    Fd fd;
    int64_t deadline_ns = 0;
    bool challenged = false;  // the hello passed and the challenge went out
    Hello hello{};
    handshake::Nonce challenge{};
    int pid = 0;
    std::string addr;         // unnamed: a unix socket's peer has no address worth logging
    int64_t accepted_ns = 0;  // PendingAccept's: its grace period
    bool silent() const { return !challenged; }
  };

  // New connections, under the policy of core/net/pending_accept.h. Never fails the caller.
  void accept_new(int64_t now) {
    Status s = accepts_.accept_burst(fd_.get(), now, [&](Fd fd, const sockaddr_storage&) {
      Pending p;
      p.fd = std::move(fd);
      p.deadline_ns = now + options_.timeout_ms * 1000000;
      return std::optional<Pending>(std::move(p));
    });
    if (!s.ok()) GW_LOG_WARN("{}", s.message());
  }

  void refuse(Pending& p, std::string_view why) {
    GW_LOG_WARN("shm accept: refused a connection: {}", why);
    Reply reply{};
    handshake::put_magic(reply.magic, "GWSR");
    reply.answer = kRefuse;
    (void)sys::send_with_fds(p.fd.get(), &reply, sizeof(reply), {}, sys::kNoWait, "shm refuse");
    p.fd.reset();
  }

  // Returns a comm when the handshake completed; resets p.fd when the socket is done with.
  // Two packets in: the hello (answered with the listener's challenge and proof), then the
  // connector's proof (answered with the segment); docs/wire-shm.md.
  Result<std::unique_ptr<RecvComm>> advance(Pending& p, int64_t now) {
    union {
      Hello hello;
      Proof proof;
      char bytes[sizeof(Hello) + 1];  // one more, so an oversized packet shows
    } in{};
    std::vector<Fd> unwanted;  // a client has no reason to send descriptors: closed unread
    Result<size_t> n =
        sys::recv_with_fds(p.fd.get(), &in, sizeof(in), &unwanted, sys::kNoWait, "shm accept");
    if (!n.ok() && n.status().code() == Code::kTimeout) {
      if (now >= p.deadline_ns) {
        GW_LOG_WARN("shm accept: a client did not finish its handshake within {} ms; dropped",
                    options_.timeout_ms);
        p.fd.reset();
      }
      return std::unique_ptr<RecvComm>();
    }
    if (!n.ok() || *n == 0) {
      p.fd.reset();
      return std::unique_ptr<RecvComm>();
    }
    if (!p.challenged) {
      Result<ucred> cred = sys::peer_credentials(p.fd.get());
      if (!cred.ok() || cred->uid != getuid()) {
        refuse(p, cred.ok() ? fmt::format("peer uid {} is not this user's", cred->uid)
                            : cred.status().to_string());
        return std::unique_ptr<RecvComm>();
      }
      p.pid = cred->pid;
      const Hello& hello = in.hello;
      std::string why =
          *n != sizeof(Hello)
              ? std::string("not a gradwire shm handshake of this version")
              : handshake::refusal({hello.magic, hello.nonce, hello.rank, hello.listener_rank},
                                   {"shm", "GWSI", nonce_, options_.rank, expected_peer()});
      if (!why.empty()) {
        refuse(p, fmt::format("{} (pid {})", why, p.pid));
        return std::unique_ptr<RecvComm>();
      }
      p.hello = hello;
      handshake::Transcript t = transcript(hello);
      Status fresh = handshake::fresh_nonce(&t.listener_challenge);
      if (!fresh.ok()) {
        refuse(p, fresh.message());
        return std::unique_ptr<RecvComm>();
      }
      Challenge ch{};
      handshake::put_magic(ch.magic, "GWSC");
      ch.challenge = t.listener_challenge;
      ch.proof = handshake::prove(options_.job_token, handshake::Role::kListener, t);
      Status sent = sys::send_with_fds(p.fd.get(), &ch, sizeof(ch), {}, sys::kNoWait,
                                       fmt::format("shm accept: challenge to pid {}", p.pid));
      if (!sent.ok()) {
        GW_LOG_WARN("{}", sent.message());
        p.fd.reset();
        return std::unique_ptr<RecvComm>();
      }
      p.challenge = t.listener_challenge;
      p.challenged = true;
      return std::unique_ptr<RecvComm>();
    }
    handshake::Transcript t = transcript(p.hello);
    t.listener_challenge = p.challenge;
    if (*n != sizeof(Proof) || !handshake::magic_is(in.proof.magic, "GWSP")) {
      refuse(p, fmt::format("malformed proof (pid {})", p.pid));
      return std::unique_ptr<RecvComm>();
    }
    if (!handshake::verify(options_.job_token, handshake::Role::kConnector, t,
                           in.proof.proof.data())) {
      refuse(p, fmt::format("{} did not prove the job token (job token mismatch) (pid {})",
                            rank_name(p.hello.rank), p.pid));
      return std::unique_ptr<RecvComm>();
    }
    const Hello& hello = p.hello;
    const int pid = p.pid;
    const Geometry& g = config_.geometry;
    // The segment lives only as this fd and the two mappings: nothing in any filesystem.
    Result<MemfdRegion> region = MemfdRegion::create("gradwire-shm", g.total());
    if (!region.ok()) {
      // Out of descriptors (a flood of connections): the shedder's spare makes the segment.
      accepts_.shedder().release_spare();
      region = MemfdRegion::create("gradwire-shm", g.total());
      accepts_.shedder().take_spare();
    }
    if (!region.ok()) return region.status().with_context("shm accept: ");
    const int memfd = region->fd();
    Ring ring(std::move(*region), g);
    RingCtrl* ctrl = new (ring.ctrl()) RingCtrl{};
    ctrl->magic = kRingMagic;
    ctrl->nslots = g.nslots;
    ctrl->slot_size = g.slot_size;

    Reply reply{};
    handshake::put_magic(reply.magic, "GWSR");
    reply.answer = kAccept;
    reply.nslots = g.nslots;
    reply.slot_size = g.slot_size;
    reply.total_size = g.total();
    Status sent = sys::send_with_fds(p.fd.get(), &reply, sizeof(reply), {&memfd, 1}, sys::kNoWait,
                                     fmt::format("shm accept: answer to pid {}", pid));
    if (!sent.ok()) {
      GW_LOG_WARN("{}", sent.message());
      p.fd.reset();
      return std::unique_ptr<RecvComm>();
    }
    ring.close_fd();  // the peer has its own copy now
    std::string peer = handshake::peer_label(hello.rank, "shm", fmt::format("pid {}", pid));
    return shm::make_recv_comm(std::move(p.fd), std::move(ring), std::move(peer), pid,
                               config_.cma_inject_refuse);
  }

  Fd fd_;
  uint64_t nonce_;
  ShmConfig config_;
  TransportOptions options_;
  PendingAccept<Pending> accepts_{"shm"};
};

class ShmConnector final : public Connector {
 public:
  ShmConnector(const HandleWire& wire, const TransportOptions& options, uint64_t cma_min)
      : cma_min_(cma_min),
        name_(wire.sock_name, strnlen(wire.sock_name, kSockNameSize)),
        deadline_(sys::deadline_after_ms(options.timeout_ms)),
        timeout_ms_(options.timeout_ms),
        peer_(handshake::peer_label(wire.rank, "shm", "@" + name_)) {
    handshake::put_magic(hello_.magic, "GWSI");
    hello_.nonce = wire.nonce;
    hello_.rank = options.rank;
    hello_.listener_rank = wire.rank;
    token_ = options.job_token;
  }

  Result<std::unique_ptr<SendComm>> poll() override {
    if (!error_.ok()) return error_;
    if (returned_) return invalid_arg("poll: the connection to {} was already returned", peer_);
    Result<std::unique_ptr<SendComm>> comm = advance();
    if (!comm.ok()) {
      error_ = comm.status();
      fd_.reset();
      return error_;
    }
    if (*comm != nullptr) {
      returned_ = true;
      return comm;
    }
    if (sys::expired(deadline_)) {
      error_ = handshake::connect_timeout_error(peer_, timeout_ms_, last_problem_);
      fd_.reset();
      return error_;
    }
    return comm;
  }

 private:
  enum class Phase { kIdle, kHello, kChallenge, kProof, kReply };

  Result<std::unique_ptr<SendComm>> advance() {
    const std::string what = fmt::format("handshake with {}", peer_);
    if (phase_ == Phase::kIdle) {
      if (now_ns() < retry_at_ns_) return std::unique_ptr<SendComm>();
      GW_ASSIGN_OR_RETURN(sys::UnixAddress addr, sys::UnixAddress::abstract(name_));
      bool nobody = false;
      Result<Fd> fd = sys::connect_unix(addr, SOCK_SEQPACKET, &nobody);
      if (!fd.ok()) {
        if (fd.status().code() != Code::kPeer) return fd.status();
        last_problem_ = fmt::format("last attempt: {}", fd.status().message());
        const int64_t now = now_ns();
        retry_at_ns_ = now + kRetryNs;
        // No listener at the name: it listened before its handle was published, so once this
        // lasts kListenerGoneMs it is gone (a full queue, EAGAIN, is waited for).
        if (!nobody) {
          refused_since_ns_ = 0;
        } else if (refused_since_ns_ == 0) {
          refused_since_ns_ = now;
        } else if (now - refused_since_ns_ >= handshake::kListenerGoneMs * 1000000) {
          return handshake::listener_gone_error(peer_, (now - refused_since_ns_) / 1000000);
        }
        return std::unique_ptr<SendComm>();
      }
      fd_ = std::move(*fd);
      phase_ = Phase::kHello;
    }
    if (phase_ == Phase::kHello) {
      if (!hello_ready_) {
        GW_RETURN_IF_ERROR(handshake::fresh_nonce(&hello_.challenge));
        hello_ready_ = true;
      }
      Status sent = sys::send_with_fds(fd_.get(), &hello_, sizeof(hello_), {}, sys::kNoWait, what);
      if (sent.code() == Code::kTimeout) return std::unique_ptr<SendComm>();
      GW_RETURN_IF_ERROR(sent);
      phase_ = Phase::kChallenge;
    }
    if (phase_ == Phase::kChallenge) {
      union {
        Challenge ch;
        Reply reply;  // a refusal
        char bytes[sizeof(Challenge) + 1];
      } in{};
      std::vector<Fd> fds;
      Result<size_t> got = sys::recv_with_fds(fd_.get(), &in, sizeof(in), &fds, sys::kNoWait, what);
      if (!got.ok()) {
        if (got.status().code() == Code::kTimeout) return std::unique_ptr<SendComm>();
        return got.status();
      }
      if (*got == 0) return handshake::closed_by_listener_error(peer_);
      if (*got == sizeof(Reply) && handshake::magic_is(in.reply.magic, "GWSR") &&
          in.reply.answer == kRefuse) {
        return handshake::refused_error(peer_);
      }
      if (*got != sizeof(Challenge) || !handshake::magic_is(in.ch.magic, "GWSC") || !fds.empty()) {
        return peer_error("{}: malformed challenge ({} bytes)", what, *got);
      }
      handshake::Transcript t = transcript(hello_);
      t.listener_challenge = in.ch.challenge;
      if (!handshake::verify(token_, handshake::Role::kListener, t, in.ch.proof.data())) {
        return handshake::listener_unproven_error(peer_);
      }
      proof_ = Proof{};
      handshake::put_magic(proof_.magic, "GWSP");
      proof_.proof = handshake::prove(token_, handshake::Role::kConnector, t);
      phase_ = Phase::kProof;
    }
    if (phase_ == Phase::kProof) {
      Status sent = sys::send_with_fds(fd_.get(), &proof_, sizeof(proof_), {}, sys::kNoWait, what);
      if (sent.code() == Code::kTimeout) return std::unique_ptr<SendComm>();
      GW_RETURN_IF_ERROR(sent);
      phase_ = Phase::kReply;
    }
    Reply reply{};
    std::vector<Fd> fds;
    Result<size_t> got =
        sys::recv_with_fds(fd_.get(), &reply, sizeof(reply), &fds, sys::kNoWait, what);
    if (!got.ok()) {
      if (got.status().code() == Code::kTimeout) return std::unique_ptr<SendComm>();
      return got.status();
    }
    const size_t n = *got;
    if (n == 0) return handshake::closed_by_listener_error(peer_);
    if (n != sizeof(reply) || !handshake::magic_is(reply.magic, "GWSR")) {
      return peer_error("{}: malformed answer ({} bytes)", what, n);
    }
    if (reply.answer == kRefuse) return handshake::refused_error(peer_);
    Geometry g;
    g.nslots = reply.nslots;
    g.slot_size = reply.slot_size;
    if (reply.answer != kAccept || fds.size() != 1 || g.nslots == 0 || g.nslots > 4096 ||
        g.slot_size == 0 || g.slot_size > (uint64_t{1} << 30) || reply.total_size != g.total()) {
      return peer_error("{}: malformed answer", what);
    }
    Result<MemfdRegion> region = MemfdRegion::map(std::move(fds[0]), g.total());
    if (!region.ok()) return region.status().with_context(what + ": ");
    region->close_fd();  // the mapping is all this side needs
    Ring ring(std::move(*region), g);
    if (ring.ctrl()->magic != kRingMagic) {
      return peer_error("{}: segment has no ring", what);
    }
    return shm::make_send_comm(std::move(fd_), std::move(ring), peer_, cma_min_);
  }

  uint64_t cma_min_;
  std::string name_;
  sys::Deadline deadline_;
  int64_t timeout_ms_;
  std::string peer_;
  Hello hello_{};
  bool hello_ready_ = false;  // hello_.challenge drawn
  std::string token_;
  Proof proof_{};
  Fd fd_;
  Phase phase_ = Phase::kIdle;
  int64_t retry_at_ns_ = 0;
  int64_t refused_since_ns_ = 0;  // the first of the refusals in a row, 0: none
  Status error_;
  std::string last_problem_;
  bool returned_ = false;
};

class ShmTransport final : public Transport {
 public:
  ShmTransport(TransportOptions options, ShmConfig config)
      : options_(std::move(options)), config_(config) {
    props_.name = "shm";
    props_.sockets_per_conn = 1;
    props_.latency_us = 2;
    props_.bandwidth_gbps = 8.0;  // conservative (docs/perf.md, "Why the defaults")
    host_id_ = encode_host_id(options_.host_id);
  }

  const Properties& properties() const override { return props_; }

  Result<std::unique_ptr<Listener>> listen(Handle* handle) override {
    if (handle == nullptr) return invalid_arg("shm listen: null handle");
    uint8_t rnd[8];
    fill_random(rnd, sizeof(rnd));
    std::string name = "gradwire-shm-";
    for (uint8_t b : rnd) name += fmt::format("{:02x}", b);
    GW_ASSIGN_OR_RETURN(sys::UnixAddress addr, sys::UnixAddress::abstract(name));
    Result<Fd> fd = sys::listen_unix(addr, SOCK_SEQPACKET, SOMAXCONN);
    if (!fd.ok()) return fd.status().with_context("shm listen: ");
    HandleWire wire{};
    handshake::put_magic(wire.magic, "GWS1");
    wire.version = kVersion;
    wire.nonce = random_u64();
    wire.rank = options_.rank;
    std::memcpy(wire.sock_name, name.data(), std::min(name.size(), kSockNameSize));
    std::memcpy(wire.host_id, host_id_.data(), host_id_.size());
    *handle = Handle{};
    std::memcpy(handle->bytes.data(), &wire, sizeof(wire));
    return std::unique_ptr<Listener>(
        std::make_unique<ShmListener>(std::move(*fd), wire.nonce, config_, options_));
  }

  Result<std::unique_ptr<Connector>> connect(const Handle& handle) override {
    HandleWire wire;
    std::memcpy(&wire, handle.bytes.data(), sizeof(wire));
    GW_RETURN_IF_ERROR(handshake::check_handle("shm", wire.magic, "GWS1", wire.version, kVersion));
    std::string_view theirs(wire.host_id, strnlen(wire.host_id, kHostIdSize));
    if (theirs != host_id_) {
      return unsupported(
          "shm connect to {}: it runs on host '{}', this process on '{}'; shared memory needs "
          "both on one host",
          rank_name(wire.rank), theirs, host_id_);
    }
    if (strnlen(wire.sock_name, kSockNameSize) == 0) {
      return invalid_arg("shm connect: the handle names no socket");
    }
    return std::unique_ptr<Connector>(
        std::make_unique<ShmConnector>(wire, options_, config_.cma_min));
  }

 private:
  TransportOptions options_;
  ShmConfig config_;
  Properties props_;
  std::string host_id_;
};

}  // namespace

Result<std::unique_ptr<Transport>> make_shm_transport(const TransportOptions& options) {
  sys::raise_descriptor_limit();
  const config::Snapshot settings =
      options.config.empty() ? config::Snapshot::capture() : options.config;
  int64_t nslots = settings.get_int(net::shm_config::kShmNslots);
  if (nslots < 2 || nslots > 4096) {
    return invalid_arg("GW_SHM_NSLOTS={} is out of range (2-4096)", nslots);
  }
  int64_t slot_size = settings.get_int(net::shm_config::kShmSlotSize);
  if (slot_size < 4096 || slot_size > (int64_t{1} << 30)) {
    return invalid_arg("GW_SHM_SLOT_SIZE={} is out of range (4K-1G)", slot_size);
  }
  GW_RETURN_IF_ERROR(handshake::check_options("shm", options));
  ShmConfig cfg;
  cfg.geometry.nslots = static_cast<uint32_t>(nslots);
  cfg.geometry.slot_size = static_cast<uint64_t>(slot_size);
  int64_t cma_min = settings.get_int(net::shm_config::kShmCmaMin);
  if (cma_min < 0) return invalid_arg("GW_SHM_CMA_MIN={} is negative", cma_min);
  cfg.cma_min = static_cast<uint64_t>(cma_min);
  cfg.cma_inject_refuse = settings.get_bool(net::shm_config::kShmCmaInjectRefuse);
  TransportOptions opts = options;
  if (opts.host_id.empty()) opts.host_id = default_host_id();
  return std::unique_ptr<Transport>(std::make_unique<ShmTransport>(opts, cfg));
}

Backend shm_backend() {
  Backend b;
  b.name = "shm";
  b.summary = "shared memory, ranks on one host";
  b.factory = &make_shm_transport;
  b.auto_priority = 20;
  b.auto_within_host = true;
  return b;
}

}  // namespace gw::net
