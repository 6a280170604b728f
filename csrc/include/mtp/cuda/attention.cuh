// CUDA kernels of head_attention (split-KV decode attention) and cache_append, torch-free.
//
// Exactness as on the CPU (mtp/attention.h): each output row (b, t, h) is a function of its
// own visible keys only.
//  1. attention_chunk_kernel: one block per (b, kv head, kAttnRows query rows) and chunk of
//     kAttnChunk keys at a fixed absolute position (the local segment's chunks after the
//     cache's). The rows r = t * G + g of the tile share every K/V load. A row sees keys
//     [lo, n) of the chunk (lo > 0 only with a sliding window); keys before the tile's first
//     lo are not read. Per row, in orders that depend only on the head dim and its own range:
//       score(r, j): lane l sums q[d] * k[j][d] over d = l, l + 32, ... (fmaf), then a fixed
//                    xor-butterfly (one warp per key);
//       m, l:        max (exact) and the sum of expf(s - m) (lane l: keys lo + l, lo + l + 32,
//                    ... in order, butterfly);
//       acc(r, d):   warp w sums p_j * v[j][d] over its keys j = w (mod 8) in order (only
//                    keys the row sees), then the 8 warps' sums are added in warp order.
//     Which rows share the block never enters a row's arithmetic.
//  2. attention_merge_kernel: one warp per output row folds its chunk partials strictly left
//     to right (cache, then local), then normalises; no visible key: zeros; a non-finite
//     score or value: the whole row NaN (the contract of reference.head_attention).
// cache_append: one block per (b, kv head, t) copies the bits of one key and one value row.
#pragma once
#include <cuda_bf16.h>

#include "mtp/attention_args.h"
#include "mtp/cache.h"
#include "mtp/cuda/common.cuh"
#include "mtp/cuda/launch.h"

namespace mtp::cuda {

constexpr int kAttnThreads = 256;
constexpr int kAttnWarps = kAttnThreads / 32;
constexpr int kMergeWarps = 4;  // output rows per merge block
constexpr int kAppendThreads = 128;

template <DType T>
__device__ __forceinline__ void store_f32(void* p, int64_t i, float v) {
  if constexpr (T == DType::F32) {
    static_cast<float*>(p)[i] = v;
  } else if constexpr (T == DType::BF16) {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);  // round to nearest even, as torch
  } else {
    static_cast<__half*>(p)[i] = __float2half_rn(v);
  }
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);  // every lane: the same bits
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// Index of the partial of (bh, chunk c, row r) in the workspace.
__device__ __forceinline__ int64_t partial_index(const AttentionWork& w, int64_t bh, int64_t c, int64_t r) {
  return (bh * w.chunks + c) * (w.row_blocks * kAttnRows) + r;
}

// Lane's elements d = lane, lane + 32, ... of the row at element `offset` of base, as fp32
// (zero past D).
template <DType T, int DPL>
__device__ __forceinline__ void load_row(const void* base, int64_t offset, int64_t d_stride, int64_t D, int lane,
                                         float (&out)[DPL]) {
#pragma unroll
  for (int i = 0; i < DPL; ++i) {
    const int d = i * 32 + lane;
    out[i] = d < D ? load_f32<T>(base, offset + d * d_stride) : 0.f;
  }
}

