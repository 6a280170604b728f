// Launchers of the CUDA head_attention / cache_append kernels (mtp/cuda/attention.cuh), torch-free.
#include <atomic>

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

// A chunk kernel with `smem` bytes of dynamic shared memory. Static and dynamic together past
// 48 KB a block need the kernel's attribute (D = 40 bf16: 40 KB staged + ~13 KB of static
// arrays), so a staging kernel sets it, once per kernel and device, to the most any head size stages.
template <auto Kernel>
void launch_chunks(dim3 grid, int64_t smem, cudaStream_t stream, const AttentionArgs& a, const AttentionWork& w) {
  if (smem > 0) {
    static std::atomic<uint64_t> opted{0};
    int dev = 0;
    cudaGetDevice(&dev);
    const uint64_t bit = uint64_t(1) << (dev & 63);
    if (!(opted.load() & bit)) {
      cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(2 * kAttnChunk * kStageRowBytes));
      opted.fetch_or(bit);
    }
  }
  Kernel<<<grid, kAttnThreads, size_t(smem), stream>>>(a, w);
}

cudaError_t head_attention(const AttentionArgs& a, const AttentionWork& w, cudaStream_t stream) {
  if (a.B == 0 || a.T == 0 || a.Hq == 0 || a.D == 0) return cudaSuccess;
  with_dtype(a.dtype, [&](auto dt) {
    constexpr DType T = decltype(dt)::value;
    with_lpk(a.D, [&](auto lpk) {
      constexpr int LPK = decltype(lpk)::value;
      const dim3 grid(unsigned(a.B * a.Hkv * w.row_blocks), unsigned(w.chunk_blocks));
      if (w.chunks == 0) return;
      const int64_t rb = stage_row_bytes(a.D, dtype_size(T)), smem = 2 * kAttnChunk * rb;
      if (rb && w.block_rows == 4)
        launch_chunks<attention_chunk_kernel<T, LPK, 4, true>>(grid, smem, stream, a, w);
      else if (rb)
        launch_chunks<attention_chunk_kernel<T, LPK, 8, true>>(grid, smem, stream, a, w);
      else if (w.block_rows == 4)
        launch_chunks<attention_chunk_kernel<T, LPK, 4, false>>(grid, 0, stream, a, w);
      else
        launch_chunks<attention_chunk_kernel<T, LPK, 8, false>>(grid, 0, stream, a, w);
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
