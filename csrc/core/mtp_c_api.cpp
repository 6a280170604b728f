// The C API (mtp.h): argument checks, then the same header-only kernels the torch ops run.
#include <algorithm>
#include <climits>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "checks.h"
#include "mtp/embedding.h"
#include "mtp/head_draft.h"
#include "mtp/isa.h"
#include "mtp/mtp.h"
#include "mtp/op_args.h"
#include "mtp/parallel.h"
#include "mtp/verify_sampled.h"
#include "mtp/verify.h"

static_assert(int(MTP_FLOAT32) == int(mtp::DType::F32) && int(MTP_BFLOAT16) == int(mtp::DType::BF16) &&
                  int(MTP_FLOAT16) == int(mtp::DType::F16),
              "mtp_dtype float values must equal mtp::DType");
static_assert(int(MTP_INT8) == int(mtp::DType::I8), "MTP_INT8 must equal mtp::DType::I8");
static_assert(int(MTP_Q4_0) == int(mtp::DType::Q4_0) && int(MTP_Q4_1) == int(mtp::DType::Q4_1) &&
                  int(MTP_Q5_0) == int(mtp::DType::Q5_0) && int(MTP_Q8_0) == int(mtp::DType::Q8_0) &&
                  int(MTP_Q4_K) == int(mtp::DType::Q4_K) && int(MTP_Q6_K) == int(mtp::DType::Q6_K),
              "mtp_dtype block values must equal mtp::DType (100 + the GGML type number)");
static_assert(int(MTP_Q4_0_X8) == int(mtp::DType::Q4_0_X8) && int(MTP_Q4_1_X8) == int(mtp::DType::Q4_1_X8) &&
                  int(MTP_Q8_0_X8) == int(mtp::DType::Q8_0_X8) && int(MTP_Q4_K_X8) == int(mtp::DType::Q4_K_X8) &&
                  int(MTP_Q6_K_X8) == int(mtp::DType::Q6_K_X8),
              "mtp_dtype x8 values must equal mtp::DType (100 + the file type's value)");

