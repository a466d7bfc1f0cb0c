// GPUDirect RDMA registration of CUDA memory in the verbs backend, over the emulator and the
// stand-in CUDA driver (tests/support/fake_cuda_driver.c): its "device memory" is a memfd mapping
// the test marks (DeviceBuf), its dma-buf export that memfd, which the emulated NIC maps itself:
// bytes that arrive are in the buffer only if they went through the dma-buf. Checked: the dma-buf
// path (the export reaches ibv_reg_dmabuf_mr with the right fd, offset, length and access, and
// bytes move), the nvidia-peermem fallback, the refusal that says why, GW_IB_GPUDIRECT, and the
// direct dma-buf registration NCCL's regMrDmaBuf uses.
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "collectives/p2p.h"
#include "core/net/transport.h"
#include "tests/support/fake_cuda.h"
#include "tests/support/ranks.h"
#include "tests/support/test_env.h"
#include "tests/verbs/verbs_test_util.h"
#include "verbs/emu/emu_verbs.h"
#include "verbs/verbs_comm.h"
#include "verbs/verbs_transport.h"

namespace gw::verbs {
namespace {

using ::gw::testing::ScopedEnv;

using test::connect_pair;
using test::finish;
using test::Pair;

const ::gw::testing::FakeCuda& fake() { return ::gw::testing::fake_cuda(GW_FAKE_CUDA_PATH); }

// "Device memory" for the dma-buf path: a memfd mapped here, marked with the stand-in driver so
// that its export is this memfd. `fill` is every byte's first value.
class DeviceBuf {
 public:
  explicit DeviceBuf(size_t n, uint8_t fill = 0, const char* name = "gw-fake-device-buf") : n_(n) {
    fd_ = memfd_create(name, MFD_CLOEXEC);
    const size_t len = (n + 4095) & ~size_t{4095};
    if (fd_ >= 0 && ftruncate(fd_, static_cast<off_t>(len)) == 0) {
      void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
      if (m != MAP_FAILED) p_ = static_cast<uint8_t*>(m);
    }
    if (p_ != nullptr) std::memset(p_, fill, n);
  }
  ~DeviceBuf() {
    if (p_ != nullptr) munmap(p_, (n_ + 4095) & ~size_t{4095});
    if (fd_ >= 0) close(fd_);
  }
  DeviceBuf(const DeviceBuf&) = delete;
  DeviceBuf& operator=(const DeviceBuf&) = delete;
  // Marks it as device memory with its memfd as the dma-buf.
  void mark() const { fake().mark_dmabuf(p_, n_, fd_); }
  bool ok() const { return p_ != nullptr; }
  uint8_t* data() const { return p_; }
  size_t size() const { return n_; }
  uint8_t* begin() const { return p_; }
  uint8_t* end() const { return p_ + n_; }
  uint8_t& operator[](size_t i) const { return p_[i]; }
  int fd() const { return fd_; }
  bool operator==(const DeviceBuf& o) const { return n_ == o.n_ && std::memcmp(p_, o.p_, n_) == 0; }

 private:
  size_t n_;
  int fd_ = -1;
  uint8_t* p_ = nullptr;
};

// Moves `src` into `dst` (same size) through registrations `ms` and `md`.
void move(Pair& p, DeviceBuf& src, DeviceBuf& dst, net::MemRegion* ms, net::MemRegion* md) {
  auto r = p.recv->irecv(dst.data(), dst.size(), 3, md);
  auto s = p.send->isend(src.data(), src.size(), 3, ms);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  ASSERT_TRUE(finish(p.send.get(), *s).ok());
  ASSERT_TRUE(finish(p.recv.get(), *r).ok());
  EXPECT_TRUE(dst == src);
}

class VerbsGpuDirect : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(fake().mark, nullptr) << "cannot load " << GW_FAKE_CUDA_PATH << ": " << dlerror();
    fake().clear();
    emu::set_dmabuf_supported(true);
    char tmpl[] = "/tmp/gw-gdr-sysfs-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    sysfs_ = tmpl;
    sysfs_env_ = std::make_unique<ScopedEnv>("GW_IB_SYSFS_ROOT", sysfs_.c_str());
  }
  void TearDown() override {
    fake().clear();
    emu::set_dmabuf_supported(true);
    std::error_code ec;
    std::filesystem::remove_all(sysfs_, ec);
  }
  void load_peermem() { std::filesystem::create_directories(sysfs_ + "/module/nvidia_peermem"); }

