// CUDA bindings of mtp.verify, mtp.accept_prefix and mtp.linear: the checks the CPU
// bindings make (shared), tensors -> pointers, the current stream. Built only with
// -DMTP_WITH_CUDA=ON; the kernels are behind the torch-free mtp/cuda/launch.h.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../cpu/checks.h"
#include "mtp/cuda/launch.h"

namespace mtp::cuda {
namespace {

using namespace mtp::cpu;  // the shared checks

constexpr const char* kVerify = "mtp.verify";
constexpr const char* kAccept = "mtp.accept_prefix";
constexpr const char* kLinear = "mtp.linear";

// num_drafts as a contiguous int64 device tensor (undefined when absent). Its values are
// checked on the host, which costs one sync; not while a CUDA graph is being captured
// (no sync is allowed there): the kernels clamp to [0, K], so nothing is read out of range.
at::Tensor device_num_drafts(const char* op, const c10::optional<at::Tensor>& nd, int64_t B, int64_t K,
                             const at::Device& device) {
  if (!nd.has_value()) return {};
  check_device(op, "num_drafts", *nd, device);
  check_dtype(op, "num_drafts", *nd, kIdTypes);
  check_dim(op, "num_drafts", *nd, 1, "[B]");
  check_size(op, "num_drafts", *nd, 0, B, "B (draft_tokens.size(0))");
  if (c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None)
    checked_num_drafts(op, nd->cpu(), B, K);
  return nd->to(at::kLong).contiguous();
}

int sm_count(const at::Device& device) {
  int n = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device.index()));
  return n;
}

std::tuple<at::Tensor, at::Tensor> verify_cuda(const at::Tensor& draft_tokens, const at::Tensor& target_logits,
                                               const c10::optional<at::Tensor>& num_drafts, int64_t pad_id) {
  const at::Device device = target_logits.device();
  check_verify_inputs(kVerify, draft_tokens, target_logits, device);
  const c10::cuda::CUDAGuard guard(device);
  const int64_t B = draft_tokens.size(0), K = draft_tokens.size(1), V = target_logits.size(2);
  at::Tensor nd = device_num_drafts(kVerify, num_drafts, B, K, device);
  VerifyArgs a = verify_args(draft_tokens, target_logits);
  a.num_drafts = nd.defined() ? nd.data_ptr<int64_t>() : nullptr;

  VerifyWork work;
  work.splits = verify_splits(B * (K + 1), V, sm_count(device));
  // Workspace from torch's caching allocator (aligned far beyond alignof(ArgmaxResult)).
  const int64_t nparts = B * (K + 1) * work.splits;
  at::Tensor partials = at::empty({nparts * int64_t(sizeof(ArgmaxResult))}, target_logits.options().dtype(at::kByte));
  at::Tensor targets = at::empty({B * (K + 1)}, target_logits.options().dtype(at::kLong));
  work.partials = reinterpret_cast<ArgmaxResult*>(partials.data_ptr<uint8_t>());
  work.targets = targets.data_ptr<int64_t>();

  auto opts = draft_tokens.options();
  at::Tensor accepted = at::empty({B}, opts), out = at::empty({B, K + 1}, opts);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_INDEX_TYPES(draft_tokens.scalar_type(), "verify_cuda", [&] {
    const cudaError_t err = verify<index_t>(a, ids<const index_t>(draft_tokens), pad_id,
                                            accepted.data_ptr<index_t>(), ids<index_t>(out), work, stream);
    C10_CUDA_CHECK(err);
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
      const cudaError_t err = accept_prefix<I, index_t>(B, K, ids<const I>(draft_tokens), ids<const index_t>(target_tokens),
                                                        nd.defined() ? nd.data_ptr<int64_t>() : nullptr,
                                                        accepted.data_ptr<I>(), stream);
      C10_CUDA_CHECK(err);
    });
  });
  return accepted;
}

at::Tensor linear_cuda(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.is_cuda(), kLinear, ": x must be on a CUDA device like the other arguments, got ", x.device());
  const c10::cuda::CUDAGuard guard(x.device());
  LinearCall c = prepare_linear(kLinear, x, weight, bias);
  C10_CUDA_CHECK(linear(c.args, c10::cuda::getCurrentCUDAStream()));
  return c.result();
}

}  // namespace

TORCH_LIBRARY_IMPL(mtp, CUDA, m) {
  m.impl("verify", &verify_cuda);
  m.impl("accept_prefix", &accept_prefix_cuda);
  m.impl("linear", &linear_cuda);
}

}  // namespace mtp::cuda
