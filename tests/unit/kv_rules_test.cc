// The parameter server's consistency rules (kv/rules.h) with scripted frame orders: a worker
// "held back" is one whose frames the test has not delivered yet, so every case states exactly
// which pulls are answered, when, and with which values. Also the wire's frames (kv/wire.h).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "kv/client.h"
#include "kv/rules.h"
#include "kv/wire.h"

namespace gw::kv {
namespace {

constexpr uint8_t kF32 = 0;
constexpr uint8_t kI32 = 4;

StoreConfig config(uint32_t workers, uint32_t mode, int staleness = 0, int k = 0,
                   uint32_t update = 0, double lr = 0, double momentum = 0) {
  StoreConfig c;
  c.workers = workers;
  c.mode = mode;
  c.staleness = staleness;
  c.sync_k = k;
  c.update = update;
  c.lr = lr;
  c.momentum = momentum;
  c.partition_bytes = 1 << 20;
  return c;
}

// One store's rules and the answers each worker got.
class Rig {
 public:
  explicit Rig(const StoreConfig& c) : rules(c, 0) {}

  std::vector<Answer> frame(Type t, uint32_t w, uint64_t clock, std::vector<float> v,
                            uint64_t key = 7) {
    Header h;
    h.type = t;
    h.dtype = kF32;
    h.worker = w;
    h.key = key;
    h.clock = clock;
    h.req_id = ++req;
    h.count = v.empty() ? count : v.size();
    h.total = h.count;
    if (t == Type::kInit || t == Type::kPush || t == Type::kPushPull) {
      h.payload = static_cast<uint32_t>(v.size() * 4);
    }
    EXPECT_TRUE(check_request(h, rules.config().workers).ok());
    std::vector<Answer> out;
    rules.on_frame(h, reinterpret_cast<const uint8_t*>(v.data()), &out);
    return out;
  }
  std::vector<Answer> init(std::vector<float> v) {
    count = v.size();
    std::vector<Answer> all;
    for (uint32_t w = 0; w < rules.config().workers; ++w) {
      auto a = frame(Type::kInit, w, 0, v);
      EXPECT_EQ(a.size(), 1u);
      EXPECT_EQ(a[0].reply.type, Type::kReply);
    }
    return all;
  }
  std::vector<Answer> push(uint32_t w, uint64_t c, std::vector<float> v) {
    return frame(Type::kPush, w, c, std::move(v));
  }
  std::vector<Answer> pull(uint32_t w, uint64_t c) { return frame(Type::kPull, w, c, {}); }
  std::vector<Answer> clock(uint32_t w, uint64_t c) {
    Header h;
    h.type = Type::kClock;
    h.worker = w;
    h.clock = c;
    h.req_id = ++req;
    std::vector<Answer> out;
    rules.on_frame(h, nullptr, &out);
    return out;
  }

