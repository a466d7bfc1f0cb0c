// kv::Server's own costs (kv/server.h): an idle server, and one with a worker joined but silent,
// is never woken (no timer: its threads make no voluntary context switch while nothing arrives),
// nor is a worker's idle link to it (kv::Client), nor a standalone server's serve() while a
// store is in use; a finished store's values are freed at once;
// a connection's threads are joined as it ends, so after 200 short connections (joined and
// said goodbye, or closed before any hello) the server holds no thread and the process is back to
// its thread count before them.
#include <dirent.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kv/client.h"
#include "kv/io.h"
#include "kv/server.h"
#include "kv/wire.h"

namespace gw::kv {
namespace {

constexpr int64_t kTimeoutMs = 20000;

// The process's threads by tid, each with its voluntary context switches so far.
std::map<std::string, long> voluntary_switches() {
  std::map<std::string, long> out;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(std::string("/proc/self/task/") + e->d_name + "/status");
    std::string line;
    long v = 0;
    while (std::getline(f, line)) {
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0) v = std::stol(line.substr(24));
    }
    out[e->d_name] = v;
  }
  closedir(d);
  return out;
}

size_t thread_count() { return voluntary_switches().size(); }

// The voluntary switches, over `ms`, of the threads not in `before` (the server's).
long wakeups_of_new_threads(const std::map<std::string, long>& before, int ms) {
  auto a = voluntary_switches();
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  auto b = voluntary_switches();
  long sum = 0;
  for (const auto& [tid, v] : b) {
    if (before.count(tid) != 0) continue;
    auto it = a.find(tid);
    sum += v - (it == a.end() ? 0 : it->second);
  }
  return sum;
}

std::unique_ptr<Server> start_server() {
  ServerOptions so;
  so.token = "tok";
  so.timeout_ms = kTimeoutMs;
  so.route_host = "127.0.0.1";
  auto srv = Server::start(so);
  EXPECT_TRUE(srv.ok()) << srv.status().message();
  return srv.ok() ? std::move(*srv) : nullptr;
}

// Connects and joins store `store` (one worker) as worker 0; an invalid Fd on failure.
sys::Fd join(const Server& srv, uint64_t store) {
  const sys::Deadline deadline = sys::deadline_after_ms(kTimeoutMs);
  auto fd = connect_to(srv.address(), deadline);
  EXPECT_TRUE(fd.ok()) << fd.status().message();
  if (!fd.ok()) return sys::Fd();
  StoreConfig c;
  c.workers = 1;
  c.partition_bytes = 1024;
  const auto hello = encode_hello(c, "tok");
  Header h;
  h.type = Type::kHello;
  h.aux = store;
  h.payload = static_cast<uint32_t>(hello.size());
  EXPECT_TRUE(write_frame(fd->get(), h, hello.data(), deadline).ok());
  Header r;
  Status s = read_header(fd->get(), &r, deadline, nullptr);
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(r.type, Type::kReply);
  return std::move(*fd);
}

TEST(KvServerTest, AnIdleServerIsNeverWoken) {
  const auto before = voluntary_switches();
  auto srv = start_server();
  ASSERT_TRUE(srv);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // into its poll
  // A timer of 50 ms would make about 40 switches in 2 s, however loaded the machine is (each
  // expiry ends in a sleep); a server woken only by work makes none.
  const long idle = wakeups_of_new_threads(before, 2000);
  std::printf("kv server idle: %ld voluntary context switches in 2 s\n", idle);
  EXPECT_LE(idle, 3);
  // A worker joined and silent: its reader and writer sleep too.
  sys::Fd w = join(*srv, 1);
  ASSERT_TRUE(w.valid());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const long joined = wakeups_of_new_threads(before, 2000);
  std::printf("kv server with a silent worker: %ld voluntary context switches in 2 s\n", joined);
  EXPECT_LE(joined, 3);
  // stop() ends the silent connection's reader at once (the stop eventfd, not a timer).
  const auto t0 = std::chrono::steady_clock::now();
  srv->stop();
  const double stop_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("kv server stop with a silent worker: %.3f s\n", stop_s);
  EXPECT_LT(stop_s, 10.0);  // a hang, not a timing figure
  EXPECT_EQ(srv->connection_threads(), 0u);
}

TEST(KvServerTest, AnIdleWorkerLinkIsNeverWoken) {
  auto srv = start_server();
  ASSERT_TRUE(srv);
  const auto before = voluntary_switches();  // the server's accept thread is not counted
  ClientOptions co;
  co.store_id = 1;
  co.config.workers = 1;
  co.config.partition_bytes = 1024;
  co.token = "tok";
  co.timeout_ms = kTimeoutMs;
  co.servers.push_back(srv->address());
  auto cl = Client::connect(co);
  ASSERT_TRUE(cl.ok()) << cl.status().message();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // The worker's sender and receiver, the server's reader and writer of the connection.
  const long idle = wakeups_of_new_threads(before, 2000);
  std::printf("an idle worker link: %ld voluntary context switches in 2 s\n", idle);
  EXPECT_LE(idle, 3);
  // close() still ends the link at once (it shuts the socket down): the goodbye reaches the
  // server, whose store is then finished.
  Status s = (*cl)->close();
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_TRUE(srv->wait_finished(1, sys::deadline_after_ms(kTimeoutMs)).ok());
  srv->stop();
}

