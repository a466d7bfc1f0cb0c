// Streamed partitions (kv wire version 2, docs/wire-kv.md §1): a partition travels and is summed
// in chunks of chunk_bytes, each chunk its own unit on the partition's server. Push_pull under
// bsp and sync:K gives exactly the sums, with and without a codec; the units are where the rule
// puts them (on the partition's server, as many as the chunks); workers that disagree on the
// chunk are refused naming it; GW_KV_CHUNK_BYTES resolves on the worker; a version-1 frame is
// refused with a message naming both versions; the Hello carries chunk_bytes.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collectives/compress/codec.h"
#include "kv/client.h"
#include "kv/server.h"
#include "kv/wire.h"

namespace gw::kv {
namespace {

constexpr int64_t kTimeoutMs = 20000;
constexpr uint64_t kKey = 11;

struct Job {
  std::vector<std::unique_ptr<Server>> servers;
  std::vector<std::unique_ptr<Client>> workers;
};

// Servers, then one client per worker, each with its chunk (-1: GW_KV_CHUNK_BYTES).
Status start_job(const StoreConfig& c, int nservers, const std::vector<int64_t>& chunks, Job* job) {
  ClientOptions co;
  for (int s = 0; s < nservers; ++s) {
    ServerOptions so;
    so.rank = s;
    so.token = "tok";
    so.timeout_ms = kTimeoutMs;
    so.route_host = "127.0.0.1";
    GW_ASSIGN_OR_RETURN(auto srv, Server::start(so));
    co.servers.push_back(srv->address());
    job->servers.push_back(std::move(srv));
  }
  co.store_id = 1;
  co.config = c;
  co.token = "tok";
  co.timeout_ms = kTimeoutMs;
  for (uint32_t w = 0; w < c.workers; ++w) {
    co.rank = w;
    co.chunk_bytes = chunks[w];
    GW_ASSIGN_OR_RETURN(auto cl, Client::connect(co));
    job->workers.push_back(std::move(cl));
  }
  return ok_status();
}

StoreConfig config(uint32_t workers, uint32_t mode, int sync_k, const std::string& codec) {
  StoreConfig c;
  c.workers = workers;
  c.mode = mode;
  c.sync_k = sync_k;
  c.partition_bytes = 4096;  // 1024 floats
  if (!codec.empty()) c.codec = coll::format_codec_spec(*check_codec_spec(codec));
  return c;
}

// 3 workers push_pull a key of 2500 floats (partitions of 1024, 1024, 452 floats; chunks of 256:
// 4 + 4 + 2 = 10 units) for 3 clocks; every value is a small integer, exact in fp16 too.
void run_streamed_sum(uint32_t mode, int sync_k, const std::string& codec) {
  const StoreConfig c = config(3, mode, sync_k, codec);
  Job job;
  Status s = start_job(c, 2, {1024, 1024, 1024}, &job);
  ASSERT_TRUE(s.ok()) << s.message();
  const size_t n = 2500;
  std::vector<float> zero(n, 0.0f);
  for (auto& w : job.workers) {
    auto op = w->start(Client::Kind::kInit, kKey, zero.data(), nullptr, n, coll::DataType::kF32, 0);
    ASSERT_TRUE(op.ok()) << op.status().message();
    ASSERT_TRUE((*op)->wait(sys::deadline_after_ms(kTimeoutMs), false).ok());
  }
  // The units sit on the partitions' servers: partition p's 4 (or 2) chunks on server_of(key, p).
  uint64_t units[2] = {0, 0};
  const uint64_t chunks_of_part[3] = {4, 4, 2};
  for (uint32_t p = 0; p < 3; ++p) units[server_of(kKey, p, 2)] += chunks_of_part[p];
  for (int sv = 0; sv < 2; ++sv) {
    auto held = job.servers[sv]->stores();
    ASSERT_EQ(held.size(), 1u);
    EXPECT_EQ(held[0].summary.partitions, units[sv]) << "server " << sv;
    EXPECT_EQ(held[0].summary.config.chunk_bytes, 1024u);
  }
  for (uint64_t clock = 0; clock < 3; ++clock) {
    std::vector<std::vector<float>> in(3, std::vector<float>(n)), out(3, std::vector<float>(n, -1));
    for (uint32_t w = 0; w < 3; ++w) {
      for (size_t i = 0; i < n; ++i) in[w][i] = static_cast<float>((i % 97) + w * 3 + clock);
    }
    std::vector<std::thread> ts;
    std::vector<Status> res(3);
    for (uint32_t w = 0; w < 3; ++w) {
      ts.emplace_back([&, w] {
        auto op = job.workers[w]->start(Client::Kind::kPushPull, kKey, in[w].data(), out[w].data(),
                                        n, coll::DataType::kF32, 0);
        if (!op.ok()) {
          res[w] = op.status();
          return;
        }
        res[w] = (*op)->wait(sys::deadline_after_ms(kTimeoutMs), true);
        if (res[w].ok()) res[w] = job.workers[w]->clock();
      });
    }
    for (auto& t : ts) t.join();
    for (uint32_t w = 0; w < 3; ++w) ASSERT_TRUE(res[w].ok()) << res[w].message();
    for (uint32_t w = 0; w < 3; ++w) {
      for (size_t i = 0; i < n; ++i) {
        // bsp: all three pushes; sync:2 closes each unit at its first two pushes, so a unit's
        // sum is one of the three pairs (each unit on its own) or all three.
        const float all = in[0][i] + in[1][i] + in[2][i];
        if (mode == 0) {
          ASSERT_EQ(out[w][i], all) << "worker " << w << " clock " << clock << " i " << i;
        } else {
          const bool pair = out[w][i] == in[0][i] + in[1][i] || out[w][i] == in[0][i] + in[2][i] ||
                            out[w][i] == in[1][i] + in[2][i];
          ASSERT_TRUE(pair || out[w][i] == all)
              << "worker " << w << " clock " << clock << " i " << i << ": " << out[w][i];
        }
      }
    }
  }
  for (auto& w : job.workers) EXPECT_TRUE(w->close().ok());
}

TEST(KvStreamTest, BspPushPullInChunksIsTheExactSum) { run_streamed_sum(0, 0, ""); }

TEST(KvStreamTest, BspPushPullInChunksWithACodecIsTheExactSum) { run_streamed_sum(0, 0, "fp16"); }

TEST(KvStreamTest, SyncKClosesEachChunkAtKPushes) { run_streamed_sum(3, 2, ""); }

TEST(KvStreamTest, WorkersWithAnotherChunkAreRefusedNamingIt) {
  Job job;
  Status s = start_job(config(2, 0, 0, ""), 1, {1024, 2048}, &job);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("chunk_bytes"), std::string::npos) << s.message();
}

TEST(KvStreamTest, ChunkFromTheEnvironmentAndWholePartitions) {
  // GW_KV_CHUNK_BYTES resolves on the worker (chunk_bytes -1); at least the partition, or 0, is
  // whole partitions (chunk_bytes 0 in the store's config); below 64 bytes is refused naming it.
  ASSERT_EQ(setenv("GW_KV_CHUNK_BYTES", "512", 1), 0);
  {
    Job job;
    Status s = start_job(config(1, 0, 0, ""), 1, {-1}, &job);
    ASSERT_TRUE(s.ok()) << s.message();
    std::vector<float> v(1024, 1.0f);
    auto op = job.workers[0]->start(Client::Kind::kInit, kKey, v.data(), nullptr, v.size(),
                                    coll::DataType::kF32, 0);
    ASSERT_TRUE(op.ok());
    ASSERT_TRUE((*op)->wait(sys::deadline_after_ms(kTimeoutMs), false).ok());
    auto held = job.servers[0]->stores();
    ASSERT_EQ(held.size(), 1u);
    EXPECT_EQ(held[0].summary.config.chunk_bytes, 512u);
    EXPECT_EQ(held[0].summary.partitions, 8u);  // 4096 bytes in chunks of 512
  }
  for (int64_t whole : {int64_t{0}, int64_t{4096}, int64_t{1} << 20}) {
    Job job;
    Status s = start_job(config(1, 0, 0, ""), 1, {whole}, &job);
    ASSERT_TRUE(s.ok()) << s.message();
    std::vector<float> v(1024, 1.0f);
    auto op = job.workers[0]->start(Client::Kind::kInit, kKey, v.data(), nullptr, v.size(),
                                    coll::DataType::kF32, 0);
    ASSERT_TRUE(op.ok());
    ASSERT_TRUE((*op)->wait(sys::deadline_after_ms(kTimeoutMs), false).ok());
    auto held = job.servers[0]->stores();
    ASSERT_EQ(held.size(), 1u);
    EXPECT_EQ(held[0].summary.config.chunk_bytes, 0u) << whole;
    EXPECT_EQ(held[0].summary.partitions, 1u) << whole;
  }
  ASSERT_EQ(setenv("GW_KV_CHUNK_BYTES", "10", 1), 0);
  {
    Job job;
    Status s = start_job(config(1, 0, 0, ""), 1, {-1}, &job);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("GW_KV_CHUNK_BYTES"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("chunk_bytes 10"), std::string::npos) << s.message();
  }
  unsetenv("GW_KV_CHUNK_BYTES");
}

TEST(KvStreamTest, WireVersionOneIsRefusedAndTheHelloCarriesTheChunk) {
  Header h;
  h.type = Type::kReply;
  uint8_t b[kHeaderBytes];
  encode_header(h, b);
  uint32_t magic = 0;
  std::memcpy(&magic, b, 4);
  EXPECT_EQ(magic, kMagic);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(b), 4), "GWK2");
  std::memcpy(b, "GWK1", 4);  // a frame of a gradwire from before streamed partitions
  Header d;
  Status s = decode_header(b, &d);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("version 1"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("version 2"), std::string::npos) << s.message();

  StoreConfig c = config(4, 0, 0, "topk:0.5");
  c.chunk_bytes = 1 << 10;
  const auto hello = encode_hello(c, "secret");
  EXPECT_EQ(hello.size(), kHelloFixedBytes + c.codec.size() + 6);
  StoreConfig back;
  std::string tok;
  ASSERT_TRUE(decode_hello(hello.data(), hello.size(), &back, &tok).ok());
  EXPECT_EQ(back, c);
  EXPECT_EQ(tok, "secret");
  c.chunk_bytes = 63;
  EXPECT_FALSE(check_config(c).ok());
  c.chunk_bytes = kMaxPartitionBytes + 1;
  EXPECT_FALSE(check_config(c).ok());
}

}  // namespace
}  // namespace gw::kv
