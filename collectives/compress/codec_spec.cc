// Codec spec strings: parse_codec_spec, format_codec_spec, and the names (codec.h).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>

#include "collectives/compress/codec.h"
#include "collectives/compress/codecs/codecs.h"

namespace gw::coll {

namespace {

struct NameKind {
  std::string_view name;
  CodecKind kind;
};
constexpr NameKind kNames[] = {
    {"none", CodecKind::kNone}, {"fp16", CodecKind::kFp16},         {"bf16", CodecKind::kBf16},
    {"topk", CodecKind::kTopK}, {"randomk", CodecKind::kRandomK},   {"sign", CodecKind::kSign},
    {"qsgd", CodecKind::kQsgd}, {"powersgd", CodecKind::kPowerSgd},
};

template <typename T>
bool parse_number(std::string_view s, T* out) {
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, *out);
  return ec == std::errc() && ptr == end;
}

bool parse_bool01(std::string_view s, bool* out) {
  if (s == "1")
    *out = true;
  else if (s == "0")
    *out = false;
  else
    return false;
  return true;
}

}  // namespace

std::string_view codec_name(CodecKind kind) {
  for (const auto& n : kNames) {
    if (n.kind == kind) return n.name;
  }
  return "?";
}

Result<CodecSpec> parse_codec_spec(std::string_view text) {
  if (text.empty()) return invalid_arg("codec spec is empty (use \"none\" for no compression)");
  CodecSpec spec;
  std::string_view head = text.substr(0, text.find(','));
  std::string_view rest = head.size() < text.size() ? text.substr(head.size() + 1) : "";
  if (head.size() < text.size() && rest.empty()) {
    return invalid_arg("codec spec \"{}\": empty option after ','", text);
  }
  const size_t colon = head.find(':');
  const std::string_view name = head.substr(0, colon);
  const bool has_arg = colon != std::string_view::npos;
  const std::string_view arg = has_arg ? head.substr(colon + 1) : std::string_view();
  bool known = false;
  for (const auto& n : kNames) {
    if (n.name == name) {
      spec.kind = n.kind;
      known = true;
    }
  }
  if (!known) {
    return invalid_arg(
        "codec spec \"{}\": unknown codec \"{}\" (expected none, fp16, bf16, topk:RATIO, "
        "randomk:RATIO, sign, qsgd:LEVELS, powersgd:RANK)",
        text, name);
  }
  switch (spec.kind) {
    case CodecKind::kNone:
    case CodecKind::kFp16:
    case CodecKind::kBf16:
    case CodecKind::kSign:
      if (has_arg) return invalid_arg("codec spec \"{}\": {} takes no ':' argument", text, name);
      break;
    case CodecKind::kTopK:
    case CodecKind::kRandomK:
      if (!parse_number(arg, &spec.ratio) || !(spec.ratio > 0.0 && spec.ratio <= 1.0)) {
        return invalid_arg("codec spec \"{}\": {} needs a ratio in (0, 1], e.g. {}:0.01", text,
                           name, name);
      }
      break;
    case CodecKind::kQsgd:
      if (!parse_number(arg, &spec.levels) || spec.levels < 1 || spec.levels > 127) {
        return invalid_arg("codec spec \"{}\": qsgd needs LEVELS in 1..127, e.g. qsgd:16", text);
      }
      break;
    case CodecKind::kPowerSgd:
      if (!parse_number(arg, &spec.rank) || spec.rank < 1 || spec.rank > 64) {
        return invalid_arg("codec spec \"{}\": powersgd needs RANK in 1..64, e.g. powersgd:4",
                           text);
      }
      break;
  }
  spec.error_feedback = spec.kind != CodecKind::kNone && spec.kind != CodecKind::kFp16 &&
                        spec.kind != CodecKind::kBf16;

  std::vector<std::string_view> seen;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view opt = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (comma != std::string_view::npos && rest.empty()) {
      return invalid_arg("codec spec \"{}\": empty option after ','", text);
    }
    const size_t eq = opt.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      return invalid_arg("codec spec \"{}\": option \"{}\" is not key=value", text, opt);
    }
    const std::string_view key = opt.substr(0, eq);
    const std::string_view value = opt.substr(eq + 1);
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
      return invalid_arg("codec spec \"{}\": option \"{}\" given twice", text, key);
    }
    seen.push_back(key);
    auto bad = [&](std::string_view what) {
      return invalid_arg("codec spec \"{}\": option {}={} {}", text, key, value, what);
    };
    auto not_for = [&]() {
      return invalid_arg("codec spec \"{}\": option \"{}\" does not apply to {}", text, key, name);
    };
    if (key == "ef") {
      if (spec.kind == CodecKind::kNone) return not_for();
      if (!parse_bool01(value, &spec.error_feedback)) return bad("must be 0 or 1");
    } else if (key == "seed") {
      if (spec.kind != CodecKind::kRandomK && spec.kind != CodecKind::kQsgd) return not_for();
      if (!parse_number(value, &spec.seed)) return bad("must be an unsigned integer");
    } else if (key == "chunk") {
      if (spec.kind != CodecKind::kSign) return not_for();
      if (!parse_number(value, &spec.chunk) || spec.chunk == 0 || spec.chunk % 64 != 0 ||
          spec.chunk > kMaxChunk) {
        return bad("must be a multiple of 64 in 64..1048576");
      }
    } else if (key == "bucket") {
      if (spec.kind != CodecKind::kQsgd) return not_for();
      if (!parse_number(value, &spec.bucket) || spec.bucket == 0 || spec.bucket > kMaxChunk) {
        return bad("must be in 1..1048576");
      }
    } else if (key == "cols") {
      if (spec.kind != CodecKind::kPowerSgd) return not_for();
      if (!parse_number(value, &spec.cols) || spec.cols == 0) return bad("must be >= 1");
    } else if (key == "slice") {
      if (spec.kind != CodecKind::kFp16 && spec.kind != CodecKind::kBf16) return not_for();
      if (!parse_number(value, &spec.slice) ||
          (spec.slice != 0 && (spec.slice < 4096 || spec.slice > (size_t{1} << 31)))) {
        return bad("must be 0 (no slicing) or 4096..2147483648 elements");
      }
    } else if (key == "nonfinite") {
      if (spec.kind == CodecKind::kNone) return not_for();
      if (value == "skip") {
        spec.skip_nonfinite = true;
      } else if (value == "keep") {
        spec.skip_nonfinite = false;
      } else {
        return bad("must be skip or keep");
      }
    } else if (key == "warm") {
      if (spec.kind != CodecKind::kPowerSgd) return not_for();
      if (!parse_bool01(value, &spec.warm_start)) return bad("must be 0 or 1");
    } else {
      return invalid_arg(
          "codec spec \"{}\": unknown option \"{}\" (known: ef, seed, chunk, bucket, cols, warm, "
          "slice, nonfinite)",
          text, key);
    }
  }
  return spec;
}

