// Store tests: the in-process store, prefix view, barrier, the TCP store (server + clients over
// loopback) and its wire codec. Hostile input on the wire and the server's limits are in
// store_hostile_test.cc (the same binary, store_test).
#include "core/store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <random>
#include <thread>

#include "core/store_socket.h"
#include "core/store_wire.h"
#include "tests/support/free_port.h"
#include "tests/support/test_env.h"
#include "tests/unit/store_test_util.h"

namespace gw {
namespace {

using namespace std::chrono_literals;

using store_test::B;
using store_test::elapsed_ms;

// Runs the same behaviour checks against each Store implementation.
class AnyStoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "memory") {
      store_ = make_memory_store();
      other_ = store_;
    } else {
      TcpStoreOptions o;
      o.host_server = true;
      auto server = TcpStore::create(o);
      ASSERT_TRUE(server.ok()) << server.status().to_string();
      TcpStoreOptions c;
      c.port = (*server)->port();
      auto client = TcpStore::create(c);
      ASSERT_TRUE(client.ok()) << client.status().to_string();
      store_ = *server;
      other_ = *client;
    }
  }
  std::shared_ptr<Store> store_;
  std::shared_ptr<Store> other_;  // a second client of the same data
};

TEST_P(AnyStoreTest, SetGetAcrossClients) {
  ASSERT_TRUE(store_->set("a", B("hello"), deadline_after_ms(2000)).ok());
  auto v = other_->get("a", deadline_after_ms(2000));
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ(*v, B("hello"));
  ASSERT_TRUE(other_->set("b", B(""), deadline_after_ms(2000)).ok());  // empty value is fine
  v = store_->get("b", deadline_after_ms(2000));
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->empty());
}

TEST_P(AnyStoreTest, GetWaitsForALaterSet) {
  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    EXPECT_TRUE(other_->set("late", B("x"), deadline_after_ms(2000)).ok());
  });
  auto start = Clock::now();
  auto v = store_->get("late", deadline_after_ms(5000));
  setter.join();
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ(*v, B("x"));
  EXPECT_GE(elapsed_ms(start), 50);
}

TEST_P(AnyStoreTest, MissingKeyTimesOutAtTheDeadline) {
  auto start = Clock::now();
  auto v = store_->get("never", deadline_after_ms(200));
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), Code::kTimeout);
  EXPECT_NE(v.status().message().find("never"), std::string::npos) << v.status().message();
  EXPECT_GE(elapsed_ms(start), 150);
  EXPECT_LT(elapsed_ms(start), 3000);
  // The connection is still usable afterwards.
  ASSERT_TRUE(store_->set("after", B("1"), deadline_after_ms(2000)).ok());
  EXPECT_TRUE(store_->get("after", deadline_after_ms(2000)).ok());
}

TEST_P(AnyStoreTest, AddCountsAndRejectsNonIntegers) {
  auto r = store_->add("n", 5, deadline_after_ms(2000));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 5);
  r = other_->add("n", -7, deadline_after_ms(2000));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, -2);
  auto v = store_->get("n", deadline_after_ms(2000));
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, B("-2"));
  // A key written by set is write-once: add refuses it whatever its value.
  ASSERT_TRUE(store_->set("s", B("abc"), deadline_after_ms(2000)).ok());
  r = store_->add("s", 1, deadline_after_ms(2000));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArg);
  ASSERT_TRUE(store_->add("big", INT64_MAX, deadline_after_ms(2000)).ok());
  r = store_->add("big", 1, deadline_after_ms(2000));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArg);
  EXPECT_NE(r.status().message().find("overflow"), std::string::npos);
  // Still usable after rejected requests.
  EXPECT_TRUE(store_->add("n", 2, deadline_after_ms(2000)).ok());
}

TEST_P(AnyStoreTest, EraseRemovesAndMissingIsFine) {
  ASSERT_TRUE(store_->add("e", 1, deadline_after_ms(2000)).ok());  // a counter: erasable
  ASSERT_TRUE(other_->erase("e", deadline_after_ms(2000)).ok());
  ASSERT_TRUE(other_->erase("e", deadline_after_ms(2000)).ok());
  auto v = store_->get("e", deadline_after_ms(100));
  EXPECT_EQ(v.status().code(), Code::kTimeout);
}

