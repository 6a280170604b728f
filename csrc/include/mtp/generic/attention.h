// Scalar attention chunk kernels: the reference path, any head dim, any element stride,
// any architecture. Each row's operations run in key order, one at a time.
#pragma once
#include <cmath>
#include <cstdint>

#include "mtp/common.h"
#include "mtp/attention_args.h"
#include "mtp/kv_rows.h"

namespace mtp::generic {

template <DType T>
struct Attention {
  // s[r][j] = scale * <q_r, k_j> for the rows r0 <= r < R and their n[r] keys.
  static void scores(const float* q, int64_t r0, int64_t R, const int64_t* n, const KvRows& k, int64_t D, float scale,
                     float* s) {
    for (int64_t r = r0; r < R; ++r)
      for (int64_t j = 0; j < n[r]; ++j) {
        const void* kj = k.row(j);
        float acc = 0.f;
        for (int64_t d = 0; d < D; ++d) acc += q[r * D + d] * load_f32(kj, T, d * k.d_stride);
        s[r * kAttnChunk + j] = acc * scale;
      }
  }

  // Scores -> exp(s - m) in place; m = max, l = sum, or NaN when a score is not finite
  // (-inf included: the row's output is NaN, see write_row).
  static void softmax(float* s, int64_t n, float* m_out, float* l_out) {
    float m = -std::numeric_limits<float>::infinity();
    bool finite = true;
    for (int64_t j = 0; j < n; ++j) {
      m = std::max(m, s[j]);
      finite = finite && std::isfinite(s[j]);
    }
    float l = 0.f;
    for (int64_t j = 0; j < n; ++j) {
      s[j] = std::exp(s[j] - m);
      l += s[j];
    }
    *m_out = m;
    *l_out = finite ? l : std::numeric_limits<float>::quiet_NaN();
  }

  // acc[r][:] = sum_j p[r][j] * v_j over n keys, for `rows` rows (row strides kAttnChunk, ld).
  static void accumulate(const float* p, int64_t rows, int64_t n, const KvRows& v, int64_t D, float* acc, int64_t ld) {
    for (int64_t r = 0; r < rows; ++r) {
      float* a = acc + r * ld;
      std::fill(a, a + D, 0.f);
      for (int64_t j = 0; j < n; ++j) {
        const void* vj = v.row(j);
        const float pj = p[r * kAttnChunk + j];
        for (int64_t d = 0; d < D; ++d) a[d] += pj * load_f32(vj, T, d * v.d_stride);
      }
    }
  }
};

}  // namespace mtp::generic
