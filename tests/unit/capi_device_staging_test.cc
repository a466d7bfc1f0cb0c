// CUDA device memory through every collective of the C ABI in direct mode (issue 27), with the
// stand-in driver (tests/support/fake_cuda_driver.c): its cuMemAlloc returns an address range the
// CPU cannot touch (PROT_NONE), so a collective that read or wrote a device pointer instead of
// staging it would crash here. Each collective runs on host buffers and then on device buffers
// with the same inputs, and the outputs must be the same bytes; then a buffer freed and
// reallocated at the same address between calls, registrations (and a stale one), and
// gw_mem_register / gw_mem_deregister misuse.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gradwire/gradwire.h"
#include "tests/support/capi_ranks.h"
#include "tests/support/fake_cuda.h"
#include "tests/support/test_env.h"

namespace {

using gw::testing::init_ranks;
using gw::testing::on_each_rank;

const gw::testing::FakeCuda& fake() { return gw::testing::fake_cuda(GW_FAKE_CUDA_PATH); }

// A buffer in host memory or in the stand-in's device memory, with the same bytes either way.
class Buf {
 public:
  Buf(bool device, const std::vector<uint8_t>& init) : device_(device), bytes_(init.size()) {
    if (!device_) {
      host_ = init;
      return;
    }
    EXPECT_EQ(fake().mem_alloc(&dptr_, bytes_ == 0 ? 1 : bytes_), 0);
    if (bytes_ > 0) {
      EXPECT_EQ(fake().htod(dptr_, init.data(), bytes_), 0);
    }
  }
  ~Buf() {
    if (device_ && dptr_ != 0) fake().mem_free(dptr_);
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  uint8_t* ptr() {
    return device_ ? reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(dptr_)) : host_.data();
  }
  std::vector<uint8_t> read() const {
    if (!device_) return host_;
    std::vector<uint8_t> out(bytes_);
    if (bytes_ > 0) {
      EXPECT_EQ(fake().dtoh(out.data(), dptr_, bytes_), 0);
    }
    return out;
  }

