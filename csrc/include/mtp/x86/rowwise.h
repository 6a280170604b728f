// x86 entry points of the row-local layer ops: the generic loops (generic/rowwise.h) inlined
// into AVX-512 and AVX2 functions, where the compiler vectorises them 16 and 8 lanes wide.
// Same source, same operations: the bits equal the generic path's.
#pragma once
#include "mtp/generic/rowwise.h"
#include "mtp/isa.h"

namespace mtp::x86 {

#define MTP_ROWWISE_ENTRY_POINTS(SET)                                                                                \
  MTP_TARGET(SET) __attribute__((flatten)) inline void rms_norm(SET, const RmsNormArgs& a) { generic::rms_norm(a); } \
  MTP_TARGET(SET) __attribute__((flatten)) inline void rope(SET, const RopeArgs& a) { generic::rope(a); }            \
  MTP_TARGET(SET) __attribute__((flatten)) inline void gated_mul(SET, const GatedMulArgs& a) { generic::gated_mul(a); }

MTP_ROWWISE_ENTRY_POINTS(Avx512)
MTP_ROWWISE_ENTRY_POINTS(Avx2)

#undef MTP_ROWWISE_ENTRY_POINTS

}  // namespace mtp::x86
