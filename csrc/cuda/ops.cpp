// CUDA bindings of mtp.verify, mtp.verify_ragged, mtp.accept_prefix, mtp.linear, mtp.head_attention and
// mtp.cache_append: the checks the CPU bindings make (shared), tensors -> pointers, the
// current stream. Built only with
// -DMTP_WITH_CUDA=ON; the kernels are behind the torch-free mtp/cuda/launch.h.
#include <cuda_runtime_api.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>

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

using DeviceGuard = torch::stable::accelerator::DeviceGuard;

// C10_CUDA_CHECK's job, in its words.
void check_cuda(cudaError_t err) { MTP_CHECK(err == cudaSuccess, "CUDA error: ", cudaGetErrorString(err)); }

// torch's current CUDA stream of a device: the C shim's function (libtorch_cuda, declared
// in shim.h only under USE_CUDA; torch 2.11's stable Stream has no native handle).
extern "C" int32_t aoti_torch_get_current_cuda_stream(int32_t device_index, void** ret_stream);

// The current stream of the current device (set by the caller's DeviceGuard).
cudaStream_t current_stream() {
  const auto index = torch::stable::accelerator::getCurrentDeviceIndex();
  void* stream = nullptr;
  MTP_CHECK(aoti_torch_get_current_cuda_stream(int32_t(index), &stream) == 0,
            "mtp: torch could not give the current CUDA stream of device ", int(index));
  return static_cast<cudaStream_t>(stream);
}

// Whether a CUDA graph is being captured on the current stream (the stable ABI has no
// c10::cuda::currentStreamCaptureStatusMayInitCtx; this is what it asks).
bool capturing() {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(current_stream(), &status));
  return status != cudaStreamCaptureStatusNone;
}

// Value checks (counts, lengths) need the values, which live on the device. By default they
// run there, without a host sync: the kernels record a bad value in the op's slot of a small
// array of mapped pinned host memory (one per device, allocated once) and compute on the value
// clamped; the next mtp call on that device raises (or mtp_kernels.cuda_check() after a sync).
// MTP_CUDA_SYNC_CHECKS=1 checks them on the host at the call (one sync per call), as the CPU.
bool sync_checks() {
  const char* v = std::getenv("MTP_CUDA_SYNC_CHECKS");
  return v && *v && std::strcmp(v, "0") != 0;
}

constexpr int kMaxDevices = 64;

struct DeviceFlags {
  bool tried = false;
  unsigned long long* host = nullptr;  // kFlagSlots records, 0: none (nullptr: not available)
  unsigned long long* dev = nullptr;   // the same memory as the kernels see it
};

// The device's flags, allocated at its first use outside a capture (allocating is not allowed
// inside one); nullptr if they are not there (then the values are checked on the host).
DeviceFlags* flags_of(int index, bool may_allocate) {
  static std::mutex mu;
  static std::array<DeviceFlags, kMaxDevices> all;
  if (index < 0 || index >= kMaxDevices) return nullptr;
  const std::lock_guard<std::mutex> lock(mu);
  DeviceFlags& f = all[size_t(index)];
  if (!f.tried && may_allocate) {
    f.tried = true;
    void* p = nullptr;
    void* d = nullptr;
    cudaError_t err =
        cudaHostAlloc(&p, kFlagSlots * sizeof(unsigned long long), cudaHostAllocMapped | cudaHostAllocPortable);
    if (err == cudaSuccess) {
      std::memset(p, 0, kFlagSlots * sizeof(unsigned long long));
      err = cudaHostGetDevicePointer(&d, p, 0);
      if (err == cudaSuccess) {
        f.host = static_cast<unsigned long long*>(p);
        f.dev = static_cast<unsigned long long*>(d);
      }
    }
    // A failure leaves the host checks in place; clear its error (only then: another call's
    // pending error is not ours to clear), or the next launch check would report it.
    if (err != cudaSuccess) (void)cudaGetLastError();
  }
  return f.host ? &f : nullptr;
}

// Whether this call's counts and lengths are checked on the host: with MTP_CUDA_SYNC_CHECKS,
// or when the device cannot record them; never inside a capture (no sync allowed there).
bool host_checks(const Device& device) {
  if (capturing()) return false;
  return sync_checks() || !flags_of(device.index(), true);
}

