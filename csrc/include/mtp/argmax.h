// Row argmax with torch.argmax's rules: the first NaN wins; otherwise the first index of
// the maximum (-0.0 == +0.0); a row of -inf gives its first index.
// A row may be split into chunks (threads) and the chunk results merged left to right:
// the merge is exact, so the answer does not depend on the split.
#pragma once
#include <cmath>
#include <limits>

#include "mtp/argmax_rule.h"
#include "mtp/common.h"
#include "mtp/isa.h"

#include "mtp/generic/argmax.h"
#if defined(MTP_X86)
#include "mtp/x86/argmax.h"
#endif
#if defined(MTP_ARM64)
#include "mtp/neon/argmax.h"
#endif

namespace mtp {

// Argmax of x[begin*stride], ..., x[(end-1)*stride] (end > begin).
inline ArgmaxResult argmax_range(const void* x, DType dt, int64_t stride, int64_t begin, int64_t end, Isa isa) {
  if (stride != 1) return generic::argmax(x, dt, stride, begin, end);
  return dispatch(isa, [&](auto set) { return argmax(set, x, dt, begin, end); });
}

}  // namespace mtp