  StoreRules rules;
  uint64_t req = 0;
  size_t count = 0;
};

// The value answers of `worker` among `as` (pull replies), in order.
std::vector<std::vector<float>> values_for(const std::vector<Answer>& as, uint32_t worker) {
  std::vector<std::vector<float>> out;
  for (const Answer& a : as) {
    if (a.worker != worker || a.reply.type != Type::kReply || a.payload.empty()) continue;
    std::vector<float> v(a.payload.size() / 4);
    std::memcpy(v.data(), a.payload.data(), a.payload.size());
    out.push_back(v);
  }
  return out;
}

bool has_error(const std::vector<Answer>& as, uint32_t worker, const std::string& text) {
  for (const Answer& a : as) {
    if (a.worker != worker || a.reply.type != Type::kError) continue;
    std::string m(a.payload.begin(), a.payload.end());
    if (m.find(text) != std::string::npos) return true;
  }
  return false;
}

TEST(KvRulesTest, BspClockClosesWhenEveryWorkerPushedAndReplacesWithTheSum) {
  Rig r(config(3, 0));
  r.init({1, 1});
  // Worker 0 pushes and pulls clock 0: its pull waits for workers 1 and 2 (held back).
  EXPECT_TRUE(values_for(r.push(0, 0, {1, 2}), 0).empty());
  EXPECT_TRUE(values_for(r.pull(0, 0), 0).empty());
  EXPECT_EQ(r.rules.waiting(), 1u);
  EXPECT_TRUE(values_for(r.push(1, 0, {10, 20}), 0).empty());
  // Worker 2's push closes clock 0: worker 0's pull gets exactly the sum of the three pushes.
  auto released = r.push(2, 0, {100, 200});
  ASSERT_EQ(values_for(released, 0).size(), 1u);
  EXPECT_EQ(values_for(released, 0)[0], (std::vector<float>{111, 222}));
  EXPECT_EQ(r.rules.waiting(), 0u);
  // A pull of clock 1 by a worker that has not pushed in it sees clock 0's value at once.
  r.clock(1, 1);
  EXPECT_EQ(values_for(r.pull(1, 1), 1), (std::vector<std::vector<float>>{{111, 222}}));
}

TEST(KvRulesTest, BspPullInNextClockWaitsForAWorkerThatDidNotPush) {
  Rig r(config(2, 0));
  r.init({5});
  r.push(0, 0, {1});
  r.clock(0, 1);
  // Worker 0 in clock 1 pulls: clock 0 is open until worker 1 pushes it or moves past it.
  EXPECT_TRUE(values_for(r.pull(0, 1), 0).empty());
  // Worker 1 moves past clock 0 without pushing: clock 0 closes with worker 0's push alone.
  auto a = r.clock(1, 1);
  EXPECT_EQ(values_for(a, 0), (std::vector<std::vector<float>>{{1}}));
}

TEST(KvRulesTest, BspSecondPushInOneClockIsRefusedAndNotApplied) {
  Rig r(config(2, 0));
  r.init({0});
  r.push(0, 0, {1});
  auto a = r.push(0, 0, {1000});
  EXPECT_TRUE(has_error(a, 0, "twice in clock 0"));
  r.push(1, 0, {2});
  EXPECT_EQ(values_for(r.pull(0, 1), 0), (std::vector<std::vector<float>>{{3}}));
}

TEST(KvRulesTest, SspPullWaitsForTheSlowestWorkerWithinStaleness) {
  // ssp:1, 3 workers: worker 0 runs ahead; workers 1 and 2 are held back at clock 0.
  Rig r(config(3, 1, /*staleness=*/1));
  r.init({0});
  r.push(0, 0, {1});
  r.clock(0, 1);
  // At clock 1 with S=1 it needs the slowest at clock >= 0: answered at once, with its own push.
  EXPECT_EQ(values_for(r.pull(0, 1), 0), (std::vector<std::vector<float>>{{1}}));
  r.push(0, 1, {1});
  r.clock(0, 2);
  // At clock 2 it needs every worker to have finished clock 0: it waits.
  EXPECT_TRUE(values_for(r.pull(0, 2), 0).empty());
  r.push(1, 0, {10});
  auto a = r.clock(1, 1);
  EXPECT_TRUE(values_for(a, 0).empty());  // worker 2 still at clock 0
  r.push(2, 0, {100});
  a = r.clock(2, 1);
  // Released: it sees every push of clock 0 (1 + 10 + 100) and its own of clock 1 (1).
  EXPECT_EQ(values_for(a, 0), (std::vector<std::vector<float>>{{112}}));
  EXPECT_EQ(r.rules.min_clock(), 1u);
}

TEST(KvRulesTest, SspZeroIsBspLikeAndAspNeverWaits) {
  Rig s0(config(2, 1, 0));
  s0.init({0});
  s0.push(0, 0, {1});
  s0.clock(0, 1);
  EXPECT_TRUE(values_for(s0.pull(0, 1), 0).empty());
  EXPECT_EQ(values_for(s0.clock(1, 1), 0), (std::vector<std::vector<float>>{{1}}));

  Rig a(config(2, 2));
  a.init({0});
  a.push(0, 0, {1});
  a.clock(0, 1);
  a.clock(0, 2);
  a.clock(0, 3);
  // Worker 1 never moved: asp answers at once with every push applied so far.
  EXPECT_EQ(values_for(a.pull(0, 3), 0), (std::vector<std::vector<float>>{{1}}));
  a.push(1, 0, {2});
  EXPECT_EQ(values_for(a.pull(1, 0), 1), (std::vector<std::vector<float>>{{3}}));
}

TEST(KvRulesTest, SyncClosesAtKPushesAndDropsTheLateOne) {
  Rig r(config(3, 3, 0, /*k=*/2));
  r.init({0, 0});
  r.push(0, 0, {1, 1});
  EXPECT_TRUE(values_for(r.pull(0, 0), 0).empty());
  auto a = r.push(1, 0, {2, 2});  // K = 2 pushes: clock 0 closes
  EXPECT_EQ(values_for(a, 0), (std::vector<std::vector<float>>{{3, 3}}));
  // The straggler's push of the closed clock is dropped and counted.
  a = r.push(2, 0, {100, 100});
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].reply.type, Type::kReply);
  EXPECT_EQ(a[0].reply.aux2, 1u);   // dropped pushes
  EXPECT_EQ(a[0].reply.clock, 1u);  // the straggler learns the next open clock
  EXPECT_EQ(r.rules.dropped(), 1u);
  EXPECT_EQ(values_for(r.pull(2, 0), 2), (std::vector<std::vector<float>>{{3, 3}}));
}

