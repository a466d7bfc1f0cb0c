// CPU kernels of the codecs: casts, sign packing, top-k candidate scan, error-feedback updates.
//
// Each kernel has a portable version, an AVX2 (+F16C, FMA) version and for the hottest ones an
// AVX-512 (F, BW, DQ, VL) version, compiled with function target attributes; the dispatching
// entry points take the widest the CPU has (__builtin_cpu_supports, probed once) unless cap_isa
// narrowed it, so the build never assumes the CPU it runs on (no -march=native). Every path
// produces bit-identical results (tests compare them). Thread-safe, never block. QSGD's kernels
// are in qsgd_kernels.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace gw::coll::codec_kernels {

// "avx512", "avx2" or "portable": the path the dispatching entry points take now (the widest
// this CPU runs, unless cap_isa narrowed it).
std::string_view isa();
// Whether the AVX2 (+F16C, FMA) versions may run here, and the AVX-512 ones (which also need
// AVX2): what the CPU has, whatever the cap.
bool cpu_has_avx2();
bool cpu_has_avx512();
// The widest path the dispatching entry points may take, for measuring and testing one path
// through the whole codec (every path gives the same bits, so results do not change): kAvx512,
// the default, lets them take the widest the CPU runs. Process-wide, thread-safe (a relaxed
// atomic read once per dispatched call); a path the CPU lacks is never taken.
enum class IsaCap { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };
void cap_isa(IsaCap cap);
// Whether the dispatching entry points take the AVX2 / AVX-512 versions now (CPU and cap).
bool dispatch_avx2();
bool dispatch_avx512();

// v = in + residual (residual may be null); out = cast16(v) with round to nearest even; when
// residual is set it becomes v - widen(out). bf16 selects bfloat16, else IEEE half.
void encode_cast16(const float* in, float* residual, size_t n, uint16_t* out, bool bf16);
// acc[i] += widen(in[i]) (add) or acc[i] = widen(in[i]) (!add).
void decode_cast16(const uint16_t* in, size_t n, float* acc, bool bf16, bool add);

// One sign chunk of n <= 64*nwords elements: v = in + residual; scale = mean |v|;
// bit i of words = (v[i] < 0 or v[i] is -0); decode is -scale / +scale. residual (may be null)
// becomes v - decode. Unused bits are zero. Returns the scale.
float sign_encode_chunk(const float* in, float* residual, size_t n, uint64_t* words);
void sign_decode_add(const uint64_t* words, float scale, size_t n, float* acc);
// out[i] = decode (overwrites; out is never read).
void sign_decode_set(const uint64_t* words, float scale, size_t n, float* out);
// out[i] = ((+0 + decode_0) + decode_1) + ... over nsrc encodings of the same n elements (words[j]
// with scales[j]), summed in that order: the bits of a zero fill followed by sign_decode_add of
// each source in turn, in one pass that writes out once (the sign server's merge).
void sign_decode_sum(const uint64_t* const* words, const float* scales, size_t nsrc, size_t n,
                     float* out);

// Appends every i in [0, n) with |v[i]| >= threshold to out (offset added), increasing.
void collect_abs_ge(const float* v, size_t n, float threshold, uint32_t offset,
                    std::vector<uint32_t>* out);
// Top-k's one pass over the data: v = in + residual (residual may be null: v = in); residual,
// when set, becomes v (or 0 where v[i] is collected and |v[i]| >= take_threshold, when take is
// set: those candidates are taken out, and the caller puts back the ones it does not send and
// takes out the rest it sends); every i with |v[i]| >= threshold is appended to out (offset
// added), increasing, and v[i] to vals when vals is set. A NaN threshold collects nothing; the
// default take_threshold (0) takes every candidate.
void add_collect_abs_ge(const float* in, float* residual, size_t n, float threshold,
                        uint32_t offset, std::vector<uint32_t>* out, std::vector<float>* vals,
                        bool take = false, float take_threshold = 0.0f);
// Random-k's one pass: v = in + residual (residual may be null: v = in); the chosen elements are
// those whose bit is set in bits (bit i % 64 of word i / 64; with invert, those whose bit is
// clear); v[i] of every chosen i < n is written to out, increasing i, and residual (when set)
// becomes v with the chosen elements 0. Returns how many were written (out must hold them).
size_t gather_bits_take(const float* in, float* residual, size_t n, const uint64_t* bits,
                        bool invert, float* out);

// Top-k's selection steps over magnitude keys (topk_select.cc). select_compact: the keys of key[0,
// n) with key >> shift == want, in order, into sub (room for n); returns how many.
size_t select_compact(const uint32_t* key, size_t n, uint32_t shift, uint32_t want, uint32_t* sub);
// keep_best_scan: an in-place compaction of the candidates (idx, val, key: n of them) that keeps,
// in order, every one with key > t and the first `ties` with key == t; returns how many were kept.
// With restore, for every candidate whose (|val| >= take_t) differs from whether it is kept,
// restore[idx] = kept ? 0 : val (top-k's residual fix-up; take_t as in add_collect_abs_ge).
size_t keep_best_scan(uint32_t* idx, float* val, const uint32_t* key, size_t n, uint32_t t,
                      size_t ties, float* restore, float take_t);

// dst[i] += src[i].
void add_f32(const float* src, size_t n, float* dst);
// dst[i] = src[i], with streaming (non-temporal) stores where the CPU has them: dst's cache lines
// are written without being read first and do not evict the caller's working set. For output
// that is written once and not read again soon. Ordered before the function returns (sfence).
void store_stream_f32(const float* src, size_t n, float* dst);

