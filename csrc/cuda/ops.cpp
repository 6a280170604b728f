// CUDA bindings of mtp.verify, mtp.verify_ragged, mtp.accept_prefix, mtp.linear, mtp.head_attention and
// mtp.cache_append: the checks the CPU bindings make (shared), tensors -> pointers, the
// current stream. Built only with
// -DMTP_WITH_CUDA=ON; the kernels are behind the torch-free mtp/cuda/launch.h.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>

#include "../torch/adapter.h"
#include "mtp/cuda/launch.h"

namespace mtp::cuda {
namespace {

using namespace mtp::torch_adapter;  // csrc/torch/adapter.h: the checks shared with the CPU binding

constexpr const char* kVerify = "mtp.verify";
constexpr const char* kAccept = "mtp.accept_prefix";
constexpr const char* kRagged = "mtp.verify_ragged";
// The same words as the Triton launcher's (mtp_kernels/_checks.py).
constexpr const char* kRaggedCaptureNeedsMax =
    "max_num_drafts is needed while a CUDA graph is captured (the width would need cu_num_draft_tokens's values "
    "on the host)";
constexpr const char* kLinear = "mtp.linear";
// The same words as the Triton launcher's (mtp_kernels/_checks.py).
constexpr const char* kGgufCpuOnly = "GGUF block-type weights (gguf_type) run on the CPU only: call it on CPU tensors";
constexpr const char* kInt8CpuOnly =
    "int8 weights run on the CPU only (no GPU kernel for Q8 blocks yet): call it on CPU tensors, or dequantize "
    "(mtp_kernels.dequantize_q8) for the GPU";

// A [B] count vector on the device: its shape checked, and its values (in [0, hi]) on the
// host, which costs one sync; not while a CUDA graph is being captured (no sync is allowed
// there): nullopt then, and the kernels guard themselves.
std::optional<std::vector<int64_t>> device_counts(const char* op, const char* name, const at::Tensor& n, int64_t B,
                                                  const char* b_what, int64_t hi, const char* hi_what,
                                                  const at::Device& device) {
  check_device(op, name, n, device);
  check_count_vector(op, name, n, B, b_what);
  if (c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None) return std::nullopt;
  return checked_counts(op, name, n.cpu(), B, b_what, hi, hi_what);
}

// num_drafts as a contiguous int64 device tensor (undefined when absent), its values
// checked (device_counts); under capture the kernels clamp to [0, K], so nothing is read
// out of range.
at::Tensor device_num_drafts(const char* op, const c10::optional<at::Tensor>& nd, int64_t B, int64_t K,
                             const at::Device& device) {
  if (!nd.has_value()) return {};
  device_counts(op, "num_drafts", *nd, B, "B (draft_tokens.size(0))", K, "K", device);
  return nd->to(at::kLong).contiguous();
}

int sm_count(const at::Device& device) {
  int n = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device.index()));
  return n;
}

// verify's two kernels over a's B requests of K + 1 rows (any layout a describes), with
// their workspace from torch's caching allocator; writes accepted [B] and out [B, K+1].
template <class I>
void run_verify(const VerifyArgs& a, IdView<const I> draft, int64_t pad_id, const at::Tensor& logits,
                at::Tensor& accepted, at::Tensor& out) {
  const int64_t rows = a.B * (a.K + 1);
  VerifyWork work;
  work.splits = verify_splits(rows, a.V, sm_count(logits.device()));
  // Workspace from torch's caching allocator (aligned far beyond alignof(ArgmaxResult)).
  const int64_t nparts = rows * work.splits;
  at::Tensor partials = at::empty({nparts * int64_t(sizeof(ArgmaxResult))}, logits.options().dtype(at::kByte));
  at::Tensor targets = at::empty({rows}, logits.options().dtype(at::kLong));
  work.partials = reinterpret_cast<ArgmaxResult*>(partials.data_ptr<uint8_t>());
  work.targets = targets.data_ptr<int64_t>();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  C10_CUDA_CHECK(verify<I>(a, draft, pad_id, accepted.data_ptr<I>(), ids<I>(out), work, stream));
}

