// Launchers of the CUDA head_attention / cache_append kernels (mtp/cuda/attention.cuh), torch-free.
#include "mtp/cuda/attention.cuh"

namespace mtp::cuda {

AttentionWork attention_work(const AttentionArgs& a, int64_t longest_cache) {
  AttentionWork w;
  w.cache_chunks = attn_chunks(longest_cache);
  w.chunks = w.cache_chunks + attn_chunks(a.S);
  w.row_blocks = ((a.Hq / a.Hkv) * a.T + kAttnRows - 1) / kAttnRows;
  w.partials = a.B * a.Hkv * w.chunks * w.row_blocks * kAttnRows;
  return w;
}

// Calls fn(integral_constant<int, DPL>): the head-dim elements per lane for a.D.
template <class Fn>
void with_dpl(int64_t D, Fn&& fn) {
  if (D <= 32)
    fn(std::integral_constant<int, 1>{});
  else if (D <= 64)
    fn(std::integral_constant<int, 2>{});
  else if (D <= 128)
    fn(std::integral_constant<int, 4>{});
  else
    fn(std::integral_constant<int, 8>{});
}

cudaError_t head_attention(const AttentionArgs& a, const AttentionWork& w, cudaStream_t stream) {
  if (a.B == 0 || a.T == 0 || a.Hq == 0 || a.D == 0) return cudaSuccess;
  with_dtype(a.dtype, [&](auto dt) {
    with_dpl(a.D, [&](auto dpl) {
      constexpr DType T = decltype(dt)::value;
      constexpr int DPL = decltype(dpl)::value;
      if (w.chunks > 0)
        attention_chunk_kernel<T, DPL>
            <<<dim3(unsigned(a.B * a.Hkv * w.row_blocks), unsigned(w.chunks)), kAttnThreads, 0, stream>>>(a, w);
      const int64_t rows = a.B * a.T * a.Hq;
      attention_merge_kernel<T, DPL>
          <<<unsigned((rows + kMergeWarps - 1) / kMergeWarps), kMergeWarps * 32, 0, stream>>>(a, w);
    });
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