TEST(KvRulesTest, SgdWithMomentumExactInBspAndAsp) {
  // bsp: the mean of the clock's pushes; lr 0.5, momentum 0.5 (exact in binary).
  Rig b(config(2, 0, 0, 0, /*update=*/1, 0.5, 0.5));
  b.init({10});
  b.push(0, 0, {2});
  b.push(1, 0, {6});  // mean 4: v = 4, value = 10 - 2 = 8
  b.clock(0, 1);
  b.clock(1, 1);
  EXPECT_EQ(values_for(b.pull(0, 1), 0), (std::vector<std::vector<float>>{{8}}));
  b.push(0, 1, {4});
  b.push(1, 1, {4});  // mean 4: v = 0.5*4 + 4 = 6, value = 8 - 3 = 5
  EXPECT_EQ(values_for(b.pull(1, 2), 1), (std::vector<std::vector<float>>{{5}}));
  // asp: each push is a step of its own.
  Rig a(config(2, 2, 0, 0, 1, 0.25, 0));
  a.init({1});
  a.push(0, 0, {2});  // 1 - 0.5
  a.push(1, 0, {2});  // 0.5 - 0.5
  EXPECT_EQ(values_for(a.pull(0, 0), 0), (std::vector<std::vector<float>>{{0}}));
}

TEST(KvRulesTest, SgdRefusesIntegerKeys) {
  StoreRules rules(config(1, 2, 0, 0, 1, 0.1, 0), 0);
  Header h;
  h.type = Type::kInit;
  h.dtype = kI32;
  h.count = h.total = 1;
  h.payload = 4;
  int32_t v = 1;
  std::vector<Answer> out;
  rules.on_frame(h, reinterpret_cast<const uint8_t*>(&v), &out);
  EXPECT_TRUE(has_error(out, 0, "floating dtype"));
}

TEST(KvRulesTest, BadShapesAndUnknownKeysAreRefusedNeverApplied) {
  Rig r(config(1, 2));
  r.init({1, 1});
  EXPECT_TRUE(has_error(r.frame(Type::kPush, 0, 0, {5, 5}, /*key=*/8), 0, "not initialised"));
  EXPECT_TRUE(has_error(r.push(0, 0, {5, 5, 5}), 0, "do not match"));
  Header h;  // the right count, another dtype
  h.type = Type::kPush;
  h.dtype = kI32;
  h.key = 7;
  h.count = h.total = 2;
  h.payload = 8;
  int32_t iv[2] = {9, 9};
  std::vector<Answer> out;
  r.rules.on_frame(h, reinterpret_cast<const uint8_t*>(iv), &out);
  EXPECT_TRUE(has_error(out, 0, "do not match"));
  EXPECT_EQ(values_for(r.pull(0, 0), 0), (std::vector<std::vector<float>>{{1, 1}}));
}

TEST(KvRulesTest, DeadWorkerFailsBspNamingItButAspGoesOn) {
  Rig b(config(2, 0));
  b.init({0});
  b.push(0, 0, {1});
  b.pull(0, 0);
  std::vector<Answer> out;
  b.rules.on_dead(1, "connection reset", &out);
  EXPECT_TRUE(has_error(out, 0, "worker 1 died"));
  EXPECT_EQ(b.rules.failed().code(), Code::kPeer);
  EXPECT_TRUE(has_error(b.pull(0, 0), 0, "worker 1 died"));

  Rig s(config(3, 1, 0));
  s.init({0});
  s.push(0, 0, {1});
  s.clock(0, 1);
  s.clock(1, 1);
  EXPECT_TRUE(values_for(s.pull(0, 1), 0).empty());  // waits for worker 2
  out.clear();
  s.rules.on_dead(2, "killed", &out);  // lost: the slowest live worker is now at 1
  EXPECT_EQ(values_for(out, 0), (std::vector<std::vector<float>>{{1}}));
  EXPECT_EQ(s.rules.lost(), 1u);
  EXPECT_TRUE(s.rules.failed().ok());

  Rig k(config(3, 3, 0, 3));  // sync:3 of 3: one death leaves fewer than K
  k.init({0});
  out.clear();
  k.rules.on_dead(0, "killed", &out);
  EXPECT_EQ(k.rules.failed().code(), Code::kPeer);
}

