// NEON linear: the simd/ kernel over the V128 traits, fp32 arithmetic (bf16 and fp16
// weights or activations widened to fp32 on load, fp32 accumulation). Isa::NeonFp16 runs
// this same path: fp16 accumulation would lose the precision the reduction needs.
#pragma once
#include "mtp/neon/vec.h"
#include "mtp/simd/linear.h"

namespace mtp::neon {

MTP_LINEAR_ENTRY_POINT(, V128, linear_neon)

}  // namespace mtp::neon
