// CPU bindings of mtp.verify and mtp.accept_prefix: tensors -> pointers, checks, threads.
#include <torch/library.h>

#include "../torch/adapter.h"
#include "mtp/lenient.h"
#include "mtp/verify_sampled.h"
#include "mtp/verify.h"

namespace mtp::cpu {
namespace {

using namespace mtp::torch_adapter;  // csrc/torch/adapter.h

constexpr const char* kVerify = "mtp.verify";
constexpr const char* kAccept = "mtp.accept_prefix";
constexpr const char* kSampled = "mtp.verify_sampled";
constexpr const char* kLenient = "mtp.verify_lenient";
constexpr const char* kRagged = "mtp.verify_ragged";
constexpr const char* kSampledRagged = "mtp.verify_sampled_ragged";

// accepted[b] and out_tokens[b] from per-position target ids (int64, row stride K+1).
template <class I>
void finish(const at::Tensor& draft, const int64_t* target, const int64_t* nd, int64_t pad, at::Tensor& accepted,
            at::Tensor& out) {
  const int64_t K = draft.size(1);
  accept_and_emit<I, int64_t>(draft.size(0), K, ids<const I>(draft), {target, {K + 1, 1}}, nd, pad,
                              accepted.data_ptr<I>(), 1, ids<I>(out));
}

std::tuple<at::Tensor, at::Tensor> verify_cpu(const at::Tensor& draft_tokens, const at::Tensor& target_logits,
                                              const c10::optional<at::Tensor>& num_drafts, int64_t pad_id) {
  check_verify_inputs(kVerify, draft_tokens, target_logits, at::kCPU);
  const int64_t B = draft_tokens.size(0), K = draft_tokens.size(1);
  std::vector<int64_t> nd = checked_num_drafts(kVerify, num_drafts, B, K);
  VerifyArgs a = verify_args(draft_tokens, target_logits);
  a.num_drafts = nd.data();
  std::vector<int64_t> target(B * (K + 1), 0);
  greedy_targets(a, target.data(), at::get_num_threads(), current_isa(), TorchParallelFor{});

  auto opts = draft_tokens.options();
  at::Tensor accepted = at::empty({B}, opts), out = at::empty({B, K + 1}, opts);
  if (draft_tokens.scalar_type() == at::kInt)
    finish<int32_t>(draft_tokens, target.data(), a.num_drafts, pad_id, accepted, out);
  else
    finish<int64_t>(draft_tokens, target.data(), a.num_drafts, pad_id, accepted, out);
  return {accepted, out};
}

// The flattened ragged layout: verify's kernel with per-request row offsets (cu read here).
std::tuple<at::Tensor, at::Tensor> verify_ragged_cpu(const at::Tensor& draft_token_ids,
                                                     const at::Tensor& cu_num_draft_tokens,
                                                     const at::Tensor& target_logits, int64_t pad_id,
                                                     c10::optional<int64_t> max_num_drafts) {
  check_ragged_inputs(kRagged, draft_token_ids, cu_num_draft_tokens, target_logits, pad_id, max_num_drafts, at::kCPU);
  const RaggedLayout l = checked_ragged_layout(kRagged, cu_num_draft_tokens, draft_token_ids.size(0), max_num_drafts);
  const int64_t B = cu_num_draft_tokens.size(0), W = l.width;
  auto opts = draft_token_ids.options();
  at::Tensor accepted = at::empty({B}, opts), out = at::empty({B, W}, opts);
  const VerifyArgs a = ragged_verify_args(target_logits, B, W, l.num_drafts.data(), l.first_row.data());
  std::vector<int64_t> target(B * W, 0);
  greedy_targets(a, target.data(), at::get_num_threads(), current_isa(), TorchParallelFor{});
  AT_DISPATCH_INDEX_TYPES(draft_token_ids.scalar_type(), "verify_ragged", [&] {
    accept_and_emit<index_t, int64_t>(B, W - 1, ragged_ids<const index_t>(draft_token_ids, l.draft_start.data()),
                                      {target.data(), {W, 1}}, l.num_drafts.data(), pad_id,
                                      accepted.data_ptr<index_t>(), 1, ids<index_t>(out));
  });
  return {accepted, out};
}

at::Tensor accept_prefix_cpu(const at::Tensor& draft_tokens, const at::Tensor& target_tokens,
                             const c10::optional<at::Tensor>& num_drafts) {
  check_accept_inputs(kAccept, draft_tokens, target_tokens, at::kCPU);
  const int64_t B = draft_tokens.size(0), K = draft_tokens.size(1);
  std::vector<int64_t> nd = checked_num_drafts(kAccept, num_drafts, B, K);
  const int64_t* n = nd.data();
  at::Tensor accepted = at::empty({B}, draft_tokens.options());
  AT_DISPATCH_INDEX_TYPES(draft_tokens.scalar_type(), "accept_prefix_draft", [&] {
    using I = index_t;
    AT_DISPATCH_INDEX_TYPES(target_tokens.scalar_type(), "accept_prefix_target", [&] {
      accept_lengths<I, index_t>(B, K, ids<const I>(draft_tokens), ids<const index_t>(target_tokens), n,
                                 accepted.data_ptr<I>(), 1);
    });
  });
  return accepted;
}

constexpr const char* kBOfDrafts = "B (draft_tokens.size(0))";

// A [B] fp32 vector of temperatures (values: >= 0 and finite), as doubles (b_what: where B comes from).
std::vector<double> checked_temperatures(const char* op, const at::Tensor& temp, int64_t B,
                                         const char* b_what = kBOfDrafts) {
  check_cpu(op, "temperature", temp);
  check_dtype(op, "temperature", temp, {at::kFloat});
  check_dim(op, "temperature", temp, 1, "[B]");
  check_size(op, "temperature", temp, 0, B, b_what);
  std::vector<double> out(B);
  const float* p = temp.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b) {
    out[b] = p[b * temp.stride(0)];
    check_ok(op, temperature_error(b, out[b]));
  }
  return out;
}

// seeds / offsets: int64 [B] (offsets default 0), as values.
std::vector<int64_t> checked_keys(const char* op, const char* name, const c10::optional<at::Tensor>& t, int64_t B,
                                  const char* b_what = kBOfDrafts) {
  if (!t.has_value()) return std::vector<int64_t>(B, 0);
  check_cpu(op, name, *t);
  check_dtype(op, name, *t, {at::kLong});
  check_dim(op, name, *t, 1, "[B]");
  check_size(op, name, *t, 0, B, b_what);
  std::vector<int64_t> out(B);
  const int64_t* p = t->data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) out[b] = p[b * t->stride(0)];
  return out;
}

