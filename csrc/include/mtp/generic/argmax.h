// Scalar argmax: the reference path, and the one for non-unit strides.
#pragma once

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

inline ArgmaxResult argmax(const void* x, DType dt, int64_t stride, int64_t begin, int64_t end) {
  switch (dt) {
    case DType::F32: return argmax_typed<DType::F32>(x, stride, begin, end);
    case DType::BF16: return argmax_typed<DType::BF16>(x, stride, begin, end);
    default: return argmax_typed<DType::F16>(x, stride, begin, end);
  }
}

}  // namespace mtp::generic