std::tuple<at::Tensor, at::Tensor> verify_cuda(const at::Tensor& draft_tokens, const at::Tensor& target_logits,
                                               const c10::optional<at::Tensor>& num_drafts, int64_t pad_id) {
  const at::Device device = target_logits.device();
  check_verify_inputs(kVerify, draft_tokens, target_logits, device);
  const c10::cuda::CUDAGuard guard(device);
  const int64_t B = draft_tokens.size(0), K = draft_tokens.size(1);
  at::Tensor nd = device_num_drafts(kVerify, num_drafts, B, K, device);
  VerifyArgs a = verify_args(draft_tokens, target_logits);
  a.num_drafts = nd.defined() ? nd.data_ptr<int64_t>() : nullptr;

  auto opts = draft_tokens.options();
  at::Tensor accepted = at::empty({B}, opts), out = at::empty({B, K + 1}, opts);
  AT_DISPATCH_INDEX_TYPES(draft_tokens.scalar_type(), "verify_cuda", [&] {
    run_verify<index_t>(a, ids<const index_t>(draft_tokens), pad_id, target_logits, accepted, out);
  });
  return {accepted, out};
}

// The flattened ragged layout: verify's kernels with per-request row offsets. Without
// max_num_drafts the width comes from cu's values on the host (one sync); while a CUDA graph
// is captured max_num_drafts is required, cu is not read on the host, and the layout
// computed on the device is clamped so that no read goes out of range.
std::tuple<at::Tensor, at::Tensor> verify_ragged_cuda(const at::Tensor& draft_token_ids,
                                                      const at::Tensor& cu_num_draft_tokens,
                                                      const at::Tensor& target_logits, int64_t pad_id,
                                                      c10::optional<int64_t> max_num_drafts) {
  const at::Device device = target_logits.device();
  check_ragged_inputs(kRagged, draft_token_ids, cu_num_draft_tokens, target_logits, pad_id, max_num_drafts, device);
  const c10::cuda::CUDAGuard guard(device);
  const int64_t N = draft_token_ids.size(0), B = cu_num_draft_tokens.size(0);
  int64_t W;
  if (c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None) {
    TORCH_CHECK(max_num_drafts.has_value(), kRagged, ": ", kRaggedCaptureNeedsMax);
    W = *max_num_drafts + 1;
  } else {
    W = checked_ragged_layout(kRagged, cu_num_draft_tokens.cpu(), N, max_num_drafts).width;
  }
  auto opts = draft_token_ids.options();
  at::Tensor accepted = at::empty({B}, opts), out = at::empty({B, W}, opts);
  if (B == 0) return {accepted, out};
  // K_b, cu[b-1], cu[b-1] + b on the device: cu[b-1] in [0, N], K_b in [0, min(W - 1, N - cu[b-1])].
  const at::Tensor cu = cu_num_draft_tokens.to(at::kLong).clamp(0, N);
  const at::Tensor prev = at::cat({at::zeros({1}, cu.options()), cu.slice(0, 0, B - 1)});
  const at::Tensor counts = (cu - prev).clamp(0, W - 1).contiguous();
  const at::Tensor first_row = (prev + at::arange(B, cu.options())).contiguous();
  const at::Tensor draft_first = prev.contiguous();
  const VerifyArgs a =
      ragged_verify_args(target_logits, B, W, counts.data_ptr<int64_t>(), first_row.data_ptr<int64_t>());
  AT_DISPATCH_INDEX_TYPES(draft_token_ids.scalar_type(), "verify_ragged_cuda", [&] {
    run_verify<index_t>(a, ragged_ids<const index_t>(draft_token_ids, draft_first.data_ptr<int64_t>()), pad_id,
                        target_logits, accepted, out);
  });
  return {accepted, out};
}

at::Tensor accept_prefix_cuda(const at::Tensor& draft_tokens, const at::Tensor& target_tokens,
                              const c10::optional<at::Tensor>& num_drafts) {
  const at::Device device = draft_tokens.device();
  check_accept_inputs(kAccept, draft_tokens, target_tokens, device);
  const c10::cuda::CUDAGuard guard(device);
  const int64_t B = draft_tokens.size(0), K = draft_tokens.size(1);
  at::Tensor nd = device_num_drafts(kAccept, num_drafts, B, K, device);
  at::Tensor accepted = at::empty({B}, draft_tokens.options());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_INDEX_TYPES(draft_tokens.scalar_type(), "accept_prefix_draft", [&] {
    using I = index_t;
    AT_DISPATCH_INDEX_TYPES(target_tokens.scalar_type(), "accept_prefix_target", [&] {
      const cudaError_t err =
          accept_prefix<I, index_t>(B, K, ids<const I>(draft_tokens), ids<const index_t>(target_tokens),
                                    nd.defined() ? nd.data_ptr<int64_t>() : nullptr, accepted.data_ptr<I>(), stream);
      C10_CUDA_CHECK(err);
    });
  });
  return accepted;
}