TEST_P(AnyStoreTest, RejectsBadKeysAndValues) {
  EXPECT_EQ(store_->set("", B("x"), deadline_after_ms(1000)).code(), Code::kInvalidArg);
  std::string long_key(store_wire::kMaxKey + 1, 'k');
  EXPECT_EQ(store_->set(long_key, B("x"), deadline_after_ms(1000)).code(), Code::kInvalidArg);
  EXPECT_EQ(store_->get(long_key, deadline_after_ms(1000)).status().code(), Code::kInvalidArg);
  EXPECT_EQ(store_->add(long_key, 1, deadline_after_ms(1000)).status().code(), Code::kInvalidArg);
  EXPECT_EQ(store_->erase("", deadline_after_ms(1000)).code(), Code::kInvalidArg);
  Bytes huge(store_wire::kMaxValue + 1);
  Status s = store_->set("huge", huge, deadline_after_ms(1000));
  EXPECT_EQ(s.code(), Code::kInvalidArg);
  EXPECT_NE(s.message().find("limit"), std::string::npos) << s.message();
  // A key of exactly the limit works.
  std::string max_key(store_wire::kMaxKey, 'm');
  EXPECT_TRUE(store_->set(max_key, B("ok"), deadline_after_ms(2000)).ok());
  EXPECT_TRUE(other_->get(max_key, deadline_after_ms(2000)).ok());
}

TEST_P(AnyStoreTest, LargeValueRoundTrips) {
  Bytes big(8u << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 131 + 7);
  ASSERT_TRUE(store_->set("big", big, deadline_after_ms(10000)).ok());
  auto v = other_->get("big", deadline_after_ms(10000));
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_TRUE(*v == big);
}

TEST_P(AnyStoreTest, ConcurrentAddsFromOneClientAreAtomic) {
  constexpr int kThreads = 4;
  constexpr int kAdds = 100;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Store& s = t % 2 ? *store_ : *other_;
      for (int i = 0; i < kAdds; ++i) EXPECT_TRUE(s.add("ctr", 1, deadline_after_ms(5000)).ok());
    });
  }
  for (auto& t : threads) t.join();
  auto r = store_->add("ctr", 0, deadline_after_ms(2000));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, kThreads * kAdds);
}

TEST_P(AnyStoreTest, PrefixStoresAreIsolated) {
  auto a = make_prefix_store(store_, "comm1/");
  auto b = make_prefix_store(other_, "comm2/");
  ASSERT_TRUE(a->set("k", B("A"), deadline_after_ms(2000)).ok());
  ASSERT_TRUE(b->set("k", B("B"), deadline_after_ms(2000)).ok());
  EXPECT_EQ(*a->get("k", deadline_after_ms(2000)), B("A"));
  EXPECT_EQ(*b->get("k", deadline_after_ms(2000)), B("B"));
  EXPECT_EQ(*store_->get("comm2/k", deadline_after_ms(2000)), B("B"));
  EXPECT_EQ(*a->add("c", 3, deadline_after_ms(2000)), 3);
  EXPECT_EQ(b->get("c", deadline_after_ms(100)).status().code(), Code::kTimeout);
  ASSERT_TRUE(a->erase("c", deadline_after_ms(2000)).ok());
  EXPECT_EQ(a->get("c", deadline_after_ms(100)).status().code(), Code::kTimeout);
  EXPECT_TRUE(b->get("k", deadline_after_ms(2000)).ok());
}

TEST_P(AnyStoreTest, BarrierReleasesEveryoneAndReportsStragglers) {
  constexpr int kWorld = 4;
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      Store& s = r % 2 ? *store_ : *other_;
      if (store_barrier(s, "bar1", kWorld, deadline_after_ms(5000)).ok()) ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kWorld);

  // One rank never comes: the others fail with kTimeout saying how many arrived.
  threads.clear();
  std::vector<Status> results(kWorld - 1);
  for (int r = 0; r < kWorld - 1; ++r) {
    threads.emplace_back(
        [&, r] { results[r] = store_barrier(*store_, "bar2", kWorld, deadline_after_ms(300)); });
  }
  for (auto& t : threads) t.join();
  for (const Status& s : results) {
    EXPECT_EQ(s.code(), Code::kTimeout);
    EXPECT_NE(s.message().find("3 of 4"), std::string::npos) << s.message();
  }
  // A reused key is detected rather than passing instantly.
  Status reuse = store_barrier(*store_, "bar1", kWorld, deadline_after_ms(300));
  EXPECT_EQ(reuse.code(), Code::kInvalidArg);
  EXPECT_EQ(store_barrier(*store_, "bar3", 0, deadline_after_ms(300)).code(), Code::kInvalidArg);
}

