// The torch adapter of the CPU and CUDA bindings (csrc/cpu/*.cpp, csrc/cuda/ops.cpp): tensors ->
// the kernels' pointers, strides and dtypes, TorchParallelFor, and the tensor checks, whose
// every message names the op, the argument, what was expected and what came.
//
// Only torch's stable C ABI (torch/csrc/stable, torch/headeronly): every accessor is a call
// into a C shim function, so one build loads under every later torch that keeps that ABI
// (docs/torch-versions.md). Nothing here may use ATen or c10's C++ API: one such symbol ties
// the whole extension to one torch release again (python_tests/test_torch_version.py checks).
#pragma once
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mtp/attention_args.h"
#include "mtp/cache.h"
#include "mtp/common.h"
#include "mtp/linear_args.h"
#include "mtp/op_args.h"
#include "mtp/verify_args.h"

// Raises RuntimeError(message) unless cond; the message is built only on failure (like
// TORCH_CHECK, without STD_TORCH_CHECK's function / file / line prefix: the messages are the contract).
#define MTP_CHECK(cond, ...)                              \
  do {                                                    \
    if (!(cond)) ::mtp::torch_adapter::fail(__VA_ARGS__); \
  } while (false)

// Hidden like torch::stable's own types (their members are): nothing of it is exported.
#pragma GCC visibility push(hidden)
namespace mtp::torch_adapter {

using Tensor = torch::stable::Tensor;
using Device = torch::stable::Device;
using DeviceType = torch::headeronly::DeviceType;
using ScalarType = torch::headeronly::ScalarType;
using TensorList = std::vector<Tensor>;

template <class... A>
[[noreturn]] void fail(const A&... a) {
  std::ostringstream s;
  (s << ... << a);
  throw std::runtime_error(s.str());
}

// A shape as torch prints one: [2, 3] ([] for a scalar).
struct Shape {
  torch::headeronly::IntHeaderOnlyArrayRef sizes;
};
inline Shape shape_of(const Tensor& t) { return {t.sizes()}; }
inline std::ostream& operator<<(std::ostream& s, const Shape& sh) {
  s << '[';
  for (size_t i = 0; i < sh.sizes.size(); ++i) s << (i ? ", " : "") << sh.sizes[i];
  return s << ']';
}
inline bool same_shape(const Tensor& a, const Tensor& b) {  // no operator== on torch 2.11's size refs
  const auto x = a.sizes(), y = b.sizes();
  return x.size() == y.size() && std::equal(x.begin(), x.end(), y.begin());
}

// A device as torch prints one (c10::Device::str): "cpu", "cuda:0", "meta".
inline std::string device_str(const Device& d) {
  const char* name = "unknown";
  switch (d.type()) {
    case DeviceType::CPU: name = "cpu"; break;
    case DeviceType::CUDA: name = "cuda"; break;
    case DeviceType::HIP: name = "hip"; break;
    case DeviceType::XPU: name = "xpu"; break;
    case DeviceType::MPS: name = "mps"; break;
    case DeviceType::Meta: name = "meta"; break;
    case DeviceType::XLA: name = "xla"; break;
    case DeviceType::HPU: name = "hpu"; break;
    case DeviceType::Lazy: name = "lazy"; break;
    case DeviceType::MTIA: name = "mtia"; break;
    case DeviceType::PrivateUse1: name = "privateuseone"; break;
    default: break;
  }
  return d.has_index() ? std::string(name) + ":" + std::to_string(d.index()) : std::string(name);
}

inline const Device kCpu{DeviceType::CPU};

// AT_DISPATCH_INDEX_TYPES's job: fn(I{}) with I the C++ type of an int32 / int64 tensor.
template <class Fn>
void dispatch_index(ScalarType t, Fn&& fn) {
  if (t == ScalarType::Int)
    fn(int32_t{});
  else
    fn(int64_t{});
}

// The product of t's sizes before the last: its number of rows [..., n].
inline int64_t leading_rows(const Tensor& t) {
  const auto s = t.sizes();
  int64_t n = 1;
  for (size_t i = 0; i + 1 < s.size(); ++i) n *= s[i];
  return n;
}

inline std::vector<int64_t> sizes_vec(const Tensor& t) {
  const auto s = t.sizes();
  return std::vector<int64_t>(s.begin(), s.end());
}

// A new tensor of `shape` on like's device (dtype: like's unless given).
inline Tensor empty_like_on(const Tensor& like, torch::headeronly::IntHeaderOnlyArrayRef shape,
                            std::optional<ScalarType> dtype = std::nullopt) {
  return torch::stable::empty(shape, dtype ? *dtype : like.scalar_type(), std::nullopt, like.device());
}

inline std::string dtype_list(std::initializer_list<ScalarType> ok) {
  std::ostringstream s;
  const char* sep = "";
  for (auto t : ok) {
    s << sep << t;
    sep = " or ";
  }
  return s.str();
}

inline void check_dtype(const char* op, const char* name, const Tensor& t, std::initializer_list<ScalarType> ok) {
  for (auto d : ok)
    if (t.scalar_type() == d) return;
  MTP_CHECK(false, op, ": ", name, " must be ", dtype_list(ok), ", got ", t.scalar_type());
}

// The kernels form byte offsets (stride * element bytes) even over a size-1 dimension, where
// torch allows any stride (as_strided): each must fit int64.
inline void check_strides(const char* op, const char* name, const Tensor& t) {
  for (int64_t d = 0; d < t.dim(); ++d)
    MTP_CHECK(t.stride(d) <= INT64_MAX / 8 && t.stride(d) >= -(INT64_MAX / 8), op, ": ", name, ".stride(", d,
              ") = ", t.stride(d), " is too large (its byte offset would overflow int64)");
}

inline void check_dim(const char* op, const char* name, const Tensor& t, int64_t dim, const char* shape) {
  MTP_CHECK(t.dim() == dim, op, ": ", name, " must be ", dim, "-D ", shape, ", got shape ", shape_of(t));
  check_strides(op, name, t);
}

inline void check_size(const char* op, const char* name, const Tensor& t, int64_t d, int64_t want, const char* what) {
  MTP_CHECK(t.size(d) == want, op, ": ", name, ".size(", d, ") must equal ", what, " = ", want, ", got ", t.size(d),
            " (shape ", shape_of(t), ")");
}

inline void check_device(const char* op, const char* name, const Tensor& t, const Device& want) {
  MTP_CHECK(t.device() == want, op, ": ", name, " must be on ",
            want.is_cpu() ? std::string("the CPU") : device_str(want), " like the other arguments, got ",
            device_str(t.device()));
}

inline void check_cpu(const char* op, const char* name, const Tensor& t) { check_device(op, name, t, kCpu); }

constexpr std::initializer_list<ScalarType> kIdTypes = {ScalarType::Int, ScalarType::Long};
constexpr std::initializer_list<ScalarType> kFloatTypes = {ScalarType::Float, ScalarType::BFloat16, ScalarType::Half};

inline DType to_dtype(ScalarType t) {
  return t == ScalarType::Float ? DType::F32 : t == ScalarType::BFloat16 ? DType::BF16 : DType::F16;
}

inline void check_same_dtype(const char* op, const char* name, const Tensor& t, const char* ref_name,
                             const Tensor& ref) {
  MTP_CHECK(t.scalar_type() == ref.scalar_type(), op, ": ", name, " must have ", ref_name, "'s dtype ",
            ref.scalar_type(), ", got ", t.scalar_type());
}

// A [B] vector of int32/int64 counts, each checked to lie in [0, hi], as int64 values
// (a plain loop: these vectors are tiny and tensor ops cost microseconds per decode step).
// b_what / hi_what say where B and hi come from.
inline void check_count_vector(const char* op, const char* name, const Tensor& n, int64_t B, const char* b_what) {
  check_dtype(op, name, n, kIdTypes);
  check_dim(op, name, n, 1, "[B]");
  check_size(op, name, n, 0, B, b_what);
}

inline std::vector<int64_t> checked_counts(const char* op, const char* name, const Tensor& n, int64_t B,
                                           const char* b_what, int64_t hi, const char* hi_what) {
  check_cpu(op, name, n);
  check_count_vector(op, name, n, B, b_what);
  std::vector<int64_t> out(B);
  dispatch_index(n.scalar_type(), [&](auto i) {
    const auto* p = n.const_data_ptr<decltype(i)>();
    for (int64_t b = 0; b < B; ++b) {
      out[b] = p[b * n.stride(0)];
      MTP_CHECK(out[b] >= 0 && out[b] <= hi, op, ": ", name, " must lie in [0, ", hi_what, "] = [0, ", hi, "], got ",
                name, "[", b, "] = ", out[b]);
    }
  });
  return out;
}

// num_drafts as int64 values in [0, K] (all K when absent).
inline std::vector<int64_t> checked_num_drafts(const char* op, const std::optional<Tensor>& nd, int64_t B, int64_t K) {
  if (!nd.has_value()) return std::vector<int64_t>(B, K);
  return checked_counts(op, "num_drafts", *nd, B, "B (draft_tokens.size(0))", K, "K");
}

// Raises "op: msg" unless msg is empty (the checks shared with the C API, mtp/op_args.h).
inline void check_ok(const char* op, const std::string& msg) { MTP_CHECK(msg.empty(), op, ": ", msg); }

// A tensor as op_args.h's View (sizes and strides point into the tensor's own metadata).
inline View view_of(const char* name, const Tensor& t) {
  View v;
  v.name = name;
  v.data = t.numel() ? t.data_ptr() : nullptr;
  v.elem_bytes = int64_t(t.element_size());
  v.ndim = t.dim();
  v.sizes = t.sizes().data();
  v.strides = t.strides().data();
  return v;
}

using NamedTensor = std::pair<const char*, const Tensor*>;

// The aliasing rule (op_args.h): each of `outputs` (written in place) has no overlapping
// elements (self: checked here) and shares no memory with another output or with `inputs`.
inline void check_written(const char* op, const char* why, std::initializer_list<NamedTensor> outputs,
                          std::initializer_list<NamedTensor> inputs) {
  View views[kMaxAliasViews];
  MTP_CHECK(outputs.size() + inputs.size() <= kMaxAliasViews, op,
            ": internal error: too many views in one aliasing check");
  size_t n = 0;
  for (const NamedTensor& t : outputs) views[n++] = view_of(t.first, *t.second);
  for (const NamedTensor& t : inputs) views[n++] = view_of(t.first, *t.second);
  check_ok(op, aliasing_error(views, n, outputs.size(), why));
}

// The written outputs (a pass's caches, its tap_out) against its weights (~180 tensors): names
// built only on a hit.
template <class Name>
void check_disjoint(const char* op, std::initializer_list<NamedTensor> outputs, const TensorList& inputs, Name&& name) {
  View outs[kMaxAliasViews];
  MTP_CHECK(outputs.size() <= kMaxAliasViews, op, ": internal error: too many views in one aliasing check");
  size_t n = 0;
  for (const NamedTensor& t : outputs) outs[n++] = view_of(t.first, *t.second);
  check_ok(op, disjoint_error(
                   outs, n, int64_t(inputs.size()),
                   [&](int64_t i, View* v) {
                     *v = view_of("", inputs[size_t(i)]);
                     return true;
                   },
                   name));
}

// draft_tokens [B, K] and `name` (dtypes `ok`, `dim`-D `shape`, B rows) on `device`: what
// verify and accept_prefix check alike. Returns K.
inline int64_t check_drafts_with(const char* op, const Tensor& draft, const char* name, const Tensor& t,
                                 std::initializer_list<ScalarType> ok, int64_t dim, const char* shape,
                                 const Device& device) {
  check_device(op, "draft_tokens", draft, device);
  check_dtype(op, "draft_tokens", draft, kIdTypes);
  check_dim(op, "draft_tokens", draft, 2, "[B, K]");
  check_device(op, name, t, device);
  check_dtype(op, name, t, ok);
  check_dim(op, name, t, dim, shape);
  const int64_t K = draft.size(1);
  MTP_CHECK(K < INT64_MAX, op, ": draft_tokens.size(1) = K = ", K, " is too large (K + 1 overflows int64)");
  check_size(op, name, t, 0, draft.size(0), "B (draft_tokens.size(0))");
  return K;
}

// draft_tokens [B, K] and target_logits [B, K+1, V] of mtp.verify; both on `device`.
inline void check_verify_inputs(const char* op, const Tensor& draft, const Tensor& logits, const Device& device) {
  const int64_t K = check_drafts_with(op, draft, "target_logits", logits, kFloatTypes, 3, "[B, K+1, V]", device);
  check_size(op, "target_logits", logits, 1, K + 1, "K+1 (draft_tokens.size(1) + 1)");
  MTP_CHECK(logits.size(2) > 0, op, ": target_logits must have a vocabulary of V >= 1 entries, got V = 0");
}

// draft_tokens [B, K] and target_tokens [B, K+1] or [B, K] of mtp.accept_prefix.
inline void check_accept_inputs(const char* op, const Tensor& draft, const Tensor& target, const Device& device) {
  const int64_t K = check_drafts_with(op, draft, "target_tokens", target, kIdTypes, 2, "[B, K+1] or [B, K]", device);
  MTP_CHECK(target.size(1) == K + 1 || target.size(1) == K, op, ": target_tokens.size(1) must be K+1 = ", K + 1,
            " or K = ", K, ", got ", target.size(1));
}

// mtp.verify_ragged's tensors on `device`: draft_token_ids [N], cu_num_draft_tokens [B]
// (both int32/int64), target_logits [N + B, V]; max_num_drafts's range; pad_id fits the ids.
inline void check_ragged_inputs(const char* op, const Tensor& draft, const Tensor& cu, const Tensor& logits,
                                int64_t pad_id, std::optional<int64_t> max_num_drafts, const Device& device) {
  check_device(op, "draft_token_ids", draft, device);
  check_dtype(op, "draft_token_ids", draft, kIdTypes);
  check_dim(op, "draft_token_ids", draft, 1, "[N]");
  check_device(op, "cu_num_draft_tokens", cu, device);
  check_dtype(op, "cu_num_draft_tokens", cu, kIdTypes);
  check_dim(op, "cu_num_draft_tokens", cu, 1, "[B]");
  check_device(op, "target_logits", logits, device);
  check_dtype(op, "target_logits", logits, kFloatTypes);
  check_dim(op, "target_logits", logits, 2, "[N + B, V]");
  check_ok(op, ragged_rows_error(draft.size(0), cu.size(0), logits.size(0), "target_logits.size(0)"));
  MTP_CHECK(logits.size(1) > 0, op, ": target_logits must have a vocabulary of V >= 1 entries, got V = 0");
  if (max_num_drafts.has_value()) check_ok(op, ragged_cap_error("max_num_drafts", *max_num_drafts, nullptr));
  check_ok(op, pad_id_error(pad_id, draft.scalar_type() == ScalarType::Int));
}

// cu_num_draft_tokens's values (a CPU tensor) checked, as the request layout; its width is
// max_num_drafts + 1 when given (checked >= every K_b), else the widest request + 1.
inline RaggedLayout checked_ragged_layout(const char* op, const Tensor& cu, int64_t N,
                                          std::optional<int64_t> max_num_drafts) {
  const int64_t B = cu.size(0);
  std::vector<int64_t> v(B);
  dispatch_index(cu.scalar_type(), [&](auto i) {
    const auto* p = cu.const_data_ptr<decltype(i)>();
    for (int64_t b = 0; b < B; ++b) v[b] = p[b * cu.stride(0)];
  });
  RaggedLayout l;
  check_ok(op, ragged_layout_error(v.data(), B, N, "draft_token_ids.size(0)", &l));
  if (max_num_drafts.has_value()) check_ok(op, ragged_cap_error("max_num_drafts", *max_num_drafts, &l));
  l.width = (max_num_drafts.has_value() ? *max_num_drafts : l.max_drafts) + 1;
  return l;
}

// verify_ragged's logits [N + B, V] as verify's kernel arguments: request b's row t is row
// first_row[b] + t, K = W - 1, num_drafts = K_b (pointers into l, which must outlive them).
inline VerifyArgs ragged_verify_args(const Tensor& logits, int64_t B, int64_t W, const int64_t* num_drafts,
                                     const int64_t* first_row) {
  VerifyArgs a;
  a.B = B;
  a.K = W - 1;
  a.V = logits.size(1);
  a.logits = logits.data_ptr();
  a.logits_dtype = to_dtype(logits.scalar_type());
  a.logits_stride[0] = 0;
  a.logits_stride[1] = logits.stride(0);
  a.logits_stride[2] = logits.stride(1);
  a.num_drafts = num_drafts;
  a.first_row = first_row;
  return a;
}

// The checked verify inputs as kernel arguments (num_drafts left to the caller).
inline VerifyArgs verify_args(const Tensor& draft, const Tensor& logits) {
  VerifyArgs a;
  a.B = draft.size(0);
  a.K = draft.size(1);
  a.V = logits.size(2);
  a.logits = logits.data_ptr();
  a.logits_dtype = to_dtype(logits.scalar_type());
  for (int d = 0; d < 3; ++d) a.logits_stride[d] = logits.stride(d);
  return a;
}

// A 2-D id tensor as an IdView; I may be const-qualified (an input view).
template <class I>
IdView<I> ids(const Tensor& t) {
  return {t.mutable_data_ptr<std::remove_const_t<I>>(), {t.stride(0), t.stride(1)}};
}

// draft_token_ids [N] as verify_ragged's per-request rows: request b's drafts start at
// first[b] (cu[b-1]).
template <class I>
IdView<I> ragged_ids(const Tensor& t, const int64_t* first) {
  return {t.mutable_data_ptr<std::remove_const_t<I>>(), {0, t.stride(0)}, first};
}

// mtp.linear's tensors, checked, as kernel arguments: x as [M, K] rows (read in place when
// each row is contiguous, whatever their stride), bias as fp32, y an fp32 [M, N] buffer;
// `result()` is the output.
struct LinearCall {
  Tensor x2, y;
  std::optional<Tensor> bias;
  std::vector<int64_t> out_shape;
  ScalarType out_dtype;
  LinearArgs args;
  Tensor result() const { return torch::stable::reshape(torch::stable::to(y, out_dtype), out_shape); }
};

// Q8 scales `name` of an int8 matrix [N, K]: fp32 [N, ceil(K/32)] on `device` (the caller
// checks that the rows are unit-stride: weight_scale_rows_error, in its own words).
inline void check_q8_scales(const char* op, const char* name, const Tensor& s, int64_t N, const char* n_what, int64_t K,
                            const Device& device) {
  check_device(op, name, s, device);
  check_dtype(op, name, s, {ScalarType::Float});
  check_dim(op, name, s, 2, kWeightScaleShape);
  check_size(op, name, s, 0, N, n_what);
  check_size(op, name, s, 1, q8_blocks(K), kWeightScaleBlocks);
}

// An int8 weight [N, K] takes weight_scale, fp32 [N, ceil(K/32)] with unit-stride rows (both
// read in place); a float weight takes none.
inline void check_weight_scale(const char* op, const Tensor& weight, const std::optional<Tensor>& weight_scale,
                               const Device& device) {
  const int64_t N = weight.size(0), K = weight.size(1), blocks = q8_blocks(K);
  if (weight.scalar_type() != ScalarType::Char) {
    MTP_CHECK(!weight_scale.has_value(), op, ": weight_scale goes with an int8 weight only (Q8 blocks), got a ",
              weight.scalar_type(), " weight");
    return;
  }
  MTP_CHECK(weight_scale.has_value(), op, ": an int8 weight needs weight_scale, Float ", kWeightScaleShape, " = [", N,
            ", ", blocks, "] (one scale per block of 32 along K), got None");
  const Tensor& s = *weight_scale;
  check_q8_scales(op, "weight_scale", s, N, "N (weight.size(0))", K, device);
  check_ok(op, weight_scale_rows_error(blocks, s.stride(0), s.stride(1)));
}

// quantize_x quantizes the activations like the weights: only with an int8 weight.
inline void check_quantize_x(const char* op, const Tensor& weight, bool quantize_x) {
  MTP_CHECK(!quantize_x || weight.scalar_type() == ScalarType::Char, op,
            ": quantize_x=True needs an int8 weight with weight_scale (mtp_kernels.quantize_q8), got a ",
            weight.scalar_type(), " weight");
}

// A GGUF block-type weight (GGML type number `type`): uint8 [N, row bytes of K elements],
// bytes contiguous within a row, no scales (they are in the blocks). Returns its DType.
inline DType check_gguf_weight(const char* op, const char* name, const Tensor& w, int64_t type, int64_t K) {
  check_ok(op, gguf_type_error(type));
  DType t;
  gguf_dtype(type, &t);
  MTP_CHECK(w.scalar_type() == ScalarType::Byte, op, ": ", name, " of GGML type ", type, " (", block_type_name(t),
            ") must be its uint8 bytes [N, row bytes], got ", w.scalar_type());
  check_dim(op, name, w, 2, "[N, row bytes]");
  const std::string e = gguf_weight_error(t, w.size(0), K, w.size(1), w.stride(0), w.stride(1));
  MTP_CHECK(e.empty(), op, ": ", name, ": ", e);
  return t;
}

inline LinearCall prepare_linear(const char* op, const Tensor& x, const Tensor& weight,
                                 const std::optional<Tensor>& bias, const std::optional<Tensor>& weight_scale,
                                 bool quantize_x = false, std::optional<int64_t> gguf_type = std::nullopt) {
  const Device device = x.device();
  check_device(op, "weight", weight, device);
  check_dtype(op, "x", x, {ScalarType::Float, ScalarType::BFloat16});
  MTP_CHECK(x.dim() >= 1, op, ": x must have at least 1 dimension [..., K], got a scalar");
  check_strides(op, "x", x);
  const int64_t K = x.size(-1), N = weight.dim() == 2 ? weight.size(0) : 0;
  check_ok(op, row_length_error("K (x.size(-1))", K));
  DType block = DType::F32;
  if (gguf_type.has_value()) {
    block = check_gguf_weight(op, "weight", weight, *gguf_type, K);
    MTP_CHECK(!weight_scale.has_value(), op,
              ": a GGUF block-type weight carries its scales; weight_scale must be None");
    MTP_CHECK(!quantize_x, op,
              ": quantize_x is for Q8 (int8) weights; a GGUF block-type weight always takes "
              "its activations as int8 rows");
  } else {
    check_dtype(op, "weight", weight, {ScalarType::Float, ScalarType::BFloat16, ScalarType::Char});
    check_dim(op, "weight", weight, 2, "[N, K]");
    check_size(op, "weight", weight, 1, K, "K (x.size(-1))");
    check_ok(op, weight_rows_error(K, weight.stride(0), weight.stride(1)));
    check_weight_scale(op, weight, weight_scale, device);
    check_quantize_x(op, weight, quantize_x);
  }
  LinearCall c;
  if (bias.has_value()) {
    check_device(op, "bias", *bias, device);
    check_dim(op, "bias", *bias, 1, "[N]");
    check_size(op, "bias", *bias, 0, N, "N (weight.size(0))");
    c.bias = torch::stable::contiguous(torch::stable::to(*bias, ScalarType::Float));
  }
  const int64_t M = leading_rows(x);
  // x as [M, K] rows: read in place when they have unit inner stride (any row stride, also
  // when the leading dims collapse into one), else copied (activations are small).
  c.x2 = x.dim() == 2 ? x : torch::stable::reshape(x, {M, K});
  if (c.x2.stride(1) != 1) c.x2 = torch::stable::contiguous(c.x2);
  c.y = empty_like_on(x, {M, N}, ScalarType::Float);
  c.out_shape = sizes_vec(x);
  c.out_shape.back() = N;
  c.out_dtype = x.scalar_type();
  LinearArgs& a = c.args;
  a.M = M;
  a.N = N;
  a.K = K;
  a.x = c.x2.data_ptr();
  a.x_dtype = to_dtype(x.scalar_type());
  a.x_stride = c.x2.stride(0);
  if (gguf_type.has_value()) {
    a.w = weight.data_ptr();
    a.w_dtype = block;
    a.w_stride = weight.stride(0);
  } else if (weight_scale.has_value())
    set_q8_weight(a, weight.data_ptr(), weight.stride(0), weight_scale->mutable_data_ptr<float>(),
                  weight_scale->stride(0));
  else {
    a.w = weight.data_ptr();
    a.w_dtype = to_dtype(weight.scalar_type());
    a.w_stride = weight.stride(0);
  }
  a.bias = c.bias ? c.bias->mutable_data_ptr<float>() : nullptr;
  a.y = c.y.mutable_data_ptr<float>();
  a.y_stride = N;
  a.quantize_x = quantize_x;
  return c;
}

inline void strides_of(const Tensor& t, int64_t* out) {
  for (int d = 0; d < 4; ++d) out[d] = t.stride(d);
}

// k_cache / v_cache: [B, Hkv, L, D] views on `device` of `ref`'s dtype, both the same shape;
// set as either op's argument struct's caches (same member names), read/written in place.
template <class Args>
void set_caches(const char* op, Args& a, const Tensor& k, const Tensor& v, const char* ref_name, const Tensor& ref,
                const Device& device) {
  check_device(op, "k_cache", k, device);
  check_device(op, "v_cache", v, device);
  check_dim(op, "k_cache", k, 4, "[B, Hkv, L, D]");
  check_dim(op, "v_cache", v, 4, "[B, Hkv, L, D]");
  check_same_dtype(op, "k_cache", k, ref_name, ref);
  check_same_dtype(op, "v_cache", v, ref_name, ref);
  MTP_CHECK(same_shape(v, k), op, ": v_cache must have k_cache's shape ", shape_of(k), ", got ", shape_of(v));
  a.k = k.data_ptr();
  a.v = v.data_ptr();
  strides_of(k, a.k_stride);
  strides_of(v, a.v_stride);
}

// mtp.head_attention's tensors on `device`, checked, as kernel arguments. cache_lens is the
// caller's (its values live on the host for the CPU, on the device for CUDA): check them
// with check_attention_lens; a.cache_lens and a.out are left to the caller.
inline AttentionArgs attention_args(const char* op, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                    const std::optional<Tensor>& k_local, const std::optional<Tensor>& v_local,
                                    std::optional<double> scale, bool causal, const Device& device) {
  check_device(op, "q", q, device);
  check_dtype(op, "q", q, kFloatTypes);
  check_dim(op, "q", q, 4, "[B, T, Hq, D]");
  AttentionArgs a;
  set_caches(op, a, k_cache, v_cache, "q", q, device);
  a.B = q.size(0);
  a.T = q.size(1);
  a.Hq = q.size(2);
  a.D = q.size(3);
  a.Hkv = k_cache.size(1);
  check_size(op, "k_cache", k_cache, 0, a.B, "B (q.size(0))");
  check_size(op, "k_cache", k_cache, 3, a.D, "the head dim D (q.size(3))");
  check_ok(op, gqa_error(a.Hq, a.Hkv));
  check_ok(op, local_pair_error(k_local.has_value(), v_local.has_value()));
  a.dtype = to_dtype(q.scalar_type());
  a.q = q.data_ptr();
  strides_of(q, a.q_stride);
  if (k_local.has_value()) {
    const Tensor &kl = *k_local, &vl = *v_local;
    check_device(op, "k_local", kl, device);
    check_device(op, "v_local", vl, device);
    check_dim(op, "k_local", kl, 4, "[B, Hkv, S, D]");
    check_same_dtype(op, "k_local", kl, "q", q);
    check_same_dtype(op, "v_local", vl, "q", q);
    check_size(op, "k_local", kl, 0, a.B, "B (q.size(0))");
    check_size(op, "k_local", kl, 1, a.Hkv, "Hkv (k_cache.size(1))");
    check_size(op, "k_local", kl, 3, a.D, "the head dim D (q.size(3))");
    MTP_CHECK(same_shape(vl, kl), op, ": v_local must have k_local's shape ", shape_of(kl), ", got ", shape_of(vl));
    set_local_views(a, kl.size(2), kl.data_ptr(), kl.strides().data(), vl.data_ptr(), vl.strides().data());
  }
  if (scale.has_value()) check_ok(op, scale_error("scale", *scale));  // at the kernel's width, fp32
  a.scale = scale.has_value() ? float(*scale) : default_attention_scale(a.D);
  a.causal = causal;
  return a;
}

// cache_lens's values (on the host): each in [0, L], and >= T in causal mode.
inline void check_attention_lens(const char* op, const AttentionArgs& a, const std::vector<int64_t>& lens) {
  check_ok(op, causal_error(lens, a.T, a.causal));
}

// mtp.cache_append's tensors on `device`, checked, as kernel arguments (cache_lens left to
// the caller; check its values with check_append_lens).
inline CacheAppendArgs cache_append_args(const char* op, const Tensor& k_cache, const Tensor& v_cache,
                                         const Tensor& k_new, const Tensor& v_new, const Device& device) {
  check_device(op, "k_new", k_new, device);
  check_device(op, "v_new", v_new, device);
  check_dtype(op, "k_new", k_new, kFloatTypes);
  check_dim(op, "k_new", k_new, 4, "[B, T, Hkv, D]");
  check_same_dtype(op, "v_new", v_new, "k_new", k_new);
  MTP_CHECK(same_shape(v_new, k_new), op, ": v_new must have k_new's shape ", shape_of(k_new), ", got ",
            shape_of(v_new));
  CacheAppendArgs a;
  set_caches(op, a, k_cache, v_cache, "k_new", k_new, device);
  a.B = k_new.size(0);
  a.T = k_new.size(1);
  a.Hkv = k_new.size(2);
  a.D = k_new.size(3);
  a.L = k_cache.size(2);
  check_size(op, "k_cache", k_cache, 0, a.B, "B (k_new.size(0))");
  check_size(op, "k_cache", k_cache, 1, a.Hkv, "Hkv (k_new.size(2))");
  check_size(op, "k_cache", k_cache, 3, a.D, "the head dim D (k_new.size(3))");
  // The caches are written in place: not expanded, not each other, not the new entries.
  check_written(op, "it is written in place", {{"k_cache", &k_cache}, {"v_cache", &v_cache}},
                {{"k_new", &k_new}, {"v_new", &v_new}});
  a.dtype = to_dtype(k_new.scalar_type());
  a.k_new = k_new.data_ptr();
  a.v_new = v_new.data_ptr();
  strides_of(k_new, a.kn_stride);
  strides_of(v_new, a.vn_stride);
  return a;
}

// No request may pass the capacity (lens: the host values; a.cache_lens is not read).
inline void check_append_lens(const char* op, CacheAppendArgs a, const std::vector<int64_t>& lens) {
  a.cache_lens = lens.data();
  check_ok(op, capacity_error(a));
}

// Runs fn(begin, end) over [0, n) on torch's intra-op thread pool.
struct TorchParallelFor {
  template <class Fn>
  void operator()(int64_t n, Fn&& fn) const {
    torch::stable::parallel_for(0, n, 1, [&](int64_t b, int64_t e) { fn(b, e); });
  }
};

}  // namespace mtp::torch_adapter
#pragma GCC visibility pop
