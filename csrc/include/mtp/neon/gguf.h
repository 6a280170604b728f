// NEON products of GGUF block-type weights (gguf.h) with int8 activation rows: a block of 32
// is two int8x16 halves, int32 lane l of half h = the four products 16h+4l..16h+4l+3, exactly
// the canonical lanes 4h+l of gguf.h, so every path gives the generic kernel's bits.
// The weights are decoded to signed int8 (Q4_0: nibble - 8, Q6_K: value - 32, Q8_0 as stored,
// Q4_1 / Q4_K: the nibble) and multiplied with the signed x: no offset correction (sum4 is
// the x86 paths'). With FEAT_DotProd: one SDOT per half from zero. Without: SMULL / SMULL2
// (int16 products, |q x| <= 128 * 127), ADDP of adjacent products (|pair| <= 32512: no int16
// overflow), SADDLP to the int32 quads. Both exact: the same integers, so the same bits.
#pragma once
#include <arm_neon.h>

#include <algorithm>

#include "mtp/gguf.h"
#include "mtp/isa.h"
#include "mtp/linear_args.h"

namespace mtp::neon {

#if defined(MTP_NEON_DOTPROD)
// Out of line with its own target so that the plain variant compiles without dotprod;
// flatten inlines it into the dotprod entry point only.
MTP_TARGET_NEON_DOTPROD inline int32x4_t gguf_sdot(int8x16_t a, int8x16_t b) {
  return vdotq_s32(vdupq_n_s32(0), a, b);
}
#endif

// The 4 int32 lanes of one half: lane l = sum of the products of elements 4l..4l+3.
template <bool kSdot>
inline int32x4_t gguf_dot4(int8x16_t q, int8x16_t x) {
#if defined(MTP_NEON_DOTPROD)
  if constexpr (kSdot) return gguf_sdot(q, x);
  else
#endif
    return vpaddlq_s16(vpaddq_s16(vmull_s8(vget_low_s8(q), vget_low_s8(x)), vmull_high_s8(q, x)));
}

constexpr int kGgufCols = 4;  // columns per tile: the scales and offsets of a block are one float32x4

// Block b of the kGgufCols weight rows w[c], decoded: q[c] the signed values (two halves),
// d / m the scales and offsets of the columns (lane c), mul Q6_K's multipliers per half.
struct WBlocks {
  int8x16_t q[kGgufCols][2];
  float32x4_t d, m;
  int32_t mul[kGgufCols][2];
};

// Four fp16 values (one per column) to fp32: FCVTL, exact.
inline float32x4_t fp16x4(const uint8_t* const* w, int64_t off) {
  uint16_t h[kGgufCols];
  for (int c = 0; c < kGgufCols; ++c) std::memcpy(&h[c], w[c] + off, 2);
  return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)));
}

