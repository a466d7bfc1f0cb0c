// Daemon mode of the plugin with device buffers (dma-bufs registered by the daemon on its verbs
// link; docs/nccl-plugin.md "Daemon mode"): part of nccl_plugin_daemon_test (the fixture:
// daemon_plugin_fixture.h).
#include <gtest/gtest.h>

#include "tests/plugin/daemon_plugin_fixture.h"
#include "tests/plugin/plugin_harness.h"

namespace gw::plugin_test {
namespace {

using Clock = std::chrono::steady_clock;

// The harness's gdr scenario (nccl_plugin_peer gdr: the one direct mode runs over the verbs
// emulator) in daemon mode, unchanged: where the daemons take device buffers (two verbs-emulator
// daemons), the plugin reports HOST|CUDA|DMABUF, regMr(NCCL_PTR_CUDA) exports and registers
// through the daemon, regMrDmaBuf too, and every byte moved by the daemons' NICs is checked; the
// flush of a device receive is a request that completes. Where they do not (tcp or dpdk between
// the daemons, or one daemon), the plugin reports HOST only, says why at start-up, and the
// scenario is skipped with that reason.
TEST_F(DaemonPlugin, TheGdrScenarioRunsWhereTheDaemonTakesDeviceBuffers) {
  const bool verbs =
      getenv("GW_PLUGIN_TEST_PEER_DAEMON") != nullptr && xhost_transport() == "verbs";
  ncclNetProperties_v11_t props{};
  ASSERT_EQ(api_->properties(0, &props), ncclSuccess);
  // Every exported version reports the same pointer support.
  for (const char* v : {"v8", "v9", "v10", "v11", "v12"}) {
    ncclNetProperties_v11_t p{};
    ASSERT_EQ(make_api(v)->properties(0, &p), ncclSuccess) << v;
    EXPECT_EQ(p.ptrSupport, props.ptrSupport) << v;
  }
  // regMr(NCCL_PTR_CUDA) where no CUDA driver can export the buffer (this process loads none): an
  // error saying so, never a host registration.
  {
    void *sc = nullptr, *rc = nullptr;
    ASSERT_EQ(connect_pair(*api_, ctx_, &sc, &rc), "");
    Buffer b(1 << 16);
    void* mh = nullptr;
    clear_log();
    EXPECT_NE(api_->reg_mr(sc, b.data, b.size, NCCL_PTR_CUDA, &mh), ncclSuccess);
    EXPECT_EQ(mh, nullptr);
    EXPECT_TRUE(warned("no CUDA driver in this process to export the buffer's dma-buf"));
    api_->close_send(sc);
    api_->close_recv(rc);
  }
  std::string out;
  const int rc = run_peer({}, {"gdr", GW_FAKE_CUDA_PATH}, &out);
  if (verbs) {
    EXPECT_EQ(props.ptrSupport, NCCL_PTR_HOST | NCCL_PTR_CUDA | NCCL_PTR_DMABUF);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_EQ(out.find("gdr skipped"), std::string::npos) << out;
    return;
  }
  EXPECT_EQ(props.ptrSupport, NCCL_PTR_HOST);
  ASSERT_EQ(rc, 77) << "the scenario must skip (exit 77), not pass or fail: " << out;
  const size_t at = out.find("gdr skipped: ");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string why = out.substr(at, out.find('\n', at) - at);
  EXPECT_NE(why.find("need verbs"), std::string::npos) << why;
  GTEST_SKIP() << why;
}

// A daemon whose status does not answer (none at the address) is taken as "no": host buffers
// only, and the start-up line says why (the connections then fail as before, saying so).
TEST_F(DaemonPlugin, NoStatusFromTheDaemonMeansHostBuffersOnly) {
  const std::string sock = "unix:/tmp/gw-no-daemon-" + std::to_string(::getpid()) + ".sock";
  EXPECT_EQ(run_peer({"GW_DAEMON=" + sock, "-GW_PLUGIN_TEST_GRADWIRED"},
                     {"info", "pointer support HOST, "}),
            0);
  EXPECT_EQ(run_peer({"GW_DAEMON=" + sock, "-GW_PLUGIN_TEST_GRADWIRED"},
                     {"info",
                      "GPUDirect RDMA none through gradwired (gradwired's status did not answer "
                      "(no gradwired listens on"}),
            0);
}

// Device buffers handed to regMrDmaBuf go to the daemon as dma-bufs (docs/nccl-plugin.md, "Daemon
// mode"): across two daemons whose job agreed verbs (the emulator, which maps the descriptor the
// daemon received: the registration proves it arrived whole), both ends register, bad input is
// refused without harming the connection, and another job's client cannot name a registration.
// Over tcp, and between two processes of one host, the refusal says why. Over verbs the registered
// buffers move (issue 28, stage C): one daemon message per isend / irecv naming the region, the
// daemons' NICs move the bytes (the emulator reads and writes the memfd through its descriptor):
// sizes across the inline, eager and chunk edges, every byte checked, order on one tag with the
// sends posted before their receives (held by the receiving daemon, not staged), truncation of
// both ends, a host receive of a device message, and a device receive of a host message refused.
TEST_F(DaemonPlugin, DmabufIsRegisteredByTheDaemonOnItsVerbsLink) {
  const char* peer_daemon = getenv("GW_PLUGIN_TEST_PEER_DAEMON");
  const char* peer_host = getenv("GW_PLUGIN_TEST_PEER_HOSTID");
  const bool xhost = peer_daemon != nullptr && peer_host != nullptr;
  const bool verbs = xhost && xhost_transport() == "verbs";
  // The connecting end: on host b (a second instance of the plugin) when there are two hosts.
  std::unique_ptr<NetApi> capi;
  void* cctx = ctx_;
  if (xhost) {
    const std::string daemon_was = getenv("GW_DAEMON");
    const std::string host_was = getenv("GW_HOSTID") != nullptr ? getenv("GW_HOSTID") : "";
    setenv("GW_DAEMON", peer_daemon, 1);
    setenv("GW_HOSTID", peer_host, 1);
    capi = make_api_of_copy();
    ASSERT_EQ(capi->init(&cctx), ncclSuccess);
    setenv("GW_DAEMON", daemon_was.c_str(), 1);
    setenv("GW_HOSTID", host_was.c_str(), 1);
  }
  NetApi& sapi = capi ? *capi : *api_;
  void *sc = nullptr, *rc = nullptr;
  ASSERT_EQ(connect_pair(*api_, ctx_, sapi, cctx, &sc, &rc), "");
  constexpr size_t kMiB = 1 << 20;
  // The sender's region [4 KiB, + 7 MiB), the receiver's [8 MiB, + 7 MiB).
  MemfdBuffer dev(16 * kMiB, "gw-daemon-dmabuf");
  ASSERT_NE(dev.data, nullptr);
  constexpr size_t kRegion = 7 * kMiB;
  void *ms = nullptr, *md = nullptr;
  clear_log();
  const ncclResult_t rs =
      sapi.reg_mr_dmabuf(sc, dev.data + 4096, kRegion, NCCL_PTR_CUDA, 4096, dev.fd, &ms);
  const ncclResult_t rr =
      api_->reg_mr_dmabuf(rc, dev.data + 8 * kMiB, kRegion, NCCL_PTR_CUDA, 8 * kMiB, dev.fd, &md);
  if (!verbs) {
    EXPECT_NE(rs, ncclSuccess);
    EXPECT_NE(rr, ncclSuccess);
    EXPECT_TRUE(warned(xhost ? "dma-bufs need verbs across hosts" : "is on this host"));
  } else {
    ASSERT_EQ(rs, ncclSuccess) << "the sender's daemon registers the dma-buf on its verbs PD";
    ASSERT_EQ(rr, ncclSuccess) << "the receiver's daemon too";
    uint8_t* const src = dev.data + 4096;
    uint8_t* const dst = dev.data + 8 * kMiB;
    // Waits for both requests (nullptr: none); their results and received sizes.
    struct Ends {
      ncclResult_t send = ncclSuccess, recv = ncclSuccess;
      int got = -1;
    };
    auto finish = [&](void* sreq, void* rreq) {
      Ends e;
      for (const auto until = Clock::now() + std::chrono::seconds(30); sreq || rreq;) {
        int d = 0, n = 0;
        if (sreq != nullptr) {
          e.send = sapi.test(sreq, &d, &n);
          if (d || e.send != ncclSuccess) sreq = nullptr;
        }
        d = 0;
        if (rreq != nullptr) {
          e.recv = api_->test(rreq, &d, &n);
          if (d || e.recv != ncclSuccess) {
            rreq = nullptr;
            if (d) e.got = n;
          }
        }
        if (Clock::now() > until) {
          ADD_FAILURE() << "device transfer did not end within 30 s";
          break;
        }
      }
      return e;
    };
    // Every size across the edges: inline (4 KiB), eager (16 KiB), the plugin's chunk (4 MiB).
    for (const size_t n : {size_t{0}, size_t{1}, size_t{4096}, size_t{4097}, size_t{16385},
                           kMiB + 7, size_t{4 * kMiB}, size_t{5 * kMiB}}) {
      SCOPED_TRACE(n);
      fill_pattern(src, n, static_cast<uint32_t>(n) + 3);
      std::memset(dst, 0, n + 64);
      void *sreq = nullptr, *rreq = nullptr;
      ASSERT_EQ(post_recv(*api_, rc, dst, n + 64, 7, md, &rreq), "");
      ASSERT_EQ(post_send(sapi, sc, src, n, 7, ms, &sreq), "");
      const Ends e = finish(sreq, rreq);
      ASSERT_EQ(e.send, ncclSuccess);
      ASSERT_EQ(e.recv, ncclSuccess);
      EXPECT_EQ(e.got, static_cast<int>(n));
      EXPECT_EQ(check_pattern(dst, n, static_cast<uint32_t>(n) + 3), -1);
      for (size_t i = n; i < n + 64; ++i) ASSERT_EQ(dst[i], 0) << "written past the message";
    }
    // iflush of a device receive runs in the receiving daemon (its NIC's flush on the data
    // connection the bytes came on): a request that completes once the daemon answered; a range
    // outside the region is refused; a host buffer needs none.
    {
      void* freq = nullptr;
      ASSERT_EQ(api_->iflush(rc, dst, 5 * kMiB, md, &freq), ncclSuccess);
      ASSERT_NE(freq, nullptr);
      EXPECT_EQ(wait_all(*api_, {freq}), "");
      EXPECT_NE(api_->iflush(rc, dst + kRegion - 10, 4096, md, &freq), ncclSuccess);
    }
    // Order on one tag: three sends before any receive (the receiving daemon holds the device
    // messages until their receives come), then the receives, each with its own message.
    {
      const size_t sizes[3] = {3 * kMiB + 1, 5, 70001};
      const size_t at[3] = {0, 4 * kMiB, 5 * kMiB};
      void* sreq[3] = {};
      void* rreq[3] = {};
      for (int i = 0; i < 3; ++i) {
        fill_pattern(src + at[i], sizes[i], 100 + i);
        ASSERT_EQ(post_send(sapi, sc, src + at[i], sizes[i], 9, ms, &sreq[i]), "");
      }
      std::memset(dst, 0, kRegion);
      for (int i = 0; i < 3; ++i) {
        ASSERT_EQ(post_recv(*api_, rc, dst + at[i], sizes[i], 9, md, &rreq[i]), "");
      }
      for (int i = 0; i < 3; ++i) {
        const Ends e = finish(sreq[i], rreq[i]);
        EXPECT_EQ(e.send, ncclSuccess) << i;
        EXPECT_EQ(e.recv, ncclSuccess) << i;
        EXPECT_EQ(e.got, static_cast<int>(sizes[i])) << i;
        EXPECT_EQ(check_pattern(dst + at[i], sizes[i], 100 + i), -1) << i;
      }
    }
    // A device message into a host buffer arrives (the NIC writes host memory as well).
    {
      Buffer host(20000);
      fill_pattern(src, 20000, 55);
      void *sreq = nullptr, *rreq = nullptr;
      ASSERT_EQ(post_recv(*api_, rc, host.data, host.size, 11, nullptr, &rreq), "");
      ASSERT_EQ(post_send(sapi, sc, src, 20000, 11, ms, &sreq), "");
      const Ends e = finish(sreq, rreq);
      EXPECT_EQ(e.send, ncclSuccess);
      EXPECT_EQ(e.recv, ncclSuccess);
      EXPECT_EQ(check_pattern(host.data, 20000, 55), -1);
    }
    // A buffer outside its region is refused at once.
    void* req = nullptr;
    EXPECT_NE(sapi.isend(sc, src + kRegion - 100, 4096, 1, ms, &req), ncclSuccess);
    // Truncation: a device receive smaller than its message fails,
    // and so does the send.
    {
      fill_pattern(src, 8192, 9);
      void *sreq = nullptr, *rreq = nullptr;
      ASSERT_EQ(post_recv(*api_, rc, dst, 4096, 12, md, &rreq), "");
      ASSERT_EQ(post_send(sapi, sc, src, 8192, 12, ms, &sreq), "");
      const Ends e = finish(sreq, rreq);
      EXPECT_NE(e.recv, ncclSuccess) << "a receive smaller than its message";
      EXPECT_NE(e.send, ncclSuccess) << "the truncated message's send";
    }
    // Bad input: no descriptor, a descriptor that is no buffer (a pipe), a range past the
    // buffer's end. Each is refused, and the connection still moves host buffers after them.
    void* bad = nullptr;
    EXPECT_NE(sapi.reg_mr_dmabuf(sc, dev.data, 4096, NCCL_PTR_CUDA, 0, -1, &bad), ncclSuccess);
    int pipe_fds[2];
    ASSERT_EQ(::pipe(pipe_fds), 0);
    EXPECT_NE(sapi.reg_mr_dmabuf(sc, dev.data, 4096, NCCL_PTR_CUDA, 0, pipe_fds[0], &bad),
              ncclSuccess);
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    EXPECT_NE(sapi.reg_mr_dmabuf(sc, dev.data, kMiB, NCCL_PTR_CUDA, 16 * kMiB - 4096, dev.fd, &bad),
              ncclSuccess);
    Buffer out(70000), in(70000);
    fill_pattern(out.data, out.size, 31);
    void *sreq = nullptr, *rreq = nullptr;
    ASSERT_EQ(post_recv(*api_, rc, in.data, in.size, 2, nullptr, &rreq), "");
    ASSERT_EQ(post_send(sapi, sc, out.data, out.size, 2, nullptr, &sreq), "");
    for (const auto until = Clock::now() + std::chrono::seconds(20); sreq || rreq;) {
      int d = 0, n = 0;
      if (sreq != nullptr) {
        ASSERT_EQ(sapi.test(sreq, &d, &n), ncclSuccess);
        if (d) sreq = nullptr;
      }
      if (rreq != nullptr) {
        ASSERT_EQ(api_->test(rreq, &d, &n), ncclSuccess);
        if (d) rreq = nullptr;
      }
      ASSERT_LT(Clock::now(), until) << "host transfer after the refusals";
    }
    EXPECT_EQ(check_pattern(in.data, in.size, 31), -1);
    // Isolation: a client of another job on host b's daemon names the sender's registration
    // (id 1: its trainer's first): refused, and the sender's stays (its deregMr succeeds).
    daemon::Hello h;
    h.job_token = "gw-dmabuf-isolation-other-job";
    h.host_id = peer_host;
    h.arena_bytes = daemon::kMinArenaBytes;
    h.timeout_ms = 4000;
    auto other = daemon::Client::connect(std::string(peer_daemon).substr(5), h, 0);
    ASSERT_TRUE(other.ok()) << other.status().to_string();
    auto ask = [&](daemon::SqEntry e) {
      auto seq = (*other)->post(e, "test");
      if (!seq.ok()) return seq.status();
      bool done = false;
      Status st = (*other)->wait_for(*seq, sys::deadline_after_ms(8000), &done, "test");
      return done ? st : timeout_error("no answer");
    };
    daemon::SqEntry dereg{};
    dereg.opcode = static_cast<uint16_t>(daemon::Opcode::kDeregisterDmabuf);
    dereg.spec_len = 1;
    Status st = ask(dereg);
    EXPECT_EQ(st.code(), Code::kInvalidArg) << st.to_string();
    EXPECT_NE(st.message().find("is not a dma-buf registration of this client"), std::string::npos)
        << st.to_string();
    // Its own descriptor for a peer of its own host (its job has one): refused saying why.
    auto ticket = (*other)->pass_fd(dev.fd, "test");
    ASSERT_TRUE(ticket.ok()) << ticket.status().to_string();
    daemon::SqEntry reg{};
    reg.opcode = static_cast<uint16_t>(daemon::Opcode::kRegisterDmabuf);
    reg.spec_len = *ticket;
    reg.count = 4096;
    reg.key_len = daemon::kDmabufSends;
    st = ask(reg);
    EXPECT_EQ(st.code(), Code::kUnsupported) << st.to_string();
    EXPECT_NE(st.message().find("is on this host"), std::string::npos) << st.to_string();
    // A ticket no descriptor came with.
    reg.spec_len = *ticket + 7;
    st = ask(reg);
    EXPECT_EQ(st.code(), Code::kInvalidArg) << st.to_string();
    EXPECT_NE(st.message().find("no descriptor came"), std::string::npos) << st.to_string();
    // A non-descriptor is refused before anything is sent.
    EXPECT_EQ((*other)->pass_fd(-1, "test").status().code(), Code::kInvalidArg);
    other->reset();
    EXPECT_EQ(sapi.dereg_mr(sc, ms), ncclSuccess);
    EXPECT_EQ(api_->dereg_mr(rc, md), ncclSuccess);
  }
  EXPECT_EQ(sapi.close_send(sc), ncclSuccess);
  EXPECT_EQ(api_->close_recv(rc), ncclSuccess);
  if (capi) capi->finalize(cctx);
}

// Every registration of a client goes when the client goes, a killed process's included: the
// peer process on host b registers a dma-buf through daemon b and is killed; daemon b says it
// released it.
TEST_F(DaemonPlugin, DmabufRegistrationsGoWithAKilledProcess) {
  if (getenv("GW_PLUGIN_TEST_PEER_DAEMON") == nullptr || xhost_transport() != "verbs") {
    GTEST_SKIP() << "two hosts over verbs only (GW_PLUGIN_TEST_XHOST_TRANSPORT=verbs)";
  }
  auto released = [] {
    const std::string out = xhost_daemon_output(1);
    size_t n = 0;
    for (size_t at = 0; (at = out.find("dma-buf registrations released", at)) != std::string::npos;
         ++at) {
      ++n;
    }
    return n;
  };
  const size_t before = released();
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* lc = nullptr;
  ASSERT_EQ(api_->listen(ctx_, 0, handle, &lc), ncclSuccess);
  Acceptor acc;
  acc.start(api_.get(), lc);
  std::string out;
  const int rc = run_peer({}, {"connect", handle_hex(handle), "dmabuf-die"}, &out);
  EXPECT_EQ(rc, -1) << "the peer kills itself";
  EXPECT_NE(out.find("registered"), std::string::npos) << out;
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (released() == before && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GT(released(), before) << "daemon b's output:\n" << xhost_daemon_output(1);
  acc.join();
  if (void* comm = acc.comm.load()) api_->close_recv(comm);
  api_->close_listen(lc);
}

// A device message whose sender is killed before the receiver takes it (its bytes wait at the
// sender's daemon, the receiving daemon holds only its header): the receiver's pending device
// receive fails (no hang), and so does a later one that would have taken the held message.
TEST_F(DaemonPlugin, DmabufSenderKilledFailsTheDeviceReceive) {
  if (getenv("GW_PLUGIN_TEST_PEER_DAEMON") == nullptr || xhost_transport() != "verbs") {
    GTEST_SKIP() << "two hosts over verbs only (GW_PLUGIN_TEST_XHOST_TRANSPORT=verbs)";
  }
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* lc = nullptr;
  ASSERT_EQ(api_->listen(ctx_, 0, handle, &lc), ncclSuccess);
  Acceptor acc;
  acc.start(api_.get(), lc);
  std::string out;
  std::thread peer([&] { run_peer({}, {"connect", handle_hex(handle), "dmabuf-send-die"}, &out); });
  void* rc = acc.wait_comm();
  ASSERT_NE(rc, nullptr);
  MemfdBuffer dev(2 << 20, "gw-dmabuf-recv-of-killed");
  ASSERT_NE(dev.data, nullptr);
  void* md = nullptr;
  ASSERT_EQ(api_->reg_mr_dmabuf(rc, dev.data, dev.size, NCCL_PTR_CUDA, 0, dev.fd, &md),
            ncclSuccess);
  // Tag 2: nothing comes on it; the sender dies meanwhile.
  void* req = nullptr;
  ASSERT_EQ(post_recv(*api_, rc, dev.data, 1 << 20, 2, md, &req), "");
  int done = 0, size = 0;
  ncclResult_t r = ncclSuccess;
  const auto t0 = Clock::now();
  while (r == ncclSuccess && !done && Clock::now() - t0 < std::chrono::seconds(20)) {
    r = api_->test(req, &done, &size);
  }
  peer.join();
  EXPECT_NE(out.find("sent"), std::string::npos) << out;
  EXPECT_NE(r, ncclSuccess) << "the device receive from a killed rank must fail, not hang";
  EXPECT_EQ(done, 0);
  // Tag 1: the held device message, whose bytes went with the sender: refused or failed.
  req = nullptr;
  r = api_->irecv(rc, dev.data, 1 << 20, 1, md, &req);
  done = 0;
  const auto t1 = Clock::now();
  while (r == ncclSuccess && req != nullptr && !done &&
         Clock::now() - t1 < std::chrono::seconds(20)) {
    r = api_->test(req, &done, &size);
  }
  EXPECT_TRUE(r != ncclSuccess || req == nullptr) << "a held device message of a killed sender";
  EXPECT_EQ(done, 0);
  (void)api_->dereg_mr(rc, md);
  api_->close_recv(rc);
  api_->close_listen(lc);
}

}  // namespace
}  // namespace gw::plugin_test
