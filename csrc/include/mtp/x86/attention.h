// x86 attention chunk kernels (AVX-512, AVX2+FMA+F16C) for head dims 64, 128 and 256: the
// simd/ kernels over the V512 / V256 traits, one flatten entry point per target.
#pragma once
#include <immintrin.h>

#include "mtp/simd/attention.h"
#include "mtp/x86/vec.h"

namespace mtp::x86 {

template <DType T, int D>
struct Avx512Attention {
  MTP_ATTENTION_ENTRY_POINTS(MTP_TARGET(Avx512), V512)
};

template <DType T, int D>
struct Avx2Attention {
  MTP_ATTENTION_ENTRY_POINTS(MTP_TARGET(Avx2), V256)
};

}  // namespace mtp::x86
