// Chain rejection sampling (mtp.verify_sampled), torch-free: the counter-based RNG and the
// per-request sampling rule, written once so the Triton/CUDA ports can mirror it line by
// line. The exact formulas are documented in mtp_kernels/reference.py (verify_sampled).
#pragma once
#include <cmath>
#include <cstdint>

#include "mtp/argmax.h"
#include "mtp/verify_args.h"

namespace mtp {

// splitmix64's finaliser (Steele et al.): a bijective 64-bit mix.
MTP_HOST_DEVICE inline uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// RNG streams: one uniform per (seed, position, stream), never a sequential state, so a
// token does not depend on the batch it was drawn in or on the thread that drew it.
enum : uint64_t { kStreamAccept = 0, kStreamSample = 1 };

// A uniform in [0, 1) on the 2^-24 grid (exact in fp32 and fp64).
MTP_HOST_DEVICE inline double sample_uniform(int64_t seed, int64_t position, uint64_t stream) {
  const uint64_t h = mix64(mix64(mix64(uint64_t(seed)) + uint64_t(position)) + stream);
  return double(h >> 40) * (1.0 / 16777216.0);
}

// The target distribution of one logits row: p_i = w_i / S with w_i = exp((x_i - m) / T),
// m = max x, S the left-to-right sum of w in fp64. Temperature 0, or a row whose softmax is
// undefined (a NaN, +inf, or all -inf), is the point mass on torch.argmax's choice.
struct RowDist {
  const void* x;
  DType dt;
  int64_t stride, V;
  double T, m = 0, S = 1;
  int64_t point = -1;  // >= 0: the point mass's index

  RowDist(const void* row, DType dt_, int64_t stride_, int64_t V_, double T_, Isa isa)
      : x(row), dt(dt_), stride(stride_), V(V_), T(T_) {
    ArgmaxResult best = argmax_range(x, dt, stride, 0, V, isa);
    m = best.val;
    if (T == 0 || best.nan || !std::isfinite(m)) {
      point = best.idx;
      return;
    }
    S = 0;
    for (int64_t i = 0; i < V; ++i) S += w(i);
  }
  double w(int64_t i) const {
    if (point >= 0) return i == point ? 1.0 : 0.0;
    return std::exp((double(load_f32(x, dt, i * stride)) - m) / T);
  }
};

// The first i whose running sum of weight(i) over i = 0.. exceeds u * total (the inverse
// CDF); total is the same left-to-right sum, so some i with weight > 0 is always found.
template <class Weight>
inline int64_t inverse_cdf(int64_t V, double total, double u, Weight weight) {
  const double target = u * total;
  double acc = 0;
  int64_t last = 0;
  for (int64_t i = 0; i < V; ++i) {
    const double wi = weight(i);
    if (wi <= 0) continue;
    acc += wi;
    last = i;
    if (acc > target) return i;
  }
  return last;  // unreachable unless total was not this sum
}

// Request b of verify_sampled. draft [K] (stride ds); q: draft_probs rows [K, V] with
// element strides qs (nullptr: one-hot drafts). Rows t = 0..nd are read only up to the
// first rejection. Writes out[0..K] (stride os) and returns the accepted count.
//
// One-hot drafts (and T == 0): y_t = inverse_cdf(p_t, u(seed, offset+t, kStreamSample));
// the draft is accepted iff y_t == draft. That accepts with probability p_t(x) = min(1,
// p/q) and, on rejection, emits y ~ p restricted to y != x = normalize(max(0, p - q)):
// exactly the rejection-sampling law, and the same token plain sampling draws at that
// position with the same seed (so speculative == plain, token for token).
// With q: accept x iff u(.., kStreamAccept) * q(x) < p(x) (x in [0, V)); on rejection
// y = inverse_cdf(max(0, p - q), u(.., kStreamSample)) (p itself if that is all zero).
template <class I>
inline int64_t sample_request(const VerifyArgs& a, int64_t b, const I* draft, int64_t ds, const void* q, DType qdt,
                              const int64_t* qs, double T, int64_t seed, int64_t offset, int64_t nd, int64_t pad,
                              I* out, int64_t os, Isa isa) {
  const int64_t esize = dtype_size(a.logits_dtype);
  for (int64_t t = 0; t <= nd; ++t) {
    const char* row = static_cast<const char*>(a.logits) + (b * a.logits_stride[0] + t * a.logits_stride[1]) * esize;
    RowDist p(row, a.logits_dtype, a.logits_stride[2], a.V, T, isa);
    const double us = sample_uniform(seed, offset + t, kStreamSample);
    const auto pw = [&](int64_t i) { return p.w(i); };
    int64_t y;
    if (t == nd || q == nullptr || T == 0) {
      y = inverse_cdf(a.V, p.S, us, pw);
      if (t < nd && int64_t(draft[t * ds]) == y) { out[t * os] = draft[t * ds]; continue; }
    } else {
      const int64_t x = int64_t(draft[t * ds]);
      const void* qrow = static_cast<const char*>(q) + t * qs[0] * dtype_size(qdt);
      const auto qv = [&](int64_t i) { return double(load_f32(qrow, qdt, i * qs[1])); };
      if (x >= 0 && x < a.V && sample_uniform(seed, offset + t, kStreamAccept) * qv(x) < p.w(x) / p.S) {
        out[t * os] = draft[t * ds];
        continue;
      }
      const auto r = [&](int64_t i) { return std::fmax(0.0, p.w(i) / p.S - qv(i)); };
      double R = 0;
      for (int64_t i = 0; i < a.V; ++i) R += r(i);
      y = R > 0 ? inverse_cdf(a.V, R, us, r) : inverse_cdf(a.V, p.S, us, pw);
    }
    out[t * os] = I(y);
    for (int64_t j = t + 1; j <= a.K; ++j) out[j * os] = I(pad);
    return t;
  }
  return nd;  // not reached: t == nd always emits
}

}  // namespace mtp
