// Launcher of the CUDA shape-invariant linear kernel (mtp/cuda/linear.cuh), torch-free.
#include "mtp/cuda/launch.h"
#include "mtp/cuda/linear.cuh"

namespace mtp::cuda {

cudaError_t linear(const LinearArgs& a, cudaStream_t stream) {
  if (a.M == 0 || a.N == 0) return cudaSuccess;
  const unsigned blocks = unsigned((a.N + kLinearBlockCols - 1) / kLinearBlockCols);
  with_dtype(a.x_dtype, [&](auto xt) {
    with_dtype(a.w_dtype, [&](auto wt) {
      linear_kernel<decltype(xt)::value, decltype(wt)::value><<<blocks, kLinearWarps * 32, 0, stream>>>(a);
    });
  });
  return cudaGetLastError();
}

}  // namespace mtp::cuda
