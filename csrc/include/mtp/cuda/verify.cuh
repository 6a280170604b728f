// CUDA kernels of verify and accept_prefix, torch-free.
//   1. argmax_partials: one block per (request, position) row and vocabulary slice. When the
//      row is unit-stride, each thread reads 16-byte vectors (8 bf16/fp16 or 4 fp32) j, j + 256,
//      ... of the slice's aligned middle, kArgmaxUnroll loads in flight, with element-by-element
//      reads for the unaligned head and the tail; otherwise element by element. Then a
//      block-wide argmax. Rows past num_drafts[b] are never read.
//   2. verify_finish: one block per request, one warp per row merges the row's slices, then
//      one thread applies the shared accept/emit rule of verify_args.h.
// argmax_combine is order-free, so neither the visiting order nor the reduction tree shows.
#pragma once
#include "mtp/cuda/common.cuh"
#include "mtp/verify_args.h"

namespace mtp::cuda {

constexpr int kArgmaxThreads = 256;
constexpr int kArgmaxUnroll = 4;  // 16-byte loads in flight per thread
constexpr int kFinishThreads = 128;

// The 16 / sizeof(T) elements of a 16-byte vector, widened to fp32 (exact, as load_f32).
template <DType T>
__device__ __forceinline__ void unpack16(const uint4& q, float (&f)[T == DType::F32 ? 4 : 8]) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if constexpr (T == DType::F32) {
      f[k] = __uint_as_float(w[k]);
    } else if constexpr (T == DType::BF16) {  // little-endian: the lower half is the earlier element
      f[2 * k] = __uint_as_float(w[k] << 16);
      f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    } else {
      f[2 * k] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[k] & 0xffffu)));
      f[2 * k + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[k] >> 16)));
    }
  }
}

// Folds the elements i, i + 1, ... of one 16-byte vector into r. Each thread visits increasing
// indices, so an element equal to r.val comes later and loses: only a larger one or a NaN can
// win (except against the initial {-inf, hi}, which the caller fixes once per slice). A vector
// holding a NaN (rare) takes the exact rule element by element.
template <DType T>
__device__ __forceinline__ void fold16(ArgmaxResult& r, const uint4& q, int64_t i) {
  constexpr int E = T == DType::F32 ? 4 : 8;
  float f[E];
  unpack16<T>(q, f);
  bool nan = false;
#pragma unroll
  for (int e = 0; e < E; ++e) nan |= f[e] != f[e];
  if (nan) {
#pragma unroll
    for (int e = 0; e < E; ++e) r = argmax_combine(r, ArgmaxResult{f[e], i + e, f[e] != f[e]});
    return;
  }
  float m = f[0];
  int at = 0;
#pragma unroll
  for (int e = 1; e < E; ++e) {
    if (f[e] > m) {
      m = f[e];
      at = e;
    }
  }
  if (m > r.val) {  // false once r.nan (r.val is NaN)
    r.val = m;
    r.idx = i + at;
  }
}

template <DType T>
__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_partials_kernel(VerifyArgs a, int64_t chunk, int splits, ArgmaxResult* partials) {
  const int64_t row = blockIdx.x, b = row / (a.K + 1), t = row % (a.K + 1);
  if (t > clamp_drafts(a.num_drafts, b, a.K)) return;  // unreachable position: not read
  const int64_t lo = int64_t(blockIdx.y) * chunk;
  const int64_t hi = lo + chunk < a.V ? lo + chunk : a.V;
  constexpr int64_t es = T == DType::F32 ? 4 : 2, E = 16 / es;  // element size, elements per vector
  const char* base = static_cast<const char*>(a.logits) + logits_row(a, b, t) * es;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(base);
  ArgmaxResult r{-__int_as_float(0x7f800000), hi, false};
  const auto scalar = [&](int64_t i) {
    const float v = load_f32<T>(base, i * a.logits_stride[2]);
    r = argmax_combine(r, ArgmaxResult{v, i, v != v});
  };
  if (a.logits_stride[2] == 1 && addr % es == 0) {
    // Element i is 16-byte aligned iff (addr / es + i) % E == 0: [v0, v1) is read in vectors.
    const int64_t mis = int64_t(addr % 16 / es);
    int64_t v0 = lo + (E - (mis + lo) % E) % E;
    if (v0 > hi) v0 = hi;
    const int64_t nvec = (hi - v0) / E, v1 = v0 + nvec * E;
    for (int64_t i = lo + threadIdx.x; i < v0; i += blockDim.x) scalar(i);
    const uint4* vec = reinterpret_cast<const uint4*>(base + v0 * es);
    for (int64_t j = threadIdx.x; j < nvec; j += kArgmaxUnroll * blockDim.x) {
      uint4 q[kArgmaxUnroll] = {};
#pragma unroll
      for (int u = 0; u < kArgmaxUnroll; ++u)
        if (j + u * blockDim.x < nvec) q[u] = __ldg(vec + j + u * blockDim.x);
#pragma unroll
      for (int u = 0; u < kArgmaxUnroll; ++u)
        if (j + u * blockDim.x < nvec) fold16<T>(r, q[u], v0 + (j + u * blockDim.x) * E);
    }
    for (int64_t i = v1 + threadIdx.x; i < hi; i += blockDim.x) scalar(i);
  } else {
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) scalar(i);
  }
  r = block_argmax(r);
  if (threadIdx.x == 0) {
    // Neither a NaN nor anything above -inf: every element is -inf, and the first one wins.
    if (!r.nan && r.val == -__int_as_float(0x7f800000) && lo < hi) r.idx = lo;
    partials[row * splits + blockIdx.y] = r;
  }
}

// One block per request (kFinishThreads threads): warp w merges the slices of rows w, w + 4, ...
template <class I>
__global__ void __launch_bounds__(kFinishThreads)
    verify_finish_kernel(VerifyArgs a, IdView<const I> draft, int64_t pad, I* accepted, IdView<I> out, int splits,
                         const ArgmaxResult* partials, int64_t* targets) {
  const int64_t b = blockIdx.x;
  const int64_t T = a.K + 1, nd = clamp_drafts(a.num_drafts, b, a.K);
  int64_t* target = targets + b * T;
  const int lane = threadIdx.x % 32;
  for (int64_t t = threadIdx.x / 32; t <= nd; t += blockDim.x / 32) {  // whole warps
    const ArgmaxResult* p = partials + (b * T + t) * splits;
    ArgmaxResult r = p[lane < splits ? lane : 0];  // a slice taken twice changes nothing
    for (int s = lane + 32; s < splits; s += 32) r = argmax_combine(r, p[s]);
    r = warp_argmax(r);
    if (lane == 0) target[t] = r.idx;
  }
  __syncthreads();  // makes the targets (global memory) visible to thread 0
  if (threadIdx.x != 0) return;
  const int64_t n = accept_length(draft.row(b), draft.stride[1], target, 1, nd);
  accepted[b] = I(n);
  emit_tokens(draft.row(b), draft.stride[1], target, 1, a.K, n, pad, out.row(b), out.stride[1]);
}

template <class I, class J>
__global__ void accept_prefix_kernel(int64_t B, int64_t K, IdView<const I> draft, IdView<const J> target,
                                     const int64_t* num_drafts, I* accepted) {
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= B) return;
  accepted[b] =
      I(accept_length(draft.row(b), draft.stride[1], target.row(b), target.stride[1], clamp_drafts(num_drafts, b, K)));
}

}  // namespace mtp::cuda
