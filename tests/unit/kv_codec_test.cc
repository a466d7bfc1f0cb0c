// Compressed kv pushes (kv/push_codec.h): two workers (kv::Client) and two servers (kv::Server)
// in this process over loopback. Each clock's pulled value is exactly what the codec's own
// encode (with each worker's residual) and decode give, summed by hand; error feedback is shown
// (what arrived over the clocks plus the final residual is what was pushed), for float64, float16
// and bfloat16 keys too (converted at the worker, the conversions' losses fed back); bad codecs,
// dtypes and codec fields in frames are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "collectives/compress/codec.h"
#include "collectives/reduce.h"
#include "kv/client.h"
#include "kv/io.h"
#include "kv/push_codec.h"
#include "kv/server.h"
#include "kv/wire.h"

namespace gw::kv {
namespace {

constexpr int64_t kTimeoutMs = 20000;
constexpr uint64_t kKey = 7;

std::string canonical(const std::string& text) {
  auto spec = check_codec_spec(text);
  EXPECT_TRUE(spec.ok()) << spec.status().message();
  return coll::format_codec_spec(*spec);
}

StoreConfig config(const std::string& codec, uint64_t partition_bytes) {
  StoreConfig c;
  c.workers = 2;
  c.partition_bytes = partition_bytes;
  c.codec = codec.empty() ? "" : canonical(codec);
  return c;
}

struct Job {
  std::vector<std::unique_ptr<Server>> servers;
  std::vector<std::unique_ptr<Client>> workers;
};

void start_job(const StoreConfig& c, int nservers, Job* job) {
  ClientOptions co;
  for (int s = 0; s < nservers; ++s) {
    ServerOptions so;
    so.rank = s;
    so.token = "tok";
    so.timeout_ms = kTimeoutMs;
    so.route_host = "127.0.0.1";
    auto srv = Server::start(so);
    ASSERT_TRUE(srv.ok()) << srv.status().message();
    co.servers.push_back((*srv)->address());
    job->servers.push_back(std::move(*srv));
  }
  co.store_id = 1;
  co.config = c;
  co.token = "tok";
  co.timeout_ms = kTimeoutMs;
  for (uint32_t w = 0; w < c.workers; ++w) {
    co.rank = w;
    auto cl = Client::connect(co);
    ASSERT_TRUE(cl.ok()) << cl.status().message();
    job->workers.push_back(std::move(*cl));
  }
}

void wait_ok(Result<std::shared_ptr<Op>> op) {
  ASSERT_TRUE(op.ok()) << op.status().message();
  Status s = (*op)->wait(sys::Deadline::max(), true);
  ASSERT_TRUE(s.ok()) << s.message();
}

float pushed(uint32_t w, int clock, size_t i) {
  // Smooth values with a few large ones that move: topk's choice changes from clock to clock.
  const float base = std::sin(0.37f * static_cast<float>(i) + 1.3f * clock + w) * (1.0f + w);
  return (i * 7 + clock * 13 + w * 5) % 41 == 0 ? base * 9.0f : base + 1e-3f * i;
}

// N clocks of bsp push_pull by 2 workers of `count` elements; checks every pulled value against
// the codec applied by hand, the residuals and error feedback's sum. Returns whether the value
// differed at some clock from what the codec would give without the residual (the carry seen).
bool run_codec_case(const std::string& spec_text, size_t count, uint64_t partition_bytes,
                    int clocks) {
  const StoreConfig c = config(spec_text, partition_bytes);
  Job job;
  start_job(c, 2, &job);
  if (::testing::Test::HasFatalFailure()) return false;
  auto spec = check_codec_spec(c.codec);
  auto codec = coll::Codec::create(*spec);
  EXPECT_TRUE(codec.ok());
  const size_t per = partition_bytes / sizeof(float);
  const size_t parts = (count + per - 1) / per;

  std::vector<float> zero(count, 0.0f);
  for (auto& w : job.workers) {
    wait_ok(
        w->start(Client::Kind::kInit, kKey, zero.data(), nullptr, count, coll::DataType::kF32, 0));
  }
  // The hand computation: each worker's residuals, and per worker the sums of pushed and arrived.
  std::vector<std::vector<float>> residual(2, std::vector<float>(count, 0.0f));
  std::vector<std::vector<double>> sum_pushed(2, std::vector<double>(count, 0.0));
  std::vector<std::vector<double>> sum_arrived(2, std::vector<double>(count, 0.0));
  bool carry_seen = false;
  for (int clock = 0; clock < clocks; ++clock) {
    std::vector<std::vector<float>> v(2, std::vector<float>(count));
    std::vector<std::vector<float>> out(2, std::vector<float>(count, -1.0f));
    std::vector<float> want(count, 0.0f), want_no_ef(count, 0.0f);
    for (uint32_t w = 0; w < 2; ++w) {
      for (size_t i = 0; i < count; ++i) {
        v[w][i] = pushed(w, clock, i);
        sum_pushed[w][i] += v[w][i];
      }
      for (size_t p = 0; p < parts; ++p) {
        const size_t first = p * per, n = std::min(per, count - first);
        const auto ctx = push_context(kKey, static_cast<uint32_t>(p), clock, w);
        std::vector<uint8_t> enc((*codec)->encoded_size(n));
        float* res = (*codec)->spec().error_feedback ? residual[w].data() + first : nullptr;
        EXPECT_TRUE(
            (*codec)->encode(v[w].data() + first, res, n, enc.data(), enc.size(), ctx).ok());
        std::vector<float> dec(n);
        EXPECT_TRUE((*codec)->decode(enc.data(), enc.size(), n, dec.data(), ctx).ok());
        std::vector<uint8_t> enc0(enc.size());
        EXPECT_TRUE(
            (*codec)->encode(v[w].data() + first, nullptr, n, enc0.data(), enc0.size(), ctx).ok());
        std::vector<float> dec0(n);
        EXPECT_TRUE((*codec)->decode(enc0.data(), enc0.size(), n, dec0.data(), ctx).ok());
        for (size_t i = 0; i < n; ++i) {
          want[first + i] = w == 0 ? dec[i] : want[first + i] + dec[i];
          want_no_ef[first + i] = w == 0 ? dec0[i] : want_no_ef[first + i] + dec0[i];
          sum_arrived[w][first + i] += dec[i];
        }
      }
    }
    // Both push_pulls are queued before either waits: the pull waits for the other's push.
    auto a = job.workers[0]->start(Client::Kind::kPushPull, kKey, v[0].data(), out[0].data(), count,
                                   coll::DataType::kF32, 0);
    auto b = job.workers[1]->start(Client::Kind::kPushPull, kKey, v[1].data(), out[1].data(), count,
                                   coll::DataType::kF32, 0);
    wait_ok(a);
    wait_ok(b);
    for (uint32_t w = 0; w < 2; ++w) {
      for (size_t i = 0; i < count; ++i) {
        EXPECT_EQ(out[w][i], want[i])
            << spec_text << " clock " << clock << " worker " << w << " i " << i;
        if (::testing::Test::HasFailure()) return false;
      }
    }
    if (clock > 0 && std::memcmp(want.data(), want_no_ef.data(), count * 4) != 0) {
      carry_seen = true;
    }
    for (auto& w : job.workers) EXPECT_TRUE(w->clock().ok());
  }
  for (uint32_t w = 0; w < 2; ++w) {
    if (job.workers[w]->encoder() == nullptr) {
      ADD_FAILURE() << "a store with a codec has no encoder";
      return false;
    }
    for (size_t p = 0; p < parts; ++p) {
      const size_t first = p * per, n = std::min(per, count - first);
      std::vector<float> r = job.workers[w]->encoder()->residual(kKey, static_cast<uint32_t>(p));
      if (!(*codec)->spec().error_feedback) {
        EXPECT_TRUE(r.empty());
        continue;
      }
      EXPECT_EQ(r.size(), n);
      if (r.size() != n) continue;
      for (size_t i = 0; i < n; ++i) {
        // The worker's residual is the hand computation's, bit for bit ...
        EXPECT_EQ(r[i], residual[w][first + i]) << "worker " << w << " i " << first + i;
        // ... and error feedback loses nothing: arrived + residual = pushed.
        const double lhs = sum_arrived[w][first + i] + r[i];
        EXPECT_NEAR(lhs, sum_pushed[w][first + i], 1e-4 * (1 + std::fabs(sum_pushed[w][first + i])))
            << "worker " << w << " i " << first + i;
      }
    }
  }
  for (auto& w : job.workers) EXPECT_TRUE(w->close().ok());
  return carry_seen;
}

TEST(KvCodecTest, Fp16PushesAreTheirFp16RoundingExactly) {
  run_codec_case("fp16", 1000, 1024, 3);  // 4 partitions over 2 servers
}

TEST(KvCodecTest, TopkPushesAreTheDecodedSumsAndTheResidualCarries) {
  EXPECT_TRUE(run_codec_case("topk:0.05", 1000, 1024, 4))
      << "the residual never changed what arrived";
}

TEST(KvCodecTest, SignPushesWithErrorFeedback) {
  EXPECT_TRUE(run_codec_case("sign", 700, 1024, 3));
}

// One worker, bsp, sum: each clock's pulled value is exactly what that clock's push applied, in the
// key's dtype. Over the clocks, what arrived plus the worker's residual is what was pushed, to f32
// rounding, although the server rounds every decoded value into float16 or bfloat16 (a loss of up
// to 2^-11 or 2^-8 of each value per clock, which the worker's residual carries); float64 values
// arrive through f32.
template <typename T>
void run_dtype_case(coll::DataType dtype, const std::string& spec_text, T (*from)(double),
                    double (*to)(T)) {
  StoreConfig c = config(spec_text, 256);
  c.workers = 1;
  Job job;
  start_job(c, 1, &job);
  if (::testing::Test::HasFatalFailure()) return;
  Client& w = *job.workers[0];
  constexpr size_t kCount = 300;  // partitions of 128 (16-bit) or 32 (float64) elements
  std::vector<T> zero(kCount, from(0.0));
  wait_ok(w.start(Client::Kind::kInit, kKey, zero.data(), nullptr, kCount, dtype, 0));
  std::vector<double> sum_pushed(kCount, 0.0), sum_arrived(kCount, 0.0);
  for (int clock = 0; clock < 12; ++clock) {
    std::vector<T> v(kCount), out(kCount, from(-1.0));
    for (size_t i = 0; i < kCount; ++i) {
      v[i] = from(static_cast<double>(pushed(0, clock, i)) * 3.0 + 1e-9 * static_cast<double>(i));
      sum_pushed[i] += to(v[i]);
    }
    wait_ok(w.start(Client::Kind::kPushPull, kKey, v.data(), out.data(), kCount, dtype, 0));
    for (size_t i = 0; i < kCount; ++i) sum_arrived[i] += to(out[i]);
    ASSERT_TRUE(w.clock().ok());
  }
  const size_t per = 256 / coll::dtype_size(dtype);
  double worst = 0;
  for (size_t i = 0; i < kCount; ++i) {
    const std::vector<float> r = w.encoder()->residual(kKey, static_cast<uint32_t>(i / per));
    ASSERT_EQ(r.size(), std::min(per, kCount - i / per * per));
    const double err = std::fabs(sum_arrived[i] + r[i % per] - sum_pushed[i]);
    worst = std::max(worst, err);
    EXPECT_LT(err, 2e-4) << spec_text << " on " << coll::dtype_name(dtype) << " i " << i
                         << ": arrived " << sum_arrived[i] << " + residual " << r[i % per]
                         << ", pushed " << sum_pushed[i];
    if (::testing::Test::HasFailure()) break;
  }
  std::printf("%s on %s: |arrived + residual - pushed| <= %.3g over 12 clocks\n", spec_text.c_str(),
              std::string(coll::dtype_name(dtype)).c_str(), worst);
  EXPECT_TRUE(w.close().ok());
}

uint16_t f16_from(double x) { return coll::float_to_half(static_cast<float>(x)); }
double f16_to(uint16_t h) { return coll::half_to_float(h); }
uint16_t bf16_from(double x) { return coll::float_to_bf16(static_cast<float>(x)); }
double bf16_to(uint16_t h) { return coll::bf16_to_float(h); }
double f64_from(double x) { return x; }
double f64_to(double x) { return x; }

TEST(KvCodecTest, Float16KeysFeedTheServersRoundingBack) {
  run_dtype_case<uint16_t>(coll::DataType::kF16, "topk:0.3", f16_from, f16_to);
}

TEST(KvCodecTest, Bfloat16KeysFeedTheServersRoundingBack) {
  run_dtype_case<uint16_t>(coll::DataType::kBF16, "qsgd:8", bf16_from, bf16_to);
}

TEST(KvCodecTest, Float64KeysGoThroughF32) {
  run_dtype_case<double>(coll::DataType::kF64, "topk:0.3", f64_from, f64_to);
}

// A 16-bit key with the codec that matches it arrives exactly: fp16 of float16 values is lossless.
TEST(KvCodecTest, Fp16OfFloat16KeysIsExact) {
  StoreConfig c = config("fp16", 256);
  c.workers = 1;
  Job job;
  start_job(c, 2, &job);
  if (::testing::Test::HasFatalFailure()) return;
  Client& w = *job.workers[0];
  std::vector<uint16_t> v(500), out(500);
  for (size_t i = 0; i < v.size(); ++i) v[i] = coll::float_to_half(0.001f * i - 0.2f);
  wait_ok(w.start(Client::Kind::kInit, kKey, v.data(), nullptr, v.size(), coll::DataType::kF16, 0));
  wait_ok(w.start(Client::Kind::kPushPull, kKey, v.data(), out.data(), v.size(),
                  coll::DataType::kF16, 0));
  EXPECT_EQ(out, v);
  EXPECT_TRUE(w.close().ok());
}

TEST(KvCodecTest, BadCodecsAndDtypesAreRefused) {
  auto psgd = check_codec_spec("powersgd:4");
  ASSERT_FALSE(psgd.ok());
  EXPECT_NE(psgd.status().message().find("not a byte codec"), std::string::npos);
  EXPECT_FALSE(check_codec_spec("zstd").ok());
  EXPECT_FALSE(check_codec_spec("topk:2").ok());
  EXPECT_FALSE(check_codec_spec("none").ok());
  StoreConfig c = config("", 1024);
  c.codec = "topk:0.01";  // not canonical (",ef=1" missing): a Hello carries the canonical form
  EXPECT_FALSE(check_config(c).ok());
  c.codec = "powersgd:2";
  EXPECT_FALSE(check_config(c).ok());
  // A store with a codec takes floating keys only.
  Job job;
  start_job(config("fp16", 1024), 1, &job);
  std::vector<int32_t> ints(10, 1);
  auto r = job.workers[0]->start(Client::Kind::kInit, 1, ints.data(), nullptr, 10,
                                 coll::DataType::kI32, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArg);
  EXPECT_NE(r.status().message().find("floating values only"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("not int32"), std::string::npos) << r.status().message();
  for (auto& w : job.workers) EXPECT_TRUE(w->close().ok());
}

TEST(KvCodecTest, HelloRoundTripsTheCodec) {
  StoreConfig c = config("qsgd:8", 4096);
  auto bytes = encode_hello(c, "token");
  StoreConfig back;
  std::string token;
  ASSERT_TRUE(decode_hello(bytes.data(), bytes.size(), &back, &token).ok());
  EXPECT_EQ(back, c);
  EXPECT_EQ(token, "token");
  bytes[20] = 200;  // codec length beyond the limit
  EXPECT_FALSE(decode_hello(bytes.data(), bytes.size(), &back, &token).ok());
}

TEST(KvCodecTest, CodecFieldsAreChecked) {
  auto spec = check_codec_spec(canonical("topk:0.5"));
  auto codec = coll::Codec::create(*spec);
  ASSERT_TRUE(codec.ok());
  Header h;
  h.type = Type::kPush;
  h.dtype = static_cast<uint8_t>(coll::DataType::kF32);
  h.count = h.total = 16;
  h.flags = static_cast<uint16_t>(coll::CodecKind::kTopK);
  h.payload = static_cast<uint32_t>((*codec)->encoded_size(16));
  EXPECT_TRUE(check_request(h, 2, codec->get()).ok());
  EXPECT_FALSE(check_request(h, 2, nullptr).ok());  // encoded push, store without a codec
  Header bad = h;
  bad.flags = static_cast<uint16_t>(coll::CodecKind::kFp16);  // not the store's codec
  EXPECT_FALSE(check_request(bad, 2, codec->get()).ok());
  bad = h;
  bad.payload -= 4;
  EXPECT_FALSE(check_request(bad, 2, codec->get()).ok());
  for (auto dt : {coll::DataType::kF64, coll::DataType::kF16, coll::DataType::kBF16}) {
    bad = h;  // floating keys are encoded too (converted at the worker)
    bad.dtype = static_cast<uint8_t>(dt);
    EXPECT_TRUE(check_request(bad, 2, codec->get()).ok()) << coll::dtype_name(dt);
  }
  for (auto dt : {coll::DataType::kI32, coll::DataType::kI64, coll::DataType::kU8}) {
    bad = h;
    bad.dtype = static_cast<uint8_t>(dt);
    Status s = check_request(bad, 2, codec->get());
    EXPECT_EQ(s.code(), Code::kInvalidArg) << coll::dtype_name(dt);
  }
  bad = h;
  bad.flags = 0;  // a raw push to an encoded store
  bad.payload = 64;
  EXPECT_FALSE(check_request(bad, 2, codec->get()).ok());
  bad = h;
  bad.type = Type::kPull;
  bad.payload = 0;
  EXPECT_FALSE(check_request(bad, 2, codec->get()).ok());  // flags on a pull
  uint8_t raw[kHeaderBytes];
  bad = h;
  bad.flags = 7;  // powersgd: no codec of a frame
  encode_header(bad, raw);
  EXPECT_FALSE(decode_header(raw, &bad).ok());
  // A corrupt encoding (an index beyond the partition) is refused by the decode.
  std::vector<float> v(16, 1.0f);
  std::vector<uint8_t> enc(h.payload);
  ASSERT_TRUE((*codec)->encode(v.data(), nullptr, 16, enc.data(), enc.size(), {}).ok());
  const uint32_t far = 1000;
  std::memcpy(enc.data() + 8, &far, 4);
  std::vector<uint8_t> scratch;
  Header d = h;
  Status s = decode_push(**codec, &d, enc.data(), &scratch);
  EXPECT_EQ(s.code(), Code::kInvalidArg) << s.message();
}

// A server answers a frame with a corrupt codec field with an Error and closes the connection.
TEST(KvCodecTest, ServerRefusesAForeignCodecField) {
  ServerOptions so;
  so.token = "tok";
  so.timeout_ms = kTimeoutMs;
  so.route_host = "127.0.0.1";
  auto srv = Server::start(so);
  ASSERT_TRUE(srv.ok()) << srv.status().message();
  const sys::Deadline deadline = sys::deadline_after_ms(kTimeoutMs);
  auto fd = connect_to((*srv)->address(), deadline);
  ASSERT_TRUE(fd.ok());
  const StoreConfig c = config("fp16", 1024);
  const auto hello = encode_hello(c, "tok");
  Header h;
  h.type = Type::kHello;
  h.aux = 9;
  h.payload = static_cast<uint32_t>(hello.size());
  ASSERT_TRUE(write_frame(fd->get(), h, hello.data(), deadline).ok());
  Header r;
  ASSERT_TRUE(read_header(fd->get(), &r, deadline, nullptr).ok());
  ASSERT_EQ(r.type, Type::kReply);
  Header p;
  p.type = Type::kPush;
  p.dtype = static_cast<uint8_t>(coll::DataType::kF32);
  p.count = p.total = 8;
  p.req_id = 5;
  p.flags = static_cast<uint16_t>(coll::CodecKind::kTopK);  // the store's is fp16
  std::vector<uint8_t> body(16, 0);
  p.payload = static_cast<uint32_t>(body.size());
  ASSERT_TRUE(write_frame(fd->get(), p, body.data(), deadline).ok());
  ASSERT_TRUE(read_header(fd->get(), &r, deadline, nullptr).ok());
  EXPECT_EQ(r.type, Type::kError);
  std::string msg(r.payload, '\0');
  ASSERT_TRUE(read_exact(fd->get(), msg.data(), msg.size(), deadline, nullptr).ok());
  EXPECT_NE(msg.find("not the store's"), std::string::npos) << msg;
  char one;
  EXPECT_FALSE(read_exact(fd->get(), &one, 1, deadline, nullptr).ok());  // closed
  fd->reset();
  (*srv)->stop();
}

}  // namespace
}  // namespace gw::kv
