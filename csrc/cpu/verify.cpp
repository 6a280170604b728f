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

// accepted[b] and out_tokens[b] from per-position target ids (int64, row stride K+1).
template <class I>
void finish(const at::Tensor& draft, const int64_t* target, const int64_t* nd, int64_t pad,
            at::Tensor& accepted, at::Tensor& out) {
  const int64_t B = draft.size(0), K = draft.size(1);
  const I* d = draft.data_ptr<I>();
  I* acc = accepted.data_ptr<I>();
  I* o = out.data_ptr<I>();
  for (int64_t b = 0; b < B; ++b) {
    const I* db = d + b * draft.stride(0);
    const int64_t* tb = target + b * (K + 1);
    int64_t n = accept_length(db, draft.stride(1), tb, 1, nd[b]);
    acc[b] = I(n);
    emit_tokens(db, draft.stride(1), tb, K, n, pad, o + b * (K + 1));
  }
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
    const I* d = draft_tokens.data_ptr<I>();
    I* acc = accepted.data_ptr<I>();
    AT_DISPATCH_INDEX_TYPES(target_tokens.scalar_type(), "accept_prefix_target", [&] {
      const index_t* t = target_tokens.data_ptr<index_t>();
      for (int64_t b = 0; b < B; ++b)
        acc[b] = I(accept_length(d + b * draft_tokens.stride(0), draft_tokens.stride(1),
                                 t + b * target_tokens.stride(0), target_tokens.stride(1), n[b]));
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
