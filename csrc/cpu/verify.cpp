// CPU bindings of mtp.verify and mtp.accept_prefix: tensors -> pointers, checks, threads.
#include <torch/csrc/stable/library.h>

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
void finish(const Tensor& draft, const int64_t* target, const int64_t* nd, int64_t pad, Tensor& accepted, Tensor& out) {
  const int64_t K = draft.size(1);
  accept_and_emit<I, int64_t>(draft.size(0), K, ids<const I>(draft), {target, {K + 1, 1}}, nd, pad,
                              accepted.mutable_data_ptr<I>(), 1, ids<I>(out));
}

std::tuple<Tensor, Tensor> verify_cpu(const Tensor& draft_tokens, const Tensor& target_logits,
                                      const std::optional<Tensor>& num_drafts, int64_t pad_id) {
  check_verify_inputs(kVerify, draft_tokens, target_logits, kCpu);
  const int64_t B = draft_tokens.size(0), K = draft_tokens.size(1);
  std::vector<int64_t> nd = checked_num_drafts(kVerify, num_drafts, B, K);
  VerifyArgs a = verify_args(draft_tokens, target_logits);
  a.num_drafts = nd.data();
  std::vector<int64_t> target(B * (K + 1), 0);
  greedy_targets(a, target.data(), int(torch::stable::get_num_threads()), current_isa(), TorchParallelFor{});

  Tensor accepted = empty_like_on(draft_tokens, {B}), out = empty_like_on(draft_tokens, {B, K + 1});
  if (draft_tokens.scalar_type() == ScalarType::Int)
    finish<int32_t>(draft_tokens, target.data(), a.num_drafts, pad_id, accepted, out);
  else
    finish<int64_t>(draft_tokens, target.data(), a.num_drafts, pad_id, accepted, out);
  return {accepted, out};
}

// The flattened ragged layout: verify's kernel with per-request row offsets (cu read here).
std::tuple<Tensor, Tensor> verify_ragged_cpu(const Tensor& draft_token_ids, const Tensor& cu_num_draft_tokens,
                                             const Tensor& target_logits, int64_t pad_id,
                                             std::optional<int64_t> max_num_drafts) {
  check_ragged_inputs(kRagged, draft_token_ids, cu_num_draft_tokens, target_logits, pad_id, max_num_drafts, kCpu);
  const RaggedLayout l = checked_ragged_layout(kRagged, cu_num_draft_tokens, draft_token_ids.size(0), max_num_drafts);
  const int64_t B = cu_num_draft_tokens.size(0), W = l.width;
  Tensor accepted = empty_like_on(draft_token_ids, {B}), out = empty_like_on(draft_token_ids, {B, W});
  const VerifyArgs a = ragged_verify_args(target_logits, B, W, l.num_drafts.data(), l.first_row.data());
  std::vector<int64_t> target(B * W, 0);
  greedy_targets(a, target.data(), int(torch::stable::get_num_threads()), current_isa(), TorchParallelFor{});
  dispatch_index(draft_token_ids.scalar_type(), [&](auto index) {
    using index_t = decltype(index);
    accept_and_emit<index_t, int64_t>(B, W - 1, ragged_ids<const index_t>(draft_token_ids, l.draft_start.data()),
                                      {target.data(), {W, 1}}, l.num_drafts.data(), pad_id,
                                      accepted.mutable_data_ptr<index_t>(), 1, ids<index_t>(out));
  });
  return {accepted, out};
}

Tensor accept_prefix_cpu(const Tensor& draft_tokens, const Tensor& target_tokens,
                         const std::optional<Tensor>& num_drafts) {
  check_accept_inputs(kAccept, draft_tokens, target_tokens, kCpu);
  const int64_t B = draft_tokens.size(0), K = draft_tokens.size(1);
  std::vector<int64_t> nd = checked_num_drafts(kAccept, num_drafts, B, K);
  const int64_t* n = nd.data();
  Tensor accepted = empty_like_on(draft_tokens, {B});
  dispatch_index(draft_tokens.scalar_type(), [&](auto index) {
    using index_t = decltype(index);
    using I = index_t;
    dispatch_index(target_tokens.scalar_type(), [&](auto index) {
      using index_t = decltype(index);
      accept_lengths<I, index_t>(B, K, ids<const I>(draft_tokens), ids<const index_t>(target_tokens), n,
                                 accepted.mutable_data_ptr<I>(), 1);
    });
  });
  return accepted;
}

