// CUDA kernels of head_attention (split-KV decode attention) and cache_append, torch-free.
//
// Exactness as on the CPU (mtp/attention.h): each output row (b, t, h) is a function of its
// own visible keys only.
//  1. attention_chunk_kernel: one block per (b, kv head, RT query rows) and chunk of
//     kAttnChunk keys at a fixed absolute position (the local segment's chunks after the
//     cache's). The rows r = t * G + g of the tile share every K/V load. The block's 256
//     threads form NG = 256 / LPK key groups of LPK lanes; lane s of a group holds the head
//     dims [8s, 8s + 8) of a key or value row (one 16-byte load of bf16/fp16 when the rows
//     allow it, else 8 element loads: the same values). LPK depends on D alone (D <= 8 * LPK).
//     A row sees keys [lo, n) of the chunk (lo > 0 only with a sliding window). Per row, in
//     orders that depend only on D and its own range:
//       score(r, j): lane s sums its 8 q[d] * k[j][d] in order (fmaf), then a fixed
//                    xor-butterfly over the group's LPK lanes;
//       m, l:        max (exact) and the sum of expf(s - m) (lane l: keys lo + l, lo + l + 32,
//                    ... in order, butterfly);
//       acc(r, d):   group g sums p_j * v[j][d] over its keys j = g (mod NG) in order (only
//                    keys the row sees), then the NG groups' sums are added in group order.
//     Which rows share the block (and RT) never enters a row's arithmetic.
//  2. attention_merge_kernel: one block per output row folds its chunk partials strictly left
//     to right (cache, then local; kMergeChunks at a time staged in shared memory), then
//     normalises; no visible key: zeros; a non-finite score or value: the whole row NaN (the
//     contract of reference.head_attention).
// cache_append: one block per (b, kv head, t) copies the bits of one key and one value row.
#pragma once
#include <cuda_bf16.h>
#include <cuda_pipeline.h>

#include "mtp/attention_args.h"
#include "mtp/cache.h"
#include "mtp/cuda/common.cuh"
#include "mtp/cuda/launch.h"

namespace mtp::cuda {

constexpr int kAttnThreads = 256;
constexpr int kAttnWarps = kAttnThreads / 32;
constexpr int kVec = 8;  // head-dim elements per lane of a key / value row (16 bytes of bf16)
constexpr int kMergeThreads = 128;
constexpr int kMergeChunks = 32;  // chunk partials a merge block stages at a time
constexpr int kAppendThreads = 128;
// A chunk's K and V rows are staged in shared memory (async copies, all in flight at once) when
// a row is whole 16-byte pieces of at most kStageRowBytes: 2 x 256 rows of 256 bytes = 128 KB.
constexpr int64_t kStageRowBytes = 256;
constexpr int64_t stage_row_bytes(int64_t D, int64_t es) {
  return D * es <= kStageRowBytes && (D * es) % 16 == 0 ? D * es : 0;
}

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
  return (bh * w.chunks + c) * (w.row_blocks * w.block_rows) + r;
}

// Two 16-bit elements of a 32-bit word (little-endian: the lower one first) as fp32, exact.
template <DType T>
__device__ __forceinline__ void widen2(uint32_t word, float& lo, float& hi) {
  if constexpr (T == DType::BF16) {
    lo = __uint_as_float(word << 16);
    hi = __uint_as_float(word & 0xffff0000u);
  } else {
    lo = __half2float(__ushort_as_half(static_cast<unsigned short>(word & 0xffffu)));
    hi = __half2float(__ushort_as_half(static_cast<unsigned short>(word >> 16)));
  }
}

// Elements [d0, d0 + kVec) of the row at `row` (bytes) as fp32, zero past D. vec: the row
// has unit stride and 16-byte alignment (row and row stride), so whole vectors are loaded
// with 16-byte loads; either way the values are the same.
template <DType T>
__device__ __forceinline__ void load_vec(const char* row, int64_t d_stride, int64_t D, int64_t d0, bool vec,
                                         float (&out)[kVec]) {
  if (vec && d0 + kVec <= D) {
    if constexpr (T == DType::F32) {
      const float4* p = reinterpret_cast<const float4*>(row) + d0 / 4;
      const float4 x = p[0], y = p[1];
      out[0] = x.x, out[1] = x.y, out[2] = x.z, out[3] = x.w;
      out[4] = y.x, out[5] = y.y, out[6] = y.z, out[7] = y.w;
    } else {
      const uint4 x = *reinterpret_cast<const uint4*>(row + d0 * 2);
      widen2<T>(x.x, out[0], out[1]);
      widen2<T>(x.y, out[2], out[3]);
      widen2<T>(x.z, out[4], out[5]);
      widen2<T>(x.w, out[6], out[7]);
    }
  } else {
#pragma unroll
    for (int e = 0; e < kVec; ++e) out[e] = d0 + e < D ? load_f32<T>(row, (d0 + e) * d_stride) : 0.f;
  }
}