TEST_P(AnyStoreTest, ReleaseHostWaitsForEveryOtherRankOnRankZeroOnly) {
  constexpr int kWorld = 4;
  // The other ranks return at once, without waiting for each other or for rank 0.
  for (int r = 1; r < kWorld - 1; ++r) {
    ASSERT_TRUE(store_release_host(*other_, "rel1", r, kWorld, deadline_after_ms(300)).ok());
  }
  // Rank 0 waits until the last of them has said it is done.
  std::atomic<bool> released{false};
  std::thread host([&] {
    EXPECT_TRUE(store_release_host(*store_, "rel1", 0, kWorld, deadline_after_ms(5000)).ok());
    released = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(released.load()) << "rank 0 returned before rank 3 was done";
  ASSERT_TRUE(store_release_host(*other_, "rel1", kWorld - 1, kWorld, deadline_after_ms(300)).ok());
  host.join();
  EXPECT_TRUE(released.load());

  // A rank that never says so: rank 0 fails with kTimeout saying how many did.
  ASSERT_TRUE(store_release_host(*other_, "rel2", 2, kWorld, deadline_after_ms(300)).ok());
  Status late = store_release_host(*store_, "rel2", 0, kWorld, deadline_after_ms(300));
  EXPECT_EQ(late.code(), Code::kTimeout);
  EXPECT_NE(late.message().find("only 1 of 3"), std::string::npos) << late.message();
  // A world of one has nobody to wait for; a reused key and a bad rank are refused.
  EXPECT_TRUE(store_release_host(*store_, "rel3", 0, 1, deadline_after_ms(300)).ok());
  EXPECT_EQ(store_release_host(*other_, "rel1", 1, kWorld, deadline_after_ms(300)).code(),
            Code::kInvalidArg);
  EXPECT_EQ(store_release_host(*other_, "rel4", kWorld, kWorld, deadline_after_ms(300)).code(),
            Code::kInvalidArg);
}

INSTANTIATE_TEST_SUITE_P(Stores, AnyStoreTest, ::testing::Values("memory", "tcp"),
                         [](const auto& info) { return info.param; });

// --- TCP store specifics ------------------------------------------------------------------------

using gw::testing::free_port;

TEST(TcpStoreTest, PortZeroPicksAPort) {
  TcpStoreOptions o;
  o.host_server = true;
  auto s = TcpStore::create(o);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_GT((*s)->port(), 0);
}

TEST(TcpStoreTest, PortInUseIsASystemErrorNamingTheAddress) {
  TcpStoreOptions o;
  o.host_server = true;
  auto first = TcpStore::create(o);
  ASSERT_TRUE(first.ok());
  o.port = (*first)->port();
  auto second = TcpStore::create(o);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), Code::kSystem);
  EXPECT_NE(second.status().message().find(std::to_string(o.port)), std::string::npos)
      << second.status().message();
}

TEST(TcpStoreTest, ClientsMayStartBeforeTheServer) {
  int port = free_port();
  std::shared_ptr<TcpStore> client;
  Status client_status;
  std::thread t([&] {
    TcpStoreOptions c;
    c.port = port;
    c.connect_timeout_ms = 10000;
    auto r = TcpStore::create(c);
    client_status = r.status();
    if (r.ok()) client = *r;
  });
  std::this_thread::sleep_for(300ms);
  TcpStoreOptions o;
  o.port = port;
  o.host_server = true;
  auto server = TcpStore::create(o);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  t.join();
  ASSERT_TRUE(client_status.ok()) << client_status.to_string();
  ASSERT_TRUE(client->set("k", B("v"), deadline_after_ms(2000)).ok());
  EXPECT_EQ(*(*server)->get("k", deadline_after_ms(2000)), B("v"));
}

TEST(TcpStoreTest, NoServerEndsInTimeoutAfterConnectTimeout) {
  TcpStoreOptions c;
  c.port = free_port();
  c.connect_timeout_ms = 300;
  auto start = Clock::now();
  auto r = TcpStore::create(c);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kTimeout);
  EXPECT_NE(r.status().message().find(std::to_string(c.port)), std::string::npos);
  EXPECT_GE(elapsed_ms(start), 250);
  EXPECT_LT(elapsed_ms(start), 3000);
}

TEST(TcpStoreTest, RejectsBadOptions) {
  TcpStoreOptions c;
  c.port = 0;  // a client needs the port
  EXPECT_EQ(TcpStore::create(c).status().code(), Code::kInvalidArg);
  c.port = 70000;
  EXPECT_EQ(TcpStore::create(c).status().code(), Code::kInvalidArg);
  c.port = -1;
  c.host_server = true;
  EXPECT_EQ(TcpStore::create(c).status().code(), Code::kInvalidArg);
  c.port = 1234;
  c.host = "";
  EXPECT_EQ(TcpStore::create(c).status().code(), Code::kInvalidArg);
  c.host = "127.0.0.1";
  c.token = std::string(store_wire::kMaxToken + 1, 't');
  EXPECT_EQ(TcpStore::create(c).status().code(), Code::kInvalidArg);
}

