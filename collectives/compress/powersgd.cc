#include "collectives/compress/powersgd.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "collectives/compress/codec_kernels.h"
#include "collectives/compress/compress.h"
#include "collectives/compress/tensor_state.h"

namespace gw::coll {

namespace ck = codec_kernels;

// ------------------------------------------------------------------------------------------
// The protocol.

namespace {

// Deterministic pseudo-random column vectors (same on every rank for the same key).
void seed_columns(uint64_t key_hash, size_t first, size_t ncols, size_t len, float* q) {
  for (size_t j = first; j < first + ncols; ++j) {
    uint64_t s = key_hash ^ (0x5851f42d4c957f2dull * (j + 1));
    for (size_t i = 0; i < len; ++i) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      q[j * len + i] = static_cast<float>(static_cast<int64_t>(s >> 40) - (1 << 23)) *
                       (1.0f / static_cast<float>(1 << 23));
    }
  }
}

}  // namespace

Status Compressor::run_low_rank(Communicator& net, TensorState& t, float* x) {
  const size_t n = t.count;
  const int p = net.size();
  const MatrixShape shape = powersgd_shape(n, t.spec.cols);
  const size_t r = std::min({static_cast<size_t>(t.spec.rank), shape.rows, shape.cols});
  // With error feedback M = x + residual, formed in the residual by the first pass (fused with
  // P = M Q); without, M is x itself.
  float* res = t.residual.empty() ? nullptr : t.residual.data();
  float* m = res ? res : x;
  if (t.q.size() != shape.cols * r || !t.spec.warm_start) {
    t.q.resize(shape.cols * r);
    seed_columns(t.key_hash, 0, r, shape.cols, t.q.data());
  } else {
    // A column that collapsed to zero would stay zero under warm start: reseed it.
    for (size_t j = 0; j < r; ++j) {
      const float* col = t.q.data() + j * shape.cols;
      if (std::all_of(col, col + shape.cols, [](float v) { return v == 0.0f; })) {
        seed_columns(t.key_hash + t.step, j, 1, shape.cols, t.q.data());
      }
    }
  }
  std::vector<float> pm(shape.rows * r);
  add_matmul_mq(res ? x : nullptr, m, n, shape, t.q.data(), r, pm.data());
  phases_.mark(PhaseTimes::kEncode);
  GW_RETURN_IF_ERROR(net.allreduce(pm.data(), pm.data(), pm.size(), DataType::kF32, ReduceOp::kSum)
                         .with_context("powersgd P"));
  count_sent(allreduce_send_bytes(pm.size() * 4, p));
  phases_.mark(PhaseTimes::kExchange);
  orthogonalize(pm.data(), shape.rows, r);
  matmul_mtp(m, n, shape, pm.data(), r, t.q.data());
  std::vector<float> q_local;
  if (res) q_local = t.q;  // the residual subtracts this rank's own P Q^T
  phases_.mark(PhaseTimes::kEncode);
  GW_RETURN_IF_ERROR(
      net.allreduce(t.q.data(), t.q.data(), t.q.size(), DataType::kF32, ReduceOp::kSum)
          .with_context("powersgd Q"));
  count_sent(allreduce_send_bytes(t.q.size() * 4, p));
  phases_.mark(PhaseTimes::kExchange);
  // One pass: residual = M - P Q_local^T, x = P Q^T (M is no longer needed when res is null).
  residual_and_decode_pq(pm.data(), q_local.data(), t.q.data(), shape, r, n, res, x);
  return ok_status();
}

// ------------------------------------------------------------------------------------------
// The linear algebra.

MatrixShape powersgd_shape(size_t count, size_t cols_hint) {
  MatrixShape s;
  if (count == 0) return s;
  s.cols = cols_hint ? std::min(cols_hint, count)
                     : static_cast<size_t>(std::ceil(std::sqrt(static_cast<double>(count))));
  s.rows = (count + s.cols - 1) / s.cols;
  return s;
}

// Row by row, each row (cols floats) read once and kept in L1 while all r factor columns pass
// over it (codec_kernels::pq_row_*: vectorised, the same bits on every path).

void matmul_mq(const float* m, size_t count, MatrixShape shape, const float* q, size_t r,
               float* out) {
  std::vector<float> dots(r);
  for (size_t i = 0; i < shape.rows; ++i) {
    const size_t off = i * shape.cols;
    ck::pq_row_dots(m + off, q, shape.cols, r, std::min(shape.cols, count - off), dots.data());
    for (size_t j = 0; j < r; ++j) out[j * shape.rows + i] = dots[j];
  }
}

