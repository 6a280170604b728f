// CPU bindings of mtp.verify and mtp.accept_prefix: tensors -> pointers, checks, threads.
#include <torch/library.h>

#include "checks.h"
#include "mtp/verify.h"

namespace mtp::cpu {
namespace {

constexpr const char* kVerify = "mtp.verify";
constexpr const char* kAccept = "mtp.accept_prefix";

void check_drafts(const char* op, const at::Tensor& draft) {
  check_cpu(op, "draft_tokens", draft);
  check_dtype(op, "draft_tokens", draft, kIdTypes);
  check_dim(op, "draft_tokens", draft, 2, "[B, K]");
}

// I may be const-qualified (an input view).
template <class I>
IdView<I> ids(const at::Tensor& t) {
  return {t.data_ptr<std::remove_const_t<I>>(), {t.stride(0), t.stride(1)}};
}

// accepted[b] and out_tokens[b] from per-position target ids (int64, row stride K+1).
template <class I>
void finish(const at::Tensor& draft, const int64_t* target, const int64_t* nd, int64_t pad,
            at::Tensor& accepted, at::Tensor& out) {
  const int64_t K = draft.size(1);
  accept_and_emit<I, int64_t>(draft.size(0), K, ids<const I>(draft), {target, {K + 1, 1}}, nd, pad,
                              accepted.data_ptr<I>(), 1, ids<I>(out));
}

std::tuple<at::Tensor, at::Tensor> verify_cpu(const at::Tensor& draft_tokens, const at::Tensor& target_logits,
                                              const c10::optional<at::Tensor>& num_drafts, int64_t pad_id) {
  check_drafts(kVerify, draft_tokens);
  check_cpu(kVerify, "target_logits", target_logits);
  check_dtype(kVerify, "target_logits", target_logits, kFloatTypes);
  check_dim(kVerify, "target_logits", target_logits, 3, "[B, K+1, V]");
  const int64_t B = draft_tokens.size(0), K = draft_tokens.size(1);
  check_size(kVerify, "target_logits", target_logits, 0, B, "B (draft_tokens.size(0))");
  check_size(kVerify, "target_logits", target_logits, 1, K + 1, "K+1 (draft_tokens.size(1) + 1)");
  const int64_t V = target_logits.size(2);
  TORCH_CHECK(V > 0, kVerify, ": target_logits must have a vocabulary of V >= 1 entries, got V = 0");
  std::vector<int64_t> nd = checked_num_drafts(kVerify, num_drafts, B, K);

  VerifyArgs a;
  a.B = B; a.K = K; a.V = V;
  a.logits = target_logits.data_ptr();
  a.logits_dtype = to_dtype(target_logits.scalar_type());
  for (int d = 0; d < 3; ++d) a.logits_stride[d] = target_logits.stride(d);
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

at::Tensor accept_prefix_cpu(const at::Tensor& draft_tokens, const at::Tensor& target_tokens,
                             const c10::optional<at::Tensor>& num_drafts) {
  check_drafts(kAccept, draft_tokens);
  check_cpu(kAccept, "target_tokens", target_tokens);
  check_dtype(kAccept, "target_tokens", target_tokens, kIdTypes);
  check_dim(kAccept, "target_tokens", target_tokens, 2, "[B, K+1] or [B, K]");
  const int64_t B = draft_tokens.size(0), K = draft_tokens.size(1);
  check_size(kAccept, "target_tokens", target_tokens, 0, B, "B (draft_tokens.size(0))");
  TORCH_CHECK(target_tokens.size(1) == K + 1 || target_tokens.size(1) == K, kAccept,
              ": target_tokens.size(1) must be K+1 = ", K + 1, " or K = ", K, ", got ", target_tokens.size(1));
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

}  // namespace

TORCH_LIBRARY_IMPL(mtp, CPU, m) {
  m.impl("verify", &verify_cpu);
  m.impl("accept_prefix", &accept_prefix_cpu);
}

}  // namespace mtp::cpu