namespace mtp::capi {
namespace {

template <class I>
IdView<I> ids(const mtp_tensor* t) {
  return {static_cast<I*>(t->data), {t->strides[0], t->strides[1]}};
}

// Calls fn(I{}) with I the C++ type of an int32/int64 view.
template <class Fn>
void with_id_type(const mtp_tensor* t, Fn&& fn) {
  if (t->dtype == MTP_INT32)
    fn(int32_t{});
  else
    fn(int64_t{});
}

// The one dtype ref has (already checked to be a known one): outputs and companions that
// must match it, like the torch ops.
std::initializer_list<mtp_dtype> same_as(const mtp_tensor* ref) {
  static constexpr std::initializer_list<mtp_dtype> f32 = {MTP_FLOAT32}, bf16 = {MTP_BFLOAT16}, f16 = {MTP_FLOAT16},
                                                    i32 = {MTP_INT32}, i64 = {MTP_INT64};
  switch (ref->dtype) {
    case MTP_FLOAT32: return f32;
    case MTP_BFLOAT16: return bf16;
    case MTP_FLOAT16: return f16;
    case MTP_INT32: return i32;
    default: return i64;
  }
}

bool is_empty(const mtp_tensor* t) {
  for (int32_t d = 0; d < t->ndim; ++d)
    if (t->sizes[d] == 0) return true;
  return false;
}

bool is_contiguous(const mtp_tensor* t) {
  int64_t stride = 1;
  for (int32_t d = t->ndim - 1; d >= 0; --d) {
    if (t->sizes[d] != 1 && t->strides[d] != stride) return false;
    stride *= t->sizes[d];
  }
  return true;
}

char* bytes(const mtp_tensor* t) { return static_cast<char*>(t->data); }

int64_t elem_bytes(int32_t dtype) { return dtype == MTP_INT64 ? 8 : dtype == MTP_INT32 ? 4 : dtype_size(DType(dtype)); }

// A checked view as op_args.h's View; a block dtype's weight [N, K] is N rows strides[0]
// bytes apart, each of K's row bytes.
View view_of(const char* name, const mtp_tensor* t) {
  View v;
  v.name = name;
  v.data = t->data;
  v.ndim = t->ndim;
  v.sizes = t->sizes;
  v.strides = t->strides;
  v.elem_bytes = elem_bytes(t->dtype);
  if (is_block_dtype(t->dtype) && t->ndim == 2 && t->sizes[1] > 0) {
    const DType dt = DType(t->dtype);
    v.ndim = 1;
    v.elem_bytes = 1;
    v.last_bytes = t->sizes[1] % block_elems(dt) == 0 ? block_row_bytes(dt, t->sizes[1]) : 0;
  }
  return v;
}

using Named = std::pair<const char*, const mtp_tensor*>;
constexpr const char* kOutput = "it is an output";

// The aliasing rule of mtp.h over checked views: every output free of overlapping elements
// and sharing no memory with another output or an input (NULL inputs skipped).
bool no_aliasing(Checker& c, std::initializer_list<Named> outputs, std::initializer_list<Named> inputs) {
  View views[kMaxAliasViews];  // no allocation per call
  if (outputs.size() + inputs.size() > kMaxAliasViews)
    return c.fail(MTP_ERROR_INTERNAL, "internal error: too many views in one aliasing check");
  size_t n = 0;
  for (const Named& o : outputs) views[n++] = view_of(o.first, o.second);
  for (const Named& i : inputs)
    if (i.second) views[n++] = view_of(i.first, i.second);
  return c.ok(aliasing_error(views, n, outputs.size(), kOutput));
}

// The outputs against a list of n more inputs (weights), named by name(i) only on a hit.
template <class Name>
bool disjoint_from(Checker& c, std::initializer_list<Named> outputs, const mtp_tensor* const* list, int64_t n,
                   Name&& name) {
  View outs[kMaxAliasViews];
  if (outputs.size() > kMaxAliasViews)
    return c.fail(MTP_ERROR_INTERNAL, "internal error: too many outputs in one aliasing check");
  size_t n_out = 0;
  for (const Named& o : outputs) outs[n_out++] = view_of(o.first, o.second);
  return c.ok(disjoint_error(
      outs, n_out, list ? n : 0,
      [&](int64_t i, View* v) {
        if (!list[i]) return false;
        *v = view_of("", list[i]);
        return true;
      },
      name));
}

// Copies a contiguous [n0, n1, n2, D] array of es-byte elements into the strided 4-D view dst.
void scatter4(const char* src, const mtp_tensor* dst, int64_t es) {
  const int64_t* n = dst->sizes;
  const int64_t* st = dst->strides;
  for (int64_t i = 0; i < n[0]; ++i)
    for (int64_t j = 0; j < n[1]; ++j)
      for (int64_t k = 0; k < n[2]; ++k)
        copy_elems(bytes(dst) + (i * st[0] + j * st[1] + k * st[2]) * es, st[3],
                   src + ((i * n[1] + j) * n[2] + k) * n[3] * es, 1, n[3], es);
}

// Of a decoder pass: the activations, and the matrices (float, int8 with Q8 scales, or GGUF
// block types in the file's or the x8 layout).
constexpr std::initializer_list<mtp_dtype> kActivationTypes = {MTP_FLOAT32, MTP_BFLOAT16};
constexpr std::initializer_list<mtp_dtype> kMatrixTypes = {
    MTP_FLOAT32, MTP_BFLOAT16, MTP_INT8,    MTP_Q4_0,    MTP_Q4_1,    MTP_Q5_0,    MTP_Q8_0,
    MTP_Q4_K,    MTP_Q6_K,     MTP_Q4_0_X8, MTP_Q4_1_X8, MTP_Q8_0_X8, MTP_Q4_K_X8, MTP_Q6_K_X8};
// mtp_linear's weights: float, or GGUF block types (int8: mtp_linear_q8).
constexpr std::initializer_list<mtp_dtype> kLinearWeightTypes = {
    MTP_FLOAT32, MTP_BFLOAT16, MTP_FLOAT16, MTP_Q4_0,    MTP_Q4_1,    MTP_Q5_0,    MTP_Q8_0,
    MTP_Q4_K,    MTP_Q6_K,     MTP_Q4_0_X8, MTP_Q4_1_X8, MTP_Q8_0_X8, MTP_Q4_K_X8, MTP_Q6_K_X8};

// Copies the [n0, n1, n2] view at src (element strides ss) to dst (element strides ds).
void copy3(const char* src, const int64_t* ss, char* dst, const int64_t* ds, const int64_t* n, int64_t es) {
  for (int64_t i = 0; i < n[0]; ++i)
    for (int64_t j = 0; j < n[1]; ++j)
      copy_elems(dst + (i * ds[0] + j * ds[1]) * es, ds[2], src + (i * ss[0] + j * ss[1]) * es, ss[2], n[2], es);
}

// A 3-D view's data as a contiguous array: in place when it is one, else packed into *tmp.
const void* contiguous3(const mtp_tensor* t, std::vector<char>* tmp) {
  if (is_contiguous(t)) return t->data;
  const int64_t* n = t->sizes;
  const int64_t es = dtype_size(float_dtype(t->dtype)), packed[3] = {n[1] * n[2], n[2], 1};
  tmp->resize(size_t(n[0] * n[1] * n[2] * es));
  copy3(bytes(t), t->strides, tmp->data(), packed, n, es);
  return tmp->data();
}

// c.fail(...) as the status an entry point returns.
template <class... Parts>
mtp_status fail_with(Checker& c, mtp_status s, const Parts&... parts) {
  c.fail(s, parts...);
  return c.status;
}

// "name: msg", or "" when msg is.
std::string named(const std::string& name, const std::string& msg) { return msg.empty() ? msg : name + ": " + msg; }

// A norm weight [H] of a decoder pass (h_what "H"; Gemma 3's q_norm, k_norm: [D], h_what "D"):
// x's dtype, unit stride (read in place).
bool decoder_norm(Checker& c, const std::string& name, const mtp_tensor* w, int64_t H, const mtp_tensor* x,
                  const void** out, const char* h_what = "H") {
  const char* nm = name.c_str();
  const std::string shape = std::string("[") + h_what + "]";
  if (!c.tensor(nm, w, 1, shape.c_str(), same_as(x)) || !c.size(nm, w, 0, H, h_what) ||
      !c.ok(named(name, norm_stride_error(H, w->strides[0]))))
    return false;
  *out = w->data;
  return true;
}

// A matrix [N, K] of a decoder pass, rows unit-stride (read in place): float32 | bfloat16 or a
// GGUF block type (strides[0] in bytes), or (q8) int8 with its scales [N, ceil(K/32)].
bool decoder_matrix(Checker& c, const std::string& name, const mtp_tensor* w, bool q8, const mtp_tensor* scale,
                    int64_t N, const char* n_what, int64_t K, const char* k_what, DecoderMatrix* m,
                    const char* scales = "weight_scales") {
  static constexpr std::initializer_list<mtp_dtype> f32 = {MTP_FLOAT32};
  const char* nm = name.c_str();
  if (!c.tensor(nm, w, 2, "[N, K]", kMatrixTypes)) return false;
  const bool block = is_block_dtype(w->dtype);
  if (q8 != (w->dtype == MTP_INT8))
    return c.fail(
        MTP_ERROR_UNSUPPORTED_DTYPE, name, " is ", dtype_name(w->dtype), " but ", scales,
        q8 ? " is not empty: with scales the matrix is int8 (Q8)" : " is empty: int8 (Q8) weights need their scales",
        block ? " (a GGUF block type carries its own scales: give it without)" : "");
  if (!c.size(nm, w, 0, N, n_what) || !c.size(nm, w, 1, K, k_what) ||
      !(block ? c.block_rows(name, w) : c.ok(named(name, weight_rows_error(K, w->strides[0], w->strides[1])))))
    return false;
  m->w = w->data;
  m->dtype = DType(w->dtype);
  m->stride = w->strides[0];
  if (!q8) return true;
  const std::string sn = name + "'s scales";
  const char* snm = sn.c_str();
  if (!c.tensor(snm, scale, 2, kWeightScaleShape, f32) || !c.size(snm, scale, 0, N, n_what) ||
      !c.size(snm, scale, 1, q8_blocks(K), kWeightScaleBlocks) ||
      !c.ok(named(sn, weight_scale_rows_error(q8_blocks(K), scale->strides[0], scale->strides[1]))))
    return false;
  m->scale = static_cast<const float*>(scale->data);
  m->scale_stride = scale->strides[0];
  return true;
}

// An embedding table [V, H] (name, its Q8 scales scale_name): any matrix kind decoder_matrix
// takes, rows H long (h_what); *V its rows.
bool embedding_table(Checker& c, const char* name, const mtp_tensor* t, const char* scale_name, const mtp_tensor* scale,
                     int64_t H, const char* h_what, int64_t* V, DecoderMatrix* m) {
  if (!c.tensor(name, t, 2, "[V, H]", kMatrixTypes)) return false;
  *V = t->sizes[0];
  return decoder_matrix(c, name, t, scale != nullptr, scale, *V, "V", H, h_what, m, scale_name);
}

// The MLP width I of a gate_up matrix [2I, H], weights[index].
bool mlp_width_of(Checker& c, const mtp_tensor* const* weights, int64_t index, const WeightNames& names, int64_t* I) {
  const mtp_tensor* gu = weights[index];
  const std::string name = names(index);
  if (!c.tensor(name.c_str(), gu, 2, "[2I, H]", kMatrixTypes)) return false;
  if (gu->sizes[0] % 2)
    return c.fail(MTP_ERROR_INVALID_ARGUMENT, name, ".sizes[0] must be even [2I, H], got ", gu->sizes[0]);
  *I = gu->sizes[0] / 2;
  return true;
}

// Layer i's four matrices (qkv, o_proj, gate_up, down_proj: weights[at[0..3]]) into l, each
// checked, with its Q8 scales (scales[4 i + j]; scales NULL: float matrices).
bool decoder_matrices(Checker& c, const mtp_tensor* const* weights, const int64_t (&at)[kLayerMatrices], int64_t i,
                      const mtp_tensor* const* scales, const WeightNames& names, int64_t H, const HeadWidths& widths,
                      int64_t I, DecoderLayer& l) {
  const int64_t s0 = kLayerMatrices * i;
  auto scale = [&](int64_t j) { return scales ? scales[s0 + j] : nullptr; };
  const bool q8 = scales != nullptr;
  return decoder_matrix(c, names(at[0]), weights[at[0]], q8, scale(0), widths.qkv_rows, "(Hq + 2 Hkv) D", H, "H",
                        &l.qkv) &&
         decoder_matrix(c, names(at[1]), weights[at[1]], q8, scale(1), H, "H", widths.q_width, "Hq D", &l.o) &&
         decoder_matrix(c, names(at[2]), weights[at[2]], q8, scale(2), 2 * I, "2I", H, "H", &l.gate_up) &&
         decoder_matrix(c, names(at[3]), weights[at[3]], q8, scale(3), H, "H", I, "I", &l.down);
}

// `count` layers from weights[offset] (6 each; scales: 4 per layer, or NULL for float
// matrices), checked against x's dtype and the head counts; *I from the first gate_up.
bool decoder_layers_of(Checker& c, const mtp_tensor* const* weights, int64_t offset, int64_t count,
                       const mtp_tensor* const* scales, const WeightNames& names, int64_t H, const HeadWidths& widths,
                       const mtp_tensor* x, int64_t* I, std::vector<DecoderLayer>* out) {
  if (count > 0 && !mlp_width_of(c, weights, offset + 4, names, I)) return false;
  out->assign(size_t(count), DecoderLayer{});
  for (int64_t i = 0; i < count; ++i) {
    const int64_t w0 = offset + kLayerTensors * i;
    DecoderLayer& l = (*out)[size_t(i)];
    if (!decoder_norm(c, names(w0), weights[w0], H, x, &l.input_norm) ||
        !decoder_norm(c, names(w0 + 3), weights[w0 + 3], H, x, &l.post_norm) ||
        !decoder_matrices(c, weights, {w0 + 1, w0 + 2, w0 + 4, w0 + 5}, i, scales, names, H, widths, *I, l))
      return false;
  }
  return true;
}

// Gemma 3's `count` layers from weights[0] (kGemma3LayerParts, 10 each), checked like
// decoder_layers_of (q_norm, k_norm [D]); windows[i] the sliding window of layer i (empty: none).
bool gemma3_layers_of(Checker& c, const mtp_tensor* const* weights, int64_t count, const mtp_tensor* const* scales,
                      const WeightNames& names, int64_t H, int64_t D, const HeadWidths& widths, const mtp_tensor* x,
                      const std::vector<int64_t>& windows, int64_t* I, std::vector<DecoderLayer>* out) {
  if (count > 0 && !mlp_width_of(c, weights, 7, names, I)) return false;
  out->assign(size_t(count), DecoderLayer{});
  for (int64_t i = 0; i < count; ++i) {
    const int64_t w0 = kGemma3LayerTensors * i;
    DecoderLayer& l = (*out)[size_t(i)];
    if (!decoder_norm(c, names(w0), weights[w0], H, x, &l.input_norm) ||
        !decoder_norm(c, names(w0 + 5), weights[w0 + 5], H, x, &l.post_attention_norm) ||
        !decoder_norm(c, names(w0 + 6), weights[w0 + 6], H, x, &l.post_norm) ||
        !decoder_norm(c, names(w0 + 9), weights[w0 + 9], H, x, &l.post_feedforward_norm) ||
        !decoder_norm(c, names(w0 + 2), weights[w0 + 2], D, x, &l.q_norm, "D") ||
        !decoder_norm(c, names(w0 + 3), weights[w0 + 3], D, x, &l.k_norm, "D") ||
        !decoder_matrices(c, weights, {w0 + 1, w0 + 4, w0 + 7, w0 + 8}, i, scales, names, H, widths, *I, l))
      return false;
    l.window = windows.empty() ? 0 : windows[size_t(i)];
  }
  return true;
}

// A [n] view of token ids, each in [0, V), as int64 values.
bool token_ids(Checker& c, const char* name, const mtp_tensor* t, int64_t n, const char* n_what, int64_t V,
               const char* v_what, std::vector<int64_t>* out) {
  if (!c.tensor(name, t, 1, "[n]", kIdTypes) || !c.size(name, t, 0, n, n_what)) return false;
  out->resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = load_id(t, i * t->strides[0]);
    if (id < 0 || id >= V)
      return c.fail(MTP_ERROR_INVALID_ARGUMENT, name, " must hold token ids in [0, ", v_what, ") = [0, ", V, "), got ",
                    name, "[", i, "] = ", id);
    (*out)[size_t(i)] = id;
  }
  return true;
}

// rope_cos / rope_sin [P, D] fp32 (named cos_name / sin_name), checked; *P their rows.
bool rope_tables(Checker& c, const mtp_tensor* cos, const mtp_tensor* sin, int64_t D, const char* d_what, int64_t* P,
                 const char* cos_name = "rope_cos", const char* sin_name = "rope_sin") {
  static constexpr std::initializer_list<mtp_dtype> f32 = {MTP_FLOAT32};
  if (!c.tensor(cos_name, cos, 2, "[P, D]", f32) || !c.size(cos_name, cos, 1, D, d_what) ||
      !c.tensor(sin_name, sin, 2, "[P, D]", f32) || !c.same_sizes(sin_name, sin, cos_name, cos))
    return false;
  *P = cos->sizes[0];
  return true;
}

// A [P, D] table as a contiguous fp32 array: in place when it is one, else packed into *tmp.
const float* contiguous_table(const mtp_tensor* t, std::vector<char>* tmp) {
  const mtp_tensor t3 = {t->data, MTP_FLOAT32, 3, {1, t->sizes[0], t->sizes[1]}, {0, t->strides[0], t->strides[1]}};
  return static_cast<const float*>(contiguous3(&t3, tmp));
}

// A [B] view whose dtype (among ok) stores T, checked, as values.
template <class T>
bool vector_of(Checker& c, const char* name, const mtp_tensor* t, int64_t B, std::initializer_list<mtp_dtype> ok,
               std::vector<T>* out, const char* b_what = "B (draft_tokens.sizes[0])") {
  if (!c.tensor(name, t, 1, "[B]", ok) || !c.size(name, t, 0, B, b_what)) return false;
  out->resize(size_t(B));
  for (int64_t b = 0; b < B; ++b) (*out)[size_t(b)] = static_cast<const T*>(t->data)[b * t->strides[0]];
  return true;
}

// The arguments mtp_verify and mtp_verify_sampled share, checked, as VerifyArgs (its
// num_drafts left to the caller: the values are in *nd).
bool verify_front(Checker& c, const mtp_tensor* draft_tokens, const mtp_tensor* target_logits,
                  const mtp_tensor* num_drafts, const mtp_tensor* accepted, const mtp_tensor* out_tokens,
                  int32_t num_threads, VerifyArgs* a, std::vector<int64_t>* nd, int* threads) {
  if (!c.tensor("draft_tokens", draft_tokens, 2, "[B, K]", kIdTypes)) return false;
  const int64_t B = draft_tokens->sizes[0], K = draft_tokens->sizes[1];
  if (K == INT64_MAX)
    return c.fail(MTP_ERROR_INVALID_ARGUMENT, "draft_tokens.sizes[1] = K = ", K,
                  " is too large (K + 1 overflows int64)");
  if (!c.tensor("target_logits", target_logits, 3, "[B, K+1, V]", kFloatTypes) ||
      !c.size("target_logits", target_logits, 0, B, "B (draft_tokens.sizes[0])") ||
      !c.size("target_logits", target_logits, 1, K + 1, "K+1 (draft_tokens.sizes[1] + 1)"))
    return false;
  const int64_t V = target_logits->sizes[2];
  if (V < 1)
    return c.fail(MTP_ERROR_INVALID_ARGUMENT, "target_logits must have a vocabulary of V >= 1 entries, got V = ", V);
  if (!c.num_drafts(num_drafts, B, K, nd) || !c.tensor("accepted", accepted, 1, "[B]", same_as(draft_tokens)) ||
      !c.size("accepted", accepted, 0, B, "B (draft_tokens.sizes[0])") ||
      !c.tensor("out_tokens", out_tokens, 2, "[B, K+1]", same_as(draft_tokens)) ||
      !c.size("out_tokens", out_tokens, 0, B, "B (draft_tokens.sizes[0])") ||
      !c.size("out_tokens", out_tokens, 1, K + 1, "K+1 (draft_tokens.sizes[1] + 1)") ||
      !c.threads(num_threads, threads) ||
      !no_aliasing(c, {{"accepted", accepted}, {"out_tokens", out_tokens}},
                   {{"draft_tokens", draft_tokens}, {"target_logits", target_logits}, {"num_drafts", num_drafts}}))
    return false;
  a->B = B;
  a->K = K;
  a->V = V;
  a->logits = target_logits->data;
  a->logits_dtype = float_dtype(target_logits->dtype);
  for (int d = 0; d < 3; ++d) a->logits_stride[d] = target_logits->strides[d];
  return true;
}

// mtp_linear (q8 false: a float weight) and mtp_linear_q8 (q8: an int8 weight and its
// scales; quantize_x: mtp_linear_q8dot): checked, then the kernel.
mtp_status linear_call(Checker& c, bool q8, const mtp_tensor* x, const mtp_tensor* weight,
                       const mtp_tensor* weight_scale, const mtp_tensor* bias, const mtp_tensor* y, int32_t num_threads,
                       bool quantize_x = false) {
  static constexpr std::initializer_list<mtp_dtype> f32 = {MTP_FLOAT32}, i8 = {MTP_INT8};
  int threads = 1;
  if (!c.tensor("x", x, 2, "[M, K]", kFloatTypes) ||
      !c.tensor("weight", weight, 2, "[N, K]", q8 ? i8 : kLinearWeightTypes) ||
      !c.size("weight", weight, 1, x->sizes[1], "K (x.sizes[1])"))
    return c.status;
  const int64_t M = x->sizes[0], K = x->sizes[1], N = weight->sizes[0];
  if (!c.ok(row_length_error("K (x.sizes[1])", K))) return c.status;
  if (is_block_dtype(weight->dtype) ? !c.block_rows("weight", weight)
                                    : !c.ok(weight_rows_error(K, weight->strides[0], weight->strides[1])))
    return c.status;
  if (q8 && (!c.tensor("weight_scale", weight_scale, 2, kWeightScaleShape, f32) ||
             !c.size("weight_scale", weight_scale, 0, N, "N (weight.sizes[0])") ||
             !c.size("weight_scale", weight_scale, 1, q8_blocks(K), kWeightScaleBlocks) ||
             !c.ok(weight_scale_rows_error(q8_blocks(K), weight_scale->strides[0], weight_scale->strides[1]))))
    return c.status;
  if (bias && (!c.tensor("bias", bias, 1, "[N]", kFloatTypes) || !c.size("bias", bias, 0, N, "N (weight.sizes[0])")))
    return c.status;
  const bool y_f32 = y && y->dtype == MTP_FLOAT32;
  if (!c.tensor("y", y, 2, "[M, N]", y_f32 ? f32 : same_as(x)) || !c.size("y", y, 0, M, "M (x.sizes[0])") ||
      !c.size("y", y, 1, N, "N (weight.sizes[0])") || !c.threads(num_threads, &threads) ||
      !no_aliasing(c, {{"y", y}},
                   {{"x", x}, {"weight", weight}, {"weight_scale", q8 ? weight_scale : nullptr}, {"bias", bias}}))
    return c.status;
  if (M == 0 || N == 0) return MTP_OK;

  LinearArgs a;
  a.M = M;
  a.N = N;
  a.K = K;
  a.quantize_x = quantize_x;
  a.x_dtype = float_dtype(x->dtype);
  const int64_t xes = dtype_size(a.x_dtype);
  std::vector<char> xpack;
  static const float kNothing = 0.f;  // K = 0: no element is read, but the pointers must be valid
  if (K == 0) {
    a.x = &kNothing;
  } else if (x->strides[1] == 1) {
    a.x = x->data;
    a.x_stride = x->strides[0];
  } else {  // the kernel wants unit-stride rows; activations are small, pack them
    xpack.resize(size_t(M * K * xes));
    for (int64_t m = 0; m < M; ++m)
      copy_elems(xpack.data() + m * K * xes, 1, bytes(x) + m * x->strides[0] * xes, x->strides[1], K, xes);
    a.x = xpack.data();
    a.x_stride = K;
  }
  if (K == 0 && q8) {
    set_q8_weight(a, &kNothing, 0, &kNothing, 0);
  } else if (q8) {
    set_q8_weight(a, weight->data, weight->strides[0], static_cast<const float*>(weight_scale->data),
                  weight_scale->strides[0]);
  } else {  // float, or a GGUF block type (its stride in bytes, as LinearArgs takes it)
    a.w = K ? weight->data : &kNothing;
    a.w_dtype = DType(weight->dtype);
    a.w_stride = K ? weight->strides[0] : 0;
  }
  std::vector<float> b;
  if (bias) {
    b.resize(size_t(N));
    for (int64_t n = 0; n < N; ++n) b[size_t(n)] = load_f32(bias->data, float_dtype(bias->dtype), n * bias->strides[0]);
    a.bias = b.data();
  }
  // The kernel writes fp32 rows with unit column stride: in place when y is such, else via
  // a copy (rounded to y's dtype as the torch op's .to(x.dtype) does).
  std::vector<float> ytmp;
  if (y_f32 && (y->strides[1] == 1 || N == 1)) {
    a.y = static_cast<float*>(y->data);
    a.y_stride = y->strides[0];
  } else {
    ytmp.resize(size_t(M * N));
    a.y = ytmp.data();
    a.y_stride = N;
  }
  linear(a, current_isa(), ThreadParallelFor{threads});
  if (!ytmp.empty())
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n)
        store_f32(y->data, float_dtype(y->dtype), m * y->strides[0] + n * y->strides[1], ytmp[size_t(m * N + n)]);
  return MTP_OK;
}

