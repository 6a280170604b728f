// The arguments of the shape-invariant linear layer, shared by the CPU core and the CUDA
// launcher (no CPU intrinsics here).
#pragma once
#include <cstdint>

#include "mtp/common.h"

namespace mtp {

struct LinearArgs {
  int64_t M = 0, N = 0, K = 0;
  const void* x = nullptr;  // [M, K], rows x_stride apart, unit inner stride
  DType x_dtype = DType::F32;
  int64_t x_stride = 0;
  const void* w = nullptr;  // [N, K], rows w_stride apart, unit inner stride
  DType w_dtype = DType::F32;
  int64_t w_stride = 0;
  const float* bias = nullptr;  // [N] fp32 or nullptr
  float* y = nullptr;           // [M, N] fp32, rows y_stride apart
  int64_t y_stride = 0;
};

}  // namespace mtp

