// torch.argmax's rule on partial results, shared by the CPU core and the CUDA kernels
// (host and device). The first NaN wins; otherwise the maximum, and among equal values
// (-0.0 == +0.0) or two NaNs the lower index. Torch-free and CUDA-runtime-free.
#pragma once
#include <cstdint>

#include "mtp/common.h"

namespace mtp {

struct ArgmaxResult {
  float val;    // the maximum (NaN when nan)
  int64_t idx;  // its first index
  bool nan;     // the chunk holds a NaN; idx is the first one
};

// Order-free combine: the result does not depend on which argument covers earlier indices,
// so any reduction tree (threads, warps, vocabulary splits) gives torch.argmax's answer.
MTP_HOST_DEVICE inline ArgmaxResult argmax_combine(const ArgmaxResult& a, const ArgmaxResult& b) {
  if (a.nan != b.nan) return a.nan ? a : b;
  if (!a.nan && a.val != b.val) return b.val > a.val ? b : a;
  return b.idx < a.idx ? b : a;
}

// Merge of two chunk results, `a` covering earlier indices than `b` (the CPU's left-to-right
// merge): the same rule.
MTP_HOST_DEVICE inline ArgmaxResult argmax_merge(const ArgmaxResult& a, const ArgmaxResult& b) {
  return argmax_combine(a, b);
}

}  // namespace mtp