  std::unique_ptr<net::Transport> make() {
    net::TransportOptions o;
    o.job_token = "t";
    auto t = make_verbs_transport(o);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return t.ok() ? std::move(*t) : nullptr;
  }

  ScopedEnv emulate_{"GW_VERBS_EMULATE", "1"};
  std::string sysfs_;
  std::unique_ptr<ScopedEnv> sysfs_env_;
};

TEST_F(VerbsGpuDirect, DeviceMemoryIsRegisteredThroughDmabufAndMovesBytes) {
  auto t = make();
  ASSERT_NE(t, nullptr);
  net::Transport::DeviceMemory dm = t->device_memory();
  EXPECT_TRUE(dm.reg && dm.dmabuf) << dm.why;
  Pair p = connect_pair(*t);
  ASSERT_TRUE(p.send && p.recv);
  // "Allocations" that start mid-page, as cudaMalloc's never do but sub-allocators' may.
  DeviceBuf src(300000), dst(300000, 0);
  ASSERT_TRUE(src.ok() && dst.ok());
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 1);
  src.mark();
  dst.mark();
  const size_t records = emu::dmabuf_records().size();
  const long exports = fake().exports();
  auto ms = p.send->reg_mr(src.data() + 100, src.size() - 100, net::MemType::kCuda);
  auto md = p.recv->reg_mr(dst.data(), dst.size(), net::MemType::kCuda);
  ASSERT_TRUE(ms.ok()) << ms.status().to_string();
  ASSERT_TRUE(md.ok()) << md.status().to_string();
  EXPECT_EQ(fake().exports() - exports, 2) << "one dma-buf export per registration";
  std::vector<emu::DmabufRecord> rec = emu::dmabuf_records();
  ASSERT_EQ(rec.size(), records + 2);
  const auto base = reinterpret_cast<uint64_t>(src.data());
  const emu::DmabufRecord& r = rec[records];
  EXPECT_NE(r.target.find("gw-fake-device-buf"), std::string::npos)
      << "the export is the device memory's own memfd: " << r.target;
  // The registration covers the range's pages inside the allocation, addressed by its offset.
  const uint64_t want_begin = std::max<uint64_t>((base + 100) & ~uint64_t{4095}, base);
  EXPECT_EQ(r.iova, want_begin);
  EXPECT_EQ(r.offset, want_begin - base);
  EXPECT_GE(r.iova + r.length, base + src.size());
  // Remote read as well: the GDR flush reads received device memory back.
  EXPECT_EQ(r.access, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  EXPECT_EQ(fcntl(r.fd, F_GETFD), -1) << "the exported fd is closed after registration";
  // A second registration inside the first reuses it: no new export.
  auto again = p.send->reg_mr(src.data() + 5000, 1000, net::MemType::kCuda);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(emu::dmabuf_records().size(), records + 2);
  std::vector<uint8_t> whole_src(src.begin() + 100, src.end());
  std::vector<uint8_t> got(whole_src.size(), 0);
  // The data path writes straight from and to the registered "device" buffers.
  auto r1 = p.recv->irecv(dst.data(), whole_src.size(), 9, *md);
  auto s1 = p.send->isend(src.data() + 100, whole_src.size(), 9, *ms);
  ASSERT_TRUE(r1.ok() && s1.ok());
  ASSERT_TRUE(finish(p.send.get(), *s1).ok());
  ASSERT_TRUE(finish(p.recv.get(), *r1).ok());
  EXPECT_TRUE(std::equal(whole_src.begin(), whole_src.end(), dst.begin()));
  EXPECT_TRUE(p.send->dereg_mr(*again).ok());
  EXPECT_TRUE(p.send->dereg_mr(*ms).ok());
  EXPECT_TRUE(p.recv->dereg_mr(*md).ok());
}