// DPL: head-dim elements per lane (D <= 32 * DPL).
template <DType T, int DPL>
__global__ void __launch_bounds__(kAttnThreads) attention_chunk_kernel(AttentionArgs a, AttentionWork w) {
  __shared__ int cnt[kAttnRows], first[kAttnRows];  // the row sees keys [first, cnt) of this chunk
  __shared__ float qs[kAttnRows][32 * DPL];         // q rows, fp32, zero past D
  __shared__ float ps[kAttnRows][kAttnChunk];       // scores, then exp(s - m)
  __shared__ float red[kAttnWarps][32 * DPL];       // per-warp sums of one row
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t G = a.Hq / a.Hkv, R = G * a.T, D = a.D;
  const int64_t bh = blockIdx.x / w.row_blocks, r0 = (blockIdx.x % w.row_blocks) * kAttnRows;
  const int64_t b = bh / a.Hkv, h = bh % a.Hkv, c = blockIdx.y;
  const bool local = c >= w.cache_chunks;
  const int64_t c0 = (local ? c - w.cache_chunks : c) * kAttnChunk;
  if (tid < kAttnRows) {
    int64_t n = 0, lo = 0;
    if (r0 + tid < R) {
      const int64_t t = (r0 + tid) / G, vis = local ? visible_local(a, t) : visible_cache(a, b, t);
      n = vis - c0;
      n = n < 0 ? 0 : n > kAttnChunk ? kAttnChunk : n;
      lo = local ? 0 : first_visible(a, vis) - c0;
      lo = lo < 0 ? 0 : lo > kAttnChunk ? kAttnChunk : lo;
      if (n <= lo) n = lo = 0;
    }
    cnt[tid] = int(n);
    first[tid] = int(lo);
  }
  for (int i = tid; i < kAttnRows * 32 * DPL; i += kAttnThreads) {
    const int64_t r = r0 + i / (32 * DPL), d = i % (32 * DPL);
    float x = 0.f;
    if (r < R && d < D) {
      const int64_t t = r / G, hq = h * G + r % G;
      x = load_f32<T>(a.q, b * a.q_stride[0] + t * a.q_stride[1] + hq * a.q_stride[2] + d * a.q_stride[3]);
    }
    qs[i / (32 * DPL)][d] = x;
  }
  __syncthreads();
  int nmax = 0, jmin = kAttnChunk;  // the tile reads keys [jmin, nmax)
  for (int r = 0; r < kAttnRows; ++r) {
    nmax = cnt[r] > nmax ? cnt[r] : nmax;
    if (cnt[r] > 0) jmin = first[r] < jmin ? first[r] : jmin;
  }
  if (nmax == 0) return;  // no row of the tile reads this chunk (uniform over the block)

  const int64_t* ks = local ? a.kl_stride : a.k_stride;
  const int64_t* vs = local ? a.vl_stride : a.v_stride;
  const int64_t es = dtype_size(a.dtype);
  const char* kb = static_cast<const char*>(local ? a.k_local : a.k) + (b * ks[0] + h * ks[1] + c0 * ks[2]) * es;
  const char* vb = static_cast<const char*>(local ? a.v_local : a.v) + (b * vs[0] + h * vs[1] + c0 * vs[2]) * es;

  // 1. Scores: one warp per key, the key row loaded once for every row of the tile.
  for (int j = jmin + warp; j < nmax; j += kAttnWarps) {
    float kr[DPL];
    load_row<T, DPL>(kb, j * ks[2], ks[3], D, lane, kr);
    for (int r = 0; r < kAttnRows; ++r) {
      if (j < first[r] || j >= cnt[r]) continue;  // uniform over the warp
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < DPL; ++i) s = fmaf(qs[r][i * 32 + lane], kr[i], s);
      s = warp_sum(s);
      if (lane == 0) ps[r][j] = s * a.scale;
    }
  }
  __syncthreads();

  // 2. Per row: m, p = exp(s - m) in place, l; l = NaN when a score is not finite (-inf
  //    included: the row's output is NaN, see the merge).
  for (int r = warp; r < kAttnRows; r += kAttnWarps) {
    const int n = cnt[r], lo = first[r];
    if (n == 0) continue;
    float m = -__int_as_float(0x7f800000);
    bool finite = true;
    for (int j = lo + lane; j < n; j += 32) {
      m = fmaxf(m, ps[r][j]);
      finite = finite && isfinite(ps[r][j]);
    }
    finite = __all_sync(0xffffffffu, finite);
    m = warp_max(m);
    float l = 0.f;
    for (int j = lo + lane; j < n; j += 32) {
      const float p = expf(ps[r][j] - m);
      ps[r][j] = p;
      l += p;
    }
    l = warp_sum(l);
    if (lane == 0) {
      float* ml = w.ml + 2 * partial_index(w, bh, c, r0 + r);
      ml[0] = m;
      ml[1] = finite ? l : __int_as_float(0x7fc00000);
    }
  }
  __syncthreads();

  // 3. acc = sum_j p_j v_j: warp w takes keys w, w + 8, ...; each value row loaded once.
  float acc[kAttnRows][DPL];
#pragma unroll
  for (int r = 0; r < kAttnRows; ++r)
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[r][i] = 0.f;
  // Key j goes to warp j % 8 whatever jmin is (a row's sums never depend on the tile).
  for (int j = jmin - jmin % kAttnWarps + warp; j < nmax; j += kAttnWarps) {
    if (j < jmin) continue;
    float vr[DPL];
    load_row<T, DPL>(vb, j * vs[2], vs[3], D, lane, vr);
#pragma unroll
    for (int r = 0; r < kAttnRows; ++r) {
      if (j < first[r] || j >= cnt[r]) continue;  // keys the row does not see add nothing (not even 0 * inf)
      const float p = ps[r][j];
#pragma unroll
      for (int i = 0; i < DPL; ++i) acc[r][i] = fmaf(p, vr[i], acc[r][i]);
    }
  }
  // The warps' sums of each row, added in warp order.