// top_k (int32|int64), top_p, min_p (fp32), each [B] or absent (off), checked per request.
std::vector<Filters> checked_filters(const char* op, const c10::optional<at::Tensor>& top_k,
                                     const c10::optional<at::Tensor>& top_p, const c10::optional<at::Tensor>& min_p,
                                     int64_t B, const char* b_what = kBOfDrafts) {
  std::vector<Filters> f(B);
  const auto vector_of = [&](const char* name, const at::Tensor& t, std::initializer_list<at::ScalarType> dtypes) {
    check_cpu(op, name, t);
    check_dtype(op, name, t, dtypes);
    check_dim(op, name, t, 1, "[B]");
    check_size(op, name, t, 0, B, b_what);
  };
  if (top_k.has_value()) {
    vector_of("top_k", *top_k, {at::kInt, at::kLong});
    const at::Tensor k = top_k->to(at::kLong);
    for (int64_t b = 0; b < B; ++b) f[b].top_k = k.data_ptr<int64_t>()[b * k.stride(0)];
  }
  if (top_p.has_value()) {
    vector_of("top_p", *top_p, {at::kFloat});
    for (int64_t b = 0; b < B; ++b) f[b].top_p = top_p->data_ptr<float>()[b * top_p->stride(0)];
  }
  if (min_p.has_value()) {
    vector_of("min_p", *min_p, {at::kFloat});
    for (int64_t b = 0; b < B; ++b) f[b].min_p = min_p->data_ptr<float>()[b * min_p->stride(0)];
  }
  for (int64_t b = 0; b < B; ++b) check_ok(op, filter_error(b, f[b].top_k, f[b].top_p, f[b].min_p));
  return f;
}