// The GDR flush: after a receive into device memory, iflush posts one RDMA READ of its first
// byte on a loopback QP and completes with it; host memory and GW_IB_GDR_FLUSH=0 need none; a
// range outside the registration is refused; at most kFlushSlots are in flight.
TEST_F(VerbsGpuDirect, GdrFlushReadsBackFromReceivedDeviceMemory) {
  auto t = make();
  ASSERT_NE(t, nullptr);
  Pair p = connect_pair(*t);
  ASSERT_TRUE(p.send && p.recv);
  DeviceBuf src(70000), dst(70000, 0);
  std::vector<uint8_t> host(64, 0);
  ASSERT_TRUE(src.ok() && dst.ok());
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 13 + 5);
  src.mark();
  dst.mark();
  auto ms = p.send->reg_mr(src.data(), src.size(), net::MemType::kCuda);
  auto md = p.recv->reg_mr(dst.data(), dst.size(), net::MemType::kCuda);
  auto mh = p.recv->reg_mr(host.data(), host.size(), net::MemType::kHost);
  ASSERT_TRUE(ms.ok() && md.ok() && mh.ok());
  move(p, src, dst, *ms, *md);
  const emu::Counters before = emu::counters();
  auto f = p.recv->iflush(dst.data(), dst.size(), *md);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  ASSERT_NE(*f, nullptr) << "device memory needs a flush";
  ASSERT_TRUE(finish(p.recv.get(), *f).ok());
  const emu::Counters after = emu::counters();
  EXPECT_EQ(after.send_wrs - before.send_wrs, 1u) << "one READ per flush";
  EXPECT_EQ(after.signaled_wrs - before.signaled_wrs, 1u);
  // A flush request is finished once: testing it again is an error, not a second completion.
  bool done = false;
  EXPECT_FALSE(p.recv->test(*f, &done, nullptr).ok());
  // Host memory: nothing to do.
  auto none = p.recv->iflush(host.data(), host.size(), *mh);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  // Outside the registration.
  auto outside = p.recv->iflush(host.data(), 8, *md);
  EXPECT_EQ(outside.status().code(), Code::kInvalidArg) << outside.status().to_string();
  // Eight in flight at once, the ninth refused; all eight complete.
  std::vector<net::Request*> flights;
  for (int i = 0; i < VerbsRecvComm::kFlushSlots; ++i) {
    auto fi = p.recv->iflush(dst.data() + i, 1, *md);
    ASSERT_TRUE(fi.ok() && *fi != nullptr) << i;
    flights.push_back(*fi);
  }
  auto ninth = p.recv->iflush(dst.data(), 1, *md);
  EXPECT_FALSE(ninth.ok());
  for (net::Request* fi : flights) EXPECT_TRUE(finish(p.recv.get(), fi).ok());
  EXPECT_TRUE(p.recv->dereg_mr(*mh).ok());
  EXPECT_TRUE(p.recv->dereg_mr(*md).ok());
  EXPECT_TRUE(p.send->dereg_mr(*ms).ok());
}

// A flush whose READ fails (the QP went to the error state, as on a fatal NIC error) ends in a
// clear error naming the device, not a hang or a success.
TEST_F(VerbsGpuDirect, AFailedGdrFlushIsAnError) {
  auto t = make();
  ASSERT_NE(t, nullptr);
  Pair p = connect_pair(*t);
  ASSERT_TRUE(p.send && p.recv);
  DeviceBuf dst(4096, 0);
  ASSERT_TRUE(dst.ok());
  dst.mark();
  auto md = p.recv->reg_mr(dst.data(), dst.size(), net::MemType::kCuda);
  ASSERT_TRUE(md.ok());
  auto first = p.recv->iflush(dst.data(), 1, *md);  // creates the loopback QP
  ASSERT_TRUE(first.ok() && *first != nullptr);
  ASSERT_TRUE(finish(p.recv.get(), *first).ok());
  emu::force_error_all();
  auto f = p.recv->iflush(dst.data(), 1, *md);
  ASSERT_TRUE(f.ok() && *f != nullptr) << f.status().to_string();
  Status s = finish(p.recv.get(), *f);
  EXPECT_EQ(s.code(), Code::kSystem) << s.to_string();
  EXPECT_NE(s.message().find("GDR flush"), std::string::npos) << s.to_string();
}

TEST_F(VerbsGpuDirect, GdrFlushCanBeTurnedOff) {
  ScopedEnv off("GW_IB_GDR_FLUSH", "0");
  auto t = make();
  ASSERT_NE(t, nullptr);
  Pair p = connect_pair(*t);
  ASSERT_TRUE(p.send && p.recv);
  DeviceBuf dst(4096, 0);
  ASSERT_TRUE(dst.ok());
  dst.mark();
  auto md = p.recv->reg_mr(dst.data(), dst.size(), net::MemType::kCuda);
  ASSERT_TRUE(md.ok());
  auto f = p.recv->iflush(dst.data(), dst.size(), *md);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(*f, nullptr);
  EXPECT_TRUE(p.recv->dereg_mr(*md).ok());
}

