// Greedy chain verification, torch-free. The caller owns threading: it hands a
// parallel_for(n, fn(begin, end)) that may run the n work items on any threads in any
// order; results never depend on how they are split.
#pragma once
#include <algorithm>
#include <vector>

#include "mtp/argmax.h"
#include "mtp/verify_args.h"

namespace mtp {

// The backbone's greedy token at each position that verification can reach
// (t <= num_drafts[b]) into target[b*(K+1) + t]; other entries are left as they are.
// Row t of request b is logits_row(a, b, t): verify's [B, K+1, V] or verify_ragged's
// flattened rows (a.first_row).
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
      const char* row = static_cast<const char*>(a.logits) + logits_row(a, b, t) * esize;
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

}  // namespace mtp
