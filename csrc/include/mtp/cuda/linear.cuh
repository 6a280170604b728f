// CUDA kernel of the shape-invariant linear layer, torch-free. K is cut into chunks of
// kLinearChunk k's at absolute positions (the last one shorter). In chunk c, output column n is
// summed by a group of 8 lanes: lane j sums x[m, k] * w[n, k] with fmaf over the chunk's k in
// [64 s + 8 j, 64 s + 8 j + 8) for s = 0, 1, ... in increasing order (the last step padded with
// zeros past K), then the group's 8 partial sums are added by a fixed xor-butterfly (offsets 4,
// 2, 1: every lane ends with the same bits) into the chunk's partial P_c. The output is
// ((P_0 + P_1) + P_2) + ..., bias last. That order depends on K alone: never on M, on the rows
// or columns sharing a block, or on the weight row's alignment (an aligned row's 8 weights come
// in one or two 16-byte loads, another row's one by one: the same values). A warp is 4 groups
// of 4 columns each; block (column block, chunk c) stages kLinearRows rows of x's chunk (as
// fp32) in shared memory at a time, and each weight load serves all those rows. With one chunk
// (K <= kLinearChunk) the block writes y. With more, either the block sums the chunks one after
// the other, or (linear_split: few columns, few rows) the chunks' blocks run side by side, so a
// grid of a few column blocks fills the GPU, and write P_c, which linear_sum_kernel adds: the
// same additions in the same order, so the same bits.
#pragma once
#include "mtp/cuda/common.cuh"
#include "mtp/linear_args.h"

namespace mtp::cuda {

constexpr int kLinearWarps = 4;                                   // warps per block
constexpr int kLinearCols = 4;                                    // columns per lane
constexpr int kLinearBlockCols = kLinearWarps * 4 * kLinearCols;  // 4 groups of 8 lanes per warp
constexpr int kLinearRows = 8;                                    // rows per pass over the weights
constexpr int kLinearChunk = 1024;                                // k's per chunk (a multiple of 64)
constexpr int kLinearSteps = 2;                                   // 64-wide steps loaded at once

// Eight consecutive weights w[k0 .. k0 + 8) of one row as raw words, zeros at k >= K.
template <DType T>
struct Weights8 {
  static constexpr int kWords = T == DType::F32 ? 8 : 4;
  uint32_t u[kWords];

  __device__ __forceinline__ void load(const char* row, int64_t k0, int64_t K, bool aligned) {
    if (aligned && k0 + 8 <= K) {
      const uint4* p = reinterpret_cast<const uint4*>(row + k0 * (T == DType::F32 ? 4 : 2));
#pragma unroll
      for (int h = 0; h < kWords / 4; ++h) {
        const uint4 q = __ldg(p + h);
        u[4 * h] = q.x, u[4 * h + 1] = q.y, u[4 * h + 2] = q.z, u[4 * h + 3] = q.w;
      }
      return;
    }
#pragma unroll
    for (int i = 0; i < kWords; ++i) u[i] = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (k0 + e >= K) break;
      if constexpr (T == DType::F32) {
        u[e] = reinterpret_cast<const uint32_t*>(row)[k0 + e];
      } else {  // little-endian words: the lower half holds the earlier element
        u[e / 2] |= uint32_t(reinterpret_cast<const uint16_t*>(row)[k0 + e]) << (16 * (e % 2));
      }
    }
  }

  // Weight k0 + e widened to fp32 (exact, as load_f32).
  __device__ __forceinline__ float get(int e) const {
    if constexpr (T == DType::F32) {
      return __uint_as_float(u[e]);
    } else if constexpr (T == DType::BF16) {
      return __uint_as_float(e % 2 ? u[e / 2] & 0xffff0000u : u[e / 2] << 16);
    } else {
      return __half2float(__ushort_as_half(static_cast<unsigned short>(e % 2 ? u[e / 2] >> 16 : u[e / 2] & 0xffffu)));
    }
  }
};

// Where x's k (relative to a multiple of 64) sits in shared memory: lane j's k's
// 64 s + 8 j + 4 h + q go to 64 s + 32 h + 4 j + q, so that each 16-byte read of the 8 lanes
// of a group covers 128 contiguous bytes (no bank conflict).
__device__ __forceinline__ int x_slot(int kk) {
  return (kk & ~63) | ((kk >> 2) & 1) << 5 | ((kk >> 3) & 7) << 2 | (kk & 3);
}

// Chunks of K: at least one (K = 0 gives bias or zeros).
MTP_HOST_DEVICE inline int64_t linear_chunks(int64_t K) {
  return K > kLinearChunk ? (K + kLinearChunk - 1) / kLinearChunk : 1;
}

// Whether the chunks run as blocks of their own: more than one, and a grid of few column blocks
// (N <= 256 blocks of 64 columns) at decode sizes (M <= 16), so the workspace stays small
// (chunks * M * N floats: 1 MB per chunk at most).
MTP_HOST_DEVICE inline bool linear_split(int64_t M, int64_t N, int64_t K) {
  return linear_chunks(K) > 1 && M <= 16 && N <= 256 * kLinearBlockCols;
}