// The device pointer of an op's slot, or nullptr when the values were checked on the host.
// Never allocates: values not checked on the host means host_checks found the flags there,
// or a capture, where allocating is not allowed (so it asks no second time whether it is one).
unsigned long long* flag_slot(const Device& device, FlagSlot slot, bool checked_on_host) {
  if (checked_on_host) return nullptr;
  DeviceFlags* f = flags_of(device.index(), false);
  return f ? f->dev + slot : nullptr;
}

struct SlotText {
  const char* op;
  const char* name;
  const char* range;
  const char* effect;
};
constexpr std::array<SlotText, kFlagSlots> kSlotText = {{
    {"mtp.verify", "num_drafts", "[0, K]", "its rows were verified with the count clamped to [0, K]"},
    {"mtp.accept_prefix", "num_drafts", "[0, K]", "it counted with the value clamped to [0, K]"},
    {"mtp.verify_ragged", "cu_num_draft_tokens",
     "non-decreasing inclusive counts ending at N, at most max_num_drafts per request",
     "its layout was clamped into range"},
    {"mtp.head_attention", "cache_lens", "[0, L] ([T, L] when causal)",
     "its rows were computed with the length clamped to [0, L]"},
    {"mtp.cache_append", "cache_lens", "[0, L - T]", "it wrote nothing"},
}};

// The error recorded on a device's flags since the last look (and clears them), "" if none.
std::string take_recorded(int index) {
  DeviceFlags* f = flags_of(index, false);
  if (!f) return "";
  auto* slots = reinterpret_cast<volatile unsigned long long*>(f->host);
  for (int s = 0; s < kFlagSlots; ++s) {
    const unsigned long long v = slots[s];
    if (!v) continue;
    slots[s] = 0;
    const SlotText& t = kSlotText[size_t(s)];
    std::ostringstream os;
    os << t.op << ": " << t.name << " must lie in " << t.range << ", got " << t.name << "[" << int64_t(v >> 32) - 1
       << "] = " << int32_t(uint32_t(v & 0xffffffffu)) << " in an earlier call on cuda:" << index << "; " << t.effect
       << " (values are checked on the device, without a host sync; MTP_CUDA_SYNC_CHECKS=1 checks them at the "
          "call)";
    return os.str();
  }
  return "";
}

// Raises what an earlier call recorded on this device (no sync: what the GPU has run so far).
void raise_recorded(const Device& device) {
  const std::string msg = take_recorded(device.index());
  MTP_CHECK(msg.empty(), msg);
}

// A [B] count vector on the device: its shape checked, and, with MTP_CUDA_SYNC_CHECKS, its
// values (in [0, hi]) on the host, which costs one sync; never while a CUDA graph is being
// captured (no sync is allowed there). nullopt when not read: the kernels check and guard.
std::optional<std::vector<int64_t>> device_counts(const char* op, const char* name, const Tensor& n, int64_t B,
                                                  const char* b_what, int64_t hi, const char* hi_what,
                                                  const Device& device) {
  check_device(op, name, n, device);
  check_count_vector(op, name, n, B, b_what);
  if (!host_checks(device)) return std::nullopt;
  return checked_counts(op, name, torch::stable::to(n, kCpu), B, b_what, hi, hi_what);
}

// A count vector's values as a contiguous int64 device tensor, clamped to [lo, hi]; values
// outside `check` recorded in its slot (unless check.flag is null).
Tensor device_int64(const Tensor& n, int64_t B, int64_t lo, int64_t hi, ValueCheck check) {
  Tensor out = empty_like_on(n, {B}, ScalarType::Long);
  dispatch_index(n.scalar_type(), [&](auto index) {
    using index_t = decltype(index);
    check_cuda(clamp_to_int64<index_t>(n.mutable_data_ptr<index_t>(), n.stride(0), B, lo, hi,
                                       out.mutable_data_ptr<int64_t>(), check, current_stream()));
  });
  return out;
}

// num_drafts as a contiguous int64 device tensor clamped to [0, K] (none when absent), its
// values checked on the host (MTP_CUDA_SYNC_CHECKS) or on the device (slot).
std::optional<Tensor> device_num_drafts(const char* op, FlagSlot slot, const std::optional<Tensor>& nd, int64_t B,
                                        int64_t K, const Device& device) {
  if (!nd.has_value()) return std::nullopt;
  const bool on_host = device_counts(op, "num_drafts", *nd, B, "B (draft_tokens.size(0))", K, "K", device).has_value();
  return device_int64(*nd, B, 0, K, ValueCheck{0, K, flag_slot(device, slot, on_host)});
}