// One size of draft_probs: what it must equal and the message's name for it.
struct ProbsDim {
  int64_t size;
  const char* what;
};

// draft_probs [B, K, V] (verify_sampled) or [N, V] (verify_sampled_ragged, request stride 0):
// checked against `dims` (and its values: probabilities), then its pointer, dtype and strides
// set in `a`.
void set_draft_probs(const char* op, const at::Tensor& dp, const char* shape, std::initializer_list<ProbsDim> dims,
                     SampledArgs& a) {
  const int n = int(dims.size());
  check_cpu(op, "draft_probs", dp);
  check_dtype(op, "draft_probs", dp, kFloatTypes);
  check_dim(op, "draft_probs", dp, n, shape);
  int64_t d = 0;
  for (const ProbsDim& s : dims) check_size(op, "draft_probs", dp, d++, s.size, s.what);
  a.q = dp.data_ptr();
  a.q_dtype = to_dtype(dp.scalar_type());
  a.q_stride[0] = n == 3 ? dp.stride(0) : 0;
  a.q_stride[1] = dp.stride(n - 2);
  a.q_stride[2] = dp.stride(n - 1);
  check_ok(op, draft_probs_error(a.q, a.q_dtype, dp.sizes().data(), dp.strides().data(), n));
}

std::tuple<at::Tensor, at::Tensor> verify_sampled_cpu(
    const at::Tensor& draft_tokens, const c10::optional<at::Tensor>& draft_probs, const at::Tensor& target_logits,
    const at::Tensor& temperature, const at::Tensor& seeds, const c10::optional<at::Tensor>& offsets,
    const c10::optional<at::Tensor>& num_drafts, int64_t pad_id, const c10::optional<at::Tensor>& top_k,
    const c10::optional<at::Tensor>& top_p, const c10::optional<at::Tensor>& min_p) {
  check_verify_inputs(kSampled, draft_tokens, target_logits, at::kCPU);
  const int64_t B = draft_tokens.size(0), K = draft_tokens.size(1);
  const std::vector<double> temp = checked_temperatures(kSampled, temperature, B);
  const std::vector<int64_t> seed = checked_keys(kSampled, "seeds", seeds, B);
  const std::vector<int64_t> offset = checked_keys(kSampled, "offsets", offsets, B);
  std::vector<int64_t> nd = checked_num_drafts(kSampled, num_drafts, B, K);
  const std::vector<Filters> filters = checked_filters(kSampled, top_k, top_p, min_p, B);
  SampledArgs a;
  a.filters = filters.data();
  a.v = verify_args(draft_tokens, target_logits);
  a.v.num_drafts = nd.data();
  a.temperature = temp.data();
  a.seed = seed.data();
  a.offset = offset.data();
  a.pad = pad_id;
  if (draft_probs.has_value())
    set_draft_probs(
        kSampled, *draft_probs, "[B, K, V]",
        {{B, "B (draft_tokens.size(0))"}, {K, "K (draft_tokens.size(1))"}, {a.v.V, "V (target_logits.size(2))"}}, a);

  auto opts = draft_tokens.options();
  at::Tensor accepted = at::empty({B}, opts), out = at::empty({B, K + 1}, opts);
  AT_DISPATCH_INDEX_TYPES(draft_tokens.scalar_type(), "verify_sampled", [&] {
    verify_sampled<index_t>(a, ids<const index_t>(draft_tokens), accepted.data_ptr<index_t>(), 1, ids<index_t>(out),
                            current_isa(), TorchParallelFor{});
  });
  return {accepted, out};
}