 private:
  bool device_;
  size_t bytes_;
  std::vector<uint8_t> host_;
  unsigned long long dptr_ = 0;
};

constexpr size_t kCount = 37;  // elements per block: odd, so no size is a round number
constexpr size_t kElem = 4;    // float32 / int32

// Rank r's input: small integers, exact in float32 and int32 sums.
std::vector<uint8_t> input(gw_dtype_t dt, int r, size_t elems) {
  std::vector<uint8_t> b(elems * kElem);
  for (size_t i = 0; i < elems; ++i) {
    const int v = static_cast<int>((i * 7 + static_cast<size_t>(r) * 13) % 50) + 1;
    if (dt == GW_FLOAT32) {
      const float f = static_cast<float>(v);
      std::memcpy(&b[i * kElem], &f, kElem);
    } else {
      const int32_t x = v;
      std::memcpy(&b[i * kElem], &x, kElem);
    }
  }
  return b;
}

// One collective: the sizes of its buffers (elements) at p ranks and the call. In place: one
// buffer of recv_elems, sendbuf at send_offset(r, p) elements into it.
struct Op {
  std::string name;
  std::function<size_t(int p)> send_elems, recv_elems;
  std::function<gw_status_t(gw_comm_t, gw_dtype_t, int r, int p, void* send, void* recv)> call;
  std::function<size_t(int r, int p)> send_offset = nullptr;  // set: in place
};

// The request is read after the call that sets it (a by-value argument could be read before).
gw_status_t wait(gw_status_t s, const gw_request_t* req) {
  return s == GW_OK ? gw_wait(*req, -1) : s;
}

std::vector<size_t> v_counts(int r, int p, bool send) {
  // rank r sends (r + j) % 3 + 1 elements to rank j; receives (j + r) % 3 + 1 from j.
  std::vector<size_t> c(static_cast<size_t>(p));
  for (int j = 0; j < p; ++j) c[static_cast<size_t>(j)] = static_cast<size_t>((r + j) % 3 + 1);
  (void)send;
  return c;
}
std::vector<size_t> v_displs(const std::vector<size_t>& counts) {
  std::vector<size_t> d(counts.size());
  size_t at = 1;  // a gap before the first block and between blocks: must stay untouched
  for (size_t i = 0; i < counts.size(); ++i) {
    d[i] = at;
    at += counts[i] + 1;
  }
  return d;
}

// All-to-all-v's send and receive counts and displacements at rank r of p.
struct VLayout {
  VLayout(int r, int p)
      : sc(v_counts(r, p, true)), rc(v_counts(r, p, false)), sd(v_displs(sc)), rd(v_displs(rc)) {}
  std::vector<size_t> sc, rc, sd, rd;
};

std::vector<Op> ops() {
  const auto one = [](int) { return kCount; };
  const auto all = [](int p) { return kCount * static_cast<size_t>(p); };
  std::vector<Op> o;
  o.push_back({"allreduce", one, one, [](gw_comm_t c, gw_dtype_t d, int, int, void* s, void* r) {
                 return gw_allreduce(c, s, r, kCount, d, GW_SUM);
               }});
  o.push_back({"allreduce_in_place", one, one,
               [](gw_comm_t c, gw_dtype_t d, int, int, void* s, void* r) {
                 return gw_allreduce(c, s, r, kCount, d, GW_MAX);
               },
               [](int, int) { return size_t{0}; }});
  o.push_back({"broadcast", [](int) { return size_t{0}; }, one,
               [](gw_comm_t c, gw_dtype_t d, int, int p, void*, void* r) {
                 return gw_broadcast(c, r, kCount, d, p - 1);
               }});
  o.push_back({"allgather", one, all, [](gw_comm_t c, gw_dtype_t d, int, int, void* s, void* r) {
                 return gw_allgather(c, s, r, kCount, d);
               }});
  o.push_back({"allgather_in_place", one, all,
               [](gw_comm_t c, gw_dtype_t d, int, int, void* s, void* r) {
                 return gw_allgather(c, s, r, kCount, d);
               },
               [](int r, int) { return kCount * static_cast<size_t>(r); }});
  o.push_back(
      {"reduce_scatter", all, one, [](gw_comm_t c, gw_dtype_t d, int, int, void* s, void* r) {
         return gw_reduce_scatter(c, s, r, kCount, d, GW_SUM);
       }});
  o.push_back({"alltoall", all, all, [](gw_comm_t c, gw_dtype_t d, int, int, void* s, void* r) {
                 return gw_alltoall(c, s, r, kCount, d);
               }});
  o.push_back({"reduce", one, one, [](gw_comm_t c, gw_dtype_t d, int, int p, void* s, void* r) {
                 return gw_reduce(c, s, r, kCount, d, GW_SUM, p - 1);
               }});
  o.push_back({"gather", one, all, [](gw_comm_t c, gw_dtype_t d, int, int, void* s, void* r) {
                 return gw_gather(c, s, r, kCount, d, 0);
               }});
  o.push_back({"scatter", all, one, [](gw_comm_t c, gw_dtype_t d, int, int, void* s, void* r) {
                 return gw_scatter(c, s, r, kCount, d, 1);
               }});
  const auto vext = [](int p) { return size_t{3 * 4 + 8} * static_cast<size_t>(p); };
  o.push_back(
      {"alltoallv", vext, vext, [](gw_comm_t c, gw_dtype_t d, int r, int p, void* s, void* rv) {
         const VLayout v(r, p);
         return gw_alltoallv(c, s, v.sc.data(), v.sd.data(), rv, v.rc.data(), v.rd.data(), d);
       }});
  o.push_back({"iallreduce", one, one, [](gw_comm_t c, gw_dtype_t d, int, int, void* s, void* r) {
                 gw_request_t q = nullptr;
                 return wait(gw_iallreduce(c, s, r, kCount, d, GW_SUM, &q), &q);
               }});
  o.push_back({"ibroadcast", [](int) { return size_t{0}; }, one,
               [](gw_comm_t c, gw_dtype_t d, int, int, void*, void* r) {
                 gw_request_t q = nullptr;
                 return wait(gw_ibroadcast(c, r, kCount, d, 0, &q), &q);
               }});
  o.push_back({"iallgather", one, all, [](gw_comm_t c, gw_dtype_t d, int, int, void* s, void* r) {
                 gw_request_t q = nullptr;
                 return wait(gw_iallgather(c, s, r, kCount, d, &q), &q);
               }});
  o.push_back(
      {"ireduce_scatter", all, one, [](gw_comm_t c, gw_dtype_t d, int, int, void* s, void* r) {
         gw_request_t q = nullptr;
         return wait(gw_ireduce_scatter(c, s, r, kCount, d, GW_SUM, &q), &q);
       }});
  o.push_back({"ialltoall", all, all, [](gw_comm_t c, gw_dtype_t d, int, int, void* s, void* r) {
                 gw_request_t q = nullptr;
                 return wait(gw_ialltoall(c, s, r, kCount, d, &q), &q);
               }});
  o.push_back({"ireduce", one, one, [](gw_comm_t c, gw_dtype_t d, int, int, void* s, void* r) {
                 gw_request_t q = nullptr;
                 return wait(gw_ireduce(c, s, r, kCount, d, GW_SUM, 0, &q), &q);
               }});
  o.push_back({"igather", one, all, [](gw_comm_t c, gw_dtype_t d, int, int p, void* s, void* r) {
                 gw_request_t q = nullptr;
                 return wait(gw_igather(c, s, r, kCount, d, p - 1, &q), &q);
               }});
  o.push_back({"iscatter", all, one, [](gw_comm_t c, gw_dtype_t d, int, int, void* s, void* r) {
                 gw_request_t q = nullptr;
                 return wait(gw_iscatter(c, s, r, kCount, d, 0, &q), &q);
               }});
  o.push_back(
      {"ialltoallv", vext, vext, [](gw_comm_t c, gw_dtype_t d, int r, int p, void* s, void* rv) {
         const VLayout v(r, p);
         gw_request_t q = nullptr;
         return wait(
             gw_ialltoallv(c, s, v.sc.data(), v.sd.data(), rv, v.rc.data(), v.rd.data(), d, &q),
             &q);
       }});
  // Point-to-point around the ring: send to the next rank, receive from the previous one.
  o.push_back(
      {"isend_recv", one, one, [](gw_comm_t c, gw_dtype_t d, int r, int p, void* s, void* rv) {
         gw_request_t q = nullptr;
         gw_status_t st = gw_isend(c, s, kCount, d, (r + 1) % p, 7, &q);
         if (st != GW_OK) return st;
         size_t got = 0;
         gw_request_t rq = nullptr;
         st = gw_irecv(c, rv, kCount, d, (r + p - 1) % p, 7, &rq);
         if (st == GW_OK) st = gw_wait_recv(rq, -1, &got, nullptr);
         const gw_status_t ws = gw_wait(q, -1);
         if (st == GW_OK && got != kCount) return GW_ERR_INTERNAL;
         return st != GW_OK ? st : ws;
       }});
  o.push_back(
      {"send_recv", one, one, [](gw_comm_t c, gw_dtype_t d, int r, int p, void* s, void* rv) {
         // Even ranks send first; an odd count of ranks has the last rank receive first.
         const int next = (r + 1) % p;
         const int prev = (r + p - 1) % p;
         if (r % 2 == 0 && !(r == p - 1 && p % 2 == 1 && p > 1)) {
           gw_status_t st = gw_send(c, s, kCount, d, next, 3);
           return st != GW_OK ? st : gw_recv(c, rv, kCount, d, prev, 3);
         }
         gw_status_t st = gw_recv(c, rv, kCount, d, prev, 3);
         return st != GW_OK ? st : gw_send(c, s, kCount, d, next, 3);
       }});
  return o;
}

class DeviceStagingTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_NE(fake().mem_alloc, nullptr)
        << "cannot load " << GW_FAKE_CUDA_PATH << ": " << dlerror();
    ::unsetenv("GW_DAEMON");
    if (GetParam() == "verbs")
      env_ = std::make_unique<gw::testing::ScopedEnv>("GW_VERBS_EMULATE", "1");
  }
  std::vector<gw_comm_t> init(int world) {
    auto comms = init_ranks(world, "devstage-" + GetParam(), GetParam().c_str());
    for (gw_comm_t c : comms) {
      if (c == nullptr) ADD_FAILURE() << "init failed";
    }
    return comms;
  }
  static void destroy(const std::vector<gw_comm_t>& comms) {
    for (gw_comm_t c : comms) {
      if (c != nullptr) {
        EXPECT_EQ(gw_comm_destroy(c), GW_OK) << gw_last_error();
      }
    }
  }
  std::unique_ptr<gw::testing::ScopedEnv> env_;
};