void matmul_mtp(const float* m, size_t count, MatrixShape shape, const float* p, size_t r,
                float* out) {
  std::fill(out, out + shape.cols * r, 0.0f);
  std::vector<float> a(r);
  for (size_t i = 0; i < shape.rows; ++i) {
    const size_t off = i * shape.cols;
    const size_t n = std::min(shape.cols, count - off);
    for (size_t j = 0; j < r; ++j) a[j] = p[j * shape.rows + i];
    ck::pq_row_axpy_out(a.data(), m + off, shape.cols, r, n, out);
  }
}

// Modified Gram-Schmidt, twice ("twice is enough": the second pass removes what round-off left of
// the earlier directions). A column whose remainder is at the level of float round-off of its
// original length lies in the span of the earlier ones; normalising it would turn round-off into
// a basis vector that is not orthogonal to the rest, so it becomes zero instead (rank-deficient
// gradients compressed at a high rank hit this on every step).
void orthogonalize(float* a, size_t rows, size_t r) {
  // Squared-length threshold: (64 float epsilons * sqrt(rows))^2 of the original.
  const double eps = 64.0 * std::numeric_limits<float>::epsilon();
  const double keep = eps * eps * static_cast<double>(std::max<size_t>(rows, 1));
  for (size_t j = 0; j < r; ++j) {
    float* aj = a + j * rows;
    double orig = 0;
    for (size_t i = 0; i < rows; ++i) orig += static_cast<double>(aj[i]) * aj[i];
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t l = 0; l < j; ++l) {
        const float* al = a + l * rows;
        double d = 0;
        for (size_t i = 0; i < rows; ++i) d += static_cast<double>(al[i]) * aj[i];
        if (d == 0) continue;  // also skips the zeroed columns
        for (size_t i = 0; i < rows; ++i) {
          aj[i] = static_cast<float>(aj[i] - d * static_cast<double>(al[i]));
        }
      }
    }
    double nn = 0;
    for (size_t i = 0; i < rows; ++i) nn += static_cast<double>(aj[i]) * aj[i];
    if (!(orig > 0) || !(nn > keep * orig) || !std::isfinite(nn)) {
      std::fill(aj, aj + rows, 0.0f);
      continue;
    }
    const float inv = static_cast<float>(1.0 / std::sqrt(nn));
    for (size_t i = 0; i < rows; ++i) aj[i] *= inv;
  }
}

void add_matmul_mq(const float* x, float* m, size_t count, MatrixShape shape, const float* q,
                   size_t r, float* out) {
  std::vector<float> dots(r);
  for (size_t i = 0; i < shape.rows; ++i) {
    const size_t off = i * shape.cols;
    const size_t n = std::min(shape.cols, count - off);
    if (x) ck::add_f32(x + off, n, m + off);  // the row stays in L1 for the dots below
    ck::pq_row_dots(m + off, q, shape.cols, r, n, dots.data());
    for (size_t j = 0; j < r; ++j) out[j * shape.rows + i] = dots[j];
  }
}

void residual_and_decode_pq(const float* p, const float* q_local, const float* q_sum,
                            MatrixShape shape, size_t r, size_t count, float* residual,
                            float* out) {
  std::vector<float> neg(r), pos(r);
  for (size_t i = 0; i < shape.rows; ++i) {
    const size_t off = i * shape.cols;
    const size_t n = std::min(shape.cols, count - off);
    for (size_t j = 0; j < r; ++j) {
      neg[j] = -1.0f * p[j * shape.rows + i];
      pos[j] = 1.0f * p[j * shape.rows + i];
    }
    if (residual) ck::pq_row_axpy_in(neg.data(), q_local, shape.cols, r, n, residual + off);
    std::fill(out + off, out + off + n, 0.0f);
    ck::pq_row_axpy_in(pos.data(), q_sum, shape.cols, r, n, out + off);
  }
}

void add_pq(const float* p, const float* q, MatrixShape shape, size_t r, size_t count, float sign,
            float* m) {
  std::vector<float> a(r);
  for (size_t i = 0; i < shape.rows; ++i) {
    const size_t off = i * shape.cols;
    const size_t n = std::min(shape.cols, count - off);
    for (size_t j = 0; j < r; ++j) a[j] = sign * p[j * shape.rows + i];
    ck::pq_row_axpy_in(a.data(), q, shape.cols, r, n, m + off);
  }
}

}  // namespace gw::coll
