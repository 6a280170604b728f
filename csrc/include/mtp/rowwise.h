// The row-local ops of a decoder layer between its projections, torch-free: RMSNorm with the
// residual add fused, RoPE (half-split, in place) and the gated product of the MLP (SiLU or
// tanh-GELU).
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

// aarch64 has no entry points of its own: its baseline (armv8.0-a) has NEON, which the
// compiler uses for the generic loops.
inline void rms_norm(const RmsNormArgs& a, Isa isa) {
  dispatch(isa, [&](auto set) { rms_norm(set, a); });
}

inline void rope(const RopeArgs& a, Isa isa) {
  dispatch(isa, [&](auto set) { rope(set, a); });
}

// act(gate) * up (a.act: SiLU for mtp.silu_mul, tanh-GELU for mtp.gelu_tanh_mul).
inline void gated_mul(const GatedMulArgs& a, Isa isa) {
  dispatch(isa, [&](auto set) { gated_mul(set, a); });
}

}  // namespace mtp