std::string describe(gw_comm_t c, const char* key) {
  char buf[512] = {0};
  EXPECT_EQ(gw_comm_describe(c, key, buf, sizeof(buf), nullptr), GW_OK) << gw_last_error();
  return buf;
}

// Runs op on every rank with host (device = false) or device buffers; rank r's outputs.
std::vector<std::vector<uint8_t>> run_op(const std::vector<gw_comm_t>& comms, const Op& op,
                                         gw_dtype_t dt, bool send_dev, bool recv_dev) {
  const int p = static_cast<int>(comms.size());
  std::vector<std::vector<uint8_t>> out(comms.size());
  on_each_rank(comms, [&](int r, gw_comm_t c) {
    const size_t se = op.send_elems(p);
    const size_t re = op.recv_elems(p);
    std::vector<uint8_t> recv_init(re * kElem, 0xEE);
    if (op.send_offset) {  // in place: one buffer, the input at its offset
      std::vector<uint8_t> init = input(dt, r + 5, re);
      Buf b(recv_dev, init);
      uint8_t* s = b.ptr() + op.send_offset(r, p) * kElem;
      EXPECT_EQ(op.call(c, dt, r, p, s, b.ptr()), GW_OK)
          << op.name << " rank " << r << ": " << gw_last_error();
      out[static_cast<size_t>(r)] = b.read();
      return;
    }
    if (op.name.find("broadcast") != std::string::npos) recv_init = input(dt, r, re);
    Buf s(send_dev, input(dt, r, se));
    Buf rv(recv_dev, recv_init);
    EXPECT_EQ(op.call(c, dt, r, p, se == 0 ? nullptr : s.ptr(), rv.ptr()), GW_OK)
        << op.name << " rank " << r << ": " << gw_last_error();
    out[static_cast<size_t>(r)] = rv.read();
    EXPECT_EQ(s.read(), input(dt, r, se)) << op.name << ": the input changed";
  });
  return out;
}