TEST_F(VerbsGpuDirect, FallsBackToPeermemWhereTheNicTakesNoDmabuf) {
  emu::set_dmabuf_supported(false);
  load_peermem();
  auto t = make();
  ASSERT_NE(t, nullptr);
  net::Transport::DeviceMemory dm = t->device_memory();
  EXPECT_TRUE(dm.reg) << dm.why;
  EXPECT_FALSE(dm.dmabuf) << dm.why;
  EXPECT_NE(dm.why.find("does not take dma-bufs"), std::string::npos) << dm.why;
  Pair p = connect_pair(*t);
  ASSERT_TRUE(p.send && p.recv);
  DeviceBuf src(70000, 5), dst(70000, 0);
  ASSERT_TRUE(src.ok() && dst.ok());
  src.mark();
  dst.mark();
  const size_t records = emu::dmabuf_records().size();
  auto ms = p.send->reg_mr(src.data(), src.size(), net::MemType::kCuda);
  auto md = p.recv->reg_mr(dst.data(), dst.size(), net::MemType::kCuda);
  ASSERT_TRUE(ms.ok()) << ms.status().to_string();
  ASSERT_TRUE(md.ok()) << md.status().to_string();
  EXPECT_EQ(emu::dmabuf_records().size(), records) << "peermem registers the pointer itself";
  move(p, src, dst, *ms, *md);
}

TEST_F(VerbsGpuDirect, NeitherPathIsRefusedSayingWhyAndWhatToDo) {
  emu::set_dmabuf_supported(false);
  auto t = make();
  ASSERT_NE(t, nullptr);
  net::Transport::DeviceMemory dm = t->device_memory();
  EXPECT_FALSE(dm.reg || dm.dmabuf);
  EXPECT_NE(dm.why.find("nvidia-peermem is not loaded"), std::string::npos) << dm.why;
  Pair p = connect_pair(*t);
  ASSERT_TRUE(p.send && p.recv);
  std::vector<uint8_t> buf(8192);
  fake().mark(buf.data(), buf.size(), 0);
  auto mr = p.send->reg_mr(buf.data(), buf.size(), net::MemType::kCuda);
  ASSERT_EQ(mr.status().code(), Code::kUnsupported);
  EXPECT_NE(mr.status().message().find("stage CUDA memory through host memory"), std::string::npos)
      << mr.status().to_string();
  // Host memory still registers as before.
  EXPECT_TRUE(p.send->reg_mr(buf.data(), buf.size(), net::MemType::kHost).ok());
}

TEST_F(VerbsGpuDirect, TheKnobChoosesOrRefuses) {
  load_peermem();
  {
    ScopedEnv off("GW_IB_GPUDIRECT", "off");
    auto t = make();
    ASSERT_NE(t, nullptr);
    EXPECT_FALSE(t->device_memory().reg);
    Pair p = connect_pair(*t);
    std::vector<uint8_t> buf(4096);
    fake().mark(buf.data(), buf.size(), 0);
    auto mr = p.send->reg_mr(buf.data(), buf.size(), net::MemType::kCuda);
    EXPECT_EQ(mr.status().code(), Code::kUnsupported);
    EXPECT_NE(mr.status().message().find("GW_IB_GPUDIRECT=off"), std::string::npos);
  }
  {
    ScopedEnv peermem("GW_IB_GPUDIRECT", "peermem");
    auto t = make();
    ASSERT_NE(t, nullptr);
    net::Transport::DeviceMemory dm = t->device_memory();
    EXPECT_TRUE(dm.reg);
    EXPECT_FALSE(dm.dmabuf) << "peermem was asked for although dma-buf works";
    Pair p = connect_pair(*t);
    DeviceBuf src(5000, 9), dst(5000, 0);
    ASSERT_TRUE(src.ok() && dst.ok());
    src.mark();
    dst.mark();
    const size_t records = emu::dmabuf_records().size();
    auto ms = p.send->reg_mr(src.data(), src.size(), net::MemType::kCuda);
    auto md = p.recv->reg_mr(dst.data(), dst.size(), net::MemType::kCuda);
    ASSERT_TRUE(ms.ok() && md.ok());
    EXPECT_EQ(emu::dmabuf_records().size(), records);
    move(p, src, dst, *ms, *md);
  }
  {
    ScopedEnv bad("GW_IB_GPUDIRECT", "sometimes");
    net::TransportOptions o;
    auto t = make_verbs_transport(o);
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), Code::kInvalidArg);
    EXPECT_NE(t.status().message().find("GW_IB_GPUDIRECT"), std::string::npos);
  }
}