std::string format_codec_spec(const CodecSpec& spec) {
  std::string out(codec_name(spec.kind));
  switch (spec.kind) {
    case CodecKind::kTopK:
    case CodecKind::kRandomK:
      out += fmt::format(":{}", spec.ratio);
      break;
    case CodecKind::kQsgd:
      out += fmt::format(":{}", spec.levels);
      break;
    case CodecKind::kPowerSgd:
      out += fmt::format(":{}", spec.rank);
      break;
    default:
      break;
  }
  if (spec.kind == CodecKind::kNone) return out;
  out += fmt::format(",ef={}", spec.error_feedback ? 1 : 0);
  if (spec.kind == CodecKind::kRandomK || spec.kind == CodecKind::kQsgd) {
    out += fmt::format(",seed={}", spec.seed);
  }
  if ((spec.kind == CodecKind::kFp16 || spec.kind == CodecKind::kBf16) &&
      spec.slice != kDefaultCastSlice) {
    out += fmt::format(",slice={}", spec.slice);
  }
  if (spec.kind == CodecKind::kSign) out += fmt::format(",chunk={}", spec.chunk);
  if (spec.kind == CodecKind::kQsgd) out += fmt::format(",bucket={}", spec.bucket);
  if (spec.kind == CodecKind::kPowerSgd) {
    if (spec.cols) out += fmt::format(",cols={}", spec.cols);
    out += fmt::format(",warm={}", spec.warm_start ? 1 : 0);
  }
  if (!spec.skip_nonfinite) out += ",nonfinite=keep";
  return out;
}

uint64_t fnv1a64(std::string_view text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace gw::coll
