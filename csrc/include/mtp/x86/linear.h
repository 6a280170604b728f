// x86 linear (AVX-512, AVX2+FMA+F16C): the simd/ kernel over the V512 / V256 traits.
#pragma once
#include "mtp/simd/linear.h"
#include "mtp/x86/vec.h"

namespace mtp::x86 {

MTP_LINEAR_ENTRY_POINT(MTP_TARGET_AVX512, V512, linear_avx512)
MTP_LINEAR_ENTRY_POINT(MTP_TARGET_AVX2, V256, linear_avx2)

}  // namespace mtp::x86
