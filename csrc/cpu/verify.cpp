// CPU bindings of mtp.verify and mtp.accept_prefix: tensors -> pointers, checks, threads.
#include <torch/library.h>

#include "checks.h"
#include "mtp/verify.h"

namespace mtp::cpu {
namespace {

constexpr const char* kVerify = "mtp.verify";
constexpr const char* kAccept = "mtp.accept_prefix";

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

}  // namespace

TORCH_LIBRARY_IMPL(mtp, CPU, m) {
  m.impl("verify", &verify_cpu);
  m.impl("accept_prefix", &accept_prefix_cpu);
}

}  // namespace mtp::cpu
