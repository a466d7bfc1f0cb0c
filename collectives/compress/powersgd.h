// PowerSGD: the low-rank scheme of the compressed allreduce (Aggregation::kLowRank, codec spec
// "powersgd:RANK"). Its protocol, Compressor::run_low_rank (P = M Q allreduced and
// orthogonalised, Q = M^T P allreduced, the result P Q^T, error feedback in the residual), and
// the linear algebra below are both in powersgd.cc.
//
// Every function is deterministic (every rank gets the same bits from the same input), does not
// block and touches only the buffers passed to it.
#pragma once

#include <cstddef>

namespace gw::coll {

// The flat gradient of `count`
// elements is viewed as a rows x cols row-major matrix M, zero-padded at the end. The factors
// are stored as r column vectors: P (rows x r) as p[j * rows + i], Q (cols x r) as q[j * cols + c].
struct MatrixShape {
  size_t rows = 0;
  size_t cols = 0;
};
MatrixShape powersgd_shape(size_t count, size_t cols_hint);
// P = M * Q; M holds `count` valid elements.
void matmul_mq(const float* m, size_t count, MatrixShape shape, const float* q, size_t r,
               float* out);
// Q = M^T * P.
void matmul_mtp(const float* m, size_t count, MatrixShape shape, const float* p, size_t r,
                float* out);
// In-place modified Gram-Schmidt on r column vectors of length rows (accumulated in double, so
// every rank gets the same bits from the same input). A column whose remaining norm falls below
// 1e-6 of its original norm (or is zero) becomes zero, so rank-deficient inputs stay finite.
void orthogonalize(float* a, size_t rows, size_t r);
// m += sign * P Q^T over the count valid elements (used for the residual and the decode).
void add_pq(const float* p, const float* q, MatrixShape shape, size_t r, size_t count, float sign,
            float* m);
// The fused passes the compressed allreduce runs (bit for bit the same as the unfused calls):
// m += x (x may be null: m as it is), then out = M Q, in one pass over m, row by row.
void add_matmul_mq(const float* x, float* m, size_t count, MatrixShape shape, const float* q,
                   size_t r, float* out);
// residual -= P Q_local^T (residual may be null: skipped) and out = P Q_sum^T, in one pass:
// add_pq(p, q_local, ..., -1, residual), then fill(out, 0) and add_pq(p, q_sum, ..., +1, out).
void residual_and_decode_pq(const float* p, const float* q_local, const float* q_sum,
                            MatrixShape shape, size_t r, size_t count, float* residual, float* out);

}  // namespace gw::coll
