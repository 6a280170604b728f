// Scalar linear: one sequential fp32 sum per output element.
#pragma once

namespace mtp::generic {

inline void linear(const LinearArgs& a, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const char* wn = static_cast<const char*>(a.w) + n * a.w_stride * dtype_size(a.w_dtype);
    for (int64_t m = 0; m < a.M; ++m) {
      const char* xm = static_cast<const char*>(a.x) + m * a.x_stride * dtype_size(a.x_dtype);
      float acc = 0.f;
      for (int64_t k = 0; k < a.K; ++k) acc += load_f32(xm, a.x_dtype, k) * load_f32(wn, a.w_dtype, k);
      a.y[m * a.y_stride + n] = a.bias ? acc + a.bias[n] : acc;
    }
  }
}

}  // namespace mtp::generic
