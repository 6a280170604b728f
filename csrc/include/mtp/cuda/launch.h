// Host entry points of the CUDA kernels (csrc/cuda/*.cu), torch-free: raw device pointers,
// element strides and a stream. The torch binding (csrc/cuda/ops.cpp) and any other host
// code call these; only the .cu files see kernel code.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "mtp/argmax_rule.h"
#include "mtp/linear_args.h"
#include "mtp/verify_args.h"

namespace mtp::cuda {

// How many vocabulary slices each reachable row is cut into: enough blocks to fill the GPU
// (about 4 per SM), slices of at least 2048 elements. The exact merge makes it invisible.
int verify_splits(int64_t rows, int64_t V, int sm_count);

// Workspace of verify, in device memory, sized by the caller.
struct VerifyWork {
  int splits = 1;
  ArgmaxResult* partials = nullptr;  // [B*(K+1)*splits]
  int64_t* targets = nullptr;        // [B*(K+1)]
};

// a.num_drafts: device pointer (int64, clamped to [0, K] in the kernels) or nullptr.
// out: [B, K+1]; the outputs are written only through `accepted` and `out`.
template <class I>
cudaError_t verify(const VerifyArgs& a, IdView<const I> draft, int64_t pad, I* accepted, IdView<I> out,
                   const VerifyWork& work, cudaStream_t stream);

template <class I, class J>
cudaError_t accept_prefix(int64_t B, int64_t K, IdView<const I> draft, IdView<const J> target,
                          const int64_t* num_drafts, I* accepted, cudaStream_t stream);

// x and w rows with unit inner stride; y fp32.
cudaError_t linear(const LinearArgs& a, cudaStream_t stream);

}  // namespace mtp::cuda
