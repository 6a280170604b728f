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

// quantize_x (int8 weights only): each activation row is quantized to int8 blocks of 32 like
// the weights (row-local: quantize_row_q8 in linear.h, reference.quantize_rows_q8), then
// multiplied with exact integer dot products per block. The kernels read a quantized row as
// groups of kXqGroup elements: kXqGroup int8 values, then their blocks' fp32 scales (72
// bytes), the row padded with zero values and zero scales to whole groups (so every ISA's
// chunk, 32 or 64 elements, is whole: no scalar tail).
constexpr int64_t kXqGroup = 64, kXqGroupBytes = kXqGroup + kXqGroup / kQ8Block * 4;
inline int64_t xq_row_bytes(int64_t K) { return (K + kXqGroup - 1) / kXqGroup * kXqGroupBytes; }
// Element k's int8 value and its block's scale in a quantized row.
inline int8_t* xq_value(void* row, int64_t k) {
  return static_cast<int8_t*>(row) + k / kXqGroup * kXqGroupBytes + k % kXqGroup;
}
inline float* xq_scale(void* row, int64_t k) {
  return reinterpret_cast<float*>(static_cast<char*>(row) + k / kXqGroup * kXqGroupBytes + kXqGroup) +
         k % kXqGroup / kQ8Block;
}
inline const int8_t* xq_value(const void* row, int64_t k) { return xq_value(const_cast<void*>(row), k); }
inline const float* xq_scale(const void* row, int64_t k) { return xq_scale(const_cast<void*>(row), k); }

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
  // [N] or nullptr: output column n reads weight row w_rows[n] (and its scales) in place,
  // not row n (the MTP head's draft vocabulary: a subset of the LM head, never copied)
  const int64_t* w_rows = nullptr;
  const float* bias = nullptr;  // [N] fp32 or nullptr
  float* y = nullptr;           // [M, N] fp32, rows y_stride apart
  int64_t y_stride = 0;
  bool quantize_x = false;  // w_dtype I8 only: integer dot products on row-quantized x (above)
};

// The weight row that output column n reads.
MTP_HOST_DEVICE inline int64_t weight_row(const LinearArgs& a, int64_t n) { return a.w_rows ? a.w_rows[n] : n; }

// with_dtype for the linear layer's weight: the float types, plus I8 (Q8 blocks). Only the
// CPU linear kernels instantiate I8.
template <class Fn>
inline void with_weight_dtype(DType dt, Fn&& fn) {
  if (dt == DType::I8) return fn(std::integral_constant<DType, DType::I8>{});
  with_dtype(dt, fn);
}

}  // namespace mtp
