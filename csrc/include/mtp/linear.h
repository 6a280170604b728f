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
#include "mtp/gguf.h"
#include "mtp/linear_args.h"
#include "mtp/isa.h"

#include "mtp/generic/linear.h"
#if defined(MTP_X86)
#include "mtp/x86/gguf.h"
#include "mtp/x86/linear.h"
#elif defined(MTP_ARM64)
#include "mtp/neon/gguf.h"
#include "mtp/neon/linear.h"
#endif

namespace mtp {

// Output columns are cut into blocks of this many; a work item is one block.
constexpr int64_t kLinearBlockN = 32;

inline int64_t linear_work_items(const LinearArgs& a) { return (a.N + kLinearBlockN - 1) / kLinearBlockN; }

// Computes the output columns of work items [begin, end) for every row.
// x quantized (quantize_x: int8 rows, linear_args.h) or float.
inline void linear_items(const LinearArgs& a, int64_t begin, int64_t end, Isa isa) {
  const int64_t n0 = begin * kLinearBlockN, n1 = std::min(a.N, end * kLinearBlockN);
  dispatch(isa, [&](auto set) { a.x_dtype == DType::I8 ? linear_q8dot(set, a, n0, n1) : linear(set, a, n0, n1); });
}

// The columns [n0, n1) of every row for a GGUF block-type weight (gguf.h), x quantized in xq.
inline void gguf_items(const LinearArgs& a, const QuantRows& xq, int64_t n0, int64_t n1, Isa isa) {
  dispatch(isa, [&](auto set) { gguf_linear(set, a, xq, n0, n1); });
}

// quantize_x: row x [K] (fp32, bf16 or fp16) -> out, xq_row_bytes(K) bytes (the layout of
// linear_args.h). Per block of 32 (the last may be partial), like reference.quantize_rows_q8:
// scale = amax|x| / 127 and q = clamp(round_half_even(x / scale), -127, 127), both divisions
// in fp32; scale 0 -> q = 0; a NaN or infinity in the block -> scale NaN and q = 0 (that
// row's outputs become NaN). Row-local: a row's bits never depend on the other rows.
// Written as loops the compiler vectorises (a decode step quantizes ~3k values per layer on
// one thread): the block widened to fp32 first, amax by the magnitudes' bits (for finite
// values the same order as the floats'; a NaN or infinity is any bits >= 0x7f800000).
inline void quantize_row_q8(const void* x, DType dt, int64_t K, void* out) {
  const int64_t end = xq_row_bytes(K) / kXqGroupBytes * kXqGroup;  // padded to whole groups
  float v[kQ8Block];
  for (int64_t k0 = 0; k0 < end; k0 += kQ8Block) {
    const int64_t n = std::max<int64_t>(0, std::min(K - k0, kQ8Block));
    with_dtype(dt, [&](auto t) {
      for (int64_t i = 0; i < n; ++i) v[i] = load_f32(x, decltype(t)::value, k0 + i);
    });
    std::fill(v + n, v + kQ8Block, 0.f);
    const float scale = quantize_block_q8(v, xq_value(out, k0));  // gguf.h: the rule of both layouts
    *xq_scale(out, k0) = n > 0 ? scale : 0.f;
  }
}

// fn(r0, r1) over M rows of a row-local step: on the calling thread below kParallelRows rows
// (a parallel region costs more than a few rows), else split over the threads (a prefill: the
// other threads would wait). Row-local, so any split gives the same bits. The decoder's
// row-local steps and linear()'s quantization of its rows (on the calling thread it was ~7%
// of a prefill's time) both split this way.
constexpr int64_t kParallelRows = 16;
template <class ParallelFor, class Fn>
void split_rows(int64_t M, ParallelFor&& parallel_for, Fn&& fn) {
  if (M < kParallelRows)
    fn(int64_t(0), M);
  else
    parallel_for(M, fn);
}

// a.y = the product. Calls parallel_for(linear_work_items(a), fn) once for the columns (and,
// quantizing kParallelRows rows or more, once before it over the rows: split_rows); fn(begin, end)
// computes the column blocks [begin, end) of every row, on any thread, then after(begin, end)
// runs on that thread (linear_to_bf16's rounding, while the blocks are in its cache).
template <class ParallelFor, class After>
void linear(const LinearArgs& a, Isa isa, ParallelFor&& parallel_for, After&& after) {
  auto columns = [&](const LinearArgs& l, auto&& fn) {
    parallel_for(linear_work_items(l), [&](int64_t begin, int64_t end) {
      fn(begin, end);
      after(begin, end);
    });
  };
  if (is_block_type(a.w_dtype)) {  // GGUF blocks: the rows quantized once (gguf.h), then the columns
    thread_local QuantRows rows;   // reused across calls; the workers read this thread's copy
    QuantRows& xq = rows;          // (a lambda names a thread_local by its own thread's instance)
    xq.resize(a.M, a.K);
    split_rows(a.M, parallel_for, [&](int64_t m0, int64_t m1) {
      dispatch(isa, [&](auto set) { quantize_row_range(set, a.x, a.x_dtype, a.x_stride, m0, m1, xq); });
    });
    columns(a, [&](int64_t begin, int64_t end) {
      gguf_items(a, xq, begin * kLinearBlockN, std::min(a.N, end * kLinearBlockN), isa);
    });
    return;
  }
  if (a.quantize_x) {  // the rows quantized once, before the loop over the columns
    const int64_t row_bytes = xq_row_bytes(a.K);
    std::vector<float> rows(size_t(a.M * row_bytes / 4));  // float: the scales' alignment
    const int64_t xb = a.x_stride * dtype_size(a.x_dtype);
    split_rows(a.M, parallel_for, [&](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m)
        quantize_row_q8(static_cast<const char*>(a.x) + m * xb, a.x_dtype, a.K,
                        reinterpret_cast<char*>(rows.data()) + m * row_bytes);
    });
    LinearArgs q = a;
    q.x = rows.data();
    q.x_dtype = DType::I8;
    q.x_stride = row_bytes;
    q.quantize_x = false;
    columns(q, [&](int64_t begin, int64_t end) { linear_items(q, begin, end, isa); });
    return;
  }
  columns(a, [&](int64_t begin, int64_t end) { linear_items(a, begin, end, isa); });
}

template <class ParallelFor>
void linear(const LinearArgs& a, Isa isa, ParallelFor&& parallel_for) {
  linear(a, isa, parallel_for, [](int64_t, int64_t) {});
}

// linear(), then a.y rounded to bf16 into out [M, N] (rows out_stride apart) as torch's
// .to(torch.bfloat16) does: each thread rounds the column blocks it has just computed (still
// in its cache) in the same parallel region, instead of a pass over the whole output after
// it. Element by element, so any split gives the same bits.
template <class ParallelFor>
void linear_to_bf16(const LinearArgs& a, uint16_t* out, int64_t out_stride, Isa isa, ParallelFor&& parallel_for) {
  linear(a, isa, parallel_for, [&](int64_t begin, int64_t end) {
    const int64_t n0 = begin * kLinearBlockN, n1 = std::min(a.N, end * kLinearBlockN);
    for (int64_t m = 0; m < a.M; ++m) {  // a plain loop of selects: it vectorises
      const float* y = a.y + m * a.y_stride;
      uint16_t* o = out + m * out_stride;
      for (int64_t n = n0; n < n1; ++n) o[n] = f32_to_bf16(y[n]);
    }
  });
}

}  // namespace mtp