template <DType T>
inline void load_blocks(const uint8_t* const* w, int64_t b, WBlocks& o) {
  const uint8x16_t low4 = vdupq_n_u8(0x0F);
  if constexpr (T == DType::Q4_0 || T == DType::Q4_1) {
    constexpr int64_t bytes = block_bytes(T);
    for (int c = 0; c < kGgufCols; ++c) {
      const uint8x16_t v = vld1q_u8(w[c] + b * bytes + bytes - 16);
      int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(v, low4)), hi = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
      if constexpr (T == DType::Q4_0) lo = vsubq_s8(lo, vdupq_n_s8(8)), hi = vsubq_s8(hi, vdupq_n_s8(8));
      o.q[c][0] = lo;
      o.q[c][1] = hi;
    }
    o.d = fp16x4(w, b * bytes);
    o.m = T == DType::Q4_1 ? fp16x4(w, b * bytes + 2) : vdupq_n_f32(0.f);
  } else if constexpr (T == DType::Q8_0) {
    for (int c = 0; c < kGgufCols; ++c) {
      const int8_t* p = reinterpret_cast<const int8_t*>(w[c] + b * 34 + 2);
      o.q[c][0] = vld1q_s8(p);
      o.q[c][1] = vld1q_s8(p + 16);
    }
    o.d = fp16x4(w, b * 34);
    o.m = vdupq_n_f32(0.f);
  } else if constexpr (T == DType::Q4_K) {
    const int64_t sb = b / 8 * 144;
    int32_t sc[kGgufCols], mn[kGgufCols];
    for (int c = 0; c < kGgufCols; ++c) {
      const uint8_t* qs = w[c] + sb + 16 + (b % 8) / 2 * 32;
      const uint8x16_t v0 = vld1q_u8(qs), v1 = vld1q_u8(qs + 16);
      o.q[c][0] = vreinterpretq_s8_u8(b % 2 ? vshrq_n_u8(v0, 4) : vandq_u8(v0, low4));
      o.q[c][1] = vreinterpretq_s8_u8(b % 2 ? vshrq_n_u8(v1, 4) : vandq_u8(v1, low4));
      int s, m;
      q4k_scale_min(w[c] + sb + 4, int(b % 8), &s, &m);
      sc[c] = s;
      mn[c] = m;
    }
    // lane for lane block_params' products (fp16 x 6 bits: exact)
    o.d = vmulq_f32(fp16x4(w, sb), vcvtq_f32_s32(vld1q_s32(sc)));
    o.m = vnegq_f32(vmulq_f32(fp16x4(w, sb + 2), vcvtq_f32_s32(vld1q_s32(mn))));
  } else {  // Q6_K
    const int64_t sb = b / 8 * 210;
    const int h = int(b % 8) / 4, g = int(b % 4);
    // (qh >> 2g & 3) << 4 as one shift by 4 - 2g (negative: right) and a mask
    const int8x16_t hshift = vdupq_n_s8(int8_t(4 - 2 * g));
    for (int c = 0; c < kGgufCols; ++c) {
      const uint8_t* ql = w[c] + sb + 64 * h + 32 * (g & 1);
      const uint8_t* qh = w[c] + sb + 128 + 32 * h;
      for (int half = 0; half < 2; ++half) {
        const uint8x16_t l = vld1q_u8(ql + 16 * half), hb = vld1q_u8(qh + 16 * half);
        const uint8x16_t nib = g >= 2 ? vshrq_n_u8(l, 4) : vandq_u8(l, low4);
        const uint8x16_t top = vandq_u8(vshlq_u8(hb, hshift), vdupq_n_u8(0x30));
        o.q[c][half] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(nib, top)), vdupq_n_s8(32));
      }
      const int8_t* sc = reinterpret_cast<const int8_t*>(w[c] + sb + 192 + 2 * (b % 8));
      o.mul[c][0] = sc[0];
      o.mul[c][1] = sc[1];
    }
    o.d = fp16x4(w, sb + 208);
    o.m = vdupq_n_f32(0.f);
  }
}

inline float sum8_neon(float32x4_t lo, float32x4_t hi) {  // gguf.h's sum8, lane for lane
  const float32x4_t t = vaddq_f32(lo, hi);                         // a_l + a_{l+4}
  const float32x2_t u = vadd_f32(vget_low_f32(t), vget_high_f32(t));  // (0 + 2), (1 + 3)
  return vget_lane_f32(u, 0) + vget_lane_f32(u, 1);
}

