// CUDA kernel of the shape-invariant linear layer, torch-free. One warp per output column
// n: lane l sums x[m, k] * w[n, k] over k = l, l + 32, ... in order (fmaf), then a fixed
// xor-butterfly over the 32 lanes (every lane ends with the same bits), bias last. That
// order is the same for every row m whatever M is; rows are taken kLinearRows at a time
// only to reuse each weight load.
#pragma once
#include "mtp/cuda/common.cuh"
#include "mtp/linear_args.h"

namespace mtp::cuda {

constexpr int kLinearWarps = 4;  // columns per block
constexpr int kLinearRows = 4;   // rows sharing one pass over a weight row

template <DType XT, DType WT>
__global__ void __launch_bounds__(kLinearWarps * 32) linear_kernel(LinearArgs a) {
  const int lane = threadIdx.x % 32;
  const int64_t n = int64_t(blockIdx.x) * kLinearWarps + threadIdx.x / 32;
  if (n >= a.N) return;  // whole warps leave together
  const char* w = static_cast<const char*>(a.w) + weight_row(a, n) * a.w_stride * (WT == DType::F32 ? 4 : 2);
  const int64_t xsize = XT == DType::F32 ? 4 : 2;
  for (int64_t m0 = 0; m0 < a.M; m0 += kLinearRows) {
    float acc[kLinearRows] = {};
    for (int64_t k = lane; k < a.K; k += 32) {
      const float wk = load_f32<WT>(w, k);
#pragma unroll
      for (int r = 0; r < kLinearRows; ++r)
        if (m0 + r < a.M)
          acc[r] = fmaf(load_f32<XT>(static_cast<const char*>(a.x) + (m0 + r) * a.x_stride * xsize, k), wk, acc[r]);
    }
#pragma unroll
    for (int r = 0; r < kLinearRows; ++r) {
      for (int offset = 16; offset > 0; offset >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], offset);
      if (lane == 0 && m0 + r < a.M) a.y[(m0 + r) * a.y_stride + n] = a.bias ? acc[r] + a.bias[n] : acc[r];
    }
  }
}

}  // namespace mtp::cuda