int sm_count(const Device& device) {
  static std::array<int, kMaxDevices> cached{};  // read once per device (a driver call)
  const int index = device.index();
  if (index >= 0 && index < kMaxDevices && cached[size_t(index)]) return cached[size_t(index)];
  int n = 0;
  check_cuda(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, index));
  if (index >= 0 && index < kMaxDevices) cached[size_t(index)] = n;
  return n;
}

// verify's two kernels over a's B requests of K + 1 rows (any layout a describes), with
// their workspace from torch's caching allocator; writes accepted [B] and out [B, K+1].
template <class I>
void run_verify(const VerifyArgs& a, IdView<const I> draft, int64_t pad_id, const Tensor& logits, Tensor& accepted,
                Tensor& out) {
  const int64_t rows = a.B * (a.K + 1);
  VerifyWork work;
  work.splits = verify_splits(rows, a.V, sm_count(logits.device()));
  // Workspace from torch's caching allocator (aligned far beyond alignof(ArgmaxResult)).
  const int64_t nparts = rows * work.splits;
  Tensor partials = empty_like_on(logits, {nparts * int64_t(sizeof(ArgmaxResult))}, ScalarType::Byte);
  Tensor targets = empty_like_on(logits, {rows}, ScalarType::Long);
  work.partials = reinterpret_cast<ArgmaxResult*>(partials.mutable_data_ptr<uint8_t>());
  work.targets = targets.mutable_data_ptr<int64_t>();
  const cudaStream_t stream = current_stream();
  check_cuda(verify<I>(a, draft, pad_id, accepted.mutable_data_ptr<I>(), ids<I>(out), work, stream));
}

std::tuple<Tensor, Tensor> verify_cuda(const Tensor& draft_tokens, const Tensor& target_logits,
                                       const std::optional<Tensor>& num_drafts, int64_t pad_id) {
  const Device device = target_logits.device();
  check_verify_inputs(kVerify, draft_tokens, target_logits, device);
  const DeviceGuard guard(device.index());
  raise_recorded(device);
  const int64_t B = draft_tokens.size(0), K = draft_tokens.size(1);
  const std::optional<Tensor> nd = device_num_drafts(kVerify, kFlagVerify, num_drafts, B, K, device);
  VerifyArgs a = verify_args(draft_tokens, target_logits);
  a.num_drafts = nd ? nd->mutable_data_ptr<int64_t>() : nullptr;

  Tensor accepted = empty_like_on(draft_tokens, {B}), out = empty_like_on(draft_tokens, {B, K + 1});
  dispatch_index(draft_tokens.scalar_type(), [&](auto index) {
    using index_t = decltype(index);
    run_verify<index_t>(a, ids<const index_t>(draft_tokens), pad_id, target_logits, accepted, out);
  });
  return {accepted, out};
}

