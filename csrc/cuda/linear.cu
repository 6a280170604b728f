// Launcher of the CUDA shape-invariant linear kernel (mtp/cuda/linear.cuh), torch-free.
#include "mtp/cuda/launch.h"
#include "mtp/cuda/linear.cuh"

namespace mtp::cuda {

int64_t linear_workspace(const LinearArgs& a) {
  return linear_split(a.M, a.N, a.K) ? linear_chunks(a.K) * a.M * a.N : 0;
}

cudaError_t linear(const LinearArgs& a, float* workspace, cudaStream_t stream) {
  if (a.M == 0 || a.N == 0) return cudaSuccess;
  const int64_t chunks = linear_split(a.M, a.N, a.K) ? linear_chunks(a.K) : 1;
  const dim3 grid(unsigned((a.N + kLinearBlockCols - 1) / kLinearBlockCols), unsigned(chunks));
  with_dtype(a.x_dtype, [&](auto xt) {
    with_dtype(a.w_dtype, [&](auto wt) {
      linear_kernel<decltype(xt)::value, decltype(wt)::value><<<grid, kLinearWarps * 32, 0, stream>>>(a, workspace);
    });
  });
  if (chunks > 1) linear_sum_kernel<<<unsigned((a.M * a.N + 255) / 256), 256, 0, stream>>>(a, workspace, chunks);
  return cudaGetLastError();
}

}  // namespace mtp::cuda