TEST(TcpStoreTest, TokenMustMatch) {
  TcpStoreOptions o;
  o.host_server = true;
  o.token = "secret-1";
  auto server = TcpStore::create(o);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  TcpStoreOptions c;
  c.port = (*server)->port();
  c.connect_timeout_ms = 5000;
  c.token = "secret-2";
  auto start = Clock::now();
  auto bad = TcpStore::create(c);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kPeer);
  EXPECT_NE(bad.status().message().find("token"), std::string::npos) << bad.status().message();
  EXPECT_LT(elapsed_ms(start), 2000);  // refused at once, not retried until the timeout
  c.token = "";
  EXPECT_EQ(TcpStore::create(c).status().code(), Code::kPeer);
  c.token = "secret-1";
  auto good = TcpStore::create(c);
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  EXPECT_TRUE((*good)->set("k", B("v"), deadline_after_ms(2000)).ok());
}

TEST(TcpStoreTest, DeadServerFailsClientsQuickly) {
  TcpStoreOptions o;
  o.host_server = true;
  auto server = TcpStore::create(o);
  ASSERT_TRUE(server.ok());
  TcpStoreOptions c;
  c.port = (*server)->port();
  auto client = TcpStore::create(c);
  ASSERT_TRUE(client.ok());
  // One client is parked in a get when the server goes away.
  Status parked;
  int64_t parked_ms = 0;
  std::thread waiter([&] {
    auto start = Clock::now();
    parked = (*client)->get("never", deadline_after_ms(20000)).status();
    parked_ms = elapsed_ms(start);
  });
  std::this_thread::sleep_for(200ms);
  auto start = Clock::now();
  server->reset();  // destroying the hosting store must not hang with clients connected
  EXPECT_LT(elapsed_ms(start), 2000);
  waiter.join();
  EXPECT_EQ(parked.code(), Code::kPeer) << parked.to_string();
  EXPECT_LT(parked_ms, 5000);
  start = Clock::now();
  Status s = (*client)->set("k", B("v"), deadline_after_ms(20000));
  EXPECT_EQ(s.code(), Code::kPeer) << s.to_string();
  EXPECT_LT(elapsed_ms(start), 2000);
}

TEST(TcpStoreTest, ServerShutdownWithIdleClientsDoesNotHang) {
  std::vector<std::shared_ptr<TcpStore>> clients;
  auto start = Clock::now();
  {
    TcpStoreOptions o;
    o.host_server = true;
    auto server = TcpStore::create(o);
    ASSERT_TRUE(server.ok());
    for (int i = 0; i < 8; ++i) {
      TcpStoreOptions c;
      c.port = (*server)->port();
      auto cl = TcpStore::create(c);
      ASSERT_TRUE(cl.ok());
      clients.push_back(*cl);
    }
  }
  EXPECT_LT(elapsed_ms(start), 3000);
  for (auto& c : clients)
    EXPECT_EQ(c->add("x", 1, deadline_after_ms(2000)).status().code(), Code::kPeer);
}

TEST(MemoryStoreTest, KeysAreWriteOnce) {
  auto s = make_memory_store();
  ASSERT_TRUE(s->set("k", B("a"), deadline_after_ms(100)).ok());
  Status again = s->set("k", B("b"), deadline_after_ms(100));
  EXPECT_EQ(again.code(), Code::kInvalidArg);
  EXPECT_NE(again.message().find("write-once"), std::string::npos) << again.message();
  EXPECT_EQ(s->add("k", 1, deadline_after_ms(100)).status().code(), Code::kInvalidArg);
  EXPECT_EQ(s->erase("k", deadline_after_ms(100)).code(), Code::kInvalidArg);
  EXPECT_EQ(*s->get("k", deadline_after_ms(100)), B("a"));
}

