// Appending new keys/values to a strided KV cache at each request's own length, torch-free.
// The cache length array is the caller's: appending does not advance it, and rejected
// drafts are rolled back by lowering it (entries past the length are never read).
#pragma once
#include <cstring>

#include "mtp/common.h"

namespace mtp {

struct CacheAppendArgs {
  int64_t B = 0, T = 0, Hkv = 0, D = 0, L = 0;  // L: capacity
  DType dtype = DType::F32;
  void* k = nullptr;  // [B, Hkv, L, D] views, element strides
  void* v = nullptr;
  int64_t k_stride[4] = {0, 0, 0, 0}, v_stride[4] = {0, 0, 0, 0};
  const void* k_new = nullptr;  // [B, T, Hkv, D]
  const void* v_new = nullptr;
  int64_t kn_stride[4] = {0, 0, 0, 0}, vn_stride[4] = {0, 0, 0, 0};
  const int64_t* cache_lens = nullptr;  // [B]
};

// The first request whose append would pass the capacity, or -1 when all fit (on the host,
// and in every block of the CUDA kernel, which then writes nothing).
MTP_HOST_DEVICE inline int64_t cache_append_overflow(const CacheAppendArgs& a) {
  for (int64_t b = 0; b < a.B; ++b)
    if (a.cache_lens[b] < 0 || a.cache_lens[b] + a.T > a.L) return b;
  return -1;
}

// Writes k_new[b, t] / v_new[b, t] at cache position cache_lens[b] + t. Returns false and
// writes nothing when a request would pass the capacity. Work items are (b, hkv) pairs.
template <class ParallelFor>
bool cache_append(const CacheAppendArgs& a, ParallelFor&& parallel_for) {
  if (cache_append_overflow(a) >= 0) return false;
  const int64_t es = dtype_size(a.dtype);
  auto one = [&](void* cache, const int64_t* cs, const void* src, const int64_t* ss, int64_t b, int64_t h) {
    for (int64_t t = 0; t < a.T; ++t)
      copy_elems(static_cast<char*>(cache) + (b * cs[0] + h * cs[1] + (a.cache_lens[b] + t) * cs[2]) * es, cs[3],
                 static_cast<const char*>(src) + (b * ss[0] + t * ss[1] + h * ss[2]) * es, ss[3], a.D, es);
  };
  parallel_for(a.B * a.Hkv, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      one(a.k, a.k_stride, a.k_new, a.kn_stride, i / a.Hkv, i % a.Hkv);
      one(a.v, a.v_stride, a.v_new, a.vn_stride, i / a.Hkv, i % a.Hkv);
    }
  });
  return true;
}

}  // namespace mtp