// The flattened ragged layout: verify's kernels with per-request row offsets. Without
// max_num_drafts the width comes from cu's values on the host (one sync); while a CUDA graph
// is captured max_num_drafts is required, cu is not read on the host, and the layout
// computed on the device is clamped so that no read goes out of range.
std::tuple<Tensor, Tensor> verify_ragged_cuda(const Tensor& draft_token_ids, const Tensor& cu_num_draft_tokens,
                                              const Tensor& target_logits, int64_t pad_id,
                                              std::optional<int64_t> max_num_drafts) {
  const Device device = target_logits.device();
  check_ragged_inputs(kRagged, draft_token_ids, cu_num_draft_tokens, target_logits, pad_id, max_num_drafts, device);
  const DeviceGuard guard(device.index());
  raise_recorded(device);
  const int64_t N = draft_token_ids.size(0), B = cu_num_draft_tokens.size(0);
  // On the host (one sync) with MTP_CUDA_SYNC_CHECKS, or when the width needs cu's values;
  // else checked on the device.
  int64_t W;
  const bool on_host = host_checks(device) || (!max_num_drafts.has_value() && !capturing());
  if (on_host) {
    W = checked_ragged_layout(kRagged, torch::stable::to(cu_num_draft_tokens, kCpu), N, max_num_drafts).width;
  } else {
    MTP_CHECK(max_num_drafts.has_value(), kRagged, ": ", kRaggedCaptureNeedsMax);
    W = *max_num_drafts + 1;
  }
  Tensor accepted = empty_like_on(draft_token_ids, {B}), out = empty_like_on(draft_token_ids, {B, W});
  if (B == 0) return {accepted, out};
  // K_b, cu[b-1], cu[b-1] + b on the device (ragged_layout): cu[b-1] in [0, N], K_b in
  // [0, min(W - 1, N - cu[b-1])].
  Tensor layout = empty_like_on(target_logits, {3, B}, ScalarType::Long);
  int64_t* counts = layout.mutable_data_ptr<int64_t>();
  int64_t *first_row = counts + B, *draft_first = counts + 2 * B;
  const VerifyArgs a = ragged_verify_args(target_logits, B, W, counts, first_row);
  dispatch_index(cu_num_draft_tokens.scalar_type(), [&](auto index) {
    using index_t = decltype(index);
    check_cuda(ragged_layout<index_t>(cu_num_draft_tokens.mutable_data_ptr<index_t>(), cu_num_draft_tokens.stride(0), B,
                                      N, W, counts, first_row, draft_first, flag_slot(device, kFlagRagged, on_host),
                                      current_stream()));
  });
  dispatch_index(draft_token_ids.scalar_type(), [&](auto index) {
    using index_t = decltype(index);
    run_verify<index_t>(a, ragged_ids<const index_t>(draft_token_ids, draft_first), pad_id, target_logits, accepted,
                        out);
  });
  return {accepted, out};
}

Tensor accept_prefix_cuda(const Tensor& draft_tokens, const Tensor& target_tokens,
                          const std::optional<Tensor>& num_drafts) {
  const Device device = draft_tokens.device();
  check_accept_inputs(kAccept, draft_tokens, target_tokens, device);
  const DeviceGuard guard(device.index());
  raise_recorded(device);
  const int64_t B = draft_tokens.size(0), K = draft_tokens.size(1);
  const std::optional<Tensor> nd = device_num_drafts(kAccept, kFlagAccept, num_drafts, B, K, device);
  Tensor accepted = empty_like_on(draft_tokens, {B});
  const cudaStream_t stream = current_stream();
  dispatch_index(draft_tokens.scalar_type(), [&](auto index) {
    using index_t = decltype(index);
    using I = index_t;
    dispatch_index(target_tokens.scalar_type(), [&](auto index) {
      using index_t = decltype(index);
      const cudaError_t err = accept_prefix<I, index_t>(
          B, K, ids<const I>(draft_tokens), ids<const index_t>(target_tokens),
          nd ? nd->mutable_data_ptr<int64_t>() : nullptr, accepted.mutable_data_ptr<I>(), stream);
      check_cuda(err);
    });
  });
  return accepted;
}

Tensor linear_cuda(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias,
                   const std::optional<Tensor>& weight_scale, bool quantize_x, std::optional<int64_t> gguf_type) {
  MTP_CHECK(x.is_cuda(), kLinear, ": x must be on a CUDA device like the other arguments, got ",
            device_str(x.device()));
  MTP_CHECK(!gguf_type.has_value(), kLinear, ": ", kGgufCpuOnly, ", got weight on ", device_str(weight.device()));
  const DeviceGuard guard(x.device().index());
  raise_recorded(x.device());
  // quantize_x needs an int8 weight (checked here), which is refused below: CPU only.
  LinearCall c = prepare_linear(kLinear, x, weight, bias, weight_scale, quantize_x);
  MTP_CHECK(c.args.w_dtype != DType::I8, kLinear, ": ", kInt8CpuOnly, ", got weight on ", device_str(weight.device()));
  const int64_t floats = linear_workspace(c.args);
  const std::optional<Tensor> work =
      floats ? std::optional<Tensor>(empty_like_on(c.y, {floats}, ScalarType::Float)) : std::nullopt;
  check_cuda(linear(c.args, work ? work->mutable_data_ptr<float>() : nullptr, current_stream()));
  return c.result();
}