// R rows x kGgufCols columns (weight rows w[c]) over all blocks.
template <DType T, bool kSdot, int R>
inline void gguf_tile(const uint8_t* const* w, const QuantRows& xq, int64_t m0, int64_t nb,
                      float (*out)[kGgufCols]) {
  constexpr int C = kGgufCols;
  float32x4_t acc[R][C][2], accm[R];  // accm: lane c = column c's offset chain (vector fma = std::fma per lane)
  for (int r = 0; r < R; ++r) {
    accm[r] = vdupq_n_f32(0.f);
    for (int c = 0; c < C; ++c) acc[r][c][0] = acc[r][c][1] = vdupq_n_f32(0.f);
  }
  constexpr int64_t stride = block_bytes(T) / (block_elems(T) / 32);  // bytes per 32 elements
  for (int64_t b = 0; b < nb; ++b) {
    for (int c = 0; c < C; ++c) __builtin_prefetch(w[c] + (b + 8) * stride);
    WBlocks wb;
    load_blocks<T>(w, b, wb);
    for (int r = 0; r < R; ++r) {
      const int8_t* x = xq.qrow(m0 + r) + b * 32;
      const int8x16_t x0 = vld1q_s8(x), x1 = vld1q_s8(x + 16);
      float scale[C];  // d_b * dx_b per column, as the generic kernel rounds it
      vst1q_f32(scale, vmulq_n_f32(wb.d, xq.dxrow(m0 + r)[b]));
      for (int c = 0; c < C; ++c) {
        int32x4_t L0 = gguf_dot4<kSdot>(wb.q[c][0], x0), L1 = gguf_dot4<kSdot>(wb.q[c][1], x1);
        if constexpr (T == DType::Q6_K) {
          L0 = vmulq_n_s32(L0, wb.mul[c][0]);
          L1 = vmulq_n_s32(L1, wb.mul[c][1]);
        }
        const float32x4_t s = vdupq_n_f32(scale[c]);
        acc[r][c][0] = vfmaq_f32(acc[r][c][0], vcvtq_f32_s32(L0), s);
        acc[r][c][1] = vfmaq_f32(acc[r][c][1], vcvtq_f32_s32(L1), s);
      }
      if constexpr (block_has_offset(T)) accm[r] = vfmaq_n_f32(accm[r], wb.m, xq.srow(m0 + r)[b]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float m[C];
    vst1q_f32(m, accm[r]);
    for (int c = 0; c < C; ++c) out[r][c] = sum8_neon(acc[r][c][0], acc[r][c][1]) + m[c];
  }
}

template <DType T, bool kSdot, int R>
inline void gguf_rows(const LinearArgs& a, const QuantRows& xq, int64_t m0, int64_t n0, int64_t n1) {
  constexpr int C = kGgufCols;
  const int64_t nb = a.K / 32;
  for (int64_t n = n0; n < n1; n += C) {
    const uint8_t* w[C];  // past n1: the last column again, computed and dropped
    for (int c = 0; c < C; ++c)
      w[c] = static_cast<const uint8_t*>(a.w) + weight_row(a, std::min(n + c, n1 - 1)) * a.w_stride;
    float out[R][C];
    gguf_tile<T, kSdot, R>(w, xq, m0, nb, out);
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C && n + c < n1; ++c)
        a.y[(m0 + r) * a.y_stride + n + c] = a.bias ? out[r][c] + a.bias[n + c] : out[r][c];
  }
}

// Rows in pairs (a pair shares each decoded weight block; 2 x 4 x 2 accumulators of the 32
// vector registers), then one; any grouping gives the same bits.
template <DType T, bool kSdot>
inline void gguf_linear_typed(const LinearArgs& a, const QuantRows& xq, int64_t n0, int64_t n1) {
  int64_t m = 0;
  for (; m + 2 <= a.M; m += 2) gguf_rows<T, kSdot, 2>(a, xq, m, n0, n1);
  for (; m < a.M; ++m) gguf_rows<T, kSdot, 1>(a, xq, m, n0, n1);
}

template <bool kSdot>
inline void gguf_linear_variant(const LinearArgs& a, const QuantRows& xq, int64_t n0, int64_t n1) {
  switch (a.w_dtype) {
    case DType::Q4_0: return gguf_linear_typed<DType::Q4_0, kSdot>(a, xq, n0, n1);
    case DType::Q4_1: return gguf_linear_typed<DType::Q4_1, kSdot>(a, xq, n0, n1);
    case DType::Q8_0: return gguf_linear_typed<DType::Q8_0, kSdot>(a, xq, n0, n1);
    case DType::Q4_K: return gguf_linear_typed<DType::Q4_K, kSdot>(a, xq, n0, n1);
    default: return gguf_linear_typed<DType::Q6_K, kSdot>(a, xq, n0, n1);
  }
}

// The entry points: flatten functions into which everything above is inlined (gguf_sdot
// only into the dotprod one, whose target allows it).
__attribute__((flatten)) inline void gguf_linear_neon_plain(const LinearArgs& a, const QuantRows& xq, int64_t n0,
                                                            int64_t n1) {
  gguf_linear_variant<false>(a, xq, n0, n1);
}
#if defined(MTP_NEON_DOTPROD)
MTP_TARGET_NEON_DOTPROD __attribute__((flatten)) inline void gguf_linear_neon_sdot(const LinearArgs& a,
                                                                                   const QuantRows& xq,
                                                                                   int64_t n0, int64_t n1) {
  gguf_linear_variant<true>(a, xq, n0, n1);
}
#endif

// Neon / NeonFp16: SDOT where the CPU has it (the same bits either way).
inline void gguf_linear_neon(const LinearArgs& a, const QuantRows& xq, int64_t n0, int64_t n1) {
#if defined(MTP_NEON_DOTPROD)
  if (has_neon_dotprod()) return gguf_linear_neon_sdot(a, xq, n0, n1);
#endif
  gguf_linear_neon_plain(a, xq, n0, n1);
}

}  // namespace mtp::neon
