// NEON products of GGUF block-type weights: placeholder while the NEON kernel is written.
#pragma once
#include "mtp/gguf.h"
#include "mtp/linear_args.h"

namespace mtp::neon {
inline void gguf_linear_neon(const LinearArgs& a, const QuantRows& xq, int64_t n0, int64_t n1) {
  generic::gguf_linear(a, xq, n0, n1);
}
}  // namespace mtp::neon
