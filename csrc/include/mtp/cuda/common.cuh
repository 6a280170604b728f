// Device helpers shared by the CUDA kernels: exact widening loads and the warp/block
// argmax reduction under argmax_combine (order-free, so the reduction tree is invisible).
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "mtp/argmax_rule.h"
#include "mtp/common.h"

namespace mtp::cuda {

// Element i of an fp32/bf16/fp16 array widened to fp32 (exact).
template <DType T>
__device__ __forceinline__ float load_f32(const void* p, int64_t i) {
  if constexpr (T == DType::F32) {
    return static_cast<const float*>(p)[i];
  } else if constexpr (T == DType::BF16) {
    return __uint_as_float(uint32_t(static_cast<const uint16_t*>(p)[i]) << 16);
  } else {
    return __half2float(__ushort_as_half(static_cast<const uint16_t*>(p)[i]));
  }
}

__device__ __forceinline__ ArgmaxResult warp_argmax(ArgmaxResult r) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    ArgmaxResult o;
    o.val = __shfl_xor_sync(0xffffffffu, r.val, offset);
    o.idx = __shfl_xor_sync(0xffffffffu, static_cast<long long>(r.idx), offset);
    o.nan = __shfl_xor_sync(0xffffffffu, int(r.nan), offset) != 0;
    r = argmax_combine(r, o);
  }
  return r;
}

// Every thread passes its partial result; thread 0 gets the block's. blockDim.x is a
// multiple of 32, at most 1024.
__device__ inline ArgmaxResult block_argmax(ArgmaxResult r) {
  __shared__ ArgmaxResult warps[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  r = warp_argmax(r);
  if (lane == 0) warps[warp] = r;
  __syncthreads();
  if (warp == 0) {
    const int nwarps = blockDim.x / 32;
    r = lane < nwarps ? warps[lane] : warps[0];
    r = warp_argmax(r);
  }
  return r;
}

__device__ __forceinline__ int64_t clamp_drafts(const int64_t* num_drafts, int64_t b, int64_t K) {
  if (!num_drafts) return K;
  const int64_t n = num_drafts[b];
  return n < 0 ? 0 : n > K ? K : n;
}

}  // namespace mtp::cuda
