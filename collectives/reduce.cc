#include "collectives/reduce.h"

#include <cpuid.h>
#include <immintrin.h>

#include <array>
#include <bit>
#include <cstring>
#include <type_traits>

namespace gw::coll {

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  const uint32_t m = h & 0x3FFu;
  if (e == 0) {
    // Zero or subnormal: m * 2^-24 is exact in f32.
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  if (e == 31) {
    // A NaN comes out quiet with its payload, as F16C's vcvtph2ps gives (the AVX2 paths use it).
    const uint32_t quiet = m != 0 ? 0x400000u : 0u;
    return std::bit_cast<float>(sign | 0x7F800000u | quiet | (m << 13));
  }
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
}

uint16_t float_to_half(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7FFFFFFFu;
  if (x >= 0x7F800000u) {  // inf or NaN; a NaN stays a (quiet) NaN
    return static_cast<uint16_t>(sign | 0x7C00u |
                                 (x > 0x7F800000u ? 0x200u | ((x >> 13) & 0x3FFu) : 0u));
  }
  if (x >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to inf
  if (x < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    if (x <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25 rounds (to even) to 0
    const uint32_t e = x >> 23;
    const uint32_t m = (x & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126u - e;
    uint32_t hm = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (hm & 1u))) ++hm;
    return static_cast<uint16_t>(sign | hm);
  }
  uint32_t r = x - 0x38000000u;  // rebias 127 -> 15
  r += 0xFFFu + ((r >> 13) & 1u);
  return static_cast<uint16_t>(sign | (r >> 13));
}

float bf16_to_float(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

uint16_t float_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

namespace {

#define GW_ALWAYS_INLINE inline __attribute__((always_inline))

// Integer sum/prod go through the unsigned type so overflow wraps instead of being UB.
template <typename T>
struct WideOf {
  using type = T;
};
template <typename T>
requires std::is_integral_v<T>
struct WideOf<T> {
  using type = std::make_unsigned_t<T>;
};
template <typename T>
using Wide = typename WideOf<T>::type;

struct SumOp {
  template <typename T>
  static GW_ALWAYS_INLINE T apply(T a, T b) {
    return static_cast<T>(static_cast<Wide<T>>(a) + static_cast<Wide<T>>(b));
  }
};
struct ProdOp {
  template <typename T>
  static GW_ALWAYS_INLINE T apply(T a, T b) {
    if constexpr (std::is_integral_v<T> && sizeof(T) < sizeof(unsigned)) {
      return static_cast<T>(static_cast<unsigned>(a) * static_cast<unsigned>(b));
    } else {
      return static_cast<T>(static_cast<Wide<T>>(a) * static_cast<Wide<T>>(b));
    }
  }
};
// a != a is the NaN test: a NaN on either side wins.
struct MinOp {
  template <typename T>
  static GW_ALWAYS_INLINE T apply(T a, T b) {
    return (a != a || a < b) ? a : b;  // NOLINT(misc-redundant-expression)
  }
};
struct MaxOp {
  template <typename T>
  static GW_ALWAYS_INLINE T apply(T a, T b) {
    return (a != a || a > b) ? a : b;  // NOLINT(misc-redundant-expression)
  }
};

struct F16Tag {};
struct BF16Tag {};

template <typename Op>
GW_ALWAYS_INLINE uint16_t op16(uint16_t a, uint16_t b, F16Tag) {
  return float_to_half(Op::apply(half_to_float(a), half_to_float(b)));
}
template <typename Op>
GW_ALWAYS_INLINE uint16_t op16(uint16_t a, uint16_t b, BF16Tag) {
  return float_to_bf16(Op::apply(bf16_to_float(a), bf16_to_float(b)));
}

// Three loops so every pointer can be __restrict (unconditional vectorisation): distinct
// buffers, out == a, out == b.
template <typename T, typename Op>
GW_ALWAYS_INLINE void loop_distinct(const T* __restrict a, const T* __restrict b, T* __restrict out,
                                    size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Op::apply(a[i], b[i]);
}
template <typename T, typename Op>
GW_ALWAYS_INLINE void loop_out_is_a(T* __restrict a, const T* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] = Op::apply(a[i], b[i]);
}
template <typename T, typename Op>
GW_ALWAYS_INLINE void loop_out_is_b(const T* __restrict a, T* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) b[i] = Op::apply(a[i], b[i]);
}

template <typename T, typename Op>
GW_ALWAYS_INLINE void run_loops(const void* a, const void* b, void* out, size_t n) {
  const T* pa = static_cast<const T*>(a);
  const T* pb = static_cast<const T*>(b);
  T* po = static_cast<T*>(out);
  if (po == pa && po == pb) {
    for (size_t i = 0; i < n; ++i) po[i] = Op::apply(po[i], po[i]);
  } else if (po == pa) {
    loop_out_is_a<T, Op>(po, pb, n);
  } else if (po == pb) {
    loop_out_is_b<T, Op>(pa, po, n);
  } else {
    loop_distinct<T, Op>(pa, pb, po, n);
  }
}

template <typename Op, typename Tag>
GW_ALWAYS_INLINE void run_loops16(const void* a, const void* b, void* out, size_t n) {
  const uint16_t* pa = static_cast<const uint16_t*>(a);
  const uint16_t* pb = static_cast<const uint16_t*>(b);
  uint16_t* po = static_cast<uint16_t*>(out);
  // Element i is read before it is written, so exact aliasing is safe.
  for (size_t i = 0; i < n; ++i) po[i] = op16<Op>(pa[i], pb[i], Tag{});
}

using KernelFn = void (*)(const void*, const void*, void*, size_t);

template <typename T, typename Op>
void portable_kernel(const void* a, const void* b, void* out, size_t n) {
  run_loops<T, Op>(a, b, out, n);
}
template <typename Op, typename Tag>
void portable_kernel16(const void* a, const void* b, void* out, size_t n) {
  run_loops16<Op, Tag>(a, b, out, n);
}

// ---- AVX2 + F16C + FMA ------------------------------------------------------------------------

template <typename T, typename Op>
__attribute__((target("avx2,f16c,fma"))) void avx2_kernel(const void* a, const void* b, void* out,
                                                          size_t n) {
  run_loops<T, Op>(a, b, out, n);
}

template <typename Op>
__attribute__((target("avx2,f16c,fma"))) GW_ALWAYS_INLINE __m256 vop(__m256 a, __m256 b) {
  if constexpr (std::is_same_v<Op, SumOp>) {
    return _mm256_add_ps(a, b);
  } else if constexpr (std::is_same_v<Op, ProdOp>) {
    return _mm256_mul_ps(a, b);
  } else {
    // minps/maxps return b when either is NaN; then take a where a is NaN: same as MinOp/MaxOp.
    __m256 r = std::is_same_v<Op, MinOp> ? _mm256_min_ps(a, b) : _mm256_max_ps(a, b);
    return _mm256_blendv_ps(r, a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
}

template <typename Op>
__attribute__((target("avx2,f16c,fma"))) void avx2_kernel_f16(const void* a, const void* b,
                                                              void* out, size_t n) {
  const uint16_t* pa = static_cast<const uint16_t*>(a);
  const uint16_t* pb = static_cast<const uint16_t*>(b);
  uint16_t* po = static_cast<uint16_t*>(out);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 va = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pa + i)));
    __m256 vb = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pb + i)));
    __m128i r = _mm256_cvtps_ph(vop<Op>(va, vb), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(po + i), r);
  }
  run_loops16<Op, F16Tag>(pa + i, pb + i, po + i, n - i);
}

