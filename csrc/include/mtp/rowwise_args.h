// The arguments of the row-local layer ops (mtp/rowwise.h): RMSNorm with the residual add
// fused, RoPE, the gated product of the MLP (SiLU or tanh-GELU). Outputs never overlap inputs
// (rope rotates x in place).
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

// The activation of the gate in a gated MLP product act(gate) * up.
enum class GatedAct : int32_t {
  Silu = 0,      // silu(g) = g / (1 + e^-g): Llama (mtp.silu_mul)
  GeluTanh = 1,  // gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))): Gemma 3 (mtp.gelu_tanh_mul)
};

struct GatedMulArgs {
  GatedAct act = GatedAct::Silu;
  int64_t M = 0, I = 0;      // M rows of 2I inputs (gate, then up) and I outputs
  DType dtype = DType::F32;  // of x and out
  const void* x = nullptr;   // [M, 2I], rows x_stride apart, unit inner stride
  int64_t x_stride = 0;
  void* out = nullptr;  // [M, I]
  int64_t out_stride = 0;
};

}  // namespace mtp