TEST(KvRulesTest, AClockFarAheadClosesTheEmptyClocksAtOnce) {
  // Workers that claim clocks far ahead (a clock frame says "finished every clock below"): the
  // empty clocks between close at once, not one by one (one step per clock up to 2^60 never
  // ended: a libFuzzer timeout), and a push at the far clock still waits for its round.
  Rig r(config(2, 0));
  r.init({0});
  r.push(0, 0, {4});
  r.push(1, 0, {5});
  const uint64_t far = uint64_t{1} << 60;
  r.clock(0, far);
  r.clock(1, far);
  r.push(0, far, {1});
  EXPECT_TRUE(values_for(r.pull(0, far + 1), 0).empty());  // worker 1 has not pushed clock far
  auto out = r.push(1, far, {2});
  EXPECT_EQ(values_for(out, 0), (std::vector<std::vector<float>>{{3}}));  // bsp sum replaces
  std::vector<Answer> bye;
  r.rules.on_bye(1, &bye);
  r.rules.on_bye(0, &bye);
  EXPECT_TRUE(r.rules.finished());
}

TEST(KvRulesTest, ByeLetsTheOthersGoOn) {
  Rig r(config(2, 0));
  r.init({0});
  r.push(0, 0, {4});
  r.pull(0, 0);
  std::vector<Answer> out;
  r.rules.on_bye(1, &out);
  EXPECT_EQ(values_for(out, 0), (std::vector<std::vector<float>>{{4}}));
  EXPECT_FALSE(r.rules.finished());
  EXPECT_GT(r.rules.summary().bytes, 0u);
  r.rules.on_bye(0, &out);
  EXPECT_TRUE(r.rules.finished());
  // Nobody can pull any more: the values are freed, the partition stays listed.
  EXPECT_EQ(r.rules.summary().bytes, 0u);
  EXPECT_EQ(r.rules.summary().partitions, 1u);
}

TEST(KvWireTest, HeaderRoundTripAndBadFieldsRefused) {
  Header h;
  h.type = Type::kPush;
  h.dtype = 1;
  h.worker = 3;
  h.partition = 9;
  h.key = 0xdeadbeefcafeull;
  h.clock = 12;
  h.req_id = 99;
  h.count = 4;
  h.total = 40;
  h.aux3 = 2;
  h.payload = 32;
  uint8_t b[kHeaderBytes];
  encode_header(h, b);
  Header d;
  ASSERT_TRUE(decode_header(b, &d).ok());
  EXPECT_EQ(d.key, h.key);
  EXPECT_EQ(d.partition, 9u);
  EXPECT_EQ(d.payload, 32u);
  EXPECT_TRUE(check_request(d, 4).ok());
  EXPECT_FALSE(check_request(d, 3).ok());  // worker out of range
  d.payload = 31;
  EXPECT_FALSE(check_request(d, 4).ok());  // payload disagrees with count x dtype
  uint8_t bad[kHeaderBytes];
  std::memcpy(bad, b, sizeof(b));
  bad[0] ^= 1;
  EXPECT_FALSE(decode_header(bad, &d).ok());
  std::memcpy(bad, b, sizeof(b));
  bad[4] = 42;  // type
  EXPECT_FALSE(decode_header(bad, &d).ok());
  std::memcpy(bad, b, sizeof(b));
  bad[5] = 7;  // dtype
  EXPECT_FALSE(decode_header(bad, &d).ok());
  std::memcpy(bad, b, sizeof(b));
  bad[79] = 0xff;  // payload beyond the limit
  EXPECT_FALSE(decode_header(bad, &d).ok());
  StoreConfig c = config(4, 3, 0, 5);
  std::string tok;
  auto hello = encode_hello(c, "secret");
  EXPECT_FALSE(decode_hello(hello.data(), hello.size(), &c, &tok).ok());  // sync_k 5 > 4 workers
  c = config(4, 1, 2);
  hello = encode_hello(c, "secret");
  StoreConfig back;
  ASSERT_TRUE(decode_hello(hello.data(), hello.size(), &back, &tok).ok());
  EXPECT_EQ(back, c);
  EXPECT_EQ(tok, "secret");
}

TEST(KvWireTest, PartitionsSpreadOverEveryServer) {
  // The documented rule: partition p of key k on server (splitmix64(k) + p) % S.
  for (uint64_t key : {0ull, 1ull, 12345ull}) {
    std::vector<int> hits(4, 0);
    for (uint32_t p = 0; p < 8; ++p) {
      EXPECT_EQ(server_of(key, p, 4), (splitmix64(key) + p) % 4);
      ++hits[server_of(key, p, 4)];
    }
    for (int h : hits) EXPECT_EQ(h, 2);
  }
}

}  // namespace
}  // namespace gw::kv
