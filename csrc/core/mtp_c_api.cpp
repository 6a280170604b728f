// The C API (mtp.h): argument checks, then the same header-only kernels the torch ops run.
#include <vector>

#include "checks.h"
#include "mtp/isa.h"
#include "mtp/mtp.h"
#include "mtp/parallel.h"
#include "mtp/verify.h"

static_assert(int(MTP_FLOAT32) == int(mtp::DType::F32) && int(MTP_BFLOAT16) == int(mtp::DType::BF16) &&
                  int(MTP_FLOAT16) == int(mtp::DType::F16),
              "mtp_dtype float values must equal mtp::DType");

namespace mtp::capi {
namespace {

template <class I>
IdView<I> ids(const mtp_tensor* t) {
  return {static_cast<I*>(t->data), {t->strides[0], t->strides[1]}};
}

// Calls fn(I{}) with I the C++ type of an int32/int64 view.
template <class Fn>
void with_id_type(const mtp_tensor* t, Fn&& fn) {
  if (t->dtype == MTP_INT32) fn(int32_t{});
  else fn(int64_t{});
}

// The outputs take the draft ids' dtype, like the torch ops.
std::initializer_list<mtp_dtype> same_ids(const mtp_tensor* draft) {
  static constexpr std::initializer_list<mtp_dtype> i32 = {MTP_INT32}, i64 = {MTP_INT64};
  return draft->dtype == MTP_INT32 ? i32 : i64;
}

}  // namespace
}  // namespace mtp::capi

using namespace mtp;
using namespace mtp::capi;

