// The arguments of the row-local layer ops (mtp/rowwise.h): RMSNorm with the residual add
// fused, RoPE, SiLU-gated product. Outputs never overlap inputs (rope rotates x in place).
#pragma once
#include <cstdint>

#include "mtp/common.h"

namespace mtp {

// Lanes of the RMSNorm sum of squares: element k adds into lane k % kNormLanes.
constexpr int kNormLanes = 16;

struct RmsNormArgs {
  int64_t M = 0, H = 0;      // M rows of H elements
  DType dtype = DType::F32;  // of x, residual, sum and out
  const void* x = nullptr;   // [M, H], rows x_stride apart, unit inner stride
  int64_t x_stride = 0;
  const void* residual = nullptr;  // [M, H] or nullptr (then sum is not written)
  int64_t residual_stride = 0;
  void* sum = nullptr;  // [M, H]: x + residual rounded to dtype
  int64_t sum_stride = 0;
  void* out = nullptr;  // [M, H]
  int64_t out_stride = 0;
  const void* weight = nullptr;  // [H], unit stride
  DType w_dtype = DType::F32;
  float eps = 0.f;
};

struct RopeArgs {
  int64_t B = 0, T = 0, H = 0, D = 0;  // D even: element i pairs with i + D/2
  DType dtype = DType::F32;
  void* x = nullptr;  // [B, T, H, D], element strides, rotated in place
  int64_t x_stride[4] = {0, 0, 0, 0};
  const float* cos = nullptr;  // [B, T, D] fp32, element strides
  const float* sin = nullptr;
  int64_t cos_stride[3] = {0, 0, 0}, sin_stride[3] = {0, 0, 0};
};

struct SiluMulArgs {
  int64_t M = 0, I = 0;      // M rows of 2I inputs (gate, then up) and I outputs
  DType dtype = DType::F32;  // of x and out
  const void* x = nullptr;   // [M, 2I], rows x_stride apart, unit inner stride
  int64_t x_stride = 0;
  void* out = nullptr;  // [M, I]
  int64_t out_stride = 0;
};

}  // namespace mtp