at::Tensor linear_cuda(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                       const c10::optional<at::Tensor>& weight_scale, bool quantize_x,
                       c10::optional<int64_t> gguf_type) {
  TORCH_CHECK(x.is_cuda(), kLinear, ": x must be on a CUDA device like the other arguments, got ", x.device());
  TORCH_CHECK(!gguf_type.has_value(), kLinear, ": ", kGgufCpuOnly, ", got weight on ", weight.device());
  const c10::cuda::CUDAGuard guard(x.device());
  // quantize_x needs an int8 weight (checked here), which is refused below: CPU only.
  LinearCall c = prepare_linear(kLinear, x, weight, bias, weight_scale, quantize_x);
  TORCH_CHECK(c.args.w_dtype != DType::I8, kLinear, ": ", kInt8CpuOnly, ", got weight on ", weight.device());
  C10_CUDA_CHECK(linear(c.args, c10::cuda::getCurrentCUDAStream()));
  return c.result();
}

constexpr const char* kAttn = "mtp.head_attention";
constexpr const char* kAppend = "mtp.cache_append";

at::Tensor head_attention_cuda(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                               const at::Tensor& cache_lens, const c10::optional<at::Tensor>& k_local,
                               const c10::optional<at::Tensor>& v_local, c10::optional<double> scale, bool causal,
                               c10::optional<int64_t> window) {
  const at::Device device = q.device();
  AttentionArgs a = attention_args(kAttn, q, k_cache, v_cache, k_local, v_local, scale, causal, device);
  check_ok(kAttn, set_window(a, window.value_or(0), k_local.has_value()));
  TORCH_CHECK(a.D <= kAttnMaxD, kAttn, ": the CUDA kernel takes head dims D <= ", kAttnMaxD, ", got D = ", a.D);
  const c10::cuda::CUDAGuard guard(device);
  const int64_t L = k_cache.size(2);
  const auto lens =
      device_counts(kAttn, "cache_lens", cache_lens, a.B, "B (q.size(0))", L, "L (k_cache.size(2))", device);
  if (lens) check_attention_lens(kAttn, a, *lens);
  // The grid covers the longest cache, or the capacity while a graph is captured (no sync);
  // blocks past a request's length return at once. Lengths are clamped to [0, L] on the
  // device, so an unchecked one cannot send a read out of range.
  const int64_t longest = lens ? (lens->empty() ? 0 : *std::max_element(lens->begin(), lens->end())) : L;
  at::Tensor dlens = cache_lens.to(at::kLong).clamp(0, L).contiguous();
  a.cache_lens = dlens.data_ptr<int64_t>();
  at::Tensor out = at::empty({a.B, a.T, a.Hq, a.D}, q.options());
  a.out = out.data_ptr();
  AttentionWork w = attention_work(a, longest);
  at::Tensor ml = at::empty({w.partials * 2}, q.options().dtype(at::kFloat));
  at::Tensor acc = at::empty({w.partials * a.D}, q.options().dtype(at::kFloat));
  w.ml = ml.data_ptr<float>();
  w.acc = acc.data_ptr<float>();
  C10_CUDA_CHECK(head_attention(a, w, c10::cuda::getCurrentCUDAStream()));
  return out;
}

void cache_append_cuda(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k_new,
                       const at::Tensor& v_new, const at::Tensor& cache_lens) {
  const at::Device device = k_new.device();
  CacheAppendArgs a = cache_append_args(kAppend, k_cache, v_cache, k_new, v_new, device);
  const c10::cuda::CUDAGuard guard(device);
  const auto lens =
      device_counts(kAppend, "cache_lens", cache_lens, a.B, "B (k_new.size(0))", a.L, "L (k_cache.size(2))", device);
  if (lens) check_append_lens(kAppend, a, *lens);
  at::Tensor dlens = cache_lens.to(at::kLong).contiguous();  // the kernel writes nothing if one overflows
  a.cache_lens = dlens.data_ptr<int64_t>();
  C10_CUDA_CHECK(mtp::cuda::cache_append(a, c10::cuda::getCurrentCUDAStream()));  // not the CPU template (ADL)
}

}  // namespace

TORCH_LIBRARY_IMPL(mtp, CUDA, m) {
  m.impl("verify", &verify_cuda);
  m.impl("verify_ragged", &verify_ragged_cuda);
  m.impl("accept_prefix", &accept_prefix_cuda);
  m.impl("linear", &linear_cuda);
  m.impl("head_attention", &head_attention_cuda);
  m.impl("cache_append", &cache_append_cuda);
}

}  // namespace mtp::cuda