TEST(KvServerTest, ServeSleepsWhileAStoreIsInUseAndFreesItsValuesWhenFinished) {
  auto srv = start_server();
  ASSERT_TRUE(srv);
  ClientOptions co;
  co.store_id = 7;
  co.config.workers = 1;
  co.config.partition_bytes = 1024;
  co.token = "tok";
  co.timeout_ms = kTimeoutMs;
  co.servers.push_back(srv->address());
  auto cl = Client::connect(co);
  ASSERT_TRUE(cl.ok()) << cl.status().message();
  std::vector<float> v(1000, 1.5f);  // 4000 bytes: 4 partitions of at most 1024 bytes
  auto op =
      (*cl)->start(Client::Kind::kInit, 3, v.data(), nullptr, v.size(), coll::DataType::kF32, 0);
  ASSERT_TRUE(op.ok()) << op.status().message();
  ASSERT_TRUE((*op)->wait(sys::deadline_after_ms(kTimeoutMs), false).ok());
  auto held = srv->stores();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].summary.bytes, 4000u);
  EXPECT_EQ(held[0].summary.partitions, 4u);

  // serve() of a standalone server (GW_ROLE=server) while the store is in use: asleep, with no
  // timer (it used to wake every 100 ms), until the worker's connection ends.
  std::atomic<bool> job_alive{true};
  Status served = internal_error("serve() did not return");
  const auto before = voluntary_switches();
  std::thread server_thread([&] { served = srv->serve([&] { return job_alive.load(); }); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const long in_use = wakeups_of_new_threads(before, 2000);
  std::printf("kv serve() with a store in use: %ld voluntary context switches in 2 s\n", in_use);
  EXPECT_LE(in_use, 3);

  // The goodbye finishes the store: its values are freed at once (its row stays, 0 bytes).
  ASSERT_TRUE((*cl)->close().ok());
  ASSERT_TRUE(srv->wait_finished(7, sys::deadline_after_ms(kTimeoutMs)).ok());
  held = srv->stores();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_TRUE(held[0].summary.finished);
  EXPECT_EQ(held[0].summary.bytes, 0u);
  EXPECT_EQ(held[0].summary.partitions, 4u);
  EXPECT_EQ(held[0].summary.keys, 1u);

  // Every store finished: serve() asks whether the job is still there (every 500 ms) and returns
  // once it is not, long before GW_TIMEOUT_MS (20 s).
  const auto t0 = std::chrono::steady_clock::now();
  job_alive = false;
  server_thread.join();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(served.ok()) << served.message();
  EXPECT_LT(took, 10.0) << "serve() did not see the job end";
  srv->stop();
}

TEST(KvServerTest, FinishedConnectionThreadsAreReapedAsTheyEnd) {
  auto srv = start_server();
  ASSERT_TRUE(srv);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const size_t baseline = thread_count();
  const sys::Deadline deadline = sys::deadline_after_ms(kTimeoutMs);
  for (uint64_t i = 0; i < 200; ++i) {
    if (i % 2 == 0) {
      // A worker that joins its own store, says goodbye and reads the server's close.
      sys::Fd fd = join(*srv, i + 1);
      ASSERT_TRUE(fd.valid());
      Header bye;
      bye.type = Type::kBye;
      ASSERT_TRUE(write_frame(fd.get(), bye, nullptr, deadline).ok());
      Header r;
      EXPECT_EQ(read_header(fd.get(), &r, deadline, nullptr).code(), Code::kAborted);  // EOF
    } else {
      // A connection that closes before its hello.
      auto fd = connect_to(srv->address(), deadline);
      ASSERT_TRUE(fd.ok()) << fd.status().message();
    }
  }
  size_t held = 0, threads = 0;
  for (int i = 0; i < 2000; ++i) {
    held = srv->connection_threads();
    threads = thread_count();
    if (held == 0 && threads <= baseline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::printf("after 200 connections: %zu connection threads held, %zu threads (baseline %zu)\n",
              held, threads, baseline);
  EXPECT_EQ(held, 0u);
  EXPECT_LE(threads, baseline);
  // The server still serves: one more connection joins.
  sys::Fd again = join(*srv, 1000);
  EXPECT_TRUE(again.valid());
  again.reset();
  srv->stop();
  EXPECT_EQ(srv->connection_threads(), 0u);
}

}  // namespace
}  // namespace gw::kv
