// Launchers of the index kernels of mtp/cuda/launch.h (the ragged layout, cache lengths as
// int64), torch-free: the bindings' arithmetic on index vectors, on the device.
#include "mtp/cuda/launch.h"

namespace mtp::cuda {
namespace {

constexpr int kIndexThreads = 256;

__device__ int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

// Records bad value v at index i in *flag (one 64-bit store: a racing record is whole).
__device__ void record(unsigned long long* flag, int64_t i, int64_t v) {
  const int64_t s = clamp64(v, INT32_MIN, INT32_MAX);
  *reinterpret_cast<volatile unsigned long long*>(flag) =
      (static_cast<unsigned long long>(i + 1) << 32) | static_cast<uint32_t>(static_cast<int32_t>(s));
}

template <class I>
__global__ void clamp_to_int64_kernel(const I* src, int64_t stride, int64_t n, int64_t lo, int64_t hi, int64_t* dst,
                                      ValueCheck check) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t v = int64_t(src[i * stride]);
  if (check.flag && (v < check.lo || v > check.hi)) record(check.flag, i, v);
  dst[i] = clamp64(v, lo, hi);
}

template <class I>
__global__ void ragged_layout_kernel(const I* cu, int64_t stride, int64_t B, int64_t N, int64_t W, int64_t* counts,
                                     int64_t* first_row, int64_t* draft_first, unsigned long long* flag) {
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= B) return;
  const int64_t raw_prev = b ? int64_t(cu[(b - 1) * stride]) : 0, raw = int64_t(cu[b * stride]);
  if (flag && (raw < raw_prev || raw > N || raw - raw_prev > W - 1 || (b == B - 1 && raw != N))) record(flag, b, raw);
  const int64_t prev = clamp64(raw_prev, 0, N);
  counts[b] = clamp64(clamp64(raw, 0, N) - prev, 0, W - 1);
  first_row[b] = prev + b;
  draft_first[b] = prev;
}

unsigned blocks_for(int64_t n) { return unsigned((n + kIndexThreads - 1) / kIndexThreads); }

}  // namespace

template <class I>
cudaError_t clamp_to_int64(const I* src, int64_t stride, int64_t n, int64_t lo, int64_t hi, int64_t* dst,
                           ValueCheck check, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  clamp_to_int64_kernel<I><<<blocks_for(n), kIndexThreads, 0, stream>>>(src, stride, n, lo, hi, dst, check);
  return cudaGetLastError();
}

template <class I>
cudaError_t ragged_layout(const I* cu, int64_t stride, int64_t B, int64_t N, int64_t W, int64_t* counts,
                          int64_t* first_row, int64_t* draft_first, unsigned long long* flag, cudaStream_t stream) {
  if (B == 0) return cudaSuccess;
  ragged_layout_kernel<I>
      <<<blocks_for(B), kIndexThreads, 0, stream>>>(cu, stride, B, N, W, counts, first_row, draft_first, flag);
  return cudaGetLastError();
}

template cudaError_t clamp_to_int64<int32_t>(const int32_t*, int64_t, int64_t, int64_t, int64_t, int64_t*, ValueCheck,
                                             cudaStream_t);
template cudaError_t clamp_to_int64<int64_t>(const int64_t*, int64_t, int64_t, int64_t, int64_t, int64_t*, ValueCheck,
                                             cudaStream_t);
template cudaError_t ragged_layout<int32_t>(const int32_t*, int64_t, int64_t, int64_t, int64_t, int64_t*, int64_t*,
                                            int64_t*, unsigned long long*, cudaStream_t);
template cudaError_t ragged_layout<int64_t>(const int64_t*, int64_t, int64_t, int64_t, int64_t, int64_t*, int64_t*,
                                            int64_t*, unsigned long long*, cudaStream_t);

}  // namespace mtp::cuda