#pragma unroll
  for (int r = 0; r < kAttnRows; ++r) {
    if (cnt[r] == 0) continue;  // uniform over the block
#pragma unroll
    for (int i = 0; i < DPL; ++i) red[warp][i * 32 + lane] = acc[r][i];
    __syncthreads();
    float* out = w.acc + partial_index(w, bh, c, r0 + r) * D;
    for (int d = tid; d < D; d += kAttnThreads) {
      float s = red[0][d];
      for (int k = 1; k < kAttnWarps; ++k) s += red[k][d];
      out[d] = s;
    }
    __syncthreads();
  }
}

template <DType T, int DPL>
__global__ void __launch_bounds__(kMergeWarps * 32) attention_merge_kernel(AttentionArgs a, AttentionWork w) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kMergeWarps + threadIdx.x / 32;  // (b * T + t) * Hq + hq
  if (row >= a.B * a.T * a.Hq) return;                                       // whole warps leave together
  const int64_t G = a.Hq / a.Hkv, hq = row % a.Hq, t = (row / a.Hq) % a.T, b = row / (a.Hq * a.T);
  const int64_t bh = b * a.Hkv + hq / G, r = t * G + hq % G;
  float m = 0.f, l = 0.f, acc[DPL];
  bool any = false;
  // Folds chunk partial c (later keys than the state); the first one is copied.
  auto fold = [&](int64_t c) {
    const int64_t p = partial_index(w, bh, c, r);
    const float pm = w.ml[2 * p], pl = w.ml[2 * p + 1];
    const float* pa = w.acc + p * a.D;
    const float mn = any ? fmaxf(m, pm) : pm;
    const float x = any ? expf(m - mn) : 0.f, y = any ? expf(pm - mn) : 1.f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
      const int d = i * 32 + lane;
      const float v = d < a.D ? pa[d] : 0.f;
      acc[i] = any ? acc[i] * x + v * y : v;
    }
    l = any ? l * x + pl * y : pl;
    m = mn;
    any = true;
  };
  const int64_t vis = visible_cache(a, b, t), nc = attn_chunks(vis), nl = attn_chunks(visible_local(a, t));
  for (int64_t c = first_visible(a, vis) / kAttnChunk; c < nc; ++c) fold(c);
  for (int64_t c = 0; c < nl; ++c) fold(w.cache_chunks + c);
  // A row is finite or all NaN (as write_row in attention.h): a NaN l (a non-finite score) or a
  // non-finite acc element (a non-finite value: inf or 0 * inf = NaN) makes every element NaN.
  bool finite = !any || isfinite(l);
#pragma unroll
  for (int i = 0; i < DPL; ++i) finite = finite && (!any || i * 32 + lane >= a.D || isfinite(acc[i]));
  finite = __all_sync(0xffffffffu, finite);
#pragma unroll
  for (int i = 0; i < DPL; ++i) {
    const int d = i * 32 + lane;
    if (d < a.D) store_f32<T>(a.out, row * a.D + d, !any ? 0.f : finite ? acc[i] / l : __int_as_float(0x7fc00000));
  }
}

// Block (b * Hkv + h, t) copies k_new[b, t, h] and v_new[b, t, h]. Every block checks every
// request first and writes nothing if one would pass the capacity (the host check raises
// before; this guards a CUDA-graph replay with longer lengths).
template <class E>
__global__ void __launch_bounds__(kAppendThreads) cache_append_kernel(CacheAppendArgs a) {
  if (cache_append_overflow(a) >= 0) return;
  const int64_t b = blockIdx.x / a.Hkv, h = blockIdx.x % a.Hkv, t = blockIdx.y, pos = a.cache_lens[b] + t;
  auto copy = [&](void* cache, const int64_t* cs, const void* src, const int64_t* ss) {
    E* dst = static_cast<E*>(cache) + b * cs[0] + h * cs[1] + pos * cs[2];
    const E* from = static_cast<const E*>(src) + b * ss[0] + t * ss[1] + h * ss[2];
    for (int64_t d = threadIdx.x; d < a.D; d += blockDim.x) dst[d * cs[3]] = from[d * ss[3]];
  };
  copy(a.k, a.k_stride, a.k_new, a.kn_stride);
  copy(a.v, a.v_stride, a.v_new, a.vn_stride);
}

}  // namespace mtp::cuda
