// NEON argmax for contiguous rows on generic::argmax_blocks. FMAX/FMAXV propagate NaN, so
// a block's maximum is NaN exactly when the block holds one: no separate NaN mask.
// fp32 and bf16 (widened by a shift) reduce in fp32; fp16 reduces in fp16 arithmetic on
// armv8.2-a (Isa::NeonFp16; the max of fp16 values is an fp16 value, so it is exact) or is
// widened to fp32 with FCVTL (armv8.0-a) otherwise. All paths return the same index.
#pragma once
#include <arm_neon.h>

#include "mtp/generic/argmax.h"
#include "mtp/neon/vec.h"  // load4

namespace mtp::neon {

// fp32 arithmetic, four accumulators of 4 lanes.
template <DType T>
inline float block_max_f32(const void* x, int64_t i, bool* has_nan) {
  float32x4_t m0 = load4<T>(x, i), m1 = load4<T>(x, i + 4);
  float32x4_t m2 = load4<T>(x, i + 8), m3 = load4<T>(x, i + 12);
  for (int64_t j = 16; j < generic::kArgmaxBlock; j += 16) {
    m0 = vmaxq_f32(m0, load4<T>(x, i + j));
    m1 = vmaxq_f32(m1, load4<T>(x, i + j + 4));
    m2 = vmaxq_f32(m2, load4<T>(x, i + j + 8));
    m3 = vmaxq_f32(m3, load4<T>(x, i + j + 12));
  }
  float m = vmaxvq_f32(vmaxq_f32(vmaxq_f32(m0, m1), vmaxq_f32(m2, m3)));
  *has_nan = m != m;
  return m;
}

#if MTP_NEON_FP16
// fp16 arithmetic, four accumulators of 8 lanes: twice the lanes of the widening path.
MTP_TARGET(NeonFp16) inline float block_max_f16(const void* x, int64_t i, bool* has_nan) {
  const float16_t* p = reinterpret_cast<const float16_t*>(static_cast<const uint16_t*>(x) + i);
  float16x8_t m0 = vld1q_f16(p), m1 = vld1q_f16(p + 8), m2 = vld1q_f16(p + 16), m3 = vld1q_f16(p + 24);
  for (int64_t j = 32; j < generic::kArgmaxBlock; j += 32) {
    m0 = vmaxq_f16(m0, vld1q_f16(p + j));
    m1 = vmaxq_f16(m1, vld1q_f16(p + j + 8));
    m2 = vmaxq_f16(m2, vld1q_f16(p + j + 16));
    m3 = vmaxq_f16(m3, vld1q_f16(p + j + 24));
  }
  float m = float(vmaxvq_f16(vmaxq_f16(vmaxq_f16(m0, m1), vmaxq_f16(m2, m3))));
  *has_nan = m != m;
  return m;
}
#endif

inline ArgmaxResult argmax(Neon, const void* x, DType dt, int64_t begin, int64_t end) {
  return with_dtype(dt, [&](auto t) {
    return generic::argmax_blocks<decltype(t)::value>(
        x, begin, end, [x](int64_t i, bool* nan) { return block_max_f32<decltype(t)::value>(x, i, nan); });
  });
}

#if MTP_NEON_FP16
// NeonFp16 reduces fp16 rows in fp16, the others as Neon.
inline ArgmaxResult argmax(NeonFp16, const void* x, DType dt, int64_t begin, int64_t end) {
  if (dt != DType::F16) return argmax(Neon{}, x, dt, begin, end);
  return generic::argmax_blocks<DType::F16>(x, begin, end,
                                            [x](int64_t i, bool* nan) { return block_max_f16(x, i, nan); });
}
#endif

}  // namespace mtp::neon
