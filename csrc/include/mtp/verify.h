// Greedy chain verification, torch-free. The caller owns threading: it hands a
// parallel_for(n, fn(begin, end)) that may run the n work items on any threads in any
// order; results never depend on how they are split.
#pragma once
#include <algorithm>
#include <vector>

#include "mtp/argmax.h"

namespace mtp {

// Views of the inputs: element strides, any sign-free layout.
struct VerifyArgs {
  int64_t B = 0, K = 0, V = 0;
  const void* logits = nullptr;  // [B, K+1, V]
  DType logits_dtype = DType::F32;
  int64_t logits_stride[3] = {0, 0, 0};
  const int64_t* num_drafts = nullptr;  // [B], each in [0, K]; nullptr: all K
};

inline int64_t drafts_of(const VerifyArgs& a, int64_t b) { return a.num_drafts ? a.num_drafts[b] : a.K; }

// The backbone's greedy token at each position that verification can reach
// (t <= num_drafts[b]) into target[b*(K+1) + t]; other entries are left as they are.
// Rows are split over the vocabulary when there are too few of them to keep
// `threads` busy; the exact merge makes the split invisible.
template <class ParallelFor>
void greedy_targets(const VerifyArgs& a, int64_t* target, int threads, Isa isa, ParallelFor&& parallel_for) {
  const int64_t T = a.K + 1;
  std::vector<int64_t> rows;  // flat b*T + t of the rows to reduce
  rows.reserve(a.B * T);
  for (int64_t b = 0; b < a.B; ++b)
    for (int64_t t = 0; t <= drafts_of(a, b); ++t) rows.push_back(b * T + t);
  if (rows.empty()) return;

  // Chunks of >= 8192 elements, enough of them for ~4 work items per thread.
  const int64_t want = std::max<int64_t>(1, (4 * int64_t(threads) + int64_t(rows.size()) - 1) / int64_t(rows.size()));
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(want, a.V / 8192));
  const int64_t chunk_len = (a.V + chunks - 1) / chunks;
  std::vector<ArgmaxResult> part(rows.size() * chunks);
  const int64_t esize = dtype_size(a.logits_dtype);

  parallel_for(int64_t(rows.size()) * chunks, [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w) {
      int64_t r = rows[w / chunks], c = w % chunks;
      int64_t b = r / T, t = r % T;
      const char* row = static_cast<const char*>(a.logits) +
                        (b * a.logits_stride[0] + t * a.logits_stride[1]) * esize;
      int64_t lo = c * chunk_len, hi = std::min(a.V, lo + chunk_len);
      part[w] = argmax_range(row, a.logits_dtype, a.logits_stride[2], lo, hi, isa);
    }
  });
  for (size_t i = 0; i < rows.size(); ++i) {
    ArgmaxResult best = part[i * chunks];
    for (int64_t c = 1; c < chunks; ++c) best = argmax_merge(best, part[i * chunks + c]);
    target[rows[i]] = best.idx;
  }
}

// Longest n <= num_drafts with draft[t] == target[t] for all t < n. `I`/`J` are the
// draft/target id types; strides in elements.
template <class I, class J>
inline int64_t accept_length(const I* draft, int64_t draft_stride, const J* target, int64_t target_stride,
                             int64_t num_drafts) {
  int64_t n = 0;
  while (n < num_drafts && int64_t(draft[n * draft_stride]) == int64_t(target[n * target_stride])) ++n;
  return n;
}

// out[0..n) = drafts, out[n] = target[n], out[n+1..K] = pad (out stride in elements).
template <class I, class J>
inline void emit_tokens(const I* draft, int64_t draft_stride, const J* target, int64_t target_stride, int64_t K,
                        int64_t n, int64_t pad, I* out, int64_t out_stride) {
  for (int64_t t = 0; t < n; ++t) out[t * out_stride] = draft[t * draft_stride];
  out[n * out_stride] = I(target[n * target_stride]);
  for (int64_t t = n + 1; t <= K; ++t) out[t * out_stride] = I(pad);
}

// A strided 2-D view of ids: element (b, t) at data[b*stride[0] + t*stride[1]].
template <class I>
struct IdView {
  I* data;
  int64_t stride[2];
  I* row(int64_t b) const { return data + b * stride[0]; }
};

// accepted[b] = accept_length over each request, num_drafts[b] (nullptr: all K) drafts.
// Both front doors (torch binding, C API) finish verify and accept_prefix here.
template <class I, class J>
inline void accept_lengths(int64_t B, int64_t K, IdView<const I> draft, IdView<const J> target,
                           const int64_t* num_drafts, I* accepted, int64_t accepted_stride) {
  for (int64_t b = 0; b < B; ++b)
    accepted[b * accepted_stride] = I(accept_length(draft.row(b), draft.stride[1], target.row(b), target.stride[1],
                                                    num_drafts ? num_drafts[b] : K));
}

// accept_lengths, plus out[b, :] = emit_tokens; target has K+1 positions per request.
template <class I, class J>
inline void accept_and_emit(int64_t B, int64_t K, IdView<const I> draft, IdView<const J> target,
                            const int64_t* num_drafts, int64_t pad, I* accepted, int64_t accepted_stride,
                            IdView<I> out) {
  accept_lengths(B, K, draft, target, num_drafts, accepted, accepted_stride);
  for (int64_t b = 0; b < B; ++b)
    emit_tokens(draft.row(b), draft.stride[1], target.row(b), target.stride[1], K,
                int64_t(accepted[b * accepted_stride]), pad, out.row(b), out.stride[1]);
}

}  // namespace mtp
