// Codec spec strings: what parses, the canonical form, and that every bad spec is rejected with a
// message naming the offending part.
#include <gtest/gtest.h>

#include "collectives/compress/codec.h"

namespace gw::coll {
namespace {

TEST(CodecSpec, ParsesEveryCodec) {
  auto s = parse_codec_spec("topk:0.01");
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->kind, CodecKind::kTopK);
  EXPECT_DOUBLE_EQ(s->ratio, 0.01);
  EXPECT_TRUE(s->error_feedback);

  s = parse_codec_spec("sign");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->kind, CodecKind::kSign);
  EXPECT_EQ(s->chunk, 2048u);
  EXPECT_TRUE(s->error_feedback);

  s = parse_codec_spec("powersgd:4,ef=1");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->kind, CodecKind::kPowerSgd);
  EXPECT_EQ(s->rank, 4);
  EXPECT_TRUE(s->error_feedback);
  EXPECT_TRUE(s->warm_start);

  s = parse_codec_spec("none");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->kind, CodecKind::kNone);
  EXPECT_FALSE(s->error_feedback);

  s = parse_codec_spec("fp16");
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(s->error_feedback);  // a cast needs no residual unless asked
  s = parse_codec_spec("bf16,ef=1");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->kind, CodecKind::kBf16);
  EXPECT_TRUE(s->error_feedback);

  s = parse_codec_spec("randomk:0.5,seed=42,ef=0");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->seed, 42u);
  EXPECT_FALSE(s->error_feedback);

  s = parse_codec_spec("qsgd:16,bucket=128");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->levels, 16);
  EXPECT_EQ(s->bucket, 128u);

  s = parse_codec_spec("sign,chunk=64");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->chunk, 64u);

  s = parse_codec_spec("powersgd:2,cols=100,warm=0");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->cols, 100u);
  EXPECT_FALSE(s->warm_start);
}

TEST(CodecSpec, CanonicalFormRoundTrips) {
  for (const char* text : {"none", "fp16", "bf16,ef=1", "topk:0.01", "randomk:0.25,seed=9",
                           "sign,chunk=128", "qsgd:127", "powersgd:4,cols=33,warm=0",
                           "sign,nonfinite=keep", "topk:0.1,nonfinite=skip"}) {
    auto a = parse_codec_spec(text);
    ASSERT_TRUE(a.ok()) << text;
    const std::string canon = format_codec_spec(*a);
    auto b = parse_codec_spec(canon);
    ASSERT_TRUE(b.ok()) << canon << ": " << b.status().to_string();
    EXPECT_EQ(format_codec_spec(*b), canon);
    EXPECT_EQ(b->kind, a->kind);
    EXPECT_EQ(b->ratio, a->ratio);
    EXPECT_EQ(b->levels, a->levels);
    EXPECT_EQ(b->rank, a->rank);
    EXPECT_EQ(b->error_feedback, a->error_feedback);
    EXPECT_EQ(b->seed, a->seed);
    EXPECT_EQ(b->chunk, a->chunk);
    EXPECT_EQ(b->cols, a->cols);
    EXPECT_EQ(b->warm_start, a->warm_start);
    EXPECT_EQ(b->skip_nonfinite, a->skip_nonfinite);
  }
  EXPECT_TRUE(parse_codec_spec("sign")->skip_nonfinite);  // the safe default
  EXPECT_FALSE(parse_codec_spec("sign,nonfinite=keep")->skip_nonfinite);
}

struct Bad {
  const char* spec;
  const char* must_mention;
};

