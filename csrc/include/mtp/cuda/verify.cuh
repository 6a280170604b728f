// CUDA kernels of verify and accept_prefix, torch-free.
//   1. argmax_partials: one block per (request, position) row and vocabulary slice; each
//      thread scans its strided share of the slice, then a block-wide argmax. Rows past
//      num_drafts[b] are never read.
//   2. verify_finish: one thread per request merges the slices of its rows (the order-free
//      argmax_combine), then the shared accept/emit rule of verify_args.h.
#pragma once
#include "mtp/cuda/common.cuh"
#include "mtp/verify_args.h"

namespace mtp::cuda {

constexpr int kArgmaxThreads = 256;
constexpr int kFinishThreads = 128;

template <DType T>
__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_partials_kernel(VerifyArgs a, int64_t chunk, int splits, ArgmaxResult* partials) {
  const int64_t row = blockIdx.x, b = row / (a.K + 1), t = row % (a.K + 1);
  if (t > clamp_drafts(a.num_drafts, b, a.K)) return;  // unreachable position: not read
  const int64_t lo = int64_t(blockIdx.y) * chunk;
  const int64_t hi = lo + chunk < a.V ? lo + chunk : a.V;
  const char* base = static_cast<const char*>(a.logits) + logits_row(a, b, t) * (T == DType::F32 ? 4 : 2);
  // Each thread visits increasing indices, so combining in visiting order is exact.
  ArgmaxResult r{-__int_as_float(0x7f800000), hi, false};
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const float v = load_f32<T>(base, i * a.logits_stride[2]);
    r = argmax_combine(r, ArgmaxResult{v, i, v != v});
  }
  r = block_argmax(r);
  if (threadIdx.x == 0) partials[row * splits + blockIdx.y] = r;
}

template <class I>
__global__ void verify_finish_kernel(VerifyArgs a, IdView<const I> draft, int64_t pad, I* accepted, IdView<I> out,
                                     int splits, const ArgmaxResult* partials, int64_t* targets) {
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= a.B) return;
  const int64_t T = a.K + 1, nd = clamp_drafts(a.num_drafts, b, a.K);
  int64_t* target = targets + b * T;
  for (int64_t t = 0; t <= nd; ++t) {
    const ArgmaxResult* p = partials + (b * T + t) * splits;
    ArgmaxResult r = p[0];
    for (int s = 1; s < splits; ++s) r = argmax_merge(r, p[s]);
    target[t] = r.idx;
  }
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
