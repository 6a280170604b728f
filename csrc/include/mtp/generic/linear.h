// Scalar linear: one sequential fp32 sum per output element; int8 (Q8) weights block by
// block: each block's products summed in fp32 in order, then acc += scale * block sum.
#pragma once
#include <cstdint>

#include "mtp/common.h"
#include "mtp/isa.h"
#include "mtp/linear_args.h"

namespace mtp::generic {

inline void linear_q8(const LinearArgs& a, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const int64_t row = weight_row(a, n);
    const int8_t* wn = static_cast<const int8_t*>(a.w) + row * a.w_stride;
    const float* sn = a.w_scale + row * a.w_scale_stride;
    for (int64_t m = 0; m < a.M; ++m) {
      const char* xm = static_cast<const char*>(a.x) + m * a.x_stride * dtype_size(a.x_dtype);
      float acc = 0.f;
      for (int64_t k0 = 0; k0 < a.K; k0 += kQ8Block) {
        const int64_t k1 = std::min(a.K, k0 + kQ8Block);
        float t = 0.f;
        for (int64_t k = k0; k < k1; ++k) t += load_f32(xm, a.x_dtype, k) * float(wn[k]);
        acc += sn[k0 / kQ8Block] * t;
      }
      a.y[m * a.y_stride + n] = a.bias ? acc + a.bias[n] : acc;
    }
  }
}

// quantize_x (x: quantized rows, linear_args.h): per block the exact int32 sum of products,
// then acc += float(sum) * (x scale * weight scale), blocks in order.
inline void linear_q8dot(const LinearArgs& a, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const int64_t row = weight_row(a, n);
    const int8_t* wn = static_cast<const int8_t*>(a.w) + row * a.w_stride;
    const float* sn = a.w_scale + row * a.w_scale_stride;
    for (int64_t m = 0; m < a.M; ++m) {
      const char* xm = static_cast<const char*>(a.x) + m * a.x_stride;
      float acc = 0.f;
      for (int64_t k0 = 0; k0 < a.K; k0 += kQ8Block) {
        const int64_t k1 = std::min(a.K, k0 + kQ8Block);
        const int8_t* xq = xq_value(xm, k0);
        int32_t t = 0;
        for (int64_t k = k0; k < k1; ++k) t += int32_t(xq[k - k0]) * int32_t(wn[k]);
        acc += float(t) * (*xq_scale(xm, k0) * sn[k0 / kQ8Block]);
      }
      a.y[m * a.y_stride + n] = a.bias ? acc + a.bias[n] : acc;
    }
  }
}

inline void linear(const LinearArgs& a, int64_t n0, int64_t n1) {
  if (a.x_dtype == DType::I8) return linear_q8dot(a, n0, n1);
  if (a.w_dtype == DType::I8) return linear_q8(a, n0, n1);
  for (int64_t n = n0; n < n1; ++n) {
    const char* wn = static_cast<const char*>(a.w) + weight_row(a, n) * a.w_stride * dtype_size(a.w_dtype);
    for (int64_t m = 0; m < a.M; ++m) {
      const char* xm = static_cast<const char*>(a.x) + m * a.x_stride * dtype_size(a.x_dtype);
      float acc = 0.f;
      for (int64_t k = 0; k < a.K; ++k) acc += load_f32(xm, a.x_dtype, k) * load_f32(wn, a.w_dtype, k);
      a.y[m * a.y_stride + n] = a.bias ? acc + a.bias[n] : acc;
    }
  }
}

// Every set without a vector path of its own (linear.h's dispatch).
inline void linear(Generic, const LinearArgs& a, int64_t n0, int64_t n1) { linear(a, n0, n1); }
inline void linear_q8dot(Generic, const LinearArgs& a, int64_t n0, int64_t n1) { linear_q8dot(a, n0, n1); }

}  // namespace mtp::generic