extern "C" {

mtp_status mtp_verify(const mtp_tensor* draft_tokens, const mtp_tensor* target_logits, const mtp_tensor* num_drafts,
                      int64_t pad_id, const mtp_tensor* accepted, const mtp_tensor* out_tokens, int32_t num_threads) {
  return guarded("mtp_verify", [&](Checker& c) {
    int threads = 1;
    if (!c.tensor("draft_tokens", draft_tokens, 2, "[B, K]", kIdTypes)) return c.status;
    const int64_t B = draft_tokens->sizes[0], K = draft_tokens->sizes[1];
    std::vector<int64_t> nd;
    if (!c.tensor("target_logits", target_logits, 3, "[B, K+1, V]", kFloatTypes) ||
        !c.size("target_logits", target_logits, 0, B, "B (draft_tokens.sizes[0])") ||
        !c.size("target_logits", target_logits, 1, K + 1, "K+1 (draft_tokens.sizes[1] + 1)"))
      return c.status;
    const int64_t V = target_logits->sizes[2];
    if (V < 1) {
      c.fail(MTP_ERROR_INVALID_ARGUMENT, "target_logits must have a vocabulary of V >= 1 entries, got V = ", V);
      return c.status;
    }
    if (!c.num_drafts(num_drafts, B, K, &nd) ||
        !c.tensor("accepted", accepted, 1, "[B]", same_ids(draft_tokens)) ||
        !c.size("accepted", accepted, 0, B, "B (draft_tokens.sizes[0])") ||
        !c.tensor("out_tokens", out_tokens, 2, "[B, K+1]", same_ids(draft_tokens)) ||
        !c.size("out_tokens", out_tokens, 0, B, "B (draft_tokens.sizes[0])") ||
        !c.size("out_tokens", out_tokens, 1, K + 1, "K+1 (draft_tokens.sizes[1] + 1)") || !c.threads(num_threads, &threads))
      return c.status;

    VerifyArgs a;
    a.B = B; a.K = K; a.V = V;
    a.logits = target_logits->data;
    a.logits_dtype = float_dtype(target_logits->dtype);
    for (int d = 0; d < 3; ++d) a.logits_stride[d] = target_logits->strides[d];
    a.num_drafts = nd.data();
    std::vector<int64_t> target(size_t(B * (K + 1)), 0);
    greedy_targets(a, target.data(), threads, current_isa(), ThreadParallelFor{threads});
    with_id_type(draft_tokens, [&](auto id) {
      using I = decltype(id);
      accept_and_emit<I, int64_t>(B, K, ids<const I>(draft_tokens), {target.data(), {K + 1, 1}}, nd.data(), pad_id,
                                  static_cast<I*>(accepted->data), accepted->strides[0], ids<I>(out_tokens));
    });
    return MTP_OK;
  });
}

mtp_status mtp_accept_prefix(const mtp_tensor* draft_tokens, const mtp_tensor* target_tokens,
                             const mtp_tensor* num_drafts, const mtp_tensor* accepted) {
  return guarded("mtp_accept_prefix", [&](Checker& c) {
    if (!c.tensor("draft_tokens", draft_tokens, 2, "[B, K]", kIdTypes)) return c.status;
    const int64_t B = draft_tokens->sizes[0], K = draft_tokens->sizes[1];
    std::vector<int64_t> nd;
    if (!c.tensor("target_tokens", target_tokens, 2, "[B, K+1] or [B, K]", kIdTypes) ||
        !c.size("target_tokens", target_tokens, 0, B, "B (draft_tokens.sizes[0])"))
      return c.status;
    if (target_tokens->sizes[1] != K + 1 && target_tokens->sizes[1] != K) {
      c.fail(MTP_ERROR_INVALID_ARGUMENT, "target_tokens.sizes[1] must be K+1 = ", K + 1, " or K = ", K, ", got ",
             target_tokens->sizes[1]);
      return c.status;
    }
    if (!c.num_drafts(num_drafts, B, K, &nd) || !c.tensor("accepted", accepted, 1, "[B]", same_ids(draft_tokens)) ||
        !c.size("accepted", accepted, 0, B, "B (draft_tokens.sizes[0])"))
      return c.status;
    with_id_type(draft_tokens, [&](auto id) {
      using I = decltype(id);
      with_id_type(target_tokens, [&](auto tid) {
        using J = decltype(tid);
        accept_lengths<I, J>(B, K, ids<const I>(draft_tokens), ids<const J>(target_tokens), nd.data(),
                             static_cast<I*>(accepted->data), accepted->strides[0]);
      });
    });
    return MTP_OK;
  });
}

const char* mtp_last_error(void) { return last_error().c_str(); }

const char* mtp_status_name(mtp_status status) {
  switch (status) {
    case MTP_OK: return "MTP_OK";
    case MTP_ERROR_NULL_POINTER: return "MTP_ERROR_NULL_POINTER";
    case MTP_ERROR_INVALID_ARGUMENT: return "MTP_ERROR_INVALID_ARGUMENT";
    case MTP_ERROR_UNSUPPORTED_DTYPE: return "MTP_ERROR_UNSUPPORTED_DTYPE";
    case MTP_ERROR_UNSUPPORTED: return "MTP_ERROR_UNSUPPORTED";
    case MTP_ERROR_OUT_OF_MEMORY: return "MTP_ERROR_OUT_OF_MEMORY";
    case MTP_ERROR_INTERNAL: return "MTP_ERROR_INTERNAL";
  }
  return "unknown status";
}

const char* mtp_get_isa(void) { return isa_name(current_isa()); }

int mtp_isa_supported(const char* name) {
  Isa isa;
  return name && parse_isa(name, &isa) && isa_supported(isa) ? 1 : 0;
}

mtp_status mtp_set_isa(const char* name) {
  Checker c("mtp_set_isa");
  Isa isa;
  if (!name) c.fail(MTP_ERROR_NULL_POINTER, "name is NULL");
  else if (!parse_isa(name, &isa))
    c.fail(MTP_ERROR_INVALID_ARGUMENT, "unknown instruction set '", name, "' (expected generic, avx2, avx512, neon or neon_fp16)");
  else if (!set_isa(isa))
    c.fail(MTP_ERROR_UNSUPPORTED, "this CPU does not support the '", name, "' instruction set");
  return c.status;
}

}  // extern "C"
