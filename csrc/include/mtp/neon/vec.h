// Shared NEON helpers (aarch64, armv8.0-a): fp32/bf16/fp16 loads widened to fp32 lanes, and
// the vector traits (V128) the simd/ kernels are written over.
#pragma once
#include <arm_neon.h>

#include <algorithm>
#include <cstring>

#include "mtp/common.h"
#include "mtp/isa.h"

namespace mtp::neon {

// 4 fp32 lanes from element i: bf16 widened by a shift, fp16 by FCVTL (exact).
template <DType T>
inline float32x4_t load4(const void* x, int64_t i) {
  if constexpr (T == DType::F32) {
    return vld1q_f32(static_cast<const float*>(x) + i);
  } else {
    uint16x4_t h = vld1_u16(static_cast<const uint16_t*>(x) + i);
    if constexpr (T == DType::BF16)
      return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
    else
      return vcvt_f32_f16(vreinterpret_f16_u16(h));
  }
}

// 4 lanes; acc tiles of 4 rows x 16 columns (16 of the 32 vector registers); linear tiles of
// up to 8 rows x linear_cols(rows) columns (4 to 16 accumulators).
// NEON has no masked loads: a tail mask is the lane count, and partial vectors go
// through a small buffer (never reading or writing past the given lanes).
struct V128 {
  using F = float32x4_t;
  using Mask = int;
  static constexpr int W = 4, kAccRows = 4, kLinearRows = 8;
  static constexpr int linear_cols(int rows, bool) { return rows <= 4 ? 4 : 2; }
  static void prefetch(const char* p) { __builtin_prefetch(p, 0, 3); }     // PRFM PLDL1KEEP
  static void prefetch_l2(const char* p) { __builtin_prefetch(p, 0, 2); }  // PRFM PLDL2KEEP
  static F zero() { return vdupq_n_f32(0.f); }
  static F set1(float x) { return vdupq_n_f32(x); }
  static F loadu(const float* p) { return vld1q_f32(p); }
  template <DType T>
  static F load(const void* p, int64_t i) {
    return load4<T>(p, i);
  }
  static void storeu(float* p, F v) { vst1q_f32(p, v); }
  static F add(F a, F b) { return vaddq_f32(a, b); }
  static F sub(F a, F b) { return vsubq_f32(a, b); }
  static F mul(F a, F b) { return vmulq_f32(a, b); }
  static F max(F a, F b) { return vmaxq_f32(a, b); }
  static F fmadd(F a, F b, F c) { return vfmaq_f32(c, a, b); }   // a*b + c, fused
  static F fnmadd(F a, F b, F c) { return vfmsq_f32(c, a, b); }  // c - a*b, fused
  static F round(F x) { return vrndnq_f32(x); }                  // to nearest, ties to even
  static F pow2i(F n) {                                          // 2^n for integral n in [-126, 127]
    return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127)), 23));
  }
  static F where_ge(F x, F lo, F v) {
    return vreinterpretq_f32_u32(vandq_u32(vcgeq_f32(x, lo), vreinterpretq_u32_f32(v)));
  }
  static Mask tail(int64_t left) { return int(std::min<int64_t>(left, W)); }
  static F load_tail(const float* p, Mask m, F fill) {
    if (m == W) return vld1q_f32(p);
    float b[W];
    vst1q_f32(b, fill);
    std::memcpy(b, p, sizeof(float) * size_t(m));
    return vld1q_f32(b);
  }
  static void store_tail(float* p, Mask m, F v) {
    if (m == W) return vst1q_f32(p, v);
    float b[W];
    vst1q_f32(b, v);
    std::memcpy(p, b, sizeof(float) * size_t(m));
  }
  static float hsum(F v) { return vaddvq_f32(v); }  // (l0 + l1) + (l2 + l3)
  static float hmax(F v) { return vmaxvq_f32(v); }
  // Lane i = the sum of a[i]'s 4 lanes by the tree (l0 + l1) + (l2 + l3), whatever the
  // other vectors hold (pairwise adds).
  static F sum_each(const F* a) { return vpaddq_f32(vpaddq_f32(a[0], a[1]), vpaddq_f32(a[2], a[3])); }
  // 4 int8 at p widened to fp32 lanes (exact): SXTL twice, then SCVTF.
  static F load_i8(const int8_t* p) {
    int32_t u;
    std::memcpy(&u, p, 4);
    const int16x8_t h = vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(u)));
    return vcvtq_f32_s32(vmovl_s16(vget_low_s16(h)));
  }
};

}  // namespace mtp::neon
