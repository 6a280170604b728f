// Launchers of the CUDA verify / accept_prefix kernels (mtp/cuda/verify.cuh), torch-free.
#include "mtp/cuda/launch.h"
#include "mtp/cuda/verify.cuh"

namespace mtp::cuda {

// Slices of about 16K elements (32 KB of bf16: a few waves of blocks that each move plenty)
// when rows are many; when they are few, more slices, down to 2048 elements, to fill the GPU
// (about 4 blocks per SM).
int verify_splits(int64_t rows, int64_t V, int sm_count) {
  if (rows <= 0) return 1;
  const int64_t by_size = (V + 16383) / 16384;
  const int64_t want = (4 * int64_t(sm_count) + rows - 1) / rows;
  const int64_t most = (V + 2047) / 2048;
  const int64_t fill = want < most ? want : most;
  const int64_t s = by_size > fill ? by_size : fill;
  return int(s < 1 ? 1 : s > 65535 ? 65535 : s);
}

template <class I>
cudaError_t verify(const VerifyArgs& a, IdView<const I> draft, int64_t pad, I* accepted, IdView<I> out,
                   const VerifyWork& work, cudaStream_t stream) {
  if (a.B == 0) return cudaSuccess;
  // A multiple of 8 elements, so that the slices of a 16-byte aligned row start aligned.
  const int64_t chunk = ((a.V + work.splits - 1) / work.splits + 7) / 8 * 8;
  const dim3 grid(unsigned(a.B * (a.K + 1)), unsigned(work.splits));
  with_dtype(a.logits_dtype, [&](auto dt) {
    argmax_partials_kernel<decltype(dt)::value>
        <<<grid, kArgmaxThreads, 0, stream>>>(a, chunk, work.splits, work.partials);
  });
  verify_finish_kernel<I><<<unsigned(a.B), kFinishThreads, 0, stream>>>(a, draft, pad, accepted, out, work.splits,
                                                                        work.partials, work.targets);
  return cudaGetLastError();
}

template <class I, class J>
cudaError_t accept_prefix(int64_t B, int64_t K, IdView<const I> draft, IdView<const J> target,
                          const int64_t* num_drafts, I* accepted, cudaStream_t stream) {
  if (B == 0) return cudaSuccess;
  const unsigned blocks = unsigned((B + kFinishThreads - 1) / kFinishThreads);
  accept_prefix_kernel<I, J><<<blocks, kFinishThreads, 0, stream>>>(B, K, draft, target, num_drafts, accepted);
  return cudaGetLastError();
}

template cudaError_t verify<int32_t>(const VerifyArgs&, IdView<const int32_t>, int64_t, int32_t*, IdView<int32_t>,
                                     const VerifyWork&, cudaStream_t);
template cudaError_t verify<int64_t>(const VerifyArgs&, IdView<const int64_t>, int64_t, int64_t*, IdView<int64_t>,
                                     const VerifyWork&, cudaStream_t);
template cudaError_t accept_prefix<int32_t, int32_t>(int64_t, int64_t, IdView<const int32_t>, IdView<const int32_t>,
                                                     const int64_t*, int32_t*, cudaStream_t);
template cudaError_t accept_prefix<int32_t, int64_t>(int64_t, int64_t, IdView<const int32_t>, IdView<const int64_t>,
                                                     const int64_t*, int32_t*, cudaStream_t);
template cudaError_t accept_prefix<int64_t, int32_t>(int64_t, int64_t, IdView<const int64_t>, IdView<const int32_t>,
                                                     const int64_t*, int64_t*, cudaStream_t);
template cudaError_t accept_prefix<int64_t, int64_t>(int64_t, int64_t, IdView<const int64_t>, IdView<const int64_t>,
                                                     const int64_t*, int64_t*, cudaStream_t);

}  // namespace mtp::cuda
