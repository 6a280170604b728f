// The arguments of the shape-invariant linear layer, shared by the CPU core and the CUDA
// launcher (no CPU intrinsics here).
#pragma once
#include <cstdint>
#include <type_traits>

#include "mtp/common.h"

namespace mtp {

// Weight-only int8 ("Q8", like ggml's Q8_0): an int8 weight [N, K] comes with fp32 scales
// [N, q8_blocks(K)], one per block of kQ8Block elements along K (the last block may be
// partial); weight element (n, k) = w[n, k] * w_scale[n, k / kQ8Block].
constexpr int64_t kQ8Block = 32;
MTP_HOST_DEVICE inline int64_t q8_blocks(int64_t K) { return (K + kQ8Block - 1) / kQ8Block; }

struct LinearArgs {
  int64_t M = 0, N = 0, K = 0;
  const void* x = nullptr;  // [M, K], rows x_stride apart, unit inner stride
  DType x_dtype = DType::F32;
  int64_t x_stride = 0;
  const void* w = nullptr;  // [N, K], rows w_stride apart, unit inner stride
  DType w_dtype = DType::F32;
  int64_t w_stride = 0;
  const float* w_scale = nullptr;  // w_dtype I8 only: [N, q8_blocks(K)], rows w_scale_stride apart, unit inner stride
  int64_t w_scale_stride = 0;
  const float* bias = nullptr;  // [N] fp32 or nullptr
  float* y = nullptr;           // [M, N] fp32, rows y_stride apart
  int64_t y_stride = 0;
};

// with_dtype for the linear layer's weight: the float types, plus I8 (Q8 blocks). Only the
// CPU linear kernels instantiate I8.
template <class Fn>
inline void with_weight_dtype(DType dt, Fn&& fn) {
  if (dt == DType::I8) return fn(std::integral_constant<DType, DType::I8>{});
  with_dtype(dt, fn);
}

}  // namespace mtp
