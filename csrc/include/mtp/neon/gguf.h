// NEON products of GGUF block-type weights (gguf.h) with int8 activation rows: the integer
// block sums I are exact, then gguf.h's one chain per output element (one fma per block, the
// scale d_b * dx_b rounded first; the offset chain beside it), so every path gives the generic
// kernel's bits. A vector fma per lane is std::fma.
// File layout: a block of 32 is two int8x16 halves, int32 lane l of half h = the four products
// 16h+4l..16h+4l+3; Q6_K multiplies each half by its scale, then pairwise adds reduce 4
// columns into one int32x4 (lane c = column c's I) and one fma serves the 4 columns.
// x8 layout: a chunk of 32 bytes is two int8x16 (columns 0-3, 4-7; 4 bytes per int32 lane),
// so its dot products with 4 activation bytes land in lane c = column c: a block's 8 sums
// come out in two int32x4, then one cvt + mul + fma per 4 columns. A row map over x8 groups
// (columns from different groups) takes the generic kernel.
// The weights are decoded to signed int8 (Q4_0: nibble - 8, Q5_0: value - 16, Q6_K: value - 32, Q8_0 as stored,
// Q4_1 / Q4_K: the nibble) and multiplied with the signed x: no offset correction (sum4 is
// the x86 paths'). With FEAT_DotProd: SDOT (x8: the by-element form, x's 4 bytes chosen by
// lane). Without: SMULL / SMULL2 (int16 products, |q x| <= 128 * 127), ADDP of adjacent
// products (|pair| <= 32512: no int16 overflow), SADDLP / SADALP to the int32 quads. Both
// exact: the same integers (|I| < 2^24), so the same bits.
#pragma once
#include <arm_neon.h>

#include <algorithm>
#include <cstring>

#include "mtp/gguf.h"
#include "mtp/isa.h"
#include "mtp/linear_args.h"

namespace mtp::neon {

#if defined(MTP_NEON_DOTPROD)
// Out of line with their own target so that the plain variant compiles without dotprod;
// flatten inlines them into the dotprod entry point only.
MTP_TARGET_NEON_DOTPROD inline int32x4_t gguf_sdot(int32x4_t acc, int8x16_t a, int8x16_t b) {
  return vdotq_s32(acc, a, b);
}
template <int kLane>
MTP_TARGET_NEON_DOTPROD inline int32x4_t gguf_sdot_lane(int32x4_t acc, int8x16_t w, int8x16_t x) {
  return vdotq_laneq_s32(acc, w, x, kLane);
}
#endif

// int16 lane l = the products of elements 2l and 2l + 1 added (|pair| <= 32512: exact);
// SADDLP / SADALP then add lanes 2l, 2l + 1 into int32 lane l (elements 4l..4l+3).
inline int16x8_t gguf_pairs(int8x16_t q, int8x16_t x) {
  return vpaddq_s16(vmull_s8(vget_low_s8(q), vget_low_s8(x)), vmull_high_s8(q, x));
}

// acc + the 4 int32 lanes of one half: lane l = sum of the products of elements 4l..4l+3.
template <bool kSdot>
inline int32x4_t gguf_dot4(int32x4_t acc, int8x16_t q, int8x16_t x) {
#if defined(MTP_NEON_DOTPROD)
  if constexpr (kSdot)
    return gguf_sdot(acc, q, x);
  else
#endif
    return vpadalq_s16(acc, gguf_pairs(q, x));
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
  } else if constexpr (T == DType::Q5_0) {
    // qh's bit e to byte e: byte e takes qh's byte e / 8 and tests bit e % 8 (0x10 where set)
    const uint8x16_t bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040201008040201ull));
    for (int c = 0; c < kGgufCols; ++c) {
      const uint8_t* blk = w[c] + b * 22;
      const uint8x16_t v = vld1q_u8(blk + 6);
      const uint8x16_t h0 = vcombine_u8(vdup_n_u8(blk[2]), vdup_n_u8(blk[3]));
      const uint8x16_t h1 = vcombine_u8(vdup_n_u8(blk[4]), vdup_n_u8(blk[5]));
      const uint8x16_t top0 = vandq_u8(vtstq_u8(h0, bit), vdupq_n_u8(0x10));
      const uint8x16_t top1 = vandq_u8(vtstq_u8(h1, bit), vdupq_n_u8(0x10));
      o.q[c][0] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(v, low4), top0)), vdupq_n_s8(16));
      o.q[c][1] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(v, 4), top1)), vdupq_n_s8(16));
    }
    o.d = fp16x4(w, b * 22);
    o.m = vdupq_n_f32(0.f);
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