TEST_F(VerbsGpuDirect, ADmabufHandedInIsRegisteredAtItsOffset) {
  // NCCL's regMrDmaBuf: the caller exported the allocation itself and passes fd and offset.
  auto t = make();
  ASSERT_NE(t, nullptr);
  Pair p = connect_pair(*t);
  ASSERT_TRUE(p.send && p.recv);
  // The buffers are the dma-buf's own pages: src at offset 8192, dst at 65536 of one memfd; the
  // NIC reaches them through the fd, so the bytes arrive only if the offsets are honoured.
  DeviceBuf whole(1 << 20, 0, "gw-test-dmabuf");
  ASSERT_TRUE(whole.ok());
  const int fd = whole.fd();
  uint8_t* src = whole.data() + 8192;
  uint8_t* dst = whole.data() + 65536;
  const size_t n = 20000;
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<uint8_t>(i * 3 + 4);
  const size_t records = emu::dmabuf_records().size();
  auto ms = p.send->reg_mr_dmabuf(src, n, 8192, fd);
  auto md = p.recv->reg_mr_dmabuf(dst, n, 65536, fd);
  ASSERT_TRUE(ms.ok()) << ms.status().to_string();
  ASSERT_TRUE(md.ok()) << md.status().to_string();
  std::vector<emu::DmabufRecord> rec = emu::dmabuf_records();
  ASSERT_EQ(rec.size(), records + 2);
  EXPECT_EQ(rec[records].offset, 8192u);
  EXPECT_EQ(rec[records].length, n);
  EXPECT_EQ(rec[records].iova, reinterpret_cast<uint64_t>(src));
  EXPECT_NE(rec[records].target.find("gw-test-dmabuf"), std::string::npos);
  EXPECT_EQ(rec[records + 1].offset, 65536u);
  auto r = p.recv->irecv(dst, n, 3, *md);
  auto s = p.send->isend(src, n, 3, *ms);
  ASSERT_TRUE(r.ok() && s.ok());
  ASSERT_TRUE(finish(p.send.get(), *s).ok());
  ASSERT_TRUE(finish(p.recv.get(), *r).ok());
  EXPECT_EQ(std::memcmp(dst, src, n), 0);
  // Bad input is an error, not a registration: no fd, no buffer, a range past the fd's end.
  EXPECT_EQ(p.send->reg_mr_dmabuf(src, n, 0, -1).status().code(), Code::kInvalidArg);
  EXPECT_EQ(p.send->reg_mr_dmabuf(nullptr, 10, 0, 3).status().code(), Code::kInvalidArg);
  auto past = p.send->reg_mr_dmabuf(src, n, (1 << 20) - 4096, fd);
  EXPECT_FALSE(past.ok()) << "[offset, offset + size) lies past the dma-buf's end";
  EXPECT_TRUE(p.send->dereg_mr(*ms).ok());
  EXPECT_TRUE(p.recv->dereg_mr(*md).ok());
}