constexpr const char* kAttn = "mtp.head_attention";
constexpr const char* kAppend = "mtp.cache_append";

Tensor head_attention_cuda(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& cache_lens,
                           const std::optional<Tensor>& k_local, const std::optional<Tensor>& v_local,
                           std::optional<double> scale, bool causal, std::optional<int64_t> window) {
  const Device device = q.device();
  AttentionArgs a = attention_args(kAttn, q, k_cache, v_cache, k_local, v_local, scale, causal, device);
  check_ok(kAttn, set_window(a, window.value_or(0), k_local.has_value()));
  MTP_CHECK(a.D <= kAttnMaxD, kAttn, ": the CUDA kernel takes head dims D <= ", kAttnMaxD, ", got D = ", a.D);
  const DeviceGuard guard(device.index());
  raise_recorded(device);
  const int64_t L = k_cache.size(2);
  const auto lens =
      device_counts(kAttn, "cache_lens", cache_lens, a.B, "B (q.size(0))", L, "L (k_cache.size(2))", device);
  if (lens) check_attention_lens(kAttn, a, *lens);
  // The grid covers the longest cache when the lengths were read on the host, else the
  // capacity (its blocks loop over chunks; chunks past a request's length cost little).
  // Lengths are clamped to [0, L] on the device, so an unchecked one cannot send a read out of
  // range, and recorded when outside [0, L] ([T, L] when causal).
  const int64_t longest = lens ? (lens->empty() ? 0 : *std::max_element(lens->begin(), lens->end())) : L;
  const ValueCheck check{a.causal && a.T > 0 ? a.T : 0, L, flag_slot(device, kFlagAttention, lens.has_value())};
  Tensor dlens = device_int64(cache_lens, a.B, 0, L, check);
  a.cache_lens = dlens.mutable_data_ptr<int64_t>();
  Tensor out = empty_like_on(q, {a.B, a.T, a.Hq, a.D});
  a.out = out.data_ptr();
  AttentionWork w = attention_work(a, longest, sm_count(device));
  Tensor ml = empty_like_on(q, {w.partials * 2}, ScalarType::Float);
  Tensor acc = empty_like_on(q, {w.partials * a.D}, ScalarType::Float);
  w.ml = ml.mutable_data_ptr<float>();
  w.acc = acc.mutable_data_ptr<float>();
  check_cuda(head_attention(a, w, current_stream()));
  return out;
}

void cache_append_cuda(const Tensor& k_cache, const Tensor& v_cache, const Tensor& k_new, const Tensor& v_new,
                       const Tensor& cache_lens) {
  const Device device = k_new.device();
  CacheAppendArgs a = cache_append_args(kAppend, k_cache, v_cache, k_new, v_new, device);
  const DeviceGuard guard(device.index());
  raise_recorded(device);
  const auto lens =
      device_counts(kAppend, "cache_lens", cache_lens, a.B, "B (k_new.size(0))", a.L, "L (k_cache.size(2))", device);
  if (lens) check_append_lens(kAppend, a, *lens);
  // Not clamped: the kernel writes nothing if one would pass the capacity (recorded here).
  const ValueCheck check{0, a.L - a.T, flag_slot(device, kFlagAppend, lens.has_value())};
  Tensor dlens = device_int64(cache_lens, a.B, INT64_MIN, INT64_MAX, check);
  a.cache_lens = dlens.mutable_data_ptr<int64_t>();
  check_cuda(mtp::cuda::cache_append(a, current_stream()));  // not the CPU template (ADL)
}

}  // namespace

// For _C.device_check (csrc/ops.cpp): what take_recorded finds on device `index`.
std::string recorded_error(int index) { return take_recorded(index); }

STABLE_TORCH_LIBRARY_IMPL(mtp, CUDA, m) {
  m.impl("verify", TORCH_BOX(&verify_cuda));
  m.impl("verify_ragged", TORCH_BOX(&verify_ragged_cuda));
  m.impl("accept_prefix", TORCH_BOX(&accept_prefix_cuda));
  m.impl("linear", TORCH_BOX(&linear_cuda));
  m.impl("head_attention", TORCH_BOX(&head_attention_cuda));
  m.impl("cache_append", TORCH_BOX(&cache_append_cuda));
}

}  // namespace mtp::cuda