TEST_P(DeviceStagingTest, EveryCollectiveOnDeviceBuffersMatchesHostBuffers) {
  const auto comms = init(3);
  const long host_allocs = fake().host_allocs();
  for (gw_dtype_t dt : {GW_FLOAT32, GW_INT32}) {
    for (const Op& op : ops()) {
      const auto want = run_op(comms, op, dt, false, false);
      // Both device, and each side alone (a device input with a host output and the reverse).
      const std::vector<std::pair<bool, bool>> sides = {{true, true}, {true, false}, {false, true}};
      for (auto [sd, rd] : sides) {
        if (op.send_offset && sd != rd) continue;
        const auto got = run_op(comms, op, dt, sd, rd);
        for (size_t r = 0; r < got.size(); ++r) {
          EXPECT_EQ(got[r], want[r]) << op.name << " dtype " << dt << " rank " << r
                                     << " send on device " << sd << ", recv on device " << rd;
        }
      }
    }
  }
  EXPECT_GT(fake().host_allocs(), host_allocs) << "staging used page-locked host memory";
  EXPECT_EQ(describe(comms[0], "device_memory").rfind("staged through page-locked host memory", 0),
            0u)
      << describe(comms[0], "device_memory");
  destroy(comms);
  EXPECT_EQ(fake().live_allocs(), 0);
}

