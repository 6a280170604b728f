// y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]) for the few rows of decoding and
// verification. Shape-invariant: every output element is reduced in one fixed order that
// depends on neither M, the row grouping nor the thread split, so a verify pass over K+1
// rows gives each row the bits of a one-row decode step. Weights are streamed once per
// call for all rows (the cost of a decode step is reading them). Weights fp32, bf16, fp16 or
// int8 with fp32 scales per block of 32 along K (Q8, see linear_args.h).
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

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
  if (a.x_dtype == DType::I8) {  // quantize_x
    if (is_avx512(isa)) return x86::linear_q8dot_avx512(a, n0, n1);
    if (isa == Isa::Avx2) return x86::linear_q8dot_avx2(a, n0, n1);
    return generic::linear(a, n0, n1);
  }
  if (isa == Isa::Avx512Bf16) return x86::linear_avx512_bf16(a, n0, n1);
  if (isa == Isa::Avx512) return x86::linear_avx512(a, n0, n1);
  if (isa == Isa::Avx2) return x86::linear_avx2(a, n0, n1);
#elif defined(MTP_ARM64)
  if (a.x_dtype == DType::I8) {  // quantize_x
    if (isa == Isa::Neon || isa == Isa::NeonFp16) return neon::linear_q8dot_neon(a, n0, n1);
    return generic::linear(a, n0, n1);
  }
  if (isa == Isa::Neon || isa == Isa::NeonFp16) return neon::linear_neon(a, n0, n1);
#endif
  generic::linear(a, n0, n1);
}

// quantize_x: row x [K] (fp32, bf16 or fp16) -> out, xq_row_bytes(K) bytes (the layout of
// linear_args.h). Per block of 32 (the last may be partial), like reference.quantize_rows_q8:
// scale = amax|x| / 127 and q = clamp(round_half_even(x / scale), -127, 127), both divisions
// in fp32; scale 0 -> q = 0; a NaN or infinity in the block -> scale NaN and q = 0 (that
// row's outputs become NaN). Row-local: a row's bits never depend on the other rows.
inline void quantize_row_q8(const void* x, DType dt, int64_t K, void* out) {
  const int64_t end = xq_row_bytes(K) / kXqGroupBytes * kXqGroup;  // padded to whole groups
  for (int64_t k0 = 0; k0 < end; k0 += kQ8Block) {
    const int64_t k1 = std::min(K, k0 + kQ8Block);
    int8_t* q = xq_value(out, k0);
    float amax = 0.f;
    bool finite = true;
    for (int64_t k = k0; k < k1; ++k) {
      const float v = load_f32(x, dt, k);
      finite = finite && std::isfinite(v);
      amax = std::max(amax, std::fabs(v));
    }
    const float scale = finite ? amax / 127.f : NAN;
    *xq_scale(out, k0) = k0 < K ? scale : 0.f;
    for (int64_t k = k0; k < k0 + kQ8Block; ++k) {
      float v = 0.f;
      if (k < k1 && scale > 0.f) v = std::min(127.f, std::max(-127.f, std::nearbyint(load_f32(x, dt, k) / scale)));
      q[k - k0] = int8_t(v);
    }
  }
}

template <class ParallelFor>
void linear(const LinearArgs& a, Isa isa, ParallelFor&& parallel_for) {
  if (a.quantize_x) {  // the rows quantized once, before the loop over the columns
    const int64_t row_bytes = xq_row_bytes(a.K);
    std::vector<float> rows(size_t(a.M * row_bytes / 4));  // float: the scales' alignment
    const int64_t xb = a.x_stride * dtype_size(a.x_dtype);
    for (int64_t m = 0; m < a.M; ++m)
      quantize_row_q8(static_cast<const char*>(a.x) + m * xb, a.x_dtype, a.K, reinterpret_cast<char*>(rows.data()) + m * row_bytes);
    LinearArgs q = a;
    q.x = rows.data();
    q.x_dtype = DType::I8;
    q.x_stride = row_bytes;
    q.quantize_x = false;
    parallel_for(linear_work_items(q), [&](int64_t begin, int64_t end) { linear_items(q, begin, end, isa); });
    return;
  }
  parallel_for(linear_work_items(a), [&](int64_t begin, int64_t end) { linear_items(a, begin, end, isa); });
}

}  // namespace mtp
