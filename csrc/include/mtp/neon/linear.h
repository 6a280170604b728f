// NEON linear: the simd/ kernel over the V128 traits, fp32 arithmetic (bf16 and fp16
// weights or activations widened to fp32 on load, fp32 accumulation). Isa::NeonFp16 runs
// this same path: fp16 accumulation would lose the precision the reduction needs.
#pragma once
#include <cstring>

#include "mtp/isa.h"
#include "mtp/neon/vec.h"
#include "mtp/simd/linear.h"

namespace mtp::neon {

MTP_LINEAR_ENTRY_POINT(Neon, V128)

// ---- quantize_x: integer dot products (simd::Int8DotBase). A chunk is one block of 32
// elements, two int8x16 halves; int32 lane l is the sum of the products of elements 4l..4l+3
// and 16+4l..16+4l+3 (x and q are both signed: no offset, any int8 q, -128 included). With
// FEAT_DotProd: two SDOTs from zero. Without: SMULL / SMULL2 (int16 products, |x q| <=
// 127 * 128), ADDP of adjacent products (|pair| <= 32512: no int16 overflow), SADDLP to the
// int32 quads, SADALP for the second half. Both exact: the same integers, so the same bits.
// The block then enters the accumulator as acc = fma(float(lanes), x_scale * w_scale, acc).

#if defined(MTP_NEON_DOTPROD)
// acc += the dot products of 4 s8 x s8 per int32 lane (SDOT). Out of line with its own target
// so that the step keeps the baseline one (the SMULL variant must compile without dotprod);
// flatten inlines it into the dotprod entry point.
MTP_TARGET_NEON_DOTPROD inline void sdot(int32x4_t& acc, const int8x16_t& a, const int8x16_t& b) {
  acc = vdotq_s32(acc, a, b);
}
#endif

template <bool kSdot>
struct Int8Dot128 : simd::Int8DotBase {
  static constexpr int kChunk = int(kQ8Block);
  struct X {
    int8x16_t lo, hi;
    float scale;
  };
  using Wt = X;
  static void load_x(X& out, const void* row, int64_t k) {
    const int8_t* p = xq(row, k);
    out.lo = vld1q_s8(p);
    out.hi = vld1q_s8(p + 16);
    out.scale = *xs(row, k);
  }
  static void load_w(Wt& out, Col w, int64_t k) {
    const int64_t left = w.K - k;
    int8_t tail[32];  // the last, partial block: zeros past K (NEON has no masked load)
    const int8_t* p = w.q + k;
    if (left < 32) {
      std::memset(tail, 0, sizeof tail);
      p = static_cast<const int8_t*>(std::memcpy(tail, p, size_t(left)));
    }
    out.lo = vld1q_s8(p);
    out.hi = vld1q_s8(p + 16);
    out.scale = w.s[k / kQ8Block];
  }
  // The 8 sums of adjacent products of a and b (elements 2i, 2i+1).
  static void pairs(int16x8_t& out, const int8x16_t& a, const int8x16_t& b) {
    out = vpaddq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)), vmull_high_s8(a, b));
  }
  static void step(float32x4_t& acc, const X& x, const Wt& w) {
    int32x4_t sums;
    if constexpr (kSdot) {
#if defined(MTP_NEON_DOTPROD)
      sums = vdupq_n_s32(0);
      sdot(sums, x.lo, w.lo);
      sdot(sums, x.hi, w.hi);
#endif
    } else {
      int16x8_t p;
      pairs(p, x.lo, w.lo);
      sums = vpaddlq_s16(p);
      pairs(p, x.hi, w.hi);
      sums = vpadalq_s16(sums, p);
    }
    acc = vfmaq_f32(acc, vcvtq_f32_s32(sums), vdupq_n_f32(x.scale * w.scale));
  }
};

MTP_LINEAR_Q8DOT_ENTRY_POINT(, V128, linear_q8dot_neon_smull, Int8Dot128<false>)
#if defined(MTP_NEON_DOTPROD)
MTP_LINEAR_Q8DOT_ENTRY_POINT(MTP_TARGET_NEON_DOTPROD, V128, linear_q8dot_neon_sdot, Int8Dot128<true>)
#endif

// quantize_x on Neon / NeonFp16: SDOT where the CPU has it (the same bits either way).
inline void linear_q8dot(Neon, const LinearArgs& a, int64_t n0, int64_t n1) {
#if defined(MTP_NEON_DOTPROD)
  if (has_neon_dotprod()) return linear_q8dot_neon_sdot(a, n0, n1);
#endif
  linear_q8dot_neon_smull(a, n0, n1);
}

}  // namespace mtp::neon