// Grid (column blocks, linear_split ? chunks : 1). part: [chunks][M][N] fp32 when split.
template <DType XT, DType WT>
__global__ void __launch_bounds__(kLinearWarps * 32) linear_kernel(LinearArgs a, float* part) {
  __shared__ __align__(16) float xs[kLinearRows][kLinearChunk];
  // P_first + ... of each output, kept by the lane that writes it (j = 0 of the column's group):
  // in shared memory rather than registers, which the accumulators fill.
  __shared__ float total[kLinearRows][kLinearBlockCols];
  constexpr int64_t xsize = XT == DType::F32 ? 4 : 2, wsize = WT == DType::F32 ? 4 : 2;
  const int lane = threadIdx.x % 32, g = lane / 8, j = lane % 8;
  // This lane's columns: nw + 4 c + g. A column past N reads nothing (its K is 0) and is not
  // written, but its lanes still take part in the barriers and shuffles.
  const int wc = threadIdx.x / 32 * (4 * kLinearCols);  // the warp's first column in the block
  const int64_t nw = int64_t(blockIdx.x) * kLinearBlockCols + wc;
  const char* wrow[kLinearCols];
  int64_t wk[kLinearCols];
  bool waligned[kLinearCols];
#pragma unroll
  for (int c = 0; c < kLinearCols; ++c) {
    const int64_t n = nw + 4 * c + g;
    wrow[c] = static_cast<const char*>(a.w) + (n < a.N ? weight_row(a, n) * a.w_stride * wsize : 0);
    wk[c] = n < a.N ? a.K : 0;
    waligned[c] = reinterpret_cast<uintptr_t>(wrow[c]) % 16 == 0;
  }
  // This block's chunks: its own one when split, else all of them in order.
  const bool split = gridDim.y > 1;
  const int64_t c_first = split ? blockIdx.y : 0, c_end = split ? c_first + 1 : linear_chunks(a.K);
  for (int64_t m0 = 0; m0 < a.M; m0 += kLinearRows) {
    const int rows = int(a.M - m0 < kLinearRows ? a.M - m0 : kLinearRows);
    for (int64_t ci = c_first; ci < c_end; ++ci) {
      const int64_t kc = ci * kLinearChunk;
      float acc[kLinearCols][kLinearRows] = {};
      if (kc < a.K) {
        // k's [kc, kc + span) staged, zeros past K; span: a multiple of 64 (whole steps)
        const int span = int(a.K - kc < kLinearChunk ? (a.K - kc + 63) / 64 * 64 : kLinearChunk);
        // kLinearSteps 64-wide steps of weights [kc + s, ...): kLinearSteps * kLinearCols loads in flight
        Weights8<WT> w[kLinearSteps][kLinearCols];
        const auto load = [&](int s) {
#pragma unroll
          for (int u = 0; u < kLinearSteps; ++u)
#pragma unroll
            for (int c = 0; c < kLinearCols; ++c)
              if (s + 64 * u < span) w[u][c].load(wrow[c], kc + s + 64 * u + 8 * j, wk[c], waligned[c]);
        };
        load(0);          // in flight while x is staged
        __syncthreads();  // the previous chunk's readers are done
        for (int r = 0; r < rows; ++r) {
          const char* x = static_cast<const char*>(a.x) + (m0 + r) * a.x_stride * xsize;
          for (int kk = threadIdx.x; kk < span; kk += blockDim.x)
            xs[r][x_slot(kk)] = kc + kk < a.K ? load_f32<XT>(x, kc + kk) : 0.f;
        }
        __syncthreads();
        for (int s = 0; s < span; s += 64 * kLinearSteps) {
          if (s > 0) load(s);
#pragma unroll
          for (int u = 0; u < kLinearSteps; ++u) {
            if (s + 64 * u >= span) break;
#pragma unroll
            for (int r = 0; r < kLinearRows; ++r) {
              if (r >= rows) break;
              const float4 x0 = *reinterpret_cast<const float4*>(&xs[r][s + 64 * u + 4 * j]);
              const float4 x1 = *reinterpret_cast<const float4*>(&xs[r][s + 64 * u + 32 + 4 * j]);
              const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
              for (int c = 0; c < kLinearCols; ++c)
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[c][r] = fmaf(xv[e], w[u][c].get(e), acc[c][r]);
            }
          }
        }
      }
      // The chunk's partial P_c: the group's 8 lane sums by the butterfly, added to the total.
#pragma unroll
      for (int r = 0; r < kLinearRows; ++r) {
        if (r >= rows) break;
#pragma unroll
        for (int c = 0; c < kLinearCols; ++c) {
          float v = acc[c][r];
          for (int offset = 4; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
          float& t = total[r][wc + 4 * c + g];
          if (j == 0) t = ci == c_first ? v : t + v;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kLinearRows; ++r) {
      if (r >= rows) break;
#pragma unroll
      for (int c = 0; c < kLinearCols; ++c) {
        const int64_t n = nw + 4 * c + g;
        if (j != 0 || n >= a.N) continue;
        const float t = total[r][wc + 4 * c + g];
        if (split)
          part[(blockIdx.y * a.M + m0 + r) * a.N + n] = t;
        else
          a.y[(m0 + r) * a.y_stride + n] = a.bias ? t + a.bias[n] : t;
      }
    }
  }
}

// y[m, n] = ((P_0 + P_1) + P_2) + ... over the chunks in order, bias last; one thread per output.
__global__ void __launch_bounds__(256) linear_sum_kernel(LinearArgs a, const float* part, int64_t chunks) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.M * a.N) return;
  const int64_t m = i / a.N, n = i % a.N;
  float v = part[i];
  for (int64_t c = 1; c < chunks; ++c) v += part[c * a.M * a.N + i];
  a.y[m * a.y_stride + n] = a.bias ? v + a.bias[n] : v;
}

}  // namespace mtp::cuda