// PowerSGD's row kernels: one row of a matrix (n elements) against r factor columns stored ld
// apart. The AVX2 versions use no FMA and keep the portable per-lane order, so both give the same
// bits (PowerSGD's result must be the same on every rank).
// out[j] = dot(row, q + j * ld) for j < r, summed in 8 lanes ((l0+l4)+(l1+l5))+((l2+l6)+(l3+l7))
// with the tail (n % 8 elements) added to lane 0.
void pq_row_dots(const float* row, const float* q, size_t ld, size_t r, size_t n, float* out);
// y[c] += a[j] * x[j * ld + c] for j = 0..r-1 in that order, c < n.
void pq_row_axpy_in(const float* a, const float* x, size_t ld, size_t r, size_t n, float* y);
// y[j * ld + c] += a[j] * x[c] for j < r, c < n.
void pq_row_axpy_out(const float* a, const float* x, size_t ld, size_t r, size_t n, float* y);

// The portable and AVX2 versions, exposed for tests: the same signatures as the entry points
// above (add_f32 has no AVX2 version: the compiler vectorises it). The avx2 ones must only be
// called when cpu_has_avx2(). Top-k's selection steps (select_compact, keep_best_scan) compact
// with a table-driven shuffle per 8 lanes on AVX2 (no compress instruction before AVX-512).
// gather_bits_take's scalar steps for elements [from, n), which every path's tail shares.
inline size_t gather_bits_tail(const float* in, float* residual, size_t from, size_t n,
                               const uint64_t* bits, bool invert, float* out) {
  size_t w = 0;
  for (size_t i = from; i < n; ++i) {
    const float v = residual ? in[i] + residual[i] : in[i];
    const bool chosen = (((bits[i / 64] >> (i % 64)) & 1u) != 0) != invert;
    if (chosen) out[w++] = v;
    if (residual) residual[i] = chosen ? 0.0f : v;
  }
  return w;
}

#define GW_CODEC_KERNEL_VARIANTS                                                                 \
  void encode_cast16(const float* in, float* residual, size_t n, uint16_t* out, bool bf16);      \
  void decode_cast16(const uint16_t* in, size_t n, float* acc, bool bf16, bool add);             \
  float sign_encode_chunk(const float* in, float* residual, size_t n, uint64_t* words);          \
  void sign_decode_add(const uint64_t* words, float scale, size_t n, float* acc);                \
  void sign_decode_set(const uint64_t* words, float scale, size_t n, float* out);                \
  void sign_decode_sum(const uint64_t* const* words, const float* scales, size_t nsrc, size_t n, \
                       float* out);                                                              \
  void collect_abs_ge(const float* v, size_t n, float threshold, uint32_t offset,                \
                      std::vector<uint32_t>* out);                                               \
  void add_collect_abs_ge(const float* in, float* residual, size_t n, float threshold,           \
                          uint32_t offset, std::vector<uint32_t>* out, std::vector<float>* vals, \
                          bool take = false, float take_threshold = 0.0f);                       \
  size_t gather_bits_take(const float* in, float* residual, size_t n, const uint64_t* bits,      \
                          bool invert, float* out);                                              \
  void store_stream_f32(const float* src, size_t n, float* dst);                                 \
  void pq_row_dots(const float* row, const float* q, size_t ld, size_t r, size_t n, float* out); \
  void pq_row_axpy_in(const float* a, const float* x, size_t ld, size_t r, size_t n, float* y);  \
  void pq_row_axpy_out(const float* a, const float* x, size_t ld, size_t r, size_t n, float* y); \
  size_t select_compact(const uint32_t* key, size_t n, uint32_t shift, uint32_t want,            \
                        uint32_t* sub);                                                          \
  size_t keep_best_scan(uint32_t* idx, float* val, const uint32_t* key, size_t n, uint32_t t,    \
                        size_t ties, float* restore, float take_t);
namespace portable {
GW_CODEC_KERNEL_VARIANTS
}  // namespace portable
namespace avx2 {
GW_CODEC_KERNEL_VARIANTS
}  // namespace avx2
#undef GW_CODEC_KERNEL_VARIANTS
// The AVX-512 versions of the hottest kernels (codec_kernels_avx512.cc); only when
// cpu_has_avx512().
namespace avx512 {
void encode_cast16(const float* in, float* residual, size_t n, uint16_t* out, bool bf16);
void decode_cast16(const uint16_t* in, size_t n, float* acc, bool bf16, bool add);
float sign_encode_chunk(const float* in, float* residual, size_t n, uint64_t* words);
void add_collect_abs_ge(const float* in, float* residual, size_t n, float threshold,
                        uint32_t offset, std::vector<uint32_t>* out, std::vector<float>* vals,
                        bool take = false, float take_threshold = 0.0f);
size_t gather_bits_take(const float* in, float* residual, size_t n, const uint64_t* bits,
                        bool invert, float* out);
size_t select_compact(const uint32_t* key, size_t n, uint32_t shift, uint32_t want, uint32_t* sub);
size_t keep_best_scan(uint32_t* idx, float* val, const uint32_t* key, size_t n, uint32_t t,
                      size_t ties, float* restore, float take_t);
}  // namespace avx512

}  // namespace gw::coll::codec_kernels
