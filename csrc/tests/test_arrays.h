// Float arrays of any dtype and 4-D views of them, shared by test_head_attention.cpp and
// test_linear.cpp.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "mtp/common.h"
#include "mtp/mtp.h"
#include "test_util.h"

// Values are stored in the dtype (rounded by common.h) and read back exactly, so the oracle
// sees the very inputs the kernel does.
struct Arr {
  mtp_dtype t;
  std::vector<uint16_t> h;
  std::vector<float> f;
  Arr(mtp_dtype t, size_t n, float fill = 0.f) : t(t) {
    t == MTP_FLOAT32 ? f.assign(n, fill) : h.assign(n, 0);
    if (t != MTP_FLOAT32)
      for (size_t i = 0; i < n; ++i) set(i, fill);
  }
  size_t size() const { return t == MTP_FLOAT32 ? f.size() : h.size(); }
  void* data() { return t == MTP_FLOAT32 ? static_cast<void*>(f.data()) : static_cast<void*>(h.data()); }
  void set(size_t i, float v) { mtp::store_f32(data(), mtp::DType(int(t)), int64_t(i), v); }
  double get(size_t i) const {
    return t == MTP_FLOAT32 ? f[i] : mtp::load_f32(h.data(), mtp::DType(int(t)), int64_t(i));
  }
  uint32_t bits(size_t i) const {
    if (t != MTP_FLOAT32) return h[i];
    uint32_t u;
    std::memcpy(&u, &f[i], 4);
    return u;
  }
  void randomize(float lo, float hi) {
    for (size_t i = 0; i < size(); ++i) set(i, float(std::uniform_real_distribution<double>(lo, hi)(rng)));
  }
};

// |got - want| <= atol + rtol * |want|: fp32 arithmetic in another order, then the rounding
// to the output dtype (bf16: 2^-9 relative, fp16: 2^-12).
inline bool close(double got, double want, mtp_dtype out, double atol32) {
  const double rtol = out == MTP_FLOAT32 ? 1e-5 : out == MTP_BFLOAT16 ? 8e-3 : 1e-3;
  return std::fabs(got - want) <= atol32 + rtol * std::fabs(want);
}

inline int64_t dot_offset(const int64_t* idx, const int64_t* strides, int n) {
  int64_t o = 0;
  for (int d = 0; d < n; ++d) o += idx[d] * strides[d];
  return o;
}

// A 4-D view of `sizes` inside arr at `strides` (element strides), offset `base`.
inline mtp_tensor view4(Arr& arr, const int64_t* sizes, const int64_t* strides, int64_t base = 0) {
  mtp_tensor v{};
  v.data = static_cast<char*>(arr.data()) + base * (arr.t == MTP_FLOAT32 ? 4 : 2);
  v.dtype = arr.t;
  v.ndim = 4;
  for (int d = 0; d < 4; ++d) {
    v.sizes[d] = sizes[d];
    v.strides[d] = strides[d];
  }
  return v;
}
