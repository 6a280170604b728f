// The row-local ops of a decoder layer (RMSNorm with the residual add fused, RoPE, the gated
// product of the MLP: SiLU or tanh-GELU) as plain loops, which the compiler vectorises for the
// target of the function they are inlined into (x86/rowwise.h; aarch64's baseline NEON). The
// source fixes every operation (no fma contraction, no reassociation: -ffp-contract=off and no
// fast-math), so scalar code, SSE2, AVX2, AVX-512 and NEON compute the same values. Each row is
// computed alone by the same code whatever the number of rows.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "mtp/common.h"
#include "mtp/isa.h"
#include "mtp/rowwise_args.h"

namespace mtp {

// exp(y) for y <= 0 from +, -, * and bit operations only (no fma, no library call), so loops
// of it vectorise (its selects become blends: -fno-trapping-math, see CMakeLists.txt) and give
// the same bits on every instruction set: Cody-Waite reduction by ln2, Cephes expf's
// polynomial (about 1 ulp), times 2^n; 0 below -87.3 (no subnormal results) and for NaN.
inline float exp_nonpositive(float y) {
  constexpr float lo = -87.3f;
  const float yc = y >= lo ? y : lo;  // NaN -> lo: the integer part below stays defined
  // Round to nearest by adding 1.5 * 2^23 (|yc * log2 e| < 2^22).
  const float n = (yc * 1.44269504088896341f + 12582912.f) - 12582912.f;
  float r = yc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.f;
  const uint32_t bits = uint32_t(int32_t(n) + 127) << 23;  // 2^n, n in [-126, 0]
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return y >= lo ? p * scale : 0.f;
}

// The gate activations as g * sigmoid(a), a of g's sign:
//   SiLU:      a = g
//   GELU-tanh: a = 2 sqrt(2/pi) (g + 0.044715 g^3), since 0.5 g (1 + tanh(a / 2)) = g sigmoid(a)
//              (torch's gelu(approximate="tanh")), each step one fp32 operation in this order:
//              (g g) g, times 0.044715f, plus g, times 2 sqrt(2/pi) rounded to fp32 (twice
//              torch's fp32 sqrt(2/pi): a is exactly twice torch's tanh argument).
// g^3 overflows to +-inf for |g| > 7e12: a = +-inf, which the exponential below takes.
template <GatedAct A>
inline float gate_sigmoid_arg(float g) {
  if constexpr (A == GatedAct::Silu) {
    return g;
  } else {
    constexpr float kTwoSqrt2OverPi = 1.5957691216057308f, kKappa = 0.044715f;
    return kTwoSqrt2OverPi * (g + kKappa * (g * g * g));
  }
}

// act(g) * u in fp32: g sigmoid(a) = g / (1 + e^-a) = g e^a / (1 + e^a), written with
// t = e^-|a| <= 1 so the exponential never overflows, and for GELU without the cancellation
// of 1 + tanh (torch's fp32 formula: 1e-5 relative error at g = -3, 30% at -5, 0 below
// -5.06). t is 0 where -|a| < -87.3 (exp_nonpositive), so act(g) is -0 there for negative g
// (its value there is below 1.1e-36 in magnitude: SiLU below -87.3, GELU below -9.9995), and
// NaN for g = -inf (-inf * 0, as torch's silu and gelu give).
template <GatedAct A>
inline float gated_mul_value(float g, float u) {
  const float t = exp_nonpositive(-std::fabs(gate_sigmoid_arg<A>(g)));
  return (g >= 0.f ? g : g * t) / (1.f + t) * u;
}

namespace generic {

// One row: [sum = round(x + residual)], then out = round(v * inv_rms(v) * weight) with v the
// row (sum or x) in fp32. The sum of squares is fixed: element k's square (rounded to fp32)
// adds into lane k % 16 in order, then the lanes are added by the tree (l, l+8), (l, l+4),
// (l, l+2), (l, l+1); inv_rms = 1 / sqrt(ss / H + eps), each step one IEEE operation.
// __restrict__: outputs never overlap inputs, so the loops vectorise without alias checks.
template <DType T, DType WT>
inline void rms_norm_row(const void* __restrict__ x, const void* __restrict__ res, void* __restrict__ sum,
                         void* __restrict__ out, const void* __restrict__ w, int64_t H, float eps) {
  if (res)
    for (int64_t k = 0; k < H; ++k) store_f32(sum, T, k, load_f32(x, T, k) + load_f32(res, T, k));
  const void* __restrict__ v = res ? sum : x;  // the rounded sum, as the next layer sees it
  float acc[kNormLanes] = {};
  const int64_t whole = H / kNormLanes * kNormLanes;
  for (int64_t k0 = 0; k0 < whole; k0 += kNormLanes)
    for (int l = 0; l < kNormLanes; ++l) {
      const float e = load_f32(v, T, k0 + l);
      acc[l] += e * e;
    }
  for (int64_t k = whole; k < H; ++k) {
    const float e = load_f32(v, T, k);
    acc[k - whole] += e * e;
  }
  for (int w2 = kNormLanes / 2; w2 >= 1; w2 /= 2)
    for (int l = 0; l < w2; ++l) acc[l] += acc[l + w2];
  const float inv = 1.f / std::sqrt(acc[0] / float(H) + eps);
  for (int64_t k = 0; k < H; ++k) store_f32(out, T, k, load_f32(v, T, k) * inv * load_f32(w, WT, k));
}

template <DType T, DType WT>
inline void rms_norm_typed(const RmsNormArgs& a) {
  const int64_t es = dtype_size(T);
  for (int64_t m = 0; m < a.M; ++m)
    rms_norm_row<T, WT>(static_cast<const char*>(a.x) + m * a.x_stride * es,
                        a.residual ? static_cast<const char*>(a.residual) + m * a.residual_stride * es : nullptr,
                        a.residual ? static_cast<char*>(a.sum) + m * a.sum_stride * es : nullptr,
                        static_cast<char*>(a.out) + m * a.out_stride * es, a.weight, a.H, a.eps);
}

// One (b, t, h) row of D = 2 * half elements, its two halves lo and hi: element i of lo
// becomes lo_i cos_i - hi_i sin_i, element i of hi becomes hi_i cos_{i+half} + lo_i sin_{i+half},
// each product rounded to fp32 (the half-split layout of Llama's rotate_half). xs, cs, ss:
// element strides (1 when UNIT: the loop the compiler vectorises).
template <DType T, bool UNIT>
inline void rope_row(void* __restrict__ lo, void* __restrict__ hi, int64_t xs, const float* __restrict__ c, int64_t cs,
                     const float* __restrict__ s, int64_t ss, int64_t half) {
  if (UNIT) xs = cs = ss = 1;
  for (int64_t i = 0; i < half; ++i) {
    const float a = load_f32(lo, T, i * xs), b = load_f32(hi, T, i * xs);
    store_f32(lo, T, i * xs, a * c[i * cs] - b * s[i * ss]);
    store_f32(hi, T, i * xs, b * c[(i + half) * cs] + a * s[(i + half) * ss]);
  }
}

template <DType T>
inline void rope_typed(const RopeArgs& a) {
  const int64_t es = dtype_size(T), half = a.D / 2;
  const bool unit = a.x_stride[3] == 1 && a.cos_stride[2] == 1 && a.sin_stride[2] == 1;
  for (int64_t b = 0; b < a.B; ++b)
    for (int64_t t = 0; t < a.T; ++t) {
      const float* c = a.cos + b * a.cos_stride[0] + t * a.cos_stride[1];
      const float* s = a.sin + b * a.sin_stride[0] + t * a.sin_stride[1];
      for (int64_t h = 0; h < a.H; ++h) {
        char* lo = static_cast<char*>(a.x) + (b * a.x_stride[0] + t * a.x_stride[1] + h * a.x_stride[2]) * es;
        char* hi = lo + half * a.x_stride[3] * es;
        if (unit)
          rope_row<T, true>(lo, hi, 1, c, 1, s, 1, half);
        else
          rope_row<T, false>(lo, hi, a.x_stride[3], c, a.cos_stride[2], s, a.sin_stride[2], half);
      }
    }
}

template <DType T, GatedAct A>
inline void gated_mul_row(const void* __restrict__ gate, const void* __restrict__ up, void* __restrict__ out,
                          int64_t I) {
  for (int64_t i = 0; i < I; ++i) store_f32(out, T, i, gated_mul_value<A>(load_f32(gate, T, i), load_f32(up, T, i)));
}

template <DType T, GatedAct A>
inline void gated_mul_typed(const GatedMulArgs& a) {
  const int64_t es = dtype_size(T);
  for (int64_t m = 0; m < a.M; ++m) {
    const char* x = static_cast<const char*>(a.x) + m * a.x_stride * es;
    gated_mul_row<T, A>(x, x + a.I * es, static_cast<char*>(a.out) + m * a.out_stride * es, a.I);
  }
}

// The entry points (each instruction set's are these, inlined into its target: x86/rowwise.h;
// the overloads on Generic serve every set without its own, rowwise.h's dispatch).
inline void rms_norm(const RmsNormArgs& a) {
  with_dtype(a.dtype, [&](auto t) {
    with_dtype(a.w_dtype, [&](auto wt) { rms_norm_typed<decltype(t)::value, decltype(wt)::value>(a); });
  });
}
inline void rope(const RopeArgs& a) {
  with_dtype(a.dtype, [&](auto t) { rope_typed<decltype(t)::value>(a); });
}
inline void gated_mul(const GatedMulArgs& a) {
  with_dtype(a.dtype, [&](auto t) {
    if (a.act == GatedAct::GeluTanh)
      gated_mul_typed<decltype(t)::value, GatedAct::GeluTanh>(a);
    else
      gated_mul_typed<decltype(t)::value, GatedAct::Silu>(a);
  });
}
inline void rms_norm(Generic, const RmsNormArgs& a) { rms_norm(a); }
inline void rope(Generic, const RopeArgs& a) { rope(a); }
inline void gated_mul(Generic, const GatedMulArgs& a) { gated_mul(a); }

}  // namespace generic
}  // namespace mtp
