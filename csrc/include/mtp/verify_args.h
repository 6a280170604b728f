// Verification's inputs and its accept/emit rule, torch-free and usable on the host and in
// CUDA kernels (the CPU core, the C API and the CUDA kernels finish verify here).
#pragma once
#include <cstdint>

#include "mtp/argmax_rule.h"
#include "mtp/common.h"

namespace mtp {

// Views of the inputs: element strides, any sign-free layout.
//   verify: logits [B, K+1, V]; request b's row t at b*stride[0] + t*stride[1].
//   verify_ragged (the flattened layout): logits [N+B, V] seen with stride[0] = 0 and
//   first_row[b] = cu[b-1] + b, so request b's row t is logits row first_row[b] + t; K is the
//   widest request (W - 1) and num_drafts[b] = K_b.
struct VerifyArgs {
  int64_t B = 0, K = 0, V = 0;
  const void* logits = nullptr;  // [B, K+1, V]
  DType logits_dtype = DType::F32;
  int64_t logits_stride[3] = {0, 0, 0};
  const int64_t* num_drafts = nullptr;  // [B], each in [0, K]; nullptr: all K
  const int64_t* first_row = nullptr;   // [B] per-request row offsets along stride[1]; nullptr: all 0
};

MTP_HOST_DEVICE inline int64_t drafts_of(const VerifyArgs& a, int64_t b) {
  return a.num_drafts ? a.num_drafts[b] : a.K;
}

// Element offset of request b's logits row t (position t of its verify pass).
MTP_HOST_DEVICE inline int64_t logits_row(const VerifyArgs& a, int64_t b, int64_t t) {
  return b * a.logits_stride[0] + ((a.first_row ? a.first_row[b] : 0) + t) * a.logits_stride[1];
}

// Longest n <= num_drafts with draft[t] == target[t] for all t < n. `I`/`J` are the
// draft/target id types; strides in elements.
template <class I, class J>
MTP_HOST_DEVICE inline int64_t accept_length(const I* draft, int64_t draft_stride, const J* target,
                                             int64_t target_stride, int64_t num_drafts) {
  int64_t n = 0;
  while (n < num_drafts && int64_t(draft[n * draft_stride]) == int64_t(target[n * target_stride])) ++n;
  return n;
}

// out[0..n) = drafts, out[n] = target[n], out[n+1..K] = pad (out stride in elements).
template <class I, class J>
MTP_HOST_DEVICE inline void emit_tokens(const I* draft, int64_t draft_stride, const J* target, int64_t target_stride,
                                        int64_t K, int64_t n, int64_t pad, I* out, int64_t out_stride) {
  for (int64_t t = 0; t < n; ++t) out[t * out_stride] = draft[t * draft_stride];
  out[n * out_stride] = I(target[n * target_stride]);
  for (int64_t t = n + 1; t <= K; ++t) out[t * out_stride] = I(pad);
}

// A strided 2-D view of ids: element (b, t) at data[b*stride[0] + t*stride[1]]; with
// `first` (the flattened ragged layout: stride[0] = 0, first[b] = cu[b-1]) request b's row
// starts `first[b]` elements along stride[1].
template <class I>
struct IdView {
  I* data;
  int64_t stride[2];
  const int64_t* first = nullptr;  // [B] or nullptr
  MTP_HOST_DEVICE I* row(int64_t b) const { return data + b * stride[0] + (first ? first[b] * stride[1] : 0); }
};

// accepted[b] = accept_length over each request, num_drafts[b] (nullptr: all K) drafts.
// Both front doors (torch binding, C API) finish verify and accept_prefix here.
template <class I, class J>
MTP_HOST_DEVICE inline void accept_lengths(int64_t B, int64_t K, IdView<const I> draft, IdView<const J> target,
                                           const int64_t* num_drafts, I* accepted, int64_t accepted_stride) {
  for (int64_t b = 0; b < B; ++b)
    accepted[b * accepted_stride] = I(
        accept_length(draft.row(b), draft.stride[1], target.row(b), target.stride[1], num_drafts ? num_drafts[b] : K));
}

// accept_lengths, plus out[b, :] = emit_tokens; target has K+1 positions per request.
template <class I, class J>
MTP_HOST_DEVICE inline void accept_and_emit(int64_t B, int64_t K, IdView<const I> draft, IdView<const J> target,
                                            const int64_t* num_drafts, int64_t pad, I* accepted,
                                            int64_t accepted_stride, IdView<I> out) {
  accept_lengths(B, K, draft, target, num_drafts, accepted, accepted_stride);
  for (int64_t b = 0; b < B; ++b)
    emit_tokens(draft.row(b), draft.stride[1], target.row(b), target.stride[1], K,
                int64_t(accepted[b * accepted_stride]), pad, out.row(b), out.stride[1]);
}

}  // namespace mtp
