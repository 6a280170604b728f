// Lenient greedy verification (mtp.verify_lenient), torch-free. NOT lossless: it accepts
// drafts the backbone would not have chosen, so the output drifts from greedy decoding.
// A draft x at row t is accepted when x is the row's argmax (torch.argmax's choice), or when
// the row has no NaN, x is among its top_k entries (ranked as torch.argmax ranks: larger
// first, then lower index) and p(x) / p(argmax) = exp(logit_x - max) >= min_ratio (the
// softmax at temperature 1). top_k = 1 is exactly mtp.verify, whatever min_ratio.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "mtp/common.h"
#include "mtp/verify_args.h"

namespace mtp {

struct LenientRule {
  int64_t top_k = 1;
  double log_min_ratio = 0;  // log(min_ratio): the test is logit_x - max >= it
};

// v in the fewest significant digits (%.Ng, N <= 17) that read back as v: 1.5, 1e+300, -1e-300,
// 1.000000000001 (std::to_string's fixed 6 decimals would print 300 digits, -0.000000, 1.000000).
inline std::string shortest_double(double v) {
  char buf[40];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (!(std::strtod(buf, nullptr) != v)) break;  // NaN and inf: the first try
  }
  return buf;
}

inline std::string lenient_error(int64_t top_k, double min_ratio) {
  if (top_k < 1) return "top_k must be >= 1, got " + std::to_string(top_k);
  if (!(min_ratio >= 0 && min_ratio <= 1)) return "min_ratio must lie in [0, 1], got " + shortest_double(min_ratio);
  return "";
}

// One pass over a row: torch.argmax's (value, index, NaN seen) and how many entries rank
// above x (x's logit vx; NaN when x is outside [0, V): nothing ranks above it then).
struct LenientScan {
  float best = -INFINITY;
  int64_t idx = 0;
  bool nan = false;
  int64_t above = 0;
};

inline LenientScan lenient_scan(const void* row, DType dt, int64_t stride, int64_t V, int64_t x, float vx) {
  LenientScan s;
  for (int64_t i = 0; i < V; ++i) {
    const float v = load_f32(row, dt, i * stride);
    if (v != v) {  // the first NaN is the argmax, and ranks are off: nothing more to learn
      s.nan = true;
      s.idx = i;
      return s;
    }
    if (v > s.best) {
      s.best = v;
      s.idx = i;
    }
    s.above += (v > vx) | ((v == vx) & (i < x));
  }
  return s;
}

// Request b: out[0..K] (stride os) and the accepted count. Rows past the first rejection
// are not read.
template <class I>
inline int64_t lenient_request(const VerifyArgs& a, int64_t b, const I* draft, int64_t ds, int64_t nd,
                               const LenientRule& rule, int64_t pad, I* out, int64_t os) {
  const int64_t esize = dtype_size(a.logits_dtype);
  for (int64_t t = 0; t <= nd; ++t) {
    const char* row = static_cast<const char*>(a.logits) + (b * a.logits_stride[0] + t * a.logits_stride[1]) * esize;
    const int64_t x = t < nd ? int64_t(draft[t * ds]) : -1;
    const bool valid = x >= 0 && x < a.V;
    const float vx = valid ? load_f32(row, a.logits_dtype, x * a.logits_stride[2]) : NAN;
    const LenientScan s = lenient_scan(row, a.logits_dtype, a.logits_stride[2], a.V, x, vx);
    const bool take = valid && (x == s.idx || (!s.nan && vx == vx && s.above < rule.top_k &&
                                               double(vx) - double(s.best) >= rule.log_min_ratio));
    if (take) {
      out[t * os] = draft[t * ds];
      continue;
    }
    out[t * os] = I(s.idx);
    for (int64_t j = t + 1; j <= a.K; ++j) out[j * os] = I(pad);
    return t;
  }
  return nd;  // not reached: row nd always emits
}

template <class I, class ParallelFor>
void verify_lenient(const VerifyArgs& a, IdView<const I> draft, const LenientRule& rule, int64_t pad, I* accepted,
                    int64_t acc_stride, IdView<I> out, ParallelFor&& parallel_for) {
  parallel_for(a.B, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      accepted[b * acc_stride] = I(lenient_request<I>(a, b, draft.row(b), draft.stride[1], drafts_of(a, b), rule, pad,
                                                      out.row(b), out.stride[1]));
  });
}

}  // namespace mtp