constexpr const char* kBOfDrafts = "B (draft_tokens.size(0))";

// A [B] fp32 vector of temperatures (values: >= 0 and finite), as doubles (b_what: where B comes from).
std::vector<double> checked_temperatures(const char* op, const Tensor& temp, int64_t B,
                                         const char* b_what = kBOfDrafts) {
  check_cpu(op, "temperature", temp);
  check_dtype(op, "temperature", temp, {ScalarType::Float});
  check_dim(op, "temperature", temp, 1, "[B]");
  check_size(op, "temperature", temp, 0, B, b_what);
  std::vector<double> out(B);
  const float* p = temp.mutable_data_ptr<float>();
  for (int64_t b = 0; b < B; ++b) {
    out[b] = p[b * temp.stride(0)];
    check_ok(op, temperature_error(b, out[b]));
  }
  return out;
}

// seeds / offsets: int64 [B] (offsets default 0), as values.
std::vector<int64_t> checked_keys(const char* op, const char* name, const std::optional<Tensor>& t, int64_t B,
                                  const char* b_what = kBOfDrafts) {
  if (!t.has_value()) return std::vector<int64_t>(B, 0);
  check_cpu(op, name, *t);
  check_dtype(op, name, *t, {ScalarType::Long});
  check_dim(op, name, *t, 1, "[B]");
  check_size(op, name, *t, 0, B, b_what);
  std::vector<int64_t> out(B);
  const int64_t* p = t->mutable_data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) out[b] = p[b * t->stride(0)];
  return out;
}