__attribute__((target("avx2,f16c,fma"))) GW_ALWAYS_INLINE __m256 load_bf16(const uint16_t* p) {
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

__attribute__((target("avx2,f16c,fma"))) GW_ALWAYS_INLINE void store_bf16(uint16_t* p, __m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
  rounded = _mm256_srli_epi32(rounded, 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, is_nan);
  const __m128i packed =
      _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}

template <typename Op>
__attribute__((target("avx2,f16c,fma"))) void avx2_kernel_bf16(const void* a, const void* b,
                                                               void* out, size_t n) {
  const uint16_t* pa = static_cast<const uint16_t*>(a);
  const uint16_t* pb = static_cast<const uint16_t*>(b);
  uint16_t* po = static_cast<uint16_t*>(out);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) store_bf16(po + i, vop<Op>(load_bf16(pa + i), load_bf16(pb + i)));
  run_loops16<Op, BF16Tag>(pa + i, pb + i, po + i, n - i);
}

// ---- dispatch tables --------------------------------------------------------------------------

constexpr int kTableOps = 4;  // sum, prod, min, max (avg reduces as sum)
using Table = std::array<std::array<KernelFn, kTableOps>, kNumDataTypes>;

template <typename T, bool kAvx2>
constexpr std::array<KernelFn, kTableOps> typed_row() {
  if constexpr (kAvx2) {
    return {&avx2_kernel<T, SumOp>, &avx2_kernel<T, ProdOp>, &avx2_kernel<T, MinOp>,
            &avx2_kernel<T, MaxOp>};
  } else {
    return {&portable_kernel<T, SumOp>, &portable_kernel<T, ProdOp>, &portable_kernel<T, MinOp>,
            &portable_kernel<T, MaxOp>};
  }
}

