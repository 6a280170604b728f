// x86 entry points of the row-local layer ops: the generic loops (generic/rowwise.h) inlined
// into AVX-512 and AVX2 functions, where the compiler vectorises them 16 and 8 lanes wide.
// Same source, same operations: the bits equal the generic path's.
#pragma once
#include "mtp/generic/rowwise.h"
#include "mtp/isa.h"

namespace mtp::x86 {

#define MTP_ROWWISE_ENTRY_POINTS(TARGET, SUFFIX)                                                                \
  TARGET __attribute__((flatten)) inline void rms_norm_##SUFFIX(const RmsNormArgs& a) { generic::rms_norm(a); } \
  TARGET __attribute__((flatten)) inline void rope_##SUFFIX(const RopeArgs& a) { generic::rope(a); }            \
  TARGET __attribute__((flatten)) inline void silu_mul_##SUFFIX(const SiluMulArgs& a) { generic::silu_mul(a); }

MTP_ROWWISE_ENTRY_POINTS(MTP_TARGET_AVX512, avx512)
MTP_ROWWISE_ENTRY_POINTS(MTP_TARGET_AVX2, avx2)

#undef MTP_ROWWISE_ENTRY_POINTS

}  // namespace mtp::x86