// Whether every row j of a [.., j, d] view at `base` (bytes; row stride js, head-dim stride
// ds, in elements) can be read with 16-byte loads.
__device__ __forceinline__ bool vec_rows(const char* base, int64_t js, int64_t ds, int64_t elem) {
  return ds == 1 && reinterpret_cast<uintptr_t>(base) % 16 == 0 && (js * elem) % 16 == 0;
}

// Issues async copies of rows [j0, j1) of a chunk at `src` (row stride rs bytes) into `dst`
// (row j at j * rb bytes), in 16-byte pieces, as one commit group.
__device__ __forceinline__ void stage_rows(char* dst, const char* src, int64_t rs, int rb, int j0, int j1) {
  const int pieces = rb / 16;
  for (int i = threadIdx.x; i < (j1 - j0) * pieces; i += blockDim.x) {
    const int j = j0 + i / pieces, o = (i % pieces) * 16;
    __pipeline_memcpy_async(dst + j * rb + o, src + j * rs + o, 16);
  }
  __pipeline_commit();
}

// LPK: lanes per key row (D <= 8 * LPK); RT: query rows per block. STAGE: K and V rows come
// through shared memory (dynamic, 2 * kAttnChunk * D * es bytes) when the caches allow 16-byte
// loads; the values, and so every row's arithmetic, are the same either way.
template <DType T, int LPK, int RT, bool STAGE>
__global__ void __launch_bounds__(kAttnThreads, 2) attention_chunk_kernel(AttentionArgs a, AttentionWork w) {
  constexpr int NG = kAttnThreads / LPK;          // key groups
  constexpr int DP = LPK * kVec;                  // head dims held by a group (>= D)
  constexpr int kKeysInFlight = RT <= 4 ? 4 : 2;  // rows each group loads before it uses the first (registers)
  __shared__ int cnt[RT], first[RT];              // the row sees keys [first, cnt) of this chunk
  __shared__ __align__(16) float qs[RT][DP];      // q rows, fp32, zero past D
  __shared__ float ps[RT][kAttnChunk];            // scores, then exp(s - m)
  __shared__ float red[NG][DP];                   // the groups' sums of one row
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = tid / LPK, s = tid % LPK;
  const int64_t G = a.Hq / a.Hkv, R = G * a.T, D = a.D;
  const int64_t bh = blockIdx.x / w.row_blocks, r0 = (blockIdx.x % w.row_blocks) * RT;
  const int64_t b = bh / a.Hkv, h = bh % a.Hkv;
  for (int i = tid; i < RT * DP; i += kAttnThreads) {
    const int64_t r = r0 + i / DP, d = i % DP;
    float x = 0.f;
    if (r < R && d < D) {
      const int64_t t = r / G, hq = h * G + r % G;
      x = load_f32<T>(a.q, b * a.q_stride[0] + t * a.q_stride[1] + hq * a.q_stride[2] + d * a.q_stride[3]);
    }
    qs[i / DP][d] = x;
  }
  // The q rows stay in shared memory (broadcast reads): in registers they pushed the
  // accumulators into local memory (spills).
  const int64_t es = dtype_size(a.dtype);

  // Chunks y, y + gridDim.y, ...: the grid may cover the capacity (no host sync for the
  // lengths), so most of a short request's chunks cost one pass over cnt.
  for (int64_t c = blockIdx.y; c < w.chunks; c += gridDim.y) {
    const bool local = c >= w.cache_chunks;
    const int64_t c0 = (local ? c - w.cache_chunks : c) * kAttnChunk;
    __syncthreads();  // the last chunk's cnt, first and ps are consumed
    if (tid < RT) {
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
    __syncthreads();
    int nmax = 0, jmin = kAttnChunk;  // the tile reads keys [jmin, nmax)
#pragma unroll
    for (int r = 0; r < RT; ++r) {
      nmax = cnt[r] > nmax ? cnt[r] : nmax;
      if (cnt[r] > 0) jmin = first[r] < jmin ? first[r] : jmin;
    }
    if (nmax == 0) continue;  // no row of the tile reads this chunk (uniform over the block)
    // Stride values, not a pointer into the kernel's arguments (that copies them to local memory).
    const int64_t kj = local ? a.kl_stride[2] : a.k_stride[2], kd = local ? a.kl_stride[3] : a.k_stride[3];
    const int64_t vj = local ? a.vl_stride[2] : a.v_stride[2], vd = local ? a.vl_stride[3] : a.v_stride[3];
    const int64_t k0 = local ? b * a.kl_stride[0] + h * a.kl_stride[1] : b * a.k_stride[0] + h * a.k_stride[1];
    const int64_t v0 = local ? b * a.vl_stride[0] + h * a.vl_stride[1] : b * a.v_stride[0] + h * a.v_stride[1];
    const char* kb = static_cast<const char*>(local ? a.k_local : a.k) + (k0 + c0 * kj) * es;
    const char* vb = static_cast<const char*>(local ? a.v_local : a.v) + (v0 + c0 * vj) * es;
    const bool kvec = vec_rows(kb, kj, kd, es), vvec = vec_rows(vb, vj, vd, es);
    // Staged: every K and V row the tile reads is requested now; the scores wait for K only.
    extern __shared__ __align__(16) char stage[];
    const int rb = int(D * es);
    const bool staged = STAGE && kvec && vvec;
    if (staged) {
      stage_rows(stage, kb, kj * es, rb, jmin, nmax);
      stage_rows(stage + kAttnChunk * rb, vb, vj * es, rb, jmin, nmax);
      __pipeline_wait_prior(1);
      __syncthreads();
    }
    // 1. Scores: group g takes keys jmin + g, jmin + g + NG, ...; each key row is loaded once
    //    for every row of the tile. The loop bounds are uniform over the block, so the
    //    butterflies run in whole warps (a key past nmax is zeros and stored nowhere).
    for (int jb = jmin; jb < nmax; jb += NG * kKeysInFlight) {
      float kr[kKeysInFlight][kVec];
#pragma unroll
      for (int u = 0; u < kKeysInFlight; ++u) {
        const int j = jb + u * NG + g;
        if (j < nmax) {
          if (staged)
            load_vec<T>(stage + j * rb, 1, D, s * kVec, true, kr[u]);
          else
            load_vec<T>(kb + j * kj * es, kd, D, s * kVec, kvec, kr[u]);
        } else {
#pragma unroll
          for (int e = 0; e < kVec; ++e) kr[u][e] = 0.f;
        }
      }
#pragma unroll
      for (int u = 0; u < kKeysInFlight; ++u) {
        const int j = jb + u * NG + g;
#pragma unroll
        for (int r = 0; r < RT; ++r) {
          const float4 q0 = *reinterpret_cast<const float4*>(&qs[r][s * kVec]);
          const float4 q1 = *reinterpret_cast<const float4*>(&qs[r][s * kVec + 4]);
          const float q8[kVec] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
          float x = 0.f;
#pragma unroll
          for (int e = 0; e < kVec; ++e) x = fmaf(q8[e], kr[u][e], x);
#pragma unroll
          for (int o = LPK / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
          if (s == 0 && j >= first[r] && j < cnt[r]) ps[r][j] = x * a.scale;
        }
      }
    }
    __syncthreads();

    // 2. Per row: m, p = exp(s - m) in place, l; l = NaN when a score is not finite (-inf
    //    included: the row's output is NaN, see the merge).
    for (int r = warp; r < RT; r += kAttnWarps) {
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
    if (staged) __pipeline_wait_prior(0);  // this thread's V copies; the barrier publishes everyone's
    __syncthreads();

    // 3. acc = sum_j p_j v_j: group g takes keys j = g (mod NG) whatever jmin is (a row's sums
    //    never depend on the tile); each value row is loaded once.
    float acc[RT][kVec];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[r][e] = 0.f;
    for (int jb = jmin - jmin % NG; jb < nmax; jb += NG * kKeysInFlight) {
      float vr[kKeysInFlight][kVec];
#pragma unroll
      for (int u = 0; u < kKeysInFlight; ++u) {
        const int j = jb + u * NG + g;
        if (j >= jmin && j < nmax) {
          if (staged)
            load_vec<T>(stage + (kAttnChunk + j) * rb, 1, D, s * kVec, true, vr[u]);
          else
            load_vec<T>(vb + j * vj * es, vd, D, s * kVec, vvec, vr[u]);
        } else {
#pragma unroll
          for (int e = 0; e < kVec; ++e) vr[u][e] = 0.f;
        }
      }
#pragma unroll
      for (int u = 0; u < kKeysInFlight; ++u) {
        const int j = jb + u * NG + g;
#pragma unroll
        for (int r = 0; r < RT; ++r) {
          if (j < first[r] || j >= cnt[r]) continue;  // keys the row does not see add nothing (not even 0 * inf)
          const float p = ps[r][j];
#pragma unroll
          for (int e = 0; e < kVec; ++e) acc[r][e] = fmaf(p, vr[u][e], acc[r][e]);
        }
      }
    }
    // The groups' sums of each row, added in group order.
#pragma unroll
    for (int r = 0; r < RT; ++r) {
      if (cnt[r] == 0) continue;  // uniform over the block
#pragma unroll
      for (int e = 0; e < kVec; ++e) red[g][s * kVec + e] = acc[r][e];
      __syncthreads();
      float* out = w.acc + partial_index(w, bh, c, r0 + r) * D;
      for (int d = tid; d < D; d += kAttnThreads) {
        float x = red[0][d];
        for (int k = 1; k < NG; ++k) x += red[k][d];
        out[d] = x;
      }
      __syncthreads();
    }
  }
}

// One block per output row (b * T + t) * Hq + hq; thread i owns head dims i, i + 128. Each
// segment of kMergeChunks partials is loaded into registers at once (every load in flight:
// a long cache's row folds hundreds of partials), then folded in order.
template <DType T>
__global__ void __launch_bounds__(kMergeThreads) attention_merge_kernel(AttentionArgs a, AttentionWork w) {
  constexpr int DPT = kAttnMaxD / kMergeThreads;  // head dims per thread
  __shared__ float ms[kMergeChunks], ls[kMergeChunks];
  __shared__ int64_t ps[kMergeChunks];  // the segment's partial indexes
  const int tid = threadIdx.x;
  const int64_t row = blockIdx.x, D = a.D;
  const int64_t G = a.Hq / a.Hkv, hq = row % a.Hq, t = (row / a.Hq) % a.T, b = row / (a.Hq * a.T);
  const int64_t bh = b * a.Hkv + hq / G, r = t * G + hq % G;
  const int64_t vis = visible_cache(a, b, t), cf = first_visible(a, vis) / kAttnChunk;
  const int64_t nc = attn_chunks(vis) - cf, n = nc + attn_chunks(visible_local(a, t));
  // The i-th partial of the row: cache chunks [cf, cf + nc), then the local segment's.
  auto chunk = [&](int64_t i) { return i < nc ? cf + i : w.cache_chunks + (i - nc); };
  float m = 0.f, l = 0.f, acc[DPT];
#pragma unroll
  for (int i = 0; i < DPT; ++i) acc[i] = 0.f;
  for (int64_t i0 = 0; i0 < n; i0 += kMergeChunks) {
    const int cn = int(n - i0 < kMergeChunks ? n - i0 : kMergeChunks);
    __syncthreads();  // the last segment is folded
    if (tid < cn) {
      const int64_t p = partial_index(w, bh, chunk(i0 + tid), r);
      ps[tid] = p;
      ms[tid] = w.ml[2 * p];
      ls[tid] = w.ml[2 * p + 1];
    }
    __syncthreads();
    float v[kMergeChunks][DPT];
#pragma unroll
    for (int i = 0; i < kMergeChunks; ++i)
#pragma unroll
      for (int k = 0; k < DPT; ++k) {
        const int d = k * kMergeThreads + tid;
        v[i][k] = i < cn && d < D ? w.acc[ps[i] * D + d] : 0.f;
      }
    // Folds partial i (later keys than the state); the row's first one is copied. Every
    // product rounds before the sum (no contraction: the CPU merge's formula).
#pragma unroll
    for (int i = 0; i < kMergeChunks; ++i) {
      if (i >= cn) break;
      const bool any = i0 + i > 0;
      const float pm = ms[i], pl = ls[i];
      const float mn = any ? fmaxf(m, pm) : pm;
      const float x = any ? expf(m - mn) : 0.f, y = any ? expf(pm - mn) : 1.f;
#pragma unroll
      for (int k = 0; k < DPT; ++k) acc[k] = any ? __fadd_rn(__fmul_rn(acc[k], x), __fmul_rn(v[i][k], y)) : v[i][k];
      l = any ? __fadd_rn(__fmul_rn(l, x), __fmul_rn(pl, y)) : pl;
      m = mn;
    }
  }
  // A row is finite or all NaN (as write_row in attention.h): a NaN l (a non-finite score) or a
  // non-finite acc element (a non-finite value: inf or 0 * inf = NaN) makes every element NaN.
  bool finite = n == 0 || isfinite(l);
#pragma unroll
  for (int k = 0; k < DPT; ++k) finite = finite && (n == 0 || k * kMergeThreads + tid >= D || isfinite(acc[k]));
  finite = __syncthreads_and(finite) != 0;
#pragma unroll
  for (int k = 0; k < DPT; ++k) {
    const int d = k * kMergeThreads + tid;
    if (d < D) store_f32<T>(a.out, row * D + d, n == 0 ? 0.f : finite ? acc[k] / l : __int_as_float(0x7fc00000));
  }
}

// Block (b * Hkv + h, t) copies k_new[b, t, h] and v_new[b, t, h]. Every block checks every
// request first and writes nothing if one would pass the capacity (the lengths are checked
// on the device before, without a host sync, and recorded; see launch.h ValueCheck).
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
