// Launchers of the CUDA head_attention / cache_append kernels (mtp/cuda/attention.cuh), torch-free.
#include "mtp/cuda/attention.cuh"

namespace mtp::cuda {

AttentionWork attention_work(const AttentionArgs& a, int64_t longest_cache, int sm_count) {
  AttentionWork w;
  w.cache_chunks = attn_chunks(longest_cache);
  w.chunks = w.cache_chunks + attn_chunks(a.S);
  const int64_t rows = (a.Hq / a.Hkv) * a.T;
  w.block_rows = rows <= 4 ? 4 : 8;  // a decode step of GQA groups <= 4 wastes no row; more rows re-read K/V from L2
  w.row_blocks = (rows + w.block_rows - 1) / w.block_rows;
  w.partials = a.B * a.Hkv * w.chunks * w.row_blocks * w.block_rows;
  // About 8 waves of 2 blocks per SM; each block loops over its chunks, so a grid over a
  // mostly empty capacity costs few block launches.
  const int64_t tiles = a.B * a.Hkv * w.row_blocks, want = tiles ? (16 * int64_t(sm_count) + tiles - 1) / tiles : 1;
  w.chunk_blocks = w.chunks < want ? w.chunks : want < 65535 ? want : 65535;
  return w;
}

// Calls fn(integral_constant<int, LPK>): the lanes per key row for a.D (D <= kVec * LPK).
template <class Fn>
void with_lpk(int64_t D, Fn&& fn) {
  if (D <= 32)
    fn(std::integral_constant<int, 4>{});
  else if (D <= 64)
    fn(std::integral_constant<int, 8>{});
  else if (D <= 128)
    fn(std::integral_constant<int, 16>{});
  else
    fn(std::integral_constant<int, 32>{});
}

cudaError_t head_attention(const AttentionArgs& a, const AttentionWork& w, cudaStream_t stream) {
  if (a.B == 0 || a.T == 0 || a.Hq == 0 || a.D == 0) return cudaSuccess;
  with_dtype(a.dtype, [&](auto dt) {
    constexpr DType T = decltype(dt)::value;
    with_lpk(a.D, [&](auto lpk) {
      constexpr int LPK = decltype(lpk)::value;
      const dim3 grid(unsigned(a.B * a.Hkv * w.row_blocks), unsigned(w.chunk_blocks));
      if (w.chunks == 0) return;
      if (w.block_rows == 4)
        attention_chunk_kernel<T, LPK, 4><<<grid, kAttnThreads, 0, stream>>>(a, w);
      else
        attention_chunk_kernel<T, LPK, 8><<<grid, kAttnThreads, 0, stream>>>(a, w);
    });
    attention_merge_kernel<T><<<unsigned(a.B * a.T * a.Hq), kMergeThreads, 0, stream>>>(a, w);
  });
  return cudaGetLastError();
}

cudaError_t cache_append(const CacheAppendArgs& a, cudaStream_t stream) {
  if (a.B == 0 || a.T == 0 || a.Hkv == 0 || a.D == 0) return cudaSuccess;
  const dim3 grid(unsigned(a.B * a.Hkv), unsigned(a.T));
  if (a.dtype == DType::F32)
    cache_append_kernel<uint32_t><<<grid, kAppendThreads, 0, stream>>>(a);
  else
    cache_append_kernel<uint16_t><<<grid, kAppendThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace mtp::cuda
