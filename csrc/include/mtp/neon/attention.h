// NEON attention chunk kernels for head dims 64, 128 and 256: the simd/ kernels over the V128
// traits. fp32 arithmetic for every dtype (bf16 and fp16 K/V widened to fp32 on load);
// the armv8.2-a fp16 arithmetic is not used here: attention accumulates in fp32 anyway, so
// Isa::NeonFp16 runs this same path.
#pragma once
#include "mtp/neon/vec.h"
#include "mtp/simd/attention.h"

namespace mtp::neon {

template <DType T, int D>
struct NeonAttention {
  MTP_ATTENTION_ENTRY_POINTS(MTP_TARGET(Neon), V128)
};

}  // namespace mtp::neon
