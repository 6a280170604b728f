// Scalar argmax: the reference path, and the one for non-unit strides.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>

#include "mtp/argmax_rule.h"
#include "mtp/common.h"
#include "mtp/isa.h"

namespace mtp {

// What a chunk with no element yet reports: loses every merge (a row of -inf gives its first index).
inline ArgmaxResult argmax_empty(int64_t begin) { return {-std::numeric_limits<float>::infinity(), begin, false}; }

}  // namespace mtp

namespace mtp::generic {

template <DType T>
inline ArgmaxResult argmax_typed(const void* x, int64_t stride, int64_t begin, int64_t end) {
  ArgmaxResult best = argmax_empty(begin);
  for (int64_t i = begin; i < end; ++i) {
    float v = load_f32(x, T, i * stride);
    if (v != v) return {v, i, true};
    if (v > best.val) best = {v, i, false};
  }
  return best;
}

constexpr int64_t kArgmaxBlock = 256;

// First index in [begin, end) whose value is NaN (nan) or equals m (!nan). Scalar: rare.
template <DType T>
inline int64_t first_index_of(const void* x, int64_t begin, int64_t end, float m, bool nan) {
  for (int64_t i = begin; i < end; ++i) {
    float v = load_f32(x, T, i);
    if (nan ? (v != v) : (v == m)) return i;
  }
  return end;  // none (a NaN alarm raised by an infinity)
}

// The skeleton of every vector path (x86, neon): each block of kArgmaxBlock contiguous
// elements is reduced to its maximum by `block_max(i, &has_nan)` (plain vector max, no
// index bookkeeping); only a block that holds a NaN or raises the running maximum is
// scanned again for the index (it is in L1 by then). The tail takes the scalar path.
template <DType T, class BlockMax>
inline ArgmaxResult argmax_blocks(const void* x, int64_t begin, int64_t end, BlockMax block_max) {
  ArgmaxResult best = argmax_empty(begin);
  int64_t i = begin;
  for (; i + kArgmaxBlock <= end; i += kArgmaxBlock) {
    bool has_nan = false;
    float m = block_max(i, &has_nan);
    if (has_nan) {  // may be a false alarm (an infinity) in some paths: confirm
      int64_t j = first_index_of<T>(x, i, i + kArgmaxBlock, 0.f, true);
      if (j < i + kArgmaxBlock) return {load_f32(x, T, j), j, true};
    }
    if (m > best.val) best = {m, first_index_of<T>(x, i, i + kArgmaxBlock, m, false), false};
  }
  if (i < end) best = argmax_merge(best, argmax_typed<T>(x, 1, i, end));
  return best;
}

inline ArgmaxResult argmax(const void* x, DType dt, int64_t stride, int64_t begin, int64_t end) {
  return with_dtype(dt, [&](auto t) { return argmax_typed<decltype(t)::value>(x, stride, begin, end); });
}

// Contiguous rows, every set without a vector path of its own (argmax.h's dispatch).
inline ArgmaxResult argmax(Generic, const void* x, DType dt, int64_t begin, int64_t end) {
  return argmax(x, dt, 1, begin, end);
}

}  // namespace mtp::generic