// top_k (int32|int64), top_p, min_p (fp32), each [B] or absent (off), checked per request.
std::vector<Filters> checked_filters(const char* op, const std::optional<Tensor>& top_k,
                                     const std::optional<Tensor>& top_p, const std::optional<Tensor>& min_p, int64_t B,
                                     const char* b_what = kBOfDrafts) {
  std::vector<Filters> f(B);
  const auto vector_of = [&](const char* name, const Tensor& t, std::initializer_list<ScalarType> dtypes) {
    check_cpu(op, name, t);
    check_dtype(op, name, t, dtypes);
    check_dim(op, name, t, 1, "[B]");
    check_size(op, name, t, 0, B, b_what);
  };
  if (top_k.has_value()) {
    vector_of("top_k", *top_k, {ScalarType::Int, ScalarType::Long});
    const Tensor k = torch::stable::to(*top_k, ScalarType::Long);
    for (int64_t b = 0; b < B; ++b) f[b].top_k = k.mutable_data_ptr<int64_t>()[b * k.stride(0)];
  }
  if (top_p.has_value()) {
    vector_of("top_p", *top_p, {ScalarType::Float});
    for (int64_t b = 0; b < B; ++b) f[b].top_p = top_p->mutable_data_ptr<float>()[b * top_p->stride(0)];
  }
  if (min_p.has_value()) {
    vector_of("min_p", *min_p, {ScalarType::Float});
    for (int64_t b = 0; b < B; ++b) f[b].min_p = min_p->mutable_data_ptr<float>()[b * min_p->stride(0)];
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
void set_draft_probs(const char* op, const Tensor& dp, const char* shape, std::initializer_list<ProbsDim> dims,
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

std::tuple<Tensor, Tensor> verify_sampled_cpu(const Tensor& draft_tokens, const std::optional<Tensor>& draft_probs,
                                              const Tensor& target_logits, const Tensor& temperature,
                                              const Tensor& seeds, const std::optional<Tensor>& offsets,
                                              const std::optional<Tensor>& num_drafts, int64_t pad_id,
                                              const std::optional<Tensor>& top_k, const std::optional<Tensor>& top_p,
                                              const std::optional<Tensor>& min_p) {
  check_verify_inputs(kSampled, draft_tokens, target_logits, kCpu);
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

  Tensor accepted = empty_like_on(draft_tokens, {B}), out = empty_like_on(draft_tokens, {B, K + 1});
  dispatch_index(draft_tokens.scalar_type(), [&](auto index) {
    using index_t = decltype(index);
    verify_sampled<index_t>(a, ids<const index_t>(draft_tokens), accepted.mutable_data_ptr<index_t>(), 1,
                            ids<index_t>(out), current_isa(), TorchParallelFor{});
  });
  return {accepted, out};
}

// verify_sampled in the flattened ragged layout: verify_sampled's kernel with verify_ragged's
// per-request row offsets (cu read here), draft_probs [N, V] with per-request q rows.
std::tuple<Tensor, Tensor> verify_sampled_ragged_cpu(
    const Tensor& draft_token_ids, const std::optional<Tensor>& draft_probs, const Tensor& cu_num_draft_tokens,
    const Tensor& target_logits, const Tensor& temperature, const Tensor& seeds, const std::optional<Tensor>& offsets,
    int64_t pad_id, const std::optional<Tensor>& top_k, const std::optional<Tensor>& top_p,
    const std::optional<Tensor>& min_p, std::optional<int64_t> max_num_drafts) {
  constexpr const char* op = kSampledRagged;
  constexpr const char* b_what = "B (cu_num_draft_tokens.size(0))";
  check_ragged_inputs(op, draft_token_ids, cu_num_draft_tokens, target_logits, pad_id, max_num_drafts, kCpu);
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
  Tensor accepted = empty_like_on(draft_token_ids, {B}), out = empty_like_on(draft_token_ids, {B, W});
  dispatch_index(draft_token_ids.scalar_type(), [&](auto index) {
    using index_t = decltype(index);
    verify_sampled<index_t>(a, ragged_ids<const index_t>(draft_token_ids, l.draft_start.data()),
                            accepted.mutable_data_ptr<index_t>(), 1, ids<index_t>(out), current_isa(),
                            TorchParallelFor{});
  });
  return {accepted, out};
}

// Not lossless (lenient.h): accepts near-greedy drafts too.
std::tuple<Tensor, Tensor> verify_lenient_cpu(const Tensor& draft_tokens, const Tensor& target_logits,
                                              const std::optional<Tensor>& num_drafts, int64_t top_k, double min_ratio,
                                              int64_t pad_id) {
  check_verify_inputs(kLenient, draft_tokens, target_logits, kCpu);
  check_ok(kLenient, lenient_error(top_k, min_ratio));
  const int64_t B = draft_tokens.size(0), K = draft_tokens.size(1);
  std::vector<int64_t> nd = checked_num_drafts(kLenient, num_drafts, B, K);
  VerifyArgs a = verify_args(draft_tokens, target_logits);
  a.num_drafts = nd.data();
  const LenientRule rule{top_k, std::log(min_ratio)};
  Tensor accepted = empty_like_on(draft_tokens, {B}), out = empty_like_on(draft_tokens, {B, K + 1});
  dispatch_index(draft_tokens.scalar_type(), [&](auto index) {
    using index_t = decltype(index);
    verify_lenient<index_t>(a, ids<const index_t>(draft_tokens), rule, pad_id, accepted.mutable_data_ptr<index_t>(), 1,
                            ids<index_t>(out), TorchParallelFor{});
  });
  return {accepted, out};
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(mtp, CPU, m) {
  m.impl("verify_sampled", TORCH_BOX(&verify_sampled_cpu));
  m.impl("verify_lenient", TORCH_BOX(&verify_lenient_cpu));
  m.impl("verify", TORCH_BOX(&verify_cpu));
  m.impl("accept_prefix", TORCH_BOX(&accept_prefix_cpu));
  m.impl("verify_ragged", TORCH_BOX(&verify_ragged_cpu));
  m.impl("verify_sampled_ragged", TORCH_BOX(&verify_sampled_ragged_cpu));
}

}  // namespace mtp::cpu