// mtp_linear_q8 / q8dot given a GGUF block-type weight: it goes to mtp_linear.
mtp_status block_weight_to_linear(Checker& c, const mtp_tensor* weight) {
  return fail_with(c, MTP_ERROR_UNSUPPORTED_DTYPE, "weight is ", dtype_name(weight->dtype),
                   ", a GGUF block type with its own scales: call mtp_linear (no weight_scale)");
}

// tree_parents [B, T] (int32/int64, any strides) -> int64 values, checked (op_args.h).
bool tree_of(Checker& c, const mtp_tensor* t, int64_t B, int64_t T, std::vector<int64_t>* out) {
  if (!c.tensor("tree_parents", t, 2, "[B, T]", kIdTypes) || !c.size("tree_parents", t, 0, B, "B (x.sizes[0])") ||
      !c.size("tree_parents", t, 1, T, "T (x.sizes[1])"))
    return false;
  out->resize(size_t(B * T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i) (*out)[size_t(b * T + i)] = load_id(t, b * t->strides[0] + i * t->strides[1]);
  return c.ok(tree_parents_error(*out, B, T));
}

// The arguments of the gemma3 layer kind (mtp_decoder_layers_gemma3).
struct Gemma3Extras {
  const mtp_tensor* rope_cos_local;
  const mtp_tensor* rope_sin_local;
  const int64_t* windows;  // [layers], or NULL: every layer global
  float attention_scale;   // 0: 1/sqrt(D)
};

// mtp_decoder_layers(_tree) (gemma3 NULL: the Llama layer) and mtp_decoder_layers_gemma3.
mtp_status decoder_layers_call(const char* op, const mtp_tensor* x, const mtp_tensor* k_cache,
                               const mtp_tensor* v_cache, const mtp_tensor* cache_lens, const mtp_tensor* rope_cos,
                               const mtp_tensor* rope_sin, const mtp_tensor* const* weights, int32_t num_weights,
                               const mtp_tensor* const* weight_scales, int32_t num_weight_scales, int64_t num_heads,
                               float eps, int32_t quantize_x, const mtp_tensor* tree_parents, const mtp_tensor* out,
                               int32_t num_threads, const Gemma3Extras* gemma3 = nullptr) {
  return guarded(op, [&](Checker& c) {
    if (!c.tensor("x", x, 3, "[B, T, H]", kActivationTypes) ||
        !c.tensor("k_cache", k_cache, 5, "[layers, B, Hkv, L, D]", same_as(x)) ||
        !c.size("k_cache", k_cache, 1, x->sizes[0], "B (x.sizes[0])") ||
        !c.tensor("v_cache", v_cache, 5, "[layers, B, Hkv, L, D]", same_as(x)) ||
        !c.same_sizes("v_cache", v_cache, "k_cache", k_cache))
      return c.status;
    DecoderArgs a;
    a.B = x->sizes[0];
    a.T = x->sizes[1];
    a.H = x->sizes[2];
    a.layers = k_cache->sizes[0];
    a.Hkv = k_cache->sizes[2];
    a.L = k_cache->sizes[3];
    a.D = k_cache->sizes[4];
    a.Hq = num_heads;
    a.dtype = float_dtype(x->dtype);
    std::vector<int64_t> lens;
    HeadWidths widths;
    if (!c.ok(decoder_heads_error(num_heads, a.Hkv, a.D, eps, &widths)) ||
        !c.ok(row_length_error("H (x.sizes[2])", a.H)) ||
        !rope_tables(c, rope_cos, rope_sin, a.D, "D (k_cache.sizes[4])", &a.P) ||
        !c.counts("cache_lens", cache_lens, a.B, "B (x.sizes[0])", a.L, "L (k_cache.sizes[3])", &lens))
      return c.status;
    if (!c.ok(positions_error(lens, a.T, a.L, "k_cache.sizes[3]", a.P, "rope_cos.sizes[0]"))) return c.status;
    std::vector<int64_t> parents;
    if (tree_parents && !tree_of(c, tree_parents, a.B, a.T, &parents)) return c.status;

    const int64_t per = gemma3 ? kGemma3LayerTensors : kLayerTensors;
    if (!c.ok(layers_error(a.layers, "k_cache.sizes[0]", per))) return c.status;
    const int64_t want = per * a.layers + 1;
    if (num_weights != want || !weights) {
      std::string parts;
      for (int64_t j = 0; j < per; ++j)
        parts += std::string(j ? ", " : "") + (gemma3 ? kGemma3LayerParts : kLayerParts)[j];
      return fail_with(c, MTP_ERROR_INVALID_ARGUMENT, "weights must hold ", per, " tensors per layer (", parts,
                       ") for the ", a.layers, " layers of k_cache, then the final norm: ", want,
                       " tensors, got num_weights = ", num_weights, weights ? "" : " and NULL");
    }
    std::vector<int64_t> windows;
    std::vector<char> cos_local_pack, sin_local_pack;
    if (gemma3) {
      a.kind = LayerKind::Gemma3;
      const Gemma3Extras& g = *gemma3;
      if (g.windows) windows.assign(g.windows, g.windows + a.layers);
      if (!c.ok(gemma3_windows_error(windows, g.windows != nullptr, a.layers, g.rope_cos_local != nullptr,
                                     g.rope_sin_local != nullptr)))
        return c.status;
      if (g.rope_cos_local) {
        if (!rope_tables(c, g.rope_cos_local, g.rope_sin_local, a.D, "D (k_cache.sizes[4])", &a.P_local,
                         "rope_cos_local", "rope_sin_local") ||
            !c.ok(positions_error(lens, a.T, a.L, "k_cache.sizes[3]", a.P_local, "rope_cos_local.sizes[0]")))
          return c.status;
      }
      if (g.attention_scale != 0) {  // 0: the default 1/sqrt(D)
        if (!c.ok(scale_error("attention_scale", g.attention_scale))) return c.status;
        a.has_scale = true;
        a.scale = g.attention_scale;
      }
    }
    const bool q8 = num_weight_scales != 0;
    if (q8 && (num_weight_scales != kLayerMatrices * a.layers || !weight_scales))
      return fail_with(c, MTP_ERROR_INVALID_ARGUMENT,
                       "weight_scales must be empty (float weights) or hold the Q8 scales of "
                       "the ",
                       kLayerMatrices,
                       " matrices of each layer (qkv, o_proj, gate_up, down_proj): ", kLayerMatrices * a.layers,
                       " tensors, got num_weight_scales = ", num_weight_scales, weight_scales ? "" : " and NULL");
    if (quantize_x && !q8)
      return fail_with(c, MTP_ERROR_INVALID_ARGUMENT,
                       "quantize_x = 1 needs int8 weights with their scales, got none "
                       "(num_weight_scales = 0; GGUF block-type matrices quantize the activations anyway)");
    const WeightNames names = gemma3 ? WeightNames{{}, a.layers, "layer", "the final norm", kGemma3LayerParts, per}
                                     : WeightNames{{}, a.layers, "layer", "the final norm"};
    std::vector<DecoderLayer> layers;
    if (gemma3 ? !gemma3_layers_of(c, weights, a.layers, q8 ? weight_scales : nullptr, names, a.H, a.D, widths, x,
                                   windows, &a.I, &layers)
               : !decoder_layers_of(c, weights, 0, a.layers, q8 ? weight_scales : nullptr, names, a.H, widths, x, &a.I,
                                    &layers))
      return c.status;
    int threads = 1;
    if (!decoder_norm(c, names(want - 1), weights[want - 1], a.H, x, &a.final_norm) ||
        !c.tensor("out", out, 3, "[B, T, H]", same_as(x)) || !c.same_sizes("out", out, "x", x) ||
        !c.threads(num_threads, &threads))
      return c.status;
    // The caches and out are written: no overlap with each other or any input.
    const std::initializer_list<Named> written = {{"k_cache", k_cache}, {"v_cache", v_cache}, {"out", out}};
    if (!no_aliasing(c, written,
                     {{"x", x},
                      {"cache_lens", cache_lens},
                      {"rope_cos", rope_cos},
                      {"rope_sin", rope_sin},
                      {"rope_cos_local", gemma3 ? gemma3->rope_cos_local : nullptr},
                      {"rope_sin_local", gemma3 ? gemma3->rope_sin_local : nullptr},
                      {"tree_parents", tree_parents}}) ||
        !disjoint_from(c, written, weights, want, names) ||
        !disjoint_from(c, written, q8 ? weight_scales : nullptr, q8 ? kLayerMatrices * a.layers : 0,
                       [](int64_t i) { return "weight_scales[" + std::to_string(i) + "]"; }))
      return c.status;
    if (is_empty(x)) return MTP_OK;

    // The core reads contiguous x and RoPE tables and writes a contiguous out: views that are
    // not are packed (the tables only when strided: they are the model's, built once).
    std::vector<char> xpack, cos_pack, sin_pack, out_tmp;
    a.x = contiguous3(x, &xpack);
    a.rope_cos = contiguous_table(rope_cos, &cos_pack);
    a.rope_sin = contiguous_table(rope_sin, &sin_pack);
    if (gemma3 && gemma3->rope_cos_local) {
      a.rope_cos_local = contiguous_table(gemma3->rope_cos_local, &cos_local_pack);
      a.rope_sin_local = contiguous_table(gemma3->rope_sin_local, &sin_local_pack);
    }
    a.k_cache = k_cache->data;
    a.v_cache = v_cache->data;
    std::copy_n(k_cache->strides, 5, a.k_stride);
    std::copy_n(v_cache->strides, 5, a.v_stride);
    a.cache_lens = lens.data();
    a.tree_parents = tree_parents ? parents.data() : nullptr;
    a.layer = layers.data();
    a.eps = eps;
    a.quantize_x = quantize_x != 0;
    const int64_t es = dtype_size(a.dtype);
    if (is_contiguous(out)) {
      a.out = out->data;
    } else {
      out_tmp.resize(size_t(a.B * a.T * a.H * es));
      a.out = out_tmp.data();
    }
    decoder_layers(a, threads, current_isa(), ThreadParallelFor{threads});
    if (!out_tmp.empty()) {
      const int64_t packed[3] = {a.T * a.H, a.H, 1};
      copy3(out_tmp.data(), packed, bytes(out), out->strides, out->sizes, es);
    }
    return MTP_OK;
  });
}

mtp_status head_draft_call(const char* op, const mtp_tensor* hidden, const mtp_tensor* token, const mtp_tensor* k_cache,
                           const mtp_tensor* v_cache, const mtp_tensor* cache_lens, const mtp_tensor* rope_cos,
                           const mtp_tensor* rope_sin, const mtp_tensor* embedding, const mtp_tensor* embedding_scale,
                           const mtp_tensor* const* weights, int32_t num_weights, const mtp_tensor* lm_head,
                           const mtp_tensor* lm_head_scale, const mtp_tensor* draft_vocab, int64_t k, int64_t num_heads,
                           float eps, int64_t alternatives, const mtp_tensor* drafts, const mtp_tensor* probs,
                           int32_t num_threads) {
  return guarded(op, [&](Checker& c) {
    if (!c.tensor("hidden", hidden, 2, "[B, H]", kActivationTypes)) return c.status;
    HeadDraftArgs a;
    a.B = hidden->sizes[0];
    a.H = hidden->sizes[1];
    a.K = k;
    a.Hq = num_heads;
    a.dtype = float_dtype(hidden->dtype);
    if (k < 0) return fail_with(c, MTP_ERROR_INVALID_ARGUMENT, "k (draft steps) must be >= 0, got ", k);
    std::vector<int64_t> lens, tokens, vocab;
    if (!c.tensor("k_cache", k_cache, 4, "[B, Hkv, L, D]", same_as(hidden)) ||
        !c.size("k_cache", k_cache, 0, a.B, "B (hidden.sizes[0])") ||
        !c.tensor("v_cache", v_cache, 4, "[B, Hkv, L, D]", same_as(hidden)) ||
        !c.same_sizes("v_cache", v_cache, "k_cache", k_cache))
      return c.status;
    a.Hkv = k_cache->sizes[1];
    a.L = k_cache->sizes[2];
    a.D = k_cache->sizes[3];
    HeadWidths widths;
    if (!c.ok(decoder_heads_error(num_heads, a.Hkv, a.D, eps, &widths)) ||
        !c.ok(row_length_error("H (hidden.sizes[1])", a.H)) ||
        !rope_tables(c, rope_cos, rope_sin, a.D, "D (k_cache.sizes[3])", &a.P) ||
        !c.counts("cache_lens", cache_lens, a.B, "B (hidden.sizes[0])", a.L, "L (k_cache.sizes[2])", &lens) ||
        !c.ok(draft_positions_error(lens, k, a.P, "rope_cos.sizes[0]")) ||
        !embedding_table(c, "embedding", embedding, "embedding_scale", embedding_scale, a.H, "H (hidden.sizes[1])",
                         &a.V, &a.embedding) ||
        !token_ids(c, "token", token, a.B, "B (hidden.sizes[0])", a.V, "V (embedding.sizes[0])", &tokens))
      return c.status;
    if (num_weights < 4 || (num_weights - 4) % kLayerTensors != 0 || !weights)
      return fail_with(c, MTP_ERROR_INVALID_ARGUMENT, "weights must hold embed_norm, hidden_norm, proj, then ",
                       kLayerTensors,
                       " tensors per block (input_norm, qkv, o_proj, post_norm, gate_up, down_proj), "
                       "then out_norm: 4 + ",
                       kLayerTensors, " x blocks tensors, got num_weights = ", num_weights, weights ? "" : " and NULL");
    a.blocks = (num_weights - 4) / kLayerTensors;
    const int64_t n = num_weights;
    const WeightNames names{{"embed_norm", "hidden_norm", "proj"}, a.blocks, "block", "out_norm"};
    std::vector<DecoderLayer> blocks;
    int threads = 1;
    if (!decoder_norm(c, names(0), weights[0], a.H, hidden, &a.embed_norm) ||
        !decoder_norm(c, names(1), weights[1], a.H, hidden, &a.hidden_norm) ||
        !decoder_norm(c, names(n - 1), weights[n - 1], a.H, hidden, &a.out_norm) ||
        !decoder_matrix(c, names(2), weights[2], false, nullptr, a.H, "H", 2 * a.H, "2H", &a.proj) ||
        !decoder_layers_of(c, weights, 3, a.blocks, nullptr, names, a.H, widths, hidden, &a.I, &blocks))
      return c.status;
    a.Vd = a.V;
    if (draft_vocab) {
      if (!c.tensor("draft_vocab", draft_vocab, 1, "[Vd]", kIdTypes)) return c.status;
      a.Vd = draft_vocab->sizes[0];
      if (a.Vd < 1) return fail_with(c, MTP_ERROR_INVALID_ARGUMENT, "draft_vocab must hold at least one token id");
      if (!token_ids(c, "draft_vocab", draft_vocab, a.Vd, "Vd", a.V, "V (embedding.sizes[0])", &vocab)) return c.status;
    }
    // lm_head [V, H], or (Vd < V) the draft vocabulary's rows [Vd, H] in its order, gathered by
    // the caller once for many drafts.
    if (!c.tensor("lm_head", lm_head, 2, draft_vocab ? "[V, H] or [Vd, H]" : "[V, H]", kMatrixTypes)) return c.status;
    a.lm_head_drafted = lm_head_drafted(draft_vocab, a.Vd, a.V, lm_head->sizes[0]);
    if (!decoder_matrix(c, "lm_head", lm_head, lm_head_scale != nullptr, lm_head_scale, a.lm_head_drafted ? a.Vd : a.V,
                        a.lm_head_drafted ? "Vd (draft_vocab.sizes[0])"
                        : draft_vocab     ? "V (embedding.sizes[0]) or Vd (draft_vocab.sizes[0])"
                                          : "V (embedding.sizes[0])",
                        a.H, "H (hidden.sizes[1])", &a.lm_head, "lm_head_scale"))
      return c.status;
    // drafts' columns; wraps (no UB) when too large, which alternatives_error then reports
    const int64_t width = int64_t(uint64_t(k) + uint64_t(alternatives));
    const std::initializer_list<Named> inputs = {{"hidden", hidden},
                                                 {"token", token},
                                                 {"k_cache", k_cache},
                                                 {"v_cache", v_cache},
                                                 {"cache_lens", cache_lens},
                                                 {"rope_cos", rope_cos},
                                                 {"rope_sin", rope_sin},
                                                 {"embedding", embedding},
                                                 {"embedding_scale", embedding_scale},
                                                 {"lm_head", lm_head},
                                                 {"lm_head_scale", lm_head_scale},
                                                 {"draft_vocab", draft_vocab}};
    if (!c.ok(alternatives_error(alternatives, a.Vd, k)) ||
        !c.tensor("drafts", drafts, 2, alternatives ? "[B, k + alternatives]" : "[B, k]", kIdTypes) ||
        !c.size("drafts", drafts, 0, a.B, "B (hidden.sizes[0])") ||
        !c.size("drafts", drafts, 1, width, alternatives ? "k + alternatives" : "k") ||
        !c.threads(num_threads, &threads) || !no_aliasing(c, {{"drafts", drafts}}, inputs) ||
        !disjoint_from(c, {{"drafts", drafts}}, weights, n, names))
      return c.status;
    static constexpr std::initializer_list<mtp_dtype> f32 = {MTP_FLOAT32};
    if (probs &&
        (!c.tensor("probs", probs, 2, "[B, k]", f32) || !c.size("probs", probs, 0, a.B, "B (hidden.sizes[0])") ||
         !c.size("probs", probs, 1, k, "k") || !no_aliasing(c, {{"probs", probs}, {"drafts", drafts}}, inputs) ||
         !disjoint_from(c, {{"probs", probs}}, weights, n, names)))
      return c.status;
    if (a.B == 0 || k == 0) return MTP_OK;

    std::vector<char> hidden_pack, cos_pack, sin_pack;
    const mtp_tensor hidden3 = {
        hidden->data, hidden->dtype, 3, {1, a.B, a.H}, {0, hidden->strides[0], hidden->strides[1]}};
    a.hidden = contiguous3(&hidden3, &hidden_pack);
    a.token = tokens.data();
    a.rope_cos = contiguous_table(rope_cos, &cos_pack);
    a.rope_sin = contiguous_table(rope_sin, &sin_pack);
    a.k_cache = k_cache->data;
    a.v_cache = v_cache->data;
    std::copy_n(k_cache->strides, 4, a.k_stride);
    std::copy_n(v_cache->strides, 4, a.v_stride);
    a.cache_lens = lens.data();
    a.block = blocks.data();
    a.draft_vocab = vocab.empty() ? nullptr : vocab.data();
    a.eps = eps;
    a.alternatives = alternatives;
    std::vector<int64_t> out(size_t(a.B * width));
    a.drafts = out.data();
    std::vector<float> p(probs ? size_t(a.B * k) : 0);
    a.probs = probs ? p.data() : nullptr;
    head_draft(a, threads, current_isa(), ThreadParallelFor{threads});
    if (probs)
      for (int64_t b = 0; b < a.B; ++b)
        for (int64_t j = 0; j < k; ++j)
          static_cast<float*>(probs->data)[b * probs->strides[0] + j * probs->strides[1]] = p[size_t(b * k + j)];
    for (int64_t b = 0; b < a.B; ++b)
      for (int64_t j = 0; j < width; ++j) {
        const int64_t offset = b * drafts->strides[0] + j * drafts->strides[1], id = out[size_t(b * width + j)];
        if (drafts->dtype == MTP_INT32)
          static_cast<int32_t*>(drafts->data)[offset] = int32_t(id);
        else
          static_cast<int64_t*>(drafts->data)[offset] = id;
      }
    return MTP_OK;
  });
}

// The arguments mtp_verify_ragged and mtp_verify_sampled_ragged share, checked: the layout
// from cu's values into *l, the kernel arguments into *a (pointers into *l).
bool ragged_front(Checker& c, const mtp_tensor* draft_token_ids, const mtp_tensor* cu_num_draft_tokens,
                  const mtp_tensor* target_logits, int64_t pad_id, const mtp_tensor* accepted,
                  const mtp_tensor* out_tokens, int32_t num_threads, VerifyArgs* a, RaggedLayout* l, int* threads) {
  if (!c.tensor("draft_token_ids", draft_token_ids, 1, "[N]", kIdTypes) ||
      !c.tensor("cu_num_draft_tokens", cu_num_draft_tokens, 1, "[B]", kIdTypes) ||
      !c.tensor("target_logits", target_logits, 2, "[N + B, V]", kFloatTypes))
    return false;
  const int64_t N = draft_token_ids->sizes[0], B = cu_num_draft_tokens->sizes[0], V = target_logits->sizes[1];
  if (!c.ok(ragged_rows_error(N, B, target_logits->sizes[0], "target_logits.sizes[0]"))) return false;
  if (V < 1)
    return c.fail(MTP_ERROR_INVALID_ARGUMENT, "target_logits must have a vocabulary of V >= 1 entries, got V = ", V);
  if (!c.ok(pad_id_error(pad_id, draft_token_ids->dtype == MTP_INT32)) ||
      !c.tensor("accepted", accepted, 1, "[B]", same_as(draft_token_ids)) ||
      !c.size("accepted", accepted, 0, B, "B (cu_num_draft_tokens.sizes[0])") ||
      !c.tensor("out_tokens", out_tokens, 2, "[B, W]", same_as(draft_token_ids)) ||
      !c.size("out_tokens", out_tokens, 0, B, "B (cu_num_draft_tokens.sizes[0])"))
    return false;
  const int64_t W = out_tokens->sizes[1];
  if (W < 1) return c.fail(MTP_ERROR_INVALID_ARGUMENT, "out_tokens.sizes[1] = W must be >= 1 (the bonus token), got 0");
  std::vector<int64_t> cu(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) cu[size_t(b)] = load_id(cu_num_draft_tokens, b * cu_num_draft_tokens->strides[0]);
  if (!c.ok(ragged_layout_error(cu.data(), B, N, "draft_token_ids.sizes[0]", l)) ||
      !c.ok(ragged_cap_error("out_tokens.sizes[1] - 1", W - 1, l)) || !c.threads(num_threads, threads) ||
      !no_aliasing(c, {{"accepted", accepted}, {"out_tokens", out_tokens}},
                   {{"draft_token_ids", draft_token_ids},
                    {"cu_num_draft_tokens", cu_num_draft_tokens},
                    {"target_logits", target_logits}}))
    return false;
  a->B = B;
  a->K = W - 1;
  a->V = V;
  a->logits = target_logits->data;
  a->logits_dtype = float_dtype(target_logits->dtype);
  a->logits_stride[0] = 0;
  a->logits_stride[1] = target_logits->strides[0];
  a->logits_stride[2] = target_logits->strides[1];
  a->num_drafts = l->num_drafts.data();
  a->first_row = l->first_row.data();
  return true;
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
    VerifyArgs a;
    std::vector<int64_t> nd;
    if (!verify_front(c, draft_tokens, target_logits, num_drafts, accepted, out_tokens, num_threads, &a, &nd, &threads))
      return c.status;
    const int64_t B = a.B, K = a.K;
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

mtp_status mtp_verify_ragged(const mtp_tensor* draft_token_ids, const mtp_tensor* cu_num_draft_tokens,
                             const mtp_tensor* target_logits, int64_t pad_id, const mtp_tensor* accepted,
                             const mtp_tensor* out_tokens, int32_t num_threads) {
  return guarded("mtp_verify_ragged", [&](Checker& c) {
    int threads = 1;
    VerifyArgs a;
    RaggedLayout l;
    if (!ragged_front(c, draft_token_ids, cu_num_draft_tokens, target_logits, pad_id, accepted, out_tokens, num_threads,
                      &a, &l, &threads))
      return c.status;
    const int64_t B = a.B, W = a.K + 1;
    std::vector<int64_t> target(size_t(B) * size_t(W), 0);
    greedy_targets(a, target.data(), threads, current_isa(), ThreadParallelFor{threads});
    with_id_type(draft_token_ids, [&](auto id) {
      using I = decltype(id);
      const IdView<const I> drafts{
          static_cast<const I*>(draft_token_ids->data), {0, draft_token_ids->strides[0]}, l.draft_start.data()};
      accept_and_emit<I, int64_t>(B, W - 1, drafts, {target.data(), {W, 1}}, l.num_drafts.data(), pad_id,
                                  static_cast<I*>(accepted->data), accepted->strides[0], ids<I>(out_tokens));
    });
    return MTP_OK;
  });
}

// The per-request filters of mtp_verify_sampled_filtered: top_k int32|int64, top_p and min_p
// float32, each [B] or NULL (off), every value checked.
bool filters_of(Checker& c, const mtp_tensor* top_k, const mtp_tensor* top_p, const mtp_tensor* min_p, int64_t B,
                std::vector<Filters>* f, const char* b_what = "B (draft_tokens.sizes[0])") {
  f->assign(size_t(B), Filters{});
  std::vector<int64_t> k64;
  std::vector<int32_t> k32;
  std::vector<float> p, mp;
  static constexpr std::initializer_list<mtp_dtype> f32 = {MTP_FLOAT32}, i32 = {MTP_INT32}, i64 = {MTP_INT64};
  if (top_k && !(c.tensor("top_k", top_k, 1, "[B]", kIdTypes) &&
                 (top_k->dtype == MTP_INT32 ? vector_of(c, "top_k", top_k, B, i32, &k32, b_what)
                                            : vector_of(c, "top_k", top_k, B, i64, &k64, b_what))))
    return false;
  if ((top_p && !vector_of(c, "top_p", top_p, B, f32, &p, b_what)) ||
      (min_p && !vector_of(c, "min_p", min_p, B, f32, &mp, b_what)))
    return false;
  for (size_t b = 0; b < size_t(B); ++b) {
    Filters& g = (*f)[b];
    if (!k32.empty()) g.top_k = k32[b];
    if (!k64.empty()) g.top_k = k64[b];
    if (!p.empty()) g.top_p = p[b];
    if (!mp.empty()) g.min_p = mp[b];
    if (!c.ok(filter_error(int64_t(b), g.top_k, g.top_p, g.min_p))) return false;
  }
  return true;
}

mtp_status mtp_verify_sampled(const mtp_tensor* draft_tokens, const mtp_tensor* draft_probs,
                              const mtp_tensor* target_logits, const mtp_tensor* temperature, const mtp_tensor* seeds,
                              const mtp_tensor* offsets, const mtp_tensor* num_drafts, int64_t pad_id,
                              const mtp_tensor* accepted, const mtp_tensor* out_tokens, int32_t num_threads) {
  return mtp_verify_sampled_filtered(draft_tokens, draft_probs, target_logits, temperature, nullptr, nullptr, nullptr,
                                     seeds, offsets, num_drafts, pad_id, accepted, out_tokens, num_threads);
}

mtp_status mtp_verify_sampled_filtered(const mtp_tensor* draft_tokens, const mtp_tensor* draft_probs,
                                       const mtp_tensor* target_logits, const mtp_tensor* temperature,
                                       const mtp_tensor* top_k, const mtp_tensor* top_p, const mtp_tensor* min_p,
                                       const mtp_tensor* seeds, const mtp_tensor* offsets, const mtp_tensor* num_drafts,
                                       int64_t pad_id, const mtp_tensor* accepted, const mtp_tensor* out_tokens,
                                       int32_t num_threads) {
  return guarded(top_k || top_p || min_p ? "mtp_verify_sampled_filtered" : "mtp_verify_sampled", [&](Checker& c) {
    int threads = 1;
    SampledArgs a;
    std::vector<int64_t> nd;
    if (!verify_front(c, draft_tokens, target_logits, num_drafts, accepted, out_tokens, num_threads, &a.v, &nd,
                      &threads))
      return c.status;
    const int64_t B = a.v.B, K = a.v.K;
    static constexpr std::initializer_list<mtp_dtype> f32 = {MTP_FLOAT32}, i64 = {MTP_INT64};
    std::vector<float> tf;
    std::vector<int64_t> seed, offset(size_t(B), 0);
    if (!vector_of(c, "temperature", temperature, B, f32, &tf) || !vector_of(c, "seeds", seeds, B, i64, &seed) ||
        (offsets && !vector_of(c, "offsets", offsets, B, i64, &offset)))
      return c.status;
    std::vector<double> temp(tf.begin(), tf.end());
    for (int64_t b = 0; b < B; ++b)
      if (!c.ok(temperature_error(b, temp[size_t(b)]))) return c.status;
    std::vector<Filters> filters;
    if (!filters_of(c, top_k, top_p, min_p, B, &filters)) return c.status;
    if (draft_probs) {
      if (!c.tensor("draft_probs", draft_probs, 3, "[B, K, V]", kFloatTypes) ||
          !c.size("draft_probs", draft_probs, 0, B, "B (draft_tokens.sizes[0])") ||
          !c.size("draft_probs", draft_probs, 1, K, "K (draft_tokens.sizes[1])") ||
          !c.size("draft_probs", draft_probs, 2, a.v.V, "V (target_logits.sizes[2])") ||
          !c.ok(draft_probs_error(draft_probs->data, float_dtype(draft_probs->dtype), draft_probs->sizes,
                                  draft_probs->strides)))
        return c.status;
      a.q = draft_probs->data;
      a.q_dtype = float_dtype(draft_probs->dtype);
      std::copy_n(draft_probs->strides, 3, a.q_stride);
    }
    if (!no_aliasing(c, {{"accepted", accepted}, {"out_tokens", out_tokens}},
                     {{"draft_probs", draft_probs},
                      {"temperature", temperature},
                      {"seeds", seeds},
                      {"offsets", offsets},
                      {"top_k", top_k},
                      {"top_p", top_p},
                      {"min_p", min_p}}))
      return c.status;
    a.v.num_drafts = nd.data();
    a.temperature = temp.data();
    a.filters = filters.data();
    a.seed = seed.data();
    a.offset = offset.data();
    a.pad = pad_id;
    with_id_type(draft_tokens, [&](auto id) {
      using I = decltype(id);
      verify_sampled<I>(a, ids<const I>(draft_tokens), static_cast<I*>(accepted->data), accepted->strides[0],
                        ids<I>(out_tokens), current_isa(), ThreadParallelFor{threads});
    });
    return MTP_OK;
  });
}

mtp_status mtp_verify_sampled_ragged(const mtp_tensor* draft_token_ids, const mtp_tensor* draft_probs,
                                     const mtp_tensor* cu_num_draft_tokens, const mtp_tensor* target_logits,
                                     const mtp_tensor* temperature, const mtp_tensor* top_k, const mtp_tensor* top_p,
                                     const mtp_tensor* min_p, const mtp_tensor* seeds, const mtp_tensor* offsets,
                                     int64_t pad_id, const mtp_tensor* accepted, const mtp_tensor* out_tokens,
                                     int32_t num_threads) {
  return guarded("mtp_verify_sampled_ragged", [&](Checker& c) {
    static constexpr const char* b_what = "B (cu_num_draft_tokens.sizes[0])";
    int threads = 1;
    SampledArgs a;
    RaggedLayout l;
    if (!ragged_front(c, draft_token_ids, cu_num_draft_tokens, target_logits, pad_id, accepted, out_tokens, num_threads,
                      &a.v, &l, &threads))
      return c.status;
    const int64_t B = a.v.B, N = draft_token_ids->sizes[0];
    static constexpr std::initializer_list<mtp_dtype> f32 = {MTP_FLOAT32}, i64 = {MTP_INT64};
    std::vector<float> tf;
    std::vector<int64_t> seed, offset(size_t(B), 0);
    if (!vector_of(c, "temperature", temperature, B, f32, &tf, b_what) ||
        !vector_of(c, "seeds", seeds, B, i64, &seed, b_what) ||
        (offsets && !vector_of(c, "offsets", offsets, B, i64, &offset, b_what)))
      return c.status;
    std::vector<double> temp(tf.begin(), tf.end());
    for (int64_t b = 0; b < B; ++b)
      if (!c.ok(temperature_error(b, temp[size_t(b)]))) return c.status;
    std::vector<Filters> filters;
    if (!filters_of(c, top_k, top_p, min_p, B, &filters, b_what)) return c.status;
    if (draft_probs) {
      if (!c.tensor("draft_probs", draft_probs, 2, "[N, V]", kFloatTypes) ||
          !c.size("draft_probs", draft_probs, 0, N, "N (draft_token_ids.sizes[0])") ||
          !c.size("draft_probs", draft_probs, 1, a.v.V, "V (target_logits.sizes[1])") ||
          !c.ok(draft_probs_error(draft_probs->data, float_dtype(draft_probs->dtype), draft_probs->sizes,
                                  draft_probs->strides, 2)))
        return c.status;
      a.q = draft_probs->data;
      a.q_dtype = float_dtype(draft_probs->dtype);
      a.q_stride[0] = 0;
      a.q_stride[1] = draft_probs->strides[0];
      a.q_stride[2] = draft_probs->strides[1];
      a.q_first = l.draft_start.data();
    }
    if (!no_aliasing(c, {{"accepted", accepted}, {"out_tokens", out_tokens}},
                     {{"draft_probs", draft_probs},
                      {"temperature", temperature},
                      {"seeds", seeds},
                      {"offsets", offsets},
                      {"top_k", top_k},
                      {"top_p", top_p},
                      {"min_p", min_p}}))
      return c.status;
    a.temperature = temp.data();
    a.filters = filters.data();
    a.seed = seed.data();
    a.offset = offset.data();
    a.pad = pad_id;
    with_id_type(draft_token_ids, [&](auto id) {
      using I = decltype(id);
      const IdView<const I> drafts{
          static_cast<const I*>(draft_token_ids->data), {0, draft_token_ids->strides[0]}, l.draft_start.data()};
      verify_sampled<I>(a, drafts, static_cast<I*>(accepted->data), accepted->strides[0], ids<I>(out_tokens),
                        current_isa(), ThreadParallelFor{threads});
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
    if (K == INT64_MAX)
      return fail_with(c, MTP_ERROR_INVALID_ARGUMENT, "draft_tokens.sizes[1] = K = ", K,
                       " is too large (K + 1 overflows int64)");
    if (!c.tensor("target_tokens", target_tokens, 2, "[B, K+1] or [B, K]", kIdTypes) ||
        !c.size("target_tokens", target_tokens, 0, B, "B (draft_tokens.sizes[0])"))
      return c.status;
    if (target_tokens->sizes[1] != K + 1 && target_tokens->sizes[1] != K) {
      c.fail(MTP_ERROR_INVALID_ARGUMENT, "target_tokens.sizes[1] must be K+1 = ", K + 1, " or K = ", K, ", got ",
             target_tokens->sizes[1]);
      return c.status;
    }
    if (!c.num_drafts(num_drafts, B, K, &nd) || !c.tensor("accepted", accepted, 1, "[B]", same_as(draft_tokens)) ||
        !c.size("accepted", accepted, 0, B, "B (draft_tokens.sizes[0])") ||
        !no_aliasing(c, {{"accepted", accepted}},
                     {{"draft_tokens", draft_tokens}, {"target_tokens", target_tokens}, {"num_drafts", num_drafts}}))
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

mtp_status mtp_head_attention(const mtp_tensor* q, const mtp_tensor* k_cache, const mtp_tensor* v_cache,
                              const mtp_tensor* cache_lens, const mtp_tensor* k_local, const mtp_tensor* v_local,
                              const float* scale, int32_t causal, const mtp_tensor* out, int32_t num_threads) {
  return mtp_head_attention_window(q, k_cache, v_cache, cache_lens, k_local, v_local, scale, causal, 0, out,
                                   num_threads);
}

mtp_status mtp_head_attention_window(const mtp_tensor* q, const mtp_tensor* k_cache, const mtp_tensor* v_cache,
                                     const mtp_tensor* cache_lens, const mtp_tensor* k_local, const mtp_tensor* v_local,
                                     const float* scale, int32_t causal, int64_t window, const mtp_tensor* out,
                                     int32_t num_threads) {
  return guarded(window != 0 ? "mtp_head_attention_window" : "mtp_head_attention", [&](Checker& c) {
    int threads = 1;
    if (!c.tensor("q", q, 4, "[B, T, Hq, D]", kFloatTypes)) return c.status;
    const int64_t B = q->sizes[0], T = q->sizes[1], Hq = q->sizes[2], D = q->sizes[3];
    if (!c.tensor("k_cache", k_cache, 4, "[B, Hkv, L, D]", same_as(q)) ||
        !c.size("k_cache", k_cache, 0, B, "B (q.sizes[0])") ||
        !c.size("k_cache", k_cache, 3, D, "the head dim D (q.sizes[3])") ||
        !c.tensor("v_cache", v_cache, 4, "[B, Hkv, L, D]", same_as(q)) ||
        !c.same_sizes("v_cache", v_cache, "k_cache", k_cache))
      return c.status;
    const int64_t Hkv = k_cache->sizes[1], L = k_cache->sizes[2];
    std::vector<int64_t> lens;
    if (!c.ok(gqa_error(Hq, Hkv)) ||
        !c.counts("cache_lens", cache_lens, B, "B (q.sizes[0])", L, "L (k_cache.sizes[2])", &lens) ||
        !c.ok(causal_error(lens, T, causal != 0)) || !c.ok(local_pair_error(k_local != nullptr, v_local != nullptr)))
      return c.status;
    if (k_local && (!c.tensor("k_local", k_local, 4, "[B, Hkv, S, D]", same_as(q)) ||
                    !c.size("k_local", k_local, 0, B, "B (q.sizes[0])") ||
                    !c.size("k_local", k_local, 1, Hkv, "Hkv (k_cache.sizes[1])") ||
                    !c.size("k_local", k_local, 3, D, "the head dim D (q.sizes[3])") ||
                    !c.tensor("v_local", v_local, 4, "[B, Hkv, S, D]", same_as(q)) ||
                    !c.same_sizes("v_local", v_local, "k_local", k_local)))
      return c.status;
    if (scale && !c.ok(scale_error("*scale", *scale))) return c.status;
    if (!c.ok(window_error(window, k_local != nullptr))) return c.status;
    if (!c.tensor("out", out, 4, "[B, T, Hq, D]", same_as(q)) || !c.same_sizes("out", out, "q", q) ||
        !c.threads(num_threads, &threads) ||
        !no_aliasing(c, {{"out", out}},
                     {{"q", q},
                      {"k_cache", k_cache},
                      {"v_cache", v_cache},
                      {"cache_lens", cache_lens},
                      {"k_local", k_local},
                      {"v_local", v_local}}))
      return c.status;
    if (is_empty(out)) return MTP_OK;

    AttentionArgs a;
    a.B = B;
    a.T = T;
    a.Hq = Hq;
    a.Hkv = Hkv;
    a.D = D;
    a.dtype = float_dtype(q->dtype);
    a.q = q->data;
    std::copy_n(q->strides, 4, a.q_stride);
    set_cache_views(a, static_cast<const void*>(k_cache->data), k_cache->strides,
                    static_cast<const void*>(v_cache->data), v_cache->strides, lens.data());
    if (k_local)
      set_local_views(a, k_local->sizes[2], k_local->data, k_local->strides, v_local->data, v_local->strides);
    a.scale = scale ? *scale : default_attention_scale(D);
    a.causal = causal != 0;
    a.window = window;
    // The kernel writes a contiguous [B, T, Hq, D]: in place when out is one, else via a copy.
    const int64_t es = dtype_size(a.dtype);
    std::vector<char> tmp;
    if (is_contiguous(out)) {
      a.out = out->data;
    } else {
      tmp.resize(size_t(B * T * Hq * D * es));
      a.out = tmp.data();
    }
    attention(a, threads, current_isa(), ThreadParallelFor{threads});
    if (!tmp.empty()) scatter4(tmp.data(), out, es);
    return MTP_OK;
  });
}

mtp_status mtp_cache_append(const mtp_tensor* k_cache, const mtp_tensor* v_cache, const mtp_tensor* k_new,
                            const mtp_tensor* v_new, const mtp_tensor* cache_lens, int32_t num_threads) {
  return guarded("mtp_cache_append", [&](Checker& c) {
    int threads = 1;
    if (!c.tensor("k_new", k_new, 4, "[B, T, Hkv, D]", kFloatTypes) ||
        !c.tensor("v_new", v_new, 4, "[B, T, Hkv, D]", same_as(k_new)) || !c.same_sizes("v_new", v_new, "k_new", k_new))
      return c.status;
    const int64_t B = k_new->sizes[0], T = k_new->sizes[1], Hkv = k_new->sizes[2], D = k_new->sizes[3];
    if (!c.tensor("k_cache", k_cache, 4, "[B, Hkv, L, D]", same_as(k_new)) ||
        !c.size("k_cache", k_cache, 0, B, "B (k_new.sizes[0])") ||
        !c.size("k_cache", k_cache, 1, Hkv, "Hkv (k_new.sizes[2])") ||
        !c.size("k_cache", k_cache, 3, D, "the head dim D (k_new.sizes[3])") ||
        !c.tensor("v_cache", v_cache, 4, "[B, Hkv, L, D]", same_as(k_new)) ||
        !c.same_sizes("v_cache", v_cache, "k_cache", k_cache))
      return c.status;
    const int64_t L = k_cache->sizes[2];
    std::vector<int64_t> lens;
    if (!c.counts("cache_lens", cache_lens, B, "B (k_new.sizes[0])", L, "L (k_cache.sizes[2])", &lens) ||
        !c.threads(num_threads, &threads) ||
        !no_aliasing(c, {{"k_cache", k_cache}, {"v_cache", v_cache}},
                     {{"k_new", k_new}, {"v_new", v_new}, {"cache_lens", cache_lens}}))
      return c.status;
    CacheAppendArgs a;
    a.B = B;
    a.T = T;
    a.Hkv = Hkv;
    a.D = D;
    a.L = L;
    a.dtype = float_dtype(k_new->dtype);
    set_cache_views(a, k_cache->data, k_cache->strides, v_cache->data, v_cache->strides, lens.data());
    set_new_views(a, k_new->data, k_new->strides, v_new->data, v_new->strides);
    if (!c.ok(capacity_error(a))) return c.status;
    if (!is_empty(k_new)) cache_append(a, ThreadParallelFor{threads});
    return MTP_OK;
  });
}

mtp_status mtp_decoder_layers(const mtp_tensor* x, const mtp_tensor* k_cache, const mtp_tensor* v_cache,
                              const mtp_tensor* cache_lens, const mtp_tensor* rope_cos, const mtp_tensor* rope_sin,
                              const mtp_tensor* const* weights, int32_t num_weights,
                              const mtp_tensor* const* weight_scales, int32_t num_weight_scales, int64_t num_heads,
                              float eps, int32_t quantize_x, const mtp_tensor* out, int32_t num_threads) {
  return decoder_layers_call("mtp_decoder_layers", x, k_cache, v_cache, cache_lens, rope_cos, rope_sin, weights,
                             num_weights, weight_scales, num_weight_scales, num_heads, eps, quantize_x, nullptr, out,
                             num_threads);
}

mtp_status mtp_decoder_layers_tree(const mtp_tensor* x, const mtp_tensor* k_cache, const mtp_tensor* v_cache,
                                   const mtp_tensor* cache_lens, const mtp_tensor* rope_cos, const mtp_tensor* rope_sin,
                                   const mtp_tensor* const* weights, int32_t num_weights,
                                   const mtp_tensor* const* weight_scales, int32_t num_weight_scales, int64_t num_heads,
                                   float eps, int32_t quantize_x, const mtp_tensor* tree_parents, const mtp_tensor* out,
                                   int32_t num_threads) {
  return decoder_layers_call("mtp_decoder_layers_tree", x, k_cache, v_cache, cache_lens, rope_cos, rope_sin, weights,
                             num_weights, weight_scales, num_weight_scales, num_heads, eps, quantize_x, tree_parents,
                             out, num_threads);
}

mtp_status mtp_decoder_layers_gemma3(const mtp_tensor* x, const mtp_tensor* k_cache, const mtp_tensor* v_cache,
                                     const mtp_tensor* cache_lens, const mtp_tensor* rope_cos,
                                     const mtp_tensor* rope_sin, const mtp_tensor* rope_cos_local,
                                     const mtp_tensor* rope_sin_local, const int64_t* windows,
                                     const mtp_tensor* const* weights, int32_t num_weights,
                                     const mtp_tensor* const* weight_scales, int32_t num_weight_scales,
                                     int64_t num_heads, float eps, float attention_scale, int32_t quantize_x,
                                     const mtp_tensor* tree_parents, const mtp_tensor* out, int32_t num_threads) {
  const Gemma3Extras g{rope_cos_local, rope_sin_local, windows, attention_scale};
  return decoder_layers_call("mtp_decoder_layers_gemma3", x, k_cache, v_cache, cache_lens, rope_cos, rope_sin, weights,
                             num_weights, weight_scales, num_weight_scales, num_heads, eps, quantize_x, tree_parents,
                             out, num_threads, &g);
}

mtp_status mtp_head_draft(const mtp_tensor* hidden, const mtp_tensor* token, const mtp_tensor* k_cache,
                          const mtp_tensor* v_cache, const mtp_tensor* cache_lens, const mtp_tensor* rope_cos,
                          const mtp_tensor* rope_sin, const mtp_tensor* embedding, const mtp_tensor* embedding_scale,
                          const mtp_tensor* const* weights, int32_t num_weights, const mtp_tensor* lm_head,
                          const mtp_tensor* lm_head_scale, const mtp_tensor* draft_vocab, int64_t k, int64_t num_heads,
                          float eps, const mtp_tensor* drafts, int32_t num_threads) {
  return head_draft_call("mtp_head_draft", hidden, token, k_cache, v_cache, cache_lens, rope_cos, rope_sin, embedding,
                         embedding_scale, weights, num_weights, lm_head, lm_head_scale, draft_vocab, k, num_heads, eps,
                         0, drafts, nullptr, num_threads);
}

mtp_status mtp_head_draft_alternatives(const mtp_tensor* hidden, const mtp_tensor* token, const mtp_tensor* k_cache,
                                       const mtp_tensor* v_cache, const mtp_tensor* cache_lens,
                                       const mtp_tensor* rope_cos, const mtp_tensor* rope_sin,
                                       const mtp_tensor* embedding, const mtp_tensor* embedding_scale,
                                       const mtp_tensor* const* weights, int32_t num_weights, const mtp_tensor* lm_head,
                                       const mtp_tensor* lm_head_scale, const mtp_tensor* draft_vocab, int64_t k,
                                       int64_t num_heads, float eps, int64_t alternatives, const mtp_tensor* drafts,
                                       int32_t num_threads) {
  return head_draft_call("mtp_head_draft_alternatives", hidden, token, k_cache, v_cache, cache_lens, rope_cos, rope_sin,
                         embedding, embedding_scale, weights, num_weights, lm_head, lm_head_scale, draft_vocab, k,
                         num_heads, eps, alternatives, drafts, nullptr, num_threads);
}

mtp_status mtp_head_draft_probs(const mtp_tensor* hidden, const mtp_tensor* token, const mtp_tensor* k_cache,
                                const mtp_tensor* v_cache, const mtp_tensor* cache_lens, const mtp_tensor* rope_cos,
                                const mtp_tensor* rope_sin, const mtp_tensor* embedding,
                                const mtp_tensor* embedding_scale, const mtp_tensor* const* weights,
                                int32_t num_weights, const mtp_tensor* lm_head, const mtp_tensor* lm_head_scale,
                                const mtp_tensor* draft_vocab, int64_t k, int64_t num_heads, float eps,
                                const mtp_tensor* drafts, const mtp_tensor* probs, int32_t num_threads) {
  if (!probs)
    return guarded("mtp_head_draft_probs", [](Checker& c) {
      return fail_with(c, MTP_ERROR_NULL_POINTER, "probs is NULL (mtp_head_draft drafts without them)");
    });
  return head_draft_call("mtp_head_draft_probs", hidden, token, k_cache, v_cache, cache_lens, rope_cos, rope_sin,
                         embedding, embedding_scale, weights, num_weights, lm_head, lm_head_scale, draft_vocab, k,
                         num_heads, eps, 0, drafts, probs, num_threads);
}

mtp_status mtp_embedding(const mtp_tensor* tokens, const mtp_tensor* weight, const mtp_tensor* weight_scale,
                         const mtp_tensor* out) {
  return guarded("mtp_embedding", [&](Checker& c) {
    if (!c.tensor("tokens", tokens, 1, "[n]", kIdTypes) || !c.tensor("out", out, 2, "[n, H]", kActivationTypes) ||
        !c.size("out", out, 0, tokens->sizes[0], "n (tokens.sizes[0])"))
      return c.status;
    EmbeddingArgs a;
    a.n = out->sizes[0];
    a.H = out->sizes[1];
    a.dtype = float_dtype(out->dtype);
    int64_t V = 0;
    std::vector<int64_t> ids;
    if (!c.ok(row_length_error("H (out.sizes[1])", a.H)) ||
        !embedding_table(c, "weight", weight, "weight_scale", weight_scale, a.H, "H (out.sizes[1])", &V, &a.table) ||
        !no_aliasing(c, {{"out", out}}, {{"tokens", tokens}, {"weight", weight}, {"weight_scale", weight_scale}}) ||
        !token_ids(c, "tokens", tokens, a.n, "n", V, "V (weight.sizes[0])", &ids))
      return c.status;
    if (is_empty(out)) return MTP_OK;
    a.ids = ids.data();
    // The rows are written unit-stride: in place when out's are, else via a copy.
    const int64_t es = dtype_size(a.dtype);
    std::vector<char> tmp;
    if (out->strides[1] == 1 || a.H == 1) {
      a.out = out->data;
      a.out_stride = out->strides[0];
    } else {
      tmp.resize(size_t(a.n * a.H * es));
      a.out = tmp.data();
      a.out_stride = a.H;
    }
    embedding(a);
    if (!tmp.empty())
      for (int64_t i = 0; i < a.n; ++i)
        copy_elems(bytes(out) + i * out->strides[0] * es, out->strides[1], tmp.data() + i * a.H * es, 1, a.H, es);
    return MTP_OK;
  });
}

mtp_status mtp_linear(const mtp_tensor* x, const mtp_tensor* weight, const mtp_tensor* bias, const mtp_tensor* y,
                      int32_t num_threads) {
  return guarded("mtp_linear", [&](Checker& c) {
    if (weight && weight->dtype == MTP_INT8) {
      c.fail(MTP_ERROR_UNSUPPORTED_DTYPE, "weight is int8: call mtp_linear_q8 with its weight_scale");
      return c.status;
    }
    return linear_call(c, false, x, weight, nullptr, bias, y, num_threads);
  });
}

mtp_status mtp_linear_q8(const mtp_tensor* x, const mtp_tensor* weight, const mtp_tensor* weight_scale,
                         const mtp_tensor* bias, const mtp_tensor* y, int32_t num_threads) {
  return guarded("mtp_linear_q8", [&](Checker& c) {
    if (weight && is_block_dtype(weight->dtype)) return block_weight_to_linear(c, weight);
    return linear_call(c, true, x, weight, weight_scale, bias, y, num_threads);
  });
}

mtp_status mtp_linear_q8dot(const mtp_tensor* x, const mtp_tensor* weight, const mtp_tensor* weight_scale,
                            const mtp_tensor* bias, const mtp_tensor* y, int32_t num_threads) {
  return guarded("mtp_linear_q8dot", [&](Checker& c) {
    if (weight && is_block_dtype(weight->dtype)) return block_weight_to_linear(c, weight);
    return linear_call(c, true, x, weight, weight_scale, bias, y, num_threads, /*quantize_x=*/true);
  });
}

mtp_status mtp_gguf_repack_x8(int32_t dtype, const void* src, int64_t rows, int64_t cols, void* dst) {
  return guarded("mtp_gguf_repack_x8", [&](Checker& c) {
    const DType t = DType(dtype);
    if (!is_block_dtype(dtype) || is_x8(t) || x8_of(t) == t)
      return fail_with(c, MTP_ERROR_UNSUPPORTED_DTYPE,
                       "dtype must be the file's type of a matrix with an x8 layout: Q4_0 or Q4_1 or Q8_0 or Q4_K or "
                       "Q6_K, got ",
                       dtype_name(dtype), " (dtype value ", dtype, ")",
                       is_x8(t)                ? ": already the x8 layout"
                       : is_block_dtype(dtype) ? ": no x8 layout"
                                               : "");
    if (rows < 0 || rows % kX8Rows != 0)
      return fail_with(c, MTP_ERROR_INVALID_ARGUMENT, "rows must be >= 0 and a multiple of 8 (the x8 layout ",
                       "interleaves groups of 8 rows), got ", rows);
    if (cols < 0 || cols % block_elems(t) != 0)
      return fail_with(c, MTP_ERROR_INVALID_ARGUMENT, "cols must be >= 0 and a multiple of ", block_type_name(t),
                       "'s blocks of ", block_elems(t), " elements, got ", cols);
    int64_t row_bytes = 0, total = 0;
    if (!checked_mul(cols / block_elems(t), block_bytes(t), &row_bytes) || !checked_mul(rows, row_bytes, &total))
      return fail_with(c, MTP_ERROR_INVALID_ARGUMENT, "a [rows, cols] = [", rows, ", ", cols, "] ", block_type_name(t),
                       " matrix has more bytes than int64 counts");
    if (total == 0) return MTP_OK;
    if (!src) return fail_with(c, MTP_ERROR_NULL_POINTER, "src is NULL for a [", rows, ", ", cols, "] matrix");
    if (!dst) return fail_with(c, MTP_ERROR_NULL_POINTER, "dst is NULL for a [", rows, ", ", cols, "] matrix");
    const uintptr_t s = reinterpret_cast<uintptr_t>(src), d = reinterpret_cast<uintptr_t>(dst),
                    n = uintptr_t(uint64_t(total));
    if (uint64_t(total) > uint64_t(UINTPTR_MAX) || s > UINTPTR_MAX - n || d > UINTPTR_MAX - n)
      return fail_with(c, MTP_ERROR_INVALID_ARGUMENT, "src or dst: ", total,
                       " bytes from there run past the end of the address space");
    if (s < d + n && d < s + n)
      return fail_with(c, MTP_ERROR_INVALID_ARGUMENT, "dst and src overlap in memory (each is rows x ", row_bytes,
                       " = ", total, " bytes): the repack is not in place, dst must be another buffer");
    repack_x8(t, static_cast<const uint8_t*>(src), row_bytes, rows, cols, static_cast<uint8_t*>(dst));
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
  if (!name)
    c.fail(MTP_ERROR_NULL_POINTER, "name is NULL");
  else if (!parse_isa(name, &isa))
    c.fail(MTP_ERROR_INVALID_ARGUMENT, "unknown instruction set '", name, "' (expected one of ", isa_names(), ")");
  else if (!set_isa(isa))
    c.fail(MTP_ERROR_UNSUPPORTED, "this CPU does not support the '", name, "' instruction set");
  return c.status;
}

}  // extern "C"