Table make_table(bool avx2) {
  Table t{};
  const int f32 = static_cast<int>(DataType::kF32), f64 = static_cast<int>(DataType::kF64);
  const int f16 = static_cast<int>(DataType::kF16), bf16 = static_cast<int>(DataType::kBF16);
  const int i32 = static_cast<int>(DataType::kI32), i64 = static_cast<int>(DataType::kI64);
  const int u8 = static_cast<int>(DataType::kU8);
  if (avx2) {
    t[f32] = typed_row<float, true>();
    t[f64] = typed_row<double, true>();
    t[i32] = typed_row<int32_t, true>();
    t[i64] = typed_row<int64_t, true>();
    t[u8] = typed_row<uint8_t, true>();
    t[f16] = {&avx2_kernel_f16<SumOp>, &avx2_kernel_f16<ProdOp>, &avx2_kernel_f16<MinOp>,
              &avx2_kernel_f16<MaxOp>};
    t[bf16] = {&avx2_kernel_bf16<SumOp>, &avx2_kernel_bf16<ProdOp>, &avx2_kernel_bf16<MinOp>,
               &avx2_kernel_bf16<MaxOp>};
  } else {
    t[f32] = typed_row<float, false>();
    t[f64] = typed_row<double, false>();
    t[i32] = typed_row<int32_t, false>();
    t[i64] = typed_row<int64_t, false>();
    t[u8] = typed_row<uint8_t, false>();
    t[f16] = {&portable_kernel16<SumOp, F16Tag>, &portable_kernel16<ProdOp, F16Tag>,
              &portable_kernel16<MinOp, F16Tag>, &portable_kernel16<MaxOp, F16Tag>};
    t[bf16] = {&portable_kernel16<SumOp, BF16Tag>, &portable_kernel16<ProdOp, BF16Tag>,
               &portable_kernel16<MinOp, BF16Tag>, &portable_kernel16<MaxOp, BF16Tag>};
  }
  return t;
}

// F16C through cpuid: clang 14 (the fuzz preset's compiler) has no __builtin_cpu_supports("f16c").
bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && cpu_has_f16c() && __builtin_cpu_supports("fma");
}

// Chosen once (thread-safe static initialisation), immutable afterwards.
const Table& dispatched_table() {
  static const Table table = make_table(cpu_has_avx2());
  return table;
}
const Table& portable_table() {
  static const Table table = make_table(false);
  return table;
}

int op_index(ReduceOp op) { return op == ReduceOp::kAvg ? 0 : static_cast<int>(op); }

template <typename T>
void divide_loop(T* p, size_t n, int nranks) {
  if constexpr (std::is_floating_point_v<T>) {
    const T d = static_cast<T>(nranks);
    for (size_t i = 0; i < n; ++i) p[i] = p[i] / d;
  } else {
    const T d = static_cast<T>(nranks);
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] / d);
  }
}

}  // namespace

void reduce(DataType dtype, ReduceOp op, const void* a, const void* b, void* out, size_t count) {
  if (count == 0) return;
  dispatched_table()[static_cast<int>(dtype)][op_index(op)](a, b, out, count);
}

void reduce_portable(DataType dtype, ReduceOp op, const void* a, const void* b, void* out,
                     size_t count) {
  if (count == 0) return;
  portable_table()[static_cast<int>(dtype)][op_index(op)](a, b, out, count);
}

std::string_view reduce_isa() { return cpu_has_avx2() ? "avx2" : "portable"; }

void finalize_avg(DataType dtype, void* buf, size_t count, int nranks) {
  if (nranks <= 1 || count == 0) return;
  switch (dtype) {
    case DataType::kF32:
      divide_loop(static_cast<float*>(buf), count, nranks);
      break;
    case DataType::kF64:
      divide_loop(static_cast<double*>(buf), count, nranks);
      break;
    case DataType::kI32:
      divide_loop(static_cast<int32_t*>(buf), count, nranks);
      break;
    case DataType::kI64:
      divide_loop(static_cast<int64_t*>(buf), count, nranks);
      break;
    case DataType::kU8:
      divide_loop(static_cast<uint8_t*>(buf), count, nranks);
      break;
    case DataType::kF16: {
      uint16_t* p = static_cast<uint16_t*>(buf);
      const float d = static_cast<float>(nranks);
      for (size_t i = 0; i < count; ++i) p[i] = float_to_half(half_to_float(p[i]) / d);
      break;
    }
    case DataType::kBF16: {
      uint16_t* p = static_cast<uint16_t*>(buf);
      const float d = static_cast<float>(nranks);
      for (size_t i = 0; i < count; ++i) p[i] = float_to_bf16(bf16_to_float(p[i]) / d);
      break;
    }
  }
}

}  // namespace gw::coll
