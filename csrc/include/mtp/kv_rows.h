// Rows of a KV cache as the attention kernels read them, in place: what attention.h hands to
// each instruction set's scores / accumulate steps (generic/, simd/ attention.h).
#pragma once
#include <cstdint>

#include "mtp/common.h"

namespace mtp {

// Rows of keys (or values) of one (request, kv head): row j starts at element
// j * key_stride of base (map: at map[j] * key_stride, a tree query's path), its element d
// at d * d_stride.
struct KvRows {
  const void* base;
  int64_t key_stride, d_stride;
  DType dtype;
  const int64_t* map = nullptr;
  const void* row(int64_t j) const {
    return static_cast<const char*>(base) + (map ? map[j] : j) * key_stride * dtype_size(dtype);
  }
  // The rows from row o on (row j of the result is row o + j of this).
  KvRows from(int64_t o) const {
    KvRows r = *this;
    if (map)
      r.map = map + o;
    else
      r.base = static_cast<const char*>(base) + o * key_stride * dtype_size(dtype);
    return r;
  }
};

// Row j with unit element stride: in place when it has one, else packed into tmp
// (D elements of the same type: values unchanged, so the arithmetic is too).
inline const void* kv_row_unit(const KvRows& kv, int64_t j, int64_t D, void* tmp) {
  const void* r = kv.row(j);
  if (kv.d_stride == 1) return r;
  copy_elems(static_cast<char*>(tmp), 1, static_cast<const char*>(r), kv.d_stride, D, dtype_size(kv.dtype));
  return tmp;
}

}  // namespace mtp