TEST(CodecSpec, RejectsBadSpecsWithAMessage) {
  const Bad bad[] = {
      {"", "empty"},
      {"zip", "unknown codec \"zip\""},
      {"topk", "ratio"},
      {"topk:", "ratio"},
      {"topk:0", "ratio"},
      {"topk:1.5", "ratio"},
      {"topk:-0.1", "ratio"},
      {"topk:abc", "ratio"},
      {"topk:0.01x", "ratio"},
      {"randomk:nan", "ratio"},
      {"qsgd", "LEVELS"},
      {"qsgd:0", "LEVELS"},
      {"qsgd:128", "LEVELS"},
      {"powersgd", "RANK"},
      {"powersgd:0", "RANK"},
      {"powersgd:65", "RANK"},
      {"sign:3", "takes no"},
      {"fp16:1", "takes no"},
      {"none,ef=1", "does not apply"},
      {"topk:0.1,chunk=64", "does not apply"},
      {"sign,chunk=100", "multiple of 64"},
      {"sign,chunk=0", "multiple of 64"},
      {"topk:0.1,ef=2", "0 or 1"},
      {"topk:0.1,ef", "key=value"},
      {"topk:0.1,=1", "key=value"},
      {"topk:0.1,", "empty option"},
      {"topk:0.1,ef=1,", "empty option"},
      {"topk:0.1,ef=1,ef=0", "given twice"},
      {"topk:0.1,colour=red", "unknown option"},
      {"randomk:0.1,seed=-1", "unsigned"},
      {"powersgd:2,cols=0", ">= 1"},
      {"qsgd:8,bucket=0", "1..1048576"},
      {"TOPK:0.1", "unknown codec"},
      {"sign,nonfinite=drop", "skip or keep"},
      {"none,nonfinite=skip", "does not apply"},
  };
  for (const auto& b : bad) {
    auto r = parse_codec_spec(b.spec);
    ASSERT_FALSE(r.ok()) << "accepted: \"" << b.spec << "\"";
    EXPECT_EQ(r.status().code(), Code::kInvalidArg) << b.spec;
    EXPECT_NE(r.status().message().find(b.must_mention), std::string::npos)
        << "spec \"" << b.spec << "\" gave: " << r.status().message();
  }
}

TEST(CodecSpec, SliceOptionOfTheHalfPrecisionCasts) {
  auto d = parse_codec_spec("fp16");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->slice, kDefaultCastSlice);
  EXPECT_EQ(format_codec_spec(*d), "fp16,ef=0");  // the default is not spelled out
  for (const char* text : {"fp16,slice=0", "bf16,ef=1,slice=4096", "fp16,slice=2147483648"}) {
    auto a = parse_codec_spec(text);
    ASSERT_TRUE(a.ok()) << text << ": " << a.status().to_string();
    auto b = parse_codec_spec(format_codec_spec(*a));
    ASSERT_TRUE(b.ok()) << format_codec_spec(*a);
    EXPECT_EQ(b->slice, a->slice) << text;
    EXPECT_NE(format_codec_spec(*a).find(",slice="), std::string::npos) << text;
  }
  EXPECT_EQ(parse_codec_spec("fp16,slice=0")->slice, 0u);
  for (const char* text : {"fp16,slice=4095", "bf16,slice=2147483649", "fp16,slice=-1",
                           "fp16,slice=1k", "fp16,slice="}) {
    auto r = parse_codec_spec(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find("4096..2147483648"), std::string::npos)
        << r.status().message();
  }
  for (const char* text : {"topk:0.1,slice=0", "sign,slice=4096", "none,slice=0"}) {
    auto r = parse_codec_spec(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find("does not apply"), std::string::npos)
        << r.status().message();
  }
}

TEST(CodecSpec, CreateRejectsSpecsWithoutAByteCodec) {
  CodecSpec none;
  EXPECT_EQ(Codec::create(none).status().code(), Code::kInvalidArg);
  auto p = parse_codec_spec("powersgd:2");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(Codec::create(*p).status().code(), Code::kInvalidArg);
  CodecSpec bad_ratio;
  bad_ratio.kind = CodecKind::kTopK;
  bad_ratio.ratio = 2;
  EXPECT_EQ(Codec::create(bad_ratio).status().code(), Code::kInvalidArg);
}

}  // namespace
}  // namespace gw::coll