// The point-to-point engine moves device buffers registered as dma-bufs (coll::PointToPoint's
// reg_dmabuf, then isend / irecv with the region): two ranks on two "hosts" over the emulator.
// Each rank's buffer is a memfd; the engine is given addresses in a PROT_NONE reservation (as
// gradwired gives them), so a CPU access would crash the test: the bytes move only through the
// registrations (the emulated NIC maps the memfd). Every byte checked; sizes across the eager
// (16 KiB) and chunk (512 KiB) edges, all in flight at once on their own tags and several on one
// tag (order per tag); truncation fails both ends; a device receive refuses an eager host
// message; the refusals of what has no NIC path.
TEST_F(VerbsGpuDirect, PointToPointMovesDmabufRegionsWithoutTheCpu) {
  ::gw::testing::RankOptions o;
  o.backend = "verbs";
  o.host_of = {0, 1};
  o.timeout_ms = 15000;
  const std::vector<size_t> sizes = {0,      1,      4096,   16384,         16385,
                                     524287, 524288, 524289, 3 * 524288 + 7};
  std::vector<size_t> at;
  size_t cap = 0;
  for (size_t n : sizes) {
    at.push_back(cap);
    cap += (n + 4095) & ~size_t{4095};
  }
  const size_t extra = cap;  // a region for the truncation and refusal cases
  cap += 1 << 20;
  auto pattern = [](size_t k, size_t i) {
    return static_cast<uint8_t>(k * 37 + i * 11 + (i >> 9));
  };
  ::gw::testing::run_ranks(2, o, [&](std::unique_ptr<coll::Communicator>& c, int rank) {
    const bool sender = rank == 0;
    DeviceBuf buf(cap, 0, sender ? "gw-p2p-dev-src" : "gw-p2p-dev-dst");
    ASSERT_TRUE(buf.ok());
    void* iova = mmap(nullptr, cap, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    ASSERT_NE(iova, MAP_FAILED);
    auto* base = static_cast<uint8_t*>(iova);
    auto mr = c->reg_dmabuf(1 - rank, sender, iova, cap, 0, buf.fd(),
                            std::chrono::steady_clock::now() + std::chrono::seconds(10));
    ASSERT_TRUE(mr.ok()) << mr.status().to_string();
    // Refusals: a device buffer to oneself, from any source; no peer of its own.
    EXPECT_EQ(c->isend_registered(base, 8, rank, 1, *mr).status().code(), Code::kUnsupported);
    EXPECT_EQ(c->irecv_registered(base, 8, -1, 1, *mr).status().code(), Code::kUnsupported);
    EXPECT_EQ(c->reg_dmabuf(rank, true, iova, cap, 0, buf.fd(), std::chrono::steady_clock::now())
                  .status()
                  .code(),
              Code::kInvalidArg);
    std::vector<std::shared_ptr<coll::P2PRequest>> reqs;
    for (size_t k = 0; k < sizes.size(); ++k) {
      if (sender) {
        for (size_t i = 0; i < sizes[k]; ++i) buf[at[k] + i] = pattern(k, i);
      }
      // The first three on one tag (order per tag), the rest on their own.
      const int tag = k < 3 ? 5 : 10 + static_cast<int>(k);
      auto r = sender ? c->isend_registered(base + at[k], sizes[k], 1, tag, *mr)
                      : c->irecv_registered(base + at[k], sizes[k], 0, tag, *mr);
      ASSERT_TRUE(r.ok()) << k << ": " << r.status().to_string();
      reqs.push_back(*r);
    }
    for (size_t k = 0; k < reqs.size(); ++k) {
      Status s = reqs[k]->wait(15000);
      ASSERT_TRUE(s.ok()) << "message " << k << " (" << sizes[k] << " bytes): " << s.to_string();
      EXPECT_EQ(reqs[k]->bytes(), sizes[k]);
    }
    if (!sender) {
      for (size_t k = 0; k < sizes.size(); ++k) {
        size_t bad = sizes[k];
        for (size_t i = 0; i < sizes[k] && bad == sizes[k]; ++i) {
          if (buf[at[k] + i] != pattern(k, i)) bad = i;
        }
        EXPECT_EQ(bad, sizes[k]) << "message " << k << " differs at byte " << bad;
      }
    }
    // Truncation: 600000 bytes into a receive of 500000 fails both ends, as direct mode's.
    auto t = sender ? c->isend_registered(base + extra, 600000, 1, 77, *mr)
                    : c->irecv_registered(base + extra, 500000, 0, 77, *mr);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    Status ts = (*t)->wait(15000);
    EXPECT_EQ(ts.code(), Code::kInvalidArg) << ts.to_string();
    EXPECT_TRUE(ts.truncated()) << ts.to_string();
    // An eager message from a host buffer does not land in a device receive (a CPU copy).
    std::vector<uint8_t> host(100, 7);
    auto e = sender ? c->isend(host.data(), host.size(), 1, 78)
                    : c->irecv_registered(base + extra, 4096, 0, 78, *mr);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    Status es = (*e)->wait(15000);
    if (sender) {
      EXPECT_TRUE(es.ok()) << "an eager send completes once sent: " << es.to_string();
    } else {
      EXPECT_EQ(es.code(), Code::kUnsupported) << es.to_string();
    }
    // Both ends done before either deregisters (the other's op may still use its own).
    auto b = sender ? c->isend(nullptr, 0, 1, 79) : c->irecv(nullptr, 0, 0, 79);
    ASSERT_TRUE(b.ok());
    EXPECT_TRUE((*b)->wait(15000).ok());
    Status ds = c->dereg_dmabuf(1 - rank, sender, *mr);
    EXPECT_TRUE(ds.ok()) << ds.to_string();
    munmap(iova, cap);
  });
}

}  // namespace
}  // namespace gw::verbs