// A buffer freed and allocated again at the same address (new buffer id) between calls, plain
// and registered: the call after the reuse uses the new allocation, never the stale entry.
TEST_P(DeviceStagingTest, FreedAndReallocatedBufferBetweenCalls) {
  const auto comms = init(2);
  on_each_rank(comms, [&](int r, gw_comm_t c) {
    // Sizes apart by rank, so that the ranks' threads never take each other's freed range.
    const size_t bytes = kCount * kElem + static_cast<size_t>(r) * 4096;
    for (int round = 0; round < 2; ++round) {
      const bool registered = round == 1;
      unsigned long long a = 0;
      ASSERT_EQ(fake().mem_alloc(&a, bytes), 0);
      auto* pa = reinterpret_cast<void*>(static_cast<uintptr_t>(a));
      gw_mem_handle_t h = nullptr;
      if (registered) {
        ASSERT_EQ(gw_mem_register(c, pa, bytes, &h), GW_OK) << gw_last_error();
      }
      std::vector<uint8_t> in = input(GW_INT32, r, kCount);
      in.resize(bytes);  // the allocation is larger than the call's elements on rank 1
      ASSERT_EQ(fake().htod(a, in.data(), bytes), 0);
      ASSERT_EQ(gw_allreduce(c, pa, pa, kCount, GW_INT32, GW_SUM), GW_OK) << gw_last_error();
      ASSERT_EQ(fake().mem_free(a), 0);
      unsigned long long b = 0;
      ASSERT_EQ(fake().mem_alloc(&b, bytes), 0);
      ASSERT_EQ(b, a) << "the stand-in hands a freed range out again";
      std::vector<uint8_t> in2 = input(GW_INT32, r + 10, kCount);
      in2.resize(bytes);
      ASSERT_EQ(fake().htod(b, in2.data(), bytes), 0);
      ASSERT_EQ(gw_allreduce(c, pa, pa, kCount, GW_INT32, GW_SUM), GW_OK) << gw_last_error();
      std::vector<uint8_t> got(bytes);
      ASSERT_EQ(fake().dtoh(got.data(), b, bytes), 0);
      for (size_t i = 0; i < kCount; ++i) {
        int32_t x, w0, w1;
        std::memcpy(&x, &got[i * kElem], 4);
        const auto i0 = input(GW_INT32, 10, kCount);
        const auto i1 = input(GW_INT32, 11, kCount);
        std::memcpy(&w0, &i0[i * kElem], 4);
        std::memcpy(&w1, &i1[i * kElem], 4);
        ASSERT_EQ(x, w0 + w1) << "rank " << r << " element " << i << " round " << round;
      }
      if (registered) {
        const std::string stats = describe(c, "device_memory_stats");
        EXPECT_NE(stats.find("stale_registrations=1"), std::string::npos) << stats;
        EXPECT_NE(stats.find("registered_hits=1 "), std::string::npos) << stats;
        EXPECT_EQ(gw_mem_deregister(c, h), GW_OK) << gw_last_error();
      }
      ASSERT_EQ(fake().mem_free(b), 0);
    }
    const std::string stats = describe(c, "device_memory_stats");
    EXPECT_EQ(stats.find("cache_invalidations=0"), std::string::npos) << stats;
    EXPECT_NE(stats.find("registrations=0"), std::string::npos) << stats;
  });
  destroy(comms);
}

// 10 MiB calls with device buffers on some ranks and host buffers on the others (each rank
// decides alone what to stage, so every rank must still run the same collectives).
TEST_P(DeviceStagingTest, LargeCallsWithDeviceBuffersOnSomeRanksOnly) {
  const auto comms = init(3);
  const size_t n = (size_t{10} << 20) / kElem + 5;
  struct Case {
    const char* name;
    gw_dtype_t dt;
    std::function<gw_status_t(gw_comm_t, void*, void*)> call;
  };
  const std::vector<Case> cases = {
      {"allreduce int32 sum", GW_INT32,
       [n](gw_comm_t c, void* s, void* r) { return gw_allreduce(c, s, r, n, GW_INT32, GW_SUM); }},
      {"allreduce float max in place", GW_FLOAT32,
       [n](gw_comm_t c, void*, void* r) { return gw_allreduce(c, r, r, n, GW_FLOAT32, GW_MAX); }},
      {"broadcast float", GW_FLOAT32,
       [n](gw_comm_t c, void*, void* r) { return gw_broadcast(c, r, n, GW_FLOAT32, 1); }},
      {"allreduce float sum", GW_FLOAT32, [n](gw_comm_t c, void* s, void* r) {
         return gw_allreduce(c, s, r, n, GW_FLOAT32, GW_SUM);
       }}};
  for (const Case& k : cases) {
    std::vector<std::vector<uint8_t>> out[2];
    for (int device = 0; device < 2; ++device) {
      out[device].resize(comms.size());
      on_each_rank(comms, [&](int r, gw_comm_t c) {
        // The second run: device buffers on ranks 0 and 2 (send) and 0 and 1 (receive).
        Buf s(device != 0 && r != 1, input(k.dt, r, n));
        Buf rv(device != 0 && r != 2, input(k.dt, r + 3, n));
        EXPECT_EQ(k.call(c, s.ptr(), rv.ptr()), GW_OK) << k.name << ": " << gw_last_error();
        out[device][static_cast<size_t>(r)] = rv.read();
      });
    }
    for (size_t r = 0; r < comms.size(); ++r) {
      EXPECT_EQ(out[1][r], out[0][r]) << k.name << " rank " << r;
    }
  }
  destroy(comms);
}

