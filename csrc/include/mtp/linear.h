// y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]) for the few rows of decoding and
// verification. Shape-invariant: every output element is reduced in one fixed order that
// depends on neither M, the row grouping nor the thread split, so a verify pass over K+1
// rows gives each row the bits of a one-row decode step. Weights are streamed once per
// call for all rows (the cost of a decode step is reading them). Weights fp32, bf16, fp16 or
// int8 with fp32 scales per block of 32 along K (Q8, see linear_args.h).
#pragma once
#include <algorithm>

#include "mtp/common.h"
#include "mtp/linear_args.h"
#include "mtp/isa.h"

#include "mtp/generic/linear.h"
#if defined(MTP_X86)
#include "mtp/x86/linear.h"
#elif defined(MTP_ARM64)
#include "mtp/neon/linear.h"
#endif

namespace mtp {

// Output columns are cut into blocks of this many; a work item is one block.
constexpr int64_t kLinearBlockN = 32;

inline int64_t linear_work_items(const LinearArgs& a) { return (a.N + kLinearBlockN - 1) / kLinearBlockN; }

// Computes the output columns of work items [begin, end) for every row.
inline void linear_items(const LinearArgs& a, int64_t begin, int64_t end, Isa isa) {
  const int64_t n0 = begin * kLinearBlockN, n1 = std::min(a.N, end * kLinearBlockN);
#if defined(MTP_X86)
  if (isa == Isa::Avx512Bf16) return x86::linear_avx512_bf16(a, n0, n1);
  if (isa == Isa::Avx512) return x86::linear_avx512(a, n0, n1);
  if (isa == Isa::Avx2) return x86::linear_avx2(a, n0, n1);
#elif defined(MTP_ARM64)
  if (isa == Isa::Neon || isa == Isa::NeonFp16) return neon::linear_neon(a, n0, n1);
#endif
  generic::linear(a, n0, n1);
}

template <class ParallelFor>
void linear(const LinearArgs& a, Isa isa, ParallelFor&& parallel_for) {
  parallel_for(linear_work_items(a), [&](int64_t begin, int64_t end) { linear_items(a, begin, end, isa); });
}

}  // namespace mtp