// Column c's block sum I (lanes to reduce; Q6_K: each half times its multiplier first).
template <DType T, bool kSdot>
inline int32x4_t block_lanes(const WBlocks& wb, int c, int8x16_t x0, int8x16_t x1) {
  const int32x4_t zero = vdupq_n_s32(0);
  if constexpr (T == DType::Q6_K)
    return vmlaq_n_s32(vmulq_n_s32(gguf_dot4<kSdot>(zero, wb.q[c][0], x0), wb.mul[c][0]),
                       gguf_dot4<kSdot>(zero, wb.q[c][1], x1), wb.mul[c][1]);
  else
    return gguf_dot4<kSdot>(gguf_dot4<kSdot>(zero, wb.q[c][0], x0), wb.q[c][1], x1);
}

// R rows x kGgufCols columns (weight rows w[c]) over all blocks: acc[r] / accm[r] lane c =
// column c's chains. Per block, the columns' blocks are decoded once for the R rows.
template <DType T, bool kSdot, int R>
inline void gguf_tile(const uint8_t* const* w, const QuantRows& xq, int64_t m0, int64_t nb, float (*out)[kGgufCols]) {
  float32x4_t acc[R], accm[R];
  for (int r = 0; r < R; ++r) acc[r] = accm[r] = vdupq_n_f32(0.f);
  constexpr int64_t stride = block_bytes(T) / (block_elems(T) / 32);  // bytes per 32 elements
  for (int64_t b = 0; b < nb; ++b) {
    for (int c = 0; c < kGgufCols; ++c) __builtin_prefetch(w[c] + (b + 8) * stride);
    WBlocks wb;
    load_blocks<T>(w, b, wb);
    for (int r = 0; r < R; ++r) {
      const int8_t* x = xq.qrow(m0 + r) + b * 32;
      const int8x16_t x0 = vld1q_s8(x), x1 = vld1q_s8(x + 16);
      // lane c = column c's I: exact integer adds, any order
      const int32x4_t I =
          vpaddq_s32(vpaddq_s32(block_lanes<T, kSdot>(wb, 0, x0, x1), block_lanes<T, kSdot>(wb, 1, x0, x1)),
                     vpaddq_s32(block_lanes<T, kSdot>(wb, 2, x0, x1), block_lanes<T, kSdot>(wb, 3, x0, x1)));
      acc[r] = vfmaq_f32(acc[r], vcvtq_f32_s32(I), vmulq_n_f32(wb.d, xq.dxrow(m0 + r)[b]));
      if constexpr (block_has_offset(T)) accm[r] = vfmaq_n_f32(accm[r], wb.m, xq.srow(m0 + r)[b]);
    }
  }
  for (int r = 0; r < R; ++r) vst1q_f32(out[r], vaddq_f32(acc[r], accm[r]));
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

// ---- x8 layout ----------------------------------------------------------------------------

// I + the dot products of w's 4 columns (4 bytes per int32 lane) with x's 4 bytes at int32
// lane kLane (SDOT by element; without it those bytes duplicated, then SMULL and pairwise adds).
template <bool kSdot, int kLane>
inline int32x4_t x8_dot(int32x4_t I, int8x16_t w, int8x16_t x) {
#if defined(MTP_NEON_DOTPROD)
  if constexpr (kSdot)
    return gguf_sdot_lane<kLane>(I, w, x);
  else
#endif
    return vpadalq_s16(I, gguf_pairs(w, vreinterpretq_s8_s32(vdupq_laneq_s32(vreinterpretq_s32_s8(x), kLane))));
}

// Chunks J.. of one x8 block (qs: its first chunk) into the R rows' block sums I[r] (columns
// 0-3, 4-7); x[r]: the row's 32 activations of the block as two int8x16. A template
// recursion: the lanes of x8_dot are constants.
template <DType T, bool kSdot, int R, int J>
inline void x8_chunks_from(const uint8_t* qs, const int8x16_t (*x)[2], int32x4_t (*I)[2]) {
  const uint8x16_t v0 = vld1q_u8(qs + 32 * J), v1 = vld1q_u8(qs + 32 * J + 16);
  if constexpr (T == DType::Q8_0) {  // chunk J: elements 4J..4J+3
    const int8x16_t w0 = vreinterpretq_s8_u8(v0), w1 = vreinterpretq_s8_u8(v1);
    for (int r = 0; r < R; ++r) {
      I[r][0] = x8_dot<kSdot, J % 4>(I[r][0], w0, x[r][J / 4]);
      I[r][1] = x8_dot<kSdot, J % 4>(I[r][1], w1, x[r][J / 4]);
    }
  } else {  // chunk J: low nibbles elements 4J..4J+3, high 16+4J..16+4J+3
    const uint8x16_t low4 = vdupq_n_u8(0x0F);
    int8x16_t lo0 = vreinterpretq_s8_u8(vandq_u8(v0, low4)), hi0 = vreinterpretq_s8_u8(vshrq_n_u8(v0, 4));
    int8x16_t lo1 = vreinterpretq_s8_u8(vandq_u8(v1, low4)), hi1 = vreinterpretq_s8_u8(vshrq_n_u8(v1, 4));
    if constexpr (T == DType::Q4_0) {
      const int8x16_t eight = vdupq_n_s8(8);
      lo0 = vsubq_s8(lo0, eight), hi0 = vsubq_s8(hi0, eight), lo1 = vsubq_s8(lo1, eight), hi1 = vsubq_s8(hi1, eight);
    }
    for (int r = 0; r < R; ++r) {
      I[r][0] = x8_dot<kSdot, J>(x8_dot<kSdot, J>(I[r][0], lo0, x[r][0]), hi0, x[r][1]);
      I[r][1] = x8_dot<kSdot, J>(x8_dot<kSdot, J>(I[r][1], lo1, x[r][0]), hi1, x[r][1]);
    }
  }
  if constexpr (J + 1 < x8_chunks(T)) x8_chunks_from<T, kSdot, R, J + 1>(qs, x, I);
}

// Eight fp16 values (one per column) to fp32: columns 0-3 and 4-7, FCVTL / FCVTL2, exact.
inline void fp16x8(const uint8_t* p, float32x4_t* out) {
  const float16x8_t h = vreinterpretq_f16_u8(vld1q_u8(p));
  out[0] = vcvt_f32_f16(vget_low_f16(h));
  out[1] = vcvt_high_f32_f16(h);
}

// R rows x the 8 columns of one x8 group (T: the blocks' file type) over all blocks: y[r][h]
// lane c = column 4h + c. Per block, each chunk is decoded once for the R rows.
template <DType T, bool kSdot, int R>
inline void x8_tile(const uint8_t* group, const QuantRows& xq, int64_t m0, int64_t nb, float32x4_t (*y)[2]) {
  constexpr int64_t gb = kX8Rows * block_bytes(T);
  float32x4_t acc[R][2], accm[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = accm[r][0] = accm[r][1] = vdupq_n_f32(0.f);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = group + b * gb;
    __builtin_prefetch(blk + 8 * gb);
    int8x16_t x[R][2];
    int32x4_t I[R][2];
    for (int r = 0; r < R; ++r) {
      const int8_t* xr = xq.qrow(m0 + r) + b * 32;
      x[r][0] = vld1q_s8(xr), x[r][1] = vld1q_s8(xr + 16);
      I[r][0] = I[r][1] = vdupq_n_s32(0);
    }
    x8_chunks_from<T, kSdot, R, 0>(blk + x8_head_bytes(T), x, I);
    float32x4_t d[2], m[2];
    fp16x8(blk, d);
    if constexpr (block_has_offset(T)) fp16x8(blk + 16, m);
    for (int r = 0; r < R; ++r) {
      const float dx = xq.dxrow(m0 + r)[b];
      for (int h = 0; h < 2; ++h) {
        acc[r][h] = vfmaq_f32(acc[r][h], vcvtq_f32_s32(I[r][h]), vmulq_n_f32(d[h], dx));
        if constexpr (block_has_offset(T)) accm[r][h] = vfmaq_n_f32(accm[r][h], m[h], xq.srow(m0 + r)[b]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h) y[r][h] = vaddq_f32(acc[r][h], accm[r][h]);
}

// ---- x8 layout of the K-quants (superblocks of 8 blocks of 32)

// Chunk K of a K-quant block as two int8x16 (columns 0-3, 4-7), signed: Q4_K the nibbles at
// ql shifted down by sl (vshl by a negative count); Q6_K those with qh's two bits (shifted by
// sh) on top, minus 32. Its dot products go to the half-block sums I[r][K / 4]. A template
// recursion as x8_chunks_from.
template <DType T, bool kSdot, int R, int K>
inline void x8k_chunks_from(const uint8_t* ql, const uint8_t* qh, int8x16_t sl, int8x16_t sh, const int8x16_t (*x)[2],
                            int32x4_t (*I)[2][2]) {
  int8x16_t w[2];
  for (int h = 0; h < 2; ++h) {
    uint8x16_t v = vandq_u8(vshlq_u8(vld1q_u8(ql + 32 * K + 16 * h), sl), vdupq_n_u8(0x0F));
    if constexpr (T == DType::Q6_K) {
      const uint8x16_t top = vandq_u8(vshlq_u8(vld1q_u8(qh + 32 * K + 16 * h), sh), vdupq_n_u8(3));
      w[h] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(v, vshlq_n_u8(top, 4))), vdupq_n_s8(32));
    } else {
      w[h] = vreinterpretq_s8_u8(v);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h) I[r][K / 4][h] = x8_dot<kSdot, K % 4>(I[r][K / 4][h], w[h], x[r][K / 4]);
  if constexpr (K + 1 < 8) x8k_chunks_from<T, kSdot, R, K + 1>(ql, qh, sl, sh, x, I);
}

// 8 bytes (one per column) as two uint32x4 (columns 0-3, 4-7).
inline void bytes8_u32(const uint8_t* p, uint32x4_t* out) {
  const uint16x8_t v = vmovl_u8(vld1_u8(p));
  out[0] = vmovl_u16(vget_low_u16(v));
  out[1] = vmovl_high_u16(v);
}

// x8_tile for Q4_K / Q6_K (x86/gguf.h: x8_tile_k): per block, the 8 columns' scales from the
// x8 layout's per-byte scale rows, the chunks decoded once for the R rows; Q4_K d_b = d * sc_j,
// m_b = -(dmin * m_j); Q6_K I = mul_0 * I_0 + mul_1 * I_1 over the half blocks (exact).
template <DType T, bool kSdot, int R>
inline void x8_tile_k(const uint8_t* group, const QuantRows& xq, int64_t m0, int64_t nb, float32x4_t (*y)[2]) {
  constexpr int64_t gb = kX8Rows * block_bytes(T);
  float32x4_t acc[R][2], accm[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = accm[r][0] = accm[r][1] = vdupq_n_f32(0.f);
  for (int64_t s = 0; s < nb / 8; ++s) {
    const uint8_t* sb = group + s * gb;
    __builtin_prefetch(sb + gb);
    float32x4_t dsb[2], dmin[2];
    fp16x8(sb + x8_field_at(T, T == DType::Q4_K ? 0 : 3), dsb);  // Q4_K: field 0, Q6_K: field 3
    if constexpr (T == DType::Q4_K) fp16x8(sb + x8_field_at(T, 1), dmin);
    for (int j = 0; j < 8; ++j) {
      const int64_t b = 8 * s + j;
      int8x16_t x[R][2];
      int32x4_t I[R][2][2];
      for (int r = 0; r < R; ++r) {
        const int8_t* xr = xq.qrow(m0 + r) + b * 32;
        x[r][0] = vld1q_s8(xr), x[r][1] = vld1q_s8(xr + 16);
        I[r][0][0] = I[r][0][1] = I[r][1][0] = I[r][1][1] = vdupq_n_s32(0);
      }
      float32x4_t d[2], m[2];
      int32x4_t sum[R][2];
      if constexpr (T == DType::Q4_K) {
        const uint8_t* sc = sb + x8_field_at(T, 2);
        uint32x4_t scj[2], mj[2], a[2], c[2];
        if (j < 4) {
          bytes8_u32(sc + 8 * j, a), bytes8_u32(sc + 8 * (j + 4), c);
          for (int h = 0; h < 2; ++h)
            scj[h] = vandq_u32(a[h], vdupq_n_u32(63)), mj[h] = vandq_u32(c[h], vdupq_n_u32(63));
        } else {
          uint32x4_t lo_sc[2], lo_m[2];
          bytes8_u32(sc + 8 * (j + 4), c), bytes8_u32(sc + 8 * (j - 4), lo_sc), bytes8_u32(sc + 8 * j, lo_m);
          for (int h = 0; h < 2; ++h) {
            scj[h] = vorrq_u32(vandq_u32(c[h], vdupq_n_u32(15)), vshlq_n_u32(vshrq_n_u32(lo_sc[h], 6), 4));
            mj[h] = vorrq_u32(vshrq_n_u32(c[h], 4), vshlq_n_u32(vshrq_n_u32(lo_m[h], 6), 4));
          }
        }
        for (int h = 0; h < 2; ++h) {
          d[h] = vmulq_f32(dsb[h], vcvtq_f32_u32(scj[h]));
          m[h] = vnegq_f32(vmulq_f32(dmin[h], vcvtq_f32_u32(mj[h])));
        }
        const int8x16_t sl = vdupq_n_s8(int8_t(-4 * (j % 2)));
        x8k_chunks_from<T, kSdot, R, 0>(sb + x8_field_at(T, 3) + 32 * 8 * (j / 2), nullptr, sl, sl, x, I);
        for (int r = 0; r < R; ++r)
          for (int h = 0; h < 2; ++h) sum[r][h] = vaddq_s32(I[r][0][h], I[r][1][h]);
      } else {  // Q6_K
        const int hh = j / 4, g = j % 4;
        const int8x16_t sl = vdupq_n_s8(int8_t(g >= 2 ? -4 : 0)), sh = vdupq_n_s8(int8_t(-2 * g));
        x8k_chunks_from<T, kSdot, R, 0>(sb + 32 * (16 * hh + 8 * (g & 1)), sb + x8_field_at(T, 1) + 32 * 8 * hh, sl, sh,
                                        x, I);
        const int16x8_t m0w = vmovl_s8(vld1_s8(reinterpret_cast<const int8_t*>(sb + x8_field_at(T, 2) + 16 * j)));
        const int16x8_t m1w = vmovl_s8(vld1_s8(reinterpret_cast<const int8_t*>(sb + x8_field_at(T, 2) + 16 * j + 8)));
        const int32x4_t mul0[2] = {vmovl_s16(vget_low_s16(m0w)), vmovl_high_s16(m0w)};
        const int32x4_t mul1[2] = {vmovl_s16(vget_low_s16(m1w)), vmovl_high_s16(m1w)};
        for (int r = 0; r < R; ++r)
          for (int h = 0; h < 2; ++h) sum[r][h] = vmlaq_s32(vmulq_s32(I[r][0][h], mul0[h]), I[r][1][h], mul1[h]);
        d[0] = dsb[0], d[1] = dsb[1];
      }
      for (int r = 0; r < R; ++r) {
        const float dx = xq.dxrow(m0 + r)[b];
        for (int h = 0; h < 2; ++h) {
          acc[r][h] = vfmaq_f32(acc[r][h], vcvtq_f32_s32(sum[r][h]), vmulq_n_f32(d[h], dx));
          if constexpr (T == DType::Q4_K) accm[r][h] = vfmaq_n_f32(accm[r][h], m[h], xq.srow(m0 + r)[b]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h) y[r][h] = vaddq_f32(acc[r][h], accm[r][h]);
}

// Columns [n0, n1) in groups of 8 (x8_columns: in place, or gathered through a row map; only
// then can n1 - n0 end in a partial group).
template <DType T, bool kSdot, int R>
inline void x8_rows(const LinearArgs& a, const QuantRows& xq, int64_t m0, int64_t n0, int64_t n1) {
  const int64_t nb = a.K / 32;
  thread_local std::vector<uint8_t> gathered;
  for (int64_t n = n0; n < n1; n += kX8Rows) {
    float32x4_t y[R][2];
    if constexpr (block_elems(T) == 256)
      x8_tile_k<T, kSdot, R>(x8_columns(a, n, n1, gathered), xq, m0, nb, y);
    else
      x8_tile<T, kSdot, R>(x8_columns(a, n, n1, gathered), xq, m0, nb, y);
    const int64_t cols = std::min<int64_t>(kX8Rows, n1 - n);
    for (int r = 0; r < R; ++r) {
      float out[kX8Rows];
      vst1q_f32(out, y[r][0]);
      vst1q_f32(out + 4, y[r][1]);
      for (int64_t c = 0; c < cols; ++c) a.y[(m0 + r) * a.y_stride + n + c] = a.bias ? out[c] + a.bias[n + c] : out[c];
    }
  }
}

// ---- dispatch -----------------------------------------------------------------------------

// Columns [n0, n1) of rows m.., in groups of R rows (a group shares each decoded block), the
// rest in smaller groups: the rows as a template argument; any grouping gives the same bits.
template <DType T, bool kSdot, bool kX8, int R>
inline void gguf_row_groups(const LinearArgs& a, const QuantRows& xq, int64_t m, int64_t n0, int64_t n1) {
  for (; m + R <= a.M; m += R) {
    if constexpr (kX8)
      x8_rows<T, kSdot, R>(a, xq, m, n0, n1);
    else
      gguf_rows<T, kSdot, R>(a, xq, m, n0, n1);
  }
  if constexpr (R > 1) gguf_row_groups<T, kSdot, kX8, R - 1>(a, xq, m, n0, n1);
}

// gguf_row_groups over [n0, n1), where the rows make more than one group in chunks of
// kColumnChunk columns (whole x8 groups and tiles from n0), all the groups over one chunk before
// the next: a verify pass of 3 rows (1 + 2 drafts) read every matrix twice, the 30 MB LM head
// from memory each time; chunked, each part once, then from the caches (on x86 with these
// groups of 2: the LM head at 3 rows 0.75x the time, at 5 rows 0.67x; bench/RESULTS.md,
// "Column chunks on NEON"). The same bits: each column's products are the same.
constexpr int64_t kColumnChunk = 64;
template <DType T, bool kSdot, bool kX8, int R>
inline void gguf_chunks(const LinearArgs& a, const QuantRows& xq, int64_t n0, int64_t n1) {
  if (a.M <= R) return gguf_row_groups<T, kSdot, kX8, R>(a, xq, 0, n0, n1);
  for (int64_t c = n0; c < n1; c += kColumnChunk)
    gguf_row_groups<T, kSdot, kX8, R>(a, xq, 0, c, std::min(n1, c + kColumnChunk));
}

// Rows sharing a decoded block: 2 in both layouts. File layout: 8 int8x16 of weights beside
// the rows, in the 32 vector registers with GCC at 2 (3 or 4 spill on the plain path and for
// Q6_K). x8: 8 registers a row (x, I, acc, accm); at 2 a few accumulators go to the stack
// (Q4_1's offset chains), one load and store per block.
constexpr int kGgufRows = 2, kGgufRowsX8 = 2;

template <bool kSdot>
inline void gguf_linear_variant(const LinearArgs& a, const QuantRows& xq, int64_t n0, int64_t n1) {
  switch (a.w_dtype) {
    case DType::Q4_0: return gguf_chunks<DType::Q4_0, kSdot, false, kGgufRows>(a, xq, n0, n1);
    case DType::Q4_1: return gguf_chunks<DType::Q4_1, kSdot, false, kGgufRows>(a, xq, n0, n1);
    case DType::Q5_0: return gguf_chunks<DType::Q5_0, kSdot, false, kGgufRows>(a, xq, n0, n1);
    case DType::Q8_0: return gguf_chunks<DType::Q8_0, kSdot, false, kGgufRows>(a, xq, n0, n1);
    case DType::Q4_K: return gguf_chunks<DType::Q4_K, kSdot, false, kGgufRows>(a, xq, n0, n1);
    case DType::Q6_K: return gguf_chunks<DType::Q6_K, kSdot, false, kGgufRows>(a, xq, n0, n1);
    case DType::Q4_0_X8: return gguf_chunks<DType::Q4_0, kSdot, true, kGgufRowsX8>(a, xq, n0, n1);
    case DType::Q4_1_X8: return gguf_chunks<DType::Q4_1, kSdot, true, kGgufRowsX8>(a, xq, n0, n1);
    case DType::Q8_0_X8: return gguf_chunks<DType::Q8_0, kSdot, true, kGgufRowsX8>(a, xq, n0, n1);
    case DType::Q4_K_X8: return gguf_chunks<DType::Q4_K, kSdot, true, kGgufRowsX8>(a, xq, n0, n1);
    case DType::Q6_K_X8: return gguf_chunks<DType::Q6_K, kSdot, true, kGgufRowsX8>(a, xq, n0, n1);
    default: return generic::gguf_linear(a, xq, n0, n1);  // not a block type: never reached
  }
}

// The entry points: flatten functions into which everything above is inlined (the SDOT
// helpers only into the dotprod one, whose target allows them).
__attribute__((flatten)) inline void gguf_linear_neon_plain(const LinearArgs& a, const QuantRows& xq, int64_t n0,
                                                            int64_t n1) {
  gguf_linear_variant<false>(a, xq, n0, n1);
}
#if defined(MTP_NEON_DOTPROD)
MTP_TARGET_NEON_DOTPROD __attribute__((flatten)) inline void gguf_linear_neon_sdot(const LinearArgs& a,
                                                                                   const QuantRows& xq, int64_t n0,
                                                                                   int64_t n1) {
  gguf_linear_variant<true>(a, xq, n0, n1);
}
#endif

// Neon / NeonFp16: SDOT where the CPU has it (the same bits either way).
inline void gguf_linear(Neon, const LinearArgs& a, const QuantRows& xq, int64_t n0, int64_t n1) {
#if defined(MTP_NEON_DOTPROD)
  if (has_neon_dotprod()) return gguf_linear_neon_sdot(a, xq, n0, n1);
#endif
  gguf_linear_neon_plain(a, xq, n0, n1);
}

}  // namespace mtp::neon