// verify_sampled in the flattened ragged layout: verify_sampled's kernel with verify_ragged's
// per-request row offsets (cu read here), draft_probs [N, V] with per-request q rows.
std::tuple<at::Tensor, at::Tensor> verify_sampled_ragged_cpu(
    const at::Tensor& draft_token_ids, const c10::optional<at::Tensor>& draft_probs,
    const at::Tensor& cu_num_draft_tokens, const at::Tensor& target_logits, const at::Tensor& temperature,
    const at::Tensor& seeds, const c10::optional<at::Tensor>& offsets, int64_t pad_id,
    const c10::optional<at::Tensor>& top_k, const c10::optional<at::Tensor>& top_p,
    const c10::optional<at::Tensor>& min_p, c10::optional<int64_t> max_num_drafts) {
  constexpr const char* op = kSampledRagged;
  constexpr const char* b_what = "B (cu_num_draft_tokens.size(0))";
  check_ragged_inputs(op, draft_token_ids, cu_num_draft_tokens, target_logits, pad_id, max_num_drafts, at::kCPU);
  const int64_t N = draft_token_ids.size(0), B = cu_num_draft_tokens.size(0), V = target_logits.size(1);
  const std::vector<double> temp = checked_temperatures(op, temperature, B, b_what);
  const std::vector<int64_t> seed = checked_keys(op, "seeds", seeds, B, b_what);
  const std::vector<int64_t> offset = checked_keys(op, "offsets", offsets, B, b_what);
  const std::vector<Filters> filters = checked_filters(op, top_k, top_p, min_p, B, b_what);
  SampledArgs a;
  if (draft_probs.has_value())
    set_draft_probs(op, *draft_probs, "[N, V]", {{N, "N (draft_token_ids.size(0))"}, {V, "V (target_logits.size(1))"}},
                    a);
  const RaggedLayout l = checked_ragged_layout(op, cu_num_draft_tokens, N, max_num_drafts);
  const int64_t W = l.width;
  a.v = ragged_verify_args(target_logits, B, W, l.num_drafts.data(), l.first_row.data());
  a.q_first = l.draft_start.data();
  a.filters = filters.data();
  a.temperature = temp.data();
  a.seed = seed.data();
  a.offset = offset.data();
  a.pad = pad_id;
  auto opts = draft_token_ids.options();
  at::Tensor accepted = at::empty({B}, opts), out = at::empty({B, W}, opts);
  AT_DISPATCH_INDEX_TYPES(draft_token_ids.scalar_type(), "verify_sampled_ragged", [&] {
    verify_sampled<index_t>(a, ragged_ids<const index_t>(draft_token_ids, l.draft_start.data()),
                            accepted.data_ptr<index_t>(), 1, ids<index_t>(out), current_isa(), TorchParallelFor{});
  });
  return {accepted, out};
}

// Not lossless (lenient.h): accepts near-greedy drafts too.
std::tuple<at::Tensor, at::Tensor> verify_lenient_cpu(const at::Tensor& draft_tokens, const at::Tensor& target_logits,
                                                      const c10::optional<at::Tensor>& num_drafts, int64_t top_k,
                                                      double min_ratio, int64_t pad_id) {
  check_verify_inputs(kLenient, draft_tokens, target_logits, at::kCPU);
  check_ok(kLenient, lenient_error(top_k, min_ratio));
  const int64_t B = draft_tokens.size(0), K = draft_tokens.size(1);
  std::vector<int64_t> nd = checked_num_drafts(kLenient, num_drafts, B, K);
  VerifyArgs a = verify_args(draft_tokens, target_logits);
  a.num_drafts = nd.data();
  const LenientRule rule{top_k, std::log(min_ratio)};
  auto opts = draft_tokens.options();
  at::Tensor accepted = at::empty({B}, opts), out = at::empty({B, K + 1}, opts);
  AT_DISPATCH_INDEX_TYPES(draft_tokens.scalar_type(), "verify_lenient", [&] {
    verify_lenient<index_t>(a, ids<const index_t>(draft_tokens), rule, pad_id, accepted.data_ptr<index_t>(), 1,
                            ids<index_t>(out), TorchParallelFor{});
  });
  return {accepted, out};
}

}  // namespace

TORCH_LIBRARY_IMPL(mtp, CPU, m) {
  m.impl("verify_sampled", &verify_sampled_cpu);
  m.impl("verify_lenient", &verify_lenient_cpu);
  m.impl("verify", &verify_cpu);
  m.impl("accept_prefix", &accept_prefix_cpu);
  m.impl("verify_ragged", &verify_ragged_cpu);
  m.impl("verify_sampled_ragged", &verify_sampled_ragged_cpu);
}

}  // namespace mtp::cpu
