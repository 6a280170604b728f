// Launchers of the index kernels of mtp/cuda/launch.h (the ragged layout, cache lengths as
// int64), torch-free: the bindings' arithmetic on index vectors, on the device.
#include "mtp/cuda/launch.h"

namespace mtp::cuda {
namespace {

constexpr int kIndexThreads = 256;

__device__ int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

template <class I>
__global__ void clamp_to_int64_kernel(const I* src, int64_t stride, int64_t n, int64_t lo, int64_t hi, int64_t* dst) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = clamp64(int64_t(src[i * stride]), lo, hi);
}

template <class I>
__global__ void ragged_layout_kernel(const I* cu, int64_t stride, int64_t B, int64_t N, int64_t W, int64_t* counts,
                                     int64_t* first_row, int64_t* draft_first) {
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= B) return;
  const int64_t prev = b ? clamp64(int64_t(cu[(b - 1) * stride]), 0, N) : 0;
  counts[b] = clamp64(clamp64(int64_t(cu[b * stride]), 0, N) - prev, 0, W - 1);
  first_row[b] = prev + b;
  draft_first[b] = prev;
}

unsigned blocks_for(int64_t n) { return unsigned((n + kIndexThreads - 1) / kIndexThreads); }

}  // namespace

template <class I>
cudaError_t clamp_to_int64(const I* src, int64_t stride, int64_t n, int64_t lo, int64_t hi, int64_t* dst,
                           cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  clamp_to_int64_kernel<I><<<blocks_for(n), kIndexThreads, 0, stream>>>(src, stride, n, lo, hi, dst);
  return cudaGetLastError();
}

template <class I>
cudaError_t ragged_layout(const I* cu, int64_t stride, int64_t B, int64_t N, int64_t W, int64_t* counts,
                          int64_t* first_row, int64_t* draft_first, cudaStream_t stream) {
  if (B == 0) return cudaSuccess;
  ragged_layout_kernel<I>
      <<<blocks_for(B), kIndexThreads, 0, stream>>>(cu, stride, B, N, W, counts, first_row, draft_first);
  return cudaGetLastError();
}

template cudaError_t clamp_to_int64<int32_t>(const int32_t*, int64_t, int64_t, int64_t, int64_t, int64_t*,
                                             cudaStream_t);
template cudaError_t clamp_to_int64<int64_t>(const int64_t*, int64_t, int64_t, int64_t, int64_t, int64_t*,
                                             cudaStream_t);
template cudaError_t ragged_layout<int32_t>(const int32_t*, int64_t, int64_t, int64_t, int64_t, int64_t*, int64_t*,
                                            int64_t*, cudaStream_t);
template cudaError_t ragged_layout<int64_t>(const int64_t*, int64_t, int64_t, int64_t, int64_t, int64_t*, int64_t*,
                                            int64_t*, cudaStream_t);

}  // namespace mtp::cuda