// The token never crosses the wire: a listener posing as the store sees only a random challenge,
// and the client refuses it because it cannot prove the token.
TEST(TcpStoreTest, TokenNeverCrossesTheWireAndAFakeStoreIsRefused) {
  int port = 0;
  auto lfd = store_socket::listen_tcp("127.0.0.1", 0, &port);
  ASSERT_TRUE(lfd.ok());
  const std::string token = "very-secret-token-0123456789";
  Bytes seen;
  std::thread fake([&] {
    pollfd p{lfd->get(), POLLIN, 0};
    if (::poll(&p, 1, 5000) != 1) return;
    sys::Fd c(::accept4(lfd->get(), nullptr, nullptr, SOCK_CLOEXEC));
    uint8_t h[4];
    if (!store_socket::recv_all(c.get(), h, 4, deadline_after_ms(3000), "fake").ok()) return;
    auto len = store_wire::decode_length(h);
    if (!len.ok()) return;
    Bytes body(*len);
    if (!store_socket::recv_all(c.get(), body.data(), body.size(), deadline_after_ms(3000), "f")
             .ok()) {
      return;
    }
    seen = body;
    // Answer with a challenge and a proof made without the token.
    store_wire::Response r;
    r.proof = net::handshake::prove("guess", net::handshake::Role::kListener,
                                    store_wire::transcript({}, r.challenge));
    Bytes out = store_wire::encode_response(store_wire::Op::kHello, r);
    (void)store_socket::send_all(c.get(), out.data(), out.size(), deadline_after_ms(3000), "f");
    uint8_t more[64];
    (void)store_socket::recv_all(c.get(), more, 1, deadline_after_ms(1000), "f");
  });
  TcpStoreOptions c;
  c.port = port;
  c.token = token;
  c.connect_timeout_ms = 5000;
  auto client = TcpStore::create(c);
  fake.join();
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), Code::kPeer);
  EXPECT_NE(client.status().message().find("did not prove"), std::string::npos)
      << client.status().message();
  ASSERT_FALSE(seen.empty());
  std::string wire(seen.begin(), seen.end());
  EXPECT_EQ(wire.find(token), std::string::npos);
  EXPECT_EQ(wire.find("secret"), std::string::npos);
}

// --- codec --------------------------------------------------------------------------------------

TEST(StoreWireTest, RequestsRoundTrip) {
  store_wire::Request r;
  r.op = store_wire::Op::kAdd;
  r.key = "counter";
  r.delta = -42;
  auto f = store_wire::encode_request(r);
  ASSERT_TRUE(f.ok());
  auto len = store_wire::decode_length(f->data());
  ASSERT_TRUE(len.ok());
  ASSERT_EQ(*len + 4, f->size());
  auto d = store_wire::decode_request(f->data() + 4, *len);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->op, store_wire::Op::kAdd);
  EXPECT_EQ(d->key, "counter");
  EXPECT_EQ(d->delta, -42);
  r.op = store_wire::Op::kSet;
  r.key = "";
  EXPECT_EQ(store_wire::encode_request(r).status().code(), Code::kInvalidArg);
}

TEST(StoreWireTest, CounterParsingIsStrict) {
  int64_t v = 0;
  EXPECT_TRUE(store_wire::parse_counter(B("-12"), &v));
  EXPECT_EQ(v, -12);
  EXPECT_FALSE(store_wire::parse_counter(B(" 12"), &v));
  EXPECT_FALSE(store_wire::parse_counter(B("12x"), &v));
  EXPECT_FALSE(store_wire::parse_counter(B(""), &v));
  EXPECT_FALSE(store_wire::parse_counter(B("99999999999999999999"), &v));
}

// Random and mutated bodies never crash the decoders and never yield out-of-limit fields.
TEST(StoreWireTest, DecodersSurviveRandomInput) {
  std::mt19937 rng(1234);
  store_wire::Request seed;
  seed.op = store_wire::Op::kSet;
  seed.key = "key";
  seed.value = B("value");
  Bytes valid = *store_wire::encode_request(seed);
  for (int i = 0; i < 20000; ++i) {
    Bytes body;
    if (i % 2) {
      body.resize(rng() % 64);
      for (auto& b : body) b = static_cast<uint8_t>(rng());
    } else {
      body.assign(valid.begin() + 4, valid.end());
      body[rng() % body.size()] = static_cast<uint8_t>(rng());
      body.resize(rng() % (body.size() + 1));
    }
    auto r = store_wire::decode_request(body.data(), body.size());
    if (r.ok()) {
      EXPECT_LE(r->key.size(), store_wire::kMaxKey);
      EXPECT_LE(r->value.size(), body.size());
    }
    for (auto op : {store_wire::Op::kGet, store_wire::Op::kAdd, store_wire::Op::kSet}) {
      auto resp = store_wire::decode_response(op, body.data(), body.size());
      if (resp.ok()) {
        EXPECT_LE(resp->value.size(), body.size());
      }
    }
  }
}

}  // namespace
}  // namespace gw