INSTANTIATE_TEST_SUITE_P(Transports, DeviceStagingTest, ::testing::Values("tcp", "shm", "verbs"));

// gw_mem_register / gw_mem_deregister: what they refuse, with one rank.
TEST(DeviceRegistrationTest, MisuseIsInvalidArg) {
  ASSERT_NE(fake().mem_alloc, nullptr) << dlerror();
  ::unsetenv("GW_DAEMON");
  gw_config_t cfg = GW_CONFIG_INIT;
  cfg.rank = 0;
  cfg.world_size = 1;
  gw_comm_t c = nullptr, other = nullptr;
  ASSERT_EQ(gw_comm_init(&c, &cfg), GW_OK) << gw_last_error();
  ASSERT_EQ(gw_comm_init(&other, &cfg), GW_OK) << gw_last_error();
  unsigned long long d = 0;
  ASSERT_EQ(fake().mem_alloc(&d, 4096), 0);
  void* p = reinterpret_cast<void*>(static_cast<uintptr_t>(d));
  gw_mem_handle_t h = nullptr;

  EXPECT_EQ(gw_mem_register(c, p, 4096, nullptr), GW_ERR_INVALID_ARG);
  EXPECT_EQ(gw_mem_register(c, nullptr, 4096, &h), GW_ERR_INVALID_ARG);
  EXPECT_EQ(gw_mem_register(c, p, 0, &h), GW_ERR_INVALID_ARG);
  EXPECT_EQ(gw_mem_register(nullptr, p, 4096, &h), GW_ERR_INVALID_ARG);
  // Past the allocation's end.
  EXPECT_EQ(gw_mem_register(c, p, 4097, &h), GW_ERR_INVALID_ARG);
  EXPECT_NE(std::string(gw_last_error()).find("pass the end"), std::string::npos)
      << gw_last_error();
  EXPECT_EQ(h, nullptr) << "no handle from a refused call";

  ASSERT_EQ(gw_mem_register(c, p, 4096, &h), GW_OK) << gw_last_error();
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(gw_mem_deregister(c, nullptr), GW_ERR_INVALID_ARG);
  EXPECT_EQ(gw_mem_deregister(other, h), GW_ERR_INVALID_ARG) << "foreign handle";
  EXPECT_EQ(gw_mem_deregister(c, h), GW_OK) << gw_last_error();
  EXPECT_EQ(gw_mem_deregister(c, h), GW_ERR_INVALID_ARG) << "double deregister";
  EXPECT_NE(std::string(gw_last_error()).find("deregistered already"), std::string::npos);
  // A made-up handle.
  EXPECT_EQ(gw_mem_deregister(c, reinterpret_cast<gw_mem_handle_t>(uintptr_t{0x1234})),
            GW_ERR_INVALID_ARG);

  // Host memory: a registration that does nothing, deregistered the same way.
  std::vector<float> host(16);
  gw_mem_handle_t hh = nullptr;
  EXPECT_EQ(gw_mem_register(c, host.data(), sizeof(float) * host.size(), &hh), GW_OK);
  EXPECT_EQ(gw_mem_deregister(c, hh), GW_OK) << gw_last_error();

  // Registrations left at destroy go with the communicator.
  ASSERT_EQ(gw_mem_register(c, p, 1024, &h), GW_OK) << gw_last_error();
  EXPECT_EQ(gw_comm_destroy(c), GW_OK);
  EXPECT_EQ(gw_comm_destroy(other), GW_OK);
  EXPECT_EQ(fake().mem_free(d), 0);
}

}  // namespace
