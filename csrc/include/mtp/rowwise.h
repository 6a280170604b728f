// The row-local ops of a decoder layer between its projections, torch-free: RMSNorm with the
// residual add fused, RoPE (half-split, in place) and the SiLU-gated product of the MLP.
// Exact by construction: each row is computed alone, in an operation order fixed by the
// source (generic/rowwise.h), so its bits depend neither on the number of rows nor on the
// instruction set. Single-threaded: a decode or verify step has a few rows of a few hundred
// elements, far below what handing work to another thread costs.
#pragma once
#include "mtp/generic/rowwise.h"
#include "mtp/isa.h"
#if defined(MTP_X86)
#include "mtp/x86/rowwise.h"
#endif

namespace mtp {

// aarch64 needs no entry points of its own: its baseline (armv8.0-a) has NEON, which the
// compiler uses for the generic loops.
#if defined(MTP_X86)
#define MTP_ROWWISE_DISPATCH(OP, ARGS)               \
  if (is_avx512(isa)) return x86::OP##_avx512(ARGS); \
  if (isa == Isa::Avx2) return x86::OP##_avx2(ARGS);
#else
#define MTP_ROWWISE_DISPATCH(OP, ARGS) (void)isa;
#endif

inline void rms_norm(const RmsNormArgs& a, Isa isa) {
  MTP_ROWWISE_DISPATCH(rms_norm, a)
  generic::rms_norm(a);
}

inline void rope(const RopeArgs& a, Isa isa) {
  MTP_ROWWISE_DISPATCH(rope, a)
  generic::rope(a);
}

inline void silu_mul(const SiluMulArgs& a, Isa isa) {
  MTP_ROWWISE_DISPATCH(silu_mul, a)
  generic::silu_mul(a);
}

#undef MTP_ROWWISE_DISPATCH

}  // namespace mtp
