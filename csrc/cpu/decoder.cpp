// CPU bindings of mtp.decoder_layers (a whole Llama-family decoder pass, mtp/decoder_layers.h),
// mtp.head_draft (the MTP head's draft steps, mtp/head_draft.h) and mtp.embedding (the rows a
// pass starts from, mtp/embedding.h), one call each. Every tensor
// is checked against the shapes the first layer's weights and the caches imply, then handed
// to the core as pointers and strides.
#include <torch/csrc/stable/library.h>

#include <string>

#include "../torch/adapter.h"
#include "mtp/head_draft.h"

namespace mtp::cpu {
namespace {

using namespace mtp::torch_adapter;  // csrc/torch/adapter.h

constexpr const char* kDecoder = "mtp.decoder_layers";
constexpr const char* kHeadDraft = "mtp.head_draft";
constexpr const char* kEmbedding = "mtp.embedding";

void check_norm(const char* op, const Tensor& w, const std::string& name, int64_t H, const Tensor& x,
                const char* x_name, const char* h_what = "H") {
  check_cpu(op, name.c_str(), w);
  check_same_dtype(op, name.c_str(), w, x_name, x);
  const std::string shape = std::string("[") + h_what + "]";
  check_dim(op, name.c_str(), w, 1, shape.c_str());
  check_size(op, name.c_str(), w, 0, H, h_what);
  const std::string stride = norm_stride_error(H, w.stride(0));
  MTP_CHECK(stride.empty(), op, ": ", name, ": ", stride);
}

// A matrix [N, K] (with its Q8 scales [N, ceil(K/32)] when int8, from the argument
// `scales`; or, type >= 0, the uint8 bytes of a GGUF block type), read in place like
// mtp.linear's weight.
DecoderMatrix matrix(const char* op, const Tensor& w, const std::optional<Tensor>& scale, const std::string& name,
                     int64_t N, const char* n_what, int64_t K, const char* k_what, const char* scales = "weight_scales",
                     int64_t type = -1) {
  const char* nm = name.c_str();
  check_cpu(op, nm, w);
  if (type >= 0) {
    DecoderMatrix m;
    m.dtype = check_gguf_weight(op, nm, w, type, K);
    check_size(op, nm, w, 0, N, n_what);
    MTP_CHECK(!scale.has_value(), op, ": ", name, " is a GGUF block type (it carries its scales) but ", scales,
              " is not empty");
    m.w = w.data_ptr();
    m.stride = w.stride(0);
    return m;
  }
  check_dtype(op, nm, w, {ScalarType::Float, ScalarType::BFloat16, ScalarType::Char});
  check_dim(op, nm, w, 2, "[N, K]");
  check_size(op, nm, w, 0, N, n_what);
  check_size(op, nm, w, 1, K, k_what);
  const std::string rows = weight_rows_error(K, w.stride(0), w.stride(1));
  MTP_CHECK(rows.empty(), op, ": ", name, ": ", rows);
  const bool int8 = w.scalar_type() == ScalarType::Char;
  MTP_CHECK(
      int8 == scale.has_value(), op, ": ", name, " is ", w.scalar_type(), " but ", scales,
      int8 ? " is empty: int8 (Q8) weights need their scales" : " is not empty: scales go with int8 (Q8) weights only");
  DecoderMatrix m;
  m.w = w.data_ptr();
  m.dtype = int8 ? DType::I8 : to_dtype(w.scalar_type());
  m.stride = w.stride(0);
  if (int8) {
    const std::string sn = name + "'s scales";
    check_q8_scales(op, sn.c_str(), *scale, N, n_what, K, kCpu);
    const std::string rows_error = weight_scale_rows_error(q8_blocks(K), scale->stride(0), scale->stride(1));
    MTP_CHECK(rows_error.empty(), op, ": ", sn, ": ", rows_error);
    m.scale = scale->mutable_data_ptr<float>();
    m.scale_stride = scale->stride(0);
  }
  return m;
}

// rope_cos, rope_sin: fp32 [P, D] tables. Returns P.
int64_t check_rope(const char* op, const Tensor& rope_cos, const Tensor& rope_sin, int64_t D, const char* d_what) {
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"rope_cos", &rope_cos}, {"rope_sin", &rope_sin}}) {
    check_cpu(op, name, *t);
    check_dtype(op, name, *t, {ScalarType::Float});
    check_dim(op, name, *t, 2, "[P, D]");
    check_size(op, name, *t, 1, D, d_what);
  }
  MTP_CHECK(rope_sin.size(0) == rope_cos.size(0), op, ": rope_sin must have rope_cos's shape ", shape_of(rope_cos),
            ", got ", shape_of(rope_sin));
  return rope_cos.size(0);
}

// The MLP width I of a gate_up matrix [2I, H], weights[index].
int64_t mlp_width(const char* op, const TensorList& weights, int64_t index, const WeightNames& names) {
  const Tensor& gu = weights[index];
  const std::string name = names(index);
  check_dim(op, name.c_str(), gu, 2, "[2I, H]");
  MTP_CHECK(gu.size(0) % 2 == 0, op, ": ", name, ".size(0) must be even [2I, H], got ", gu.size(0));
  return gu.size(0) / 2;
}

// Layer i's four matrices (qkv, o_proj, gate_up, down_proj: weights[at[0..3]]) into l, each
// checked, with its Q8 scales (scales[4 i + j]) or GGUF type (types[4 i + j]) if any.
void parse_matrices(const char* op, const TensorList& weights, const int64_t (&at)[kLayerMatrices], int64_t i,
                    const TensorList& scales, const WeightNames& names, int64_t H, const HeadWidths& widths, int64_t I,
                    const std::vector<int64_t>& types, DecoderLayer& l) {
  const int64_t s0 = kLayerMatrices * i;
  auto scale = [&](int64_t j) { return scales.empty() ? std::nullopt : std::optional<Tensor>(scales[s0 + j]); };
  auto type = [&](int64_t j) { return types.empty() ? int64_t(-1) : types[size_t(s0 + j)]; };
  l.qkv = matrix(op, weights[at[0]], scale(0), names(at[0]), widths.qkv_rows, "(Hq + 2 Hkv) D", H, "H", "weight_scales",
                 type(0));
  l.o = matrix(op, weights[at[1]], scale(1), names(at[1]), H, "H", widths.q_width, "Hq D", "weight_scales", type(1));
  l.gate_up = matrix(op, weights[at[2]], scale(2), names(at[2]), 2 * I, "2I", H, "H", "weight_scales", type(2));
  l.down = matrix(op, weights[at[3]], scale(3), names(at[3]), H, "H", I, "I", "weight_scales", type(3));
}

// `count` layers of weights from weights[offset] (scales[4 i + j] the Q8 scales of layer i's
// matrix j, or none), checked; sets I (the MLP width, from the first gate_up).
std::vector<DecoderLayer> parse_layers(const char* op, const TensorList& weights, int64_t offset, int64_t count,
                                       const TensorList& scales, const WeightNames& names, int64_t H,
                                       const HeadWidths& widths, const Tensor& x, const char* x_name, int64_t* I,
                                       const std::vector<int64_t>& types = {}) {
  if (count > 0) *I = mlp_width(op, weights, offset + 4, names);
  std::vector<DecoderLayer> layers(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const int64_t w0 = offset + kLayerTensors * i;
    check_norm(op, weights[w0], names(w0), H, x, x_name);
    check_norm(op, weights[w0 + 3], names(w0 + 3), H, x, x_name);
    DecoderLayer& l = layers[size_t(i)];
    l.input_norm = weights[w0].data_ptr();
    l.post_norm = weights[w0 + 3].data_ptr();
    parse_matrices(op, weights, {w0 + 1, w0 + 2, w0 + 4, w0 + 5}, i, scales, names, H, widths, *I, types, l);
  }
  return layers;
}

// Gemma 3's layers (kGemma3LayerParts, 10 tensors each) from weights[0], checked like
// parse_layers; windows[i] the sliding window of layer i.
std::vector<DecoderLayer> parse_gemma3_layers(const char* op, const TensorList& weights, int64_t count,
                                              const TensorList& scales, const WeightNames& names, int64_t H, int64_t D,
                                              const HeadWidths& widths, const Tensor& x, int64_t* I,
                                              const std::vector<int64_t>& types, const std::vector<int64_t>& windows) {
  constexpr int64_t per = kGemma3LayerTensors;
  if (count > 0) *I = mlp_width(op, weights, 7, names);
  std::vector<DecoderLayer> layers(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const int64_t w0 = per * i;
    for (int64_t j : {0, 5, 6, 9}) check_norm(op, weights[w0 + j], names(w0 + j), H, x, "x");
    for (int64_t j : {2, 3}) check_norm(op, weights[w0 + j], names(w0 + j), D, x, "x", "D");
    DecoderLayer& l = layers[size_t(i)];
    l.input_norm = weights[w0].data_ptr();
    l.q_norm = weights[w0 + 2].data_ptr();
    l.k_norm = weights[w0 + 3].data_ptr();
    l.post_attention_norm = weights[w0 + 5].data_ptr();
    l.post_norm = weights[w0 + 6].data_ptr();
    l.post_feedforward_norm = weights[w0 + 9].data_ptr();
    l.window = windows.empty() ? 0 : windows[size_t(i)];
    parse_matrices(op, weights, {w0 + 1, w0 + 4, w0 + 7, w0 + 8}, i, scales, names, H, widths, *I, types, l);
  }
  return layers;
}

// tree_parents [B, T] (int32 or int64) as int64 values, checked: each request's row 0 is
// the root (-1) and every other row's parent an earlier row.
std::vector<int64_t> checked_tree(const char* op, const Tensor& t, int64_t B, int64_t T) {
  check_cpu(op, "tree_parents", t);
  MTP_CHECK(t.scalar_type() == ScalarType::Long || t.scalar_type() == ScalarType::Int, op,
            ": tree_parents must be int32 or int64, got ", t.scalar_type());
  MTP_CHECK(t.dim() == 2 && t.size(0) == B && t.size(1) == T, op, ": tree_parents must be [B, T] = [", B, ", ", T,
            "] (x's first two sizes), got ", shape_of(t));
  const Tensor v = torch::stable::contiguous(torch::stable::to(t, ScalarType::Long));
  std::vector<int64_t> parents(v.mutable_data_ptr<int64_t>(), v.mutable_data_ptr<int64_t>() + B * T);
  check_ok(op, tree_parents_error(parents, B, T));
  return parents;
}

// weight_types (or none: empty), checked: one GGML type number or -1 per matrix, `count` of
// them (`which`: the matrices in words).
std::vector<int64_t> checked_types(const char* op, const std::optional<std::vector<int64_t>>& weight_types,
                                   int64_t count, const std::string& which) {
  if (!weight_types.has_value()) return {};
  const std::vector<int64_t>& types = *weight_types;
  MTP_CHECK(int64_t(types.size()) == count, op,
            ": weight_types must hold one GGML type number (or -1: a float or Q8 matrix) per matrix, ", which, ": ",
            count, " values, got ", types.size());
  for (size_t i = 0; i < types.size(); ++i)
    MTP_CHECK(types[i] == -1 || gguf_type_error(types[i]).empty(), op, ": weight_types[", i,
              "]: ", gguf_type_error(types[i]), " (or -1)");
  return types;
}

Tensor decoder_layers_cpu(const Tensor& x, const Tensor& k_cache, const Tensor& v_cache, const Tensor& cache_lens,
                          const Tensor& rope_cos, const Tensor& rope_sin, const TensorList& weights,
                          const TensorList& weight_scales, int64_t num_heads, double eps, bool quantize_x,
                          const std::optional<Tensor>& tree_parents,
                          const std::optional<std::vector<int64_t>>& weight_types, std::string layer,
                          const std::optional<std::vector<int64_t>>& windows,
                          const std::optional<Tensor>& rope_cos_local, const std::optional<Tensor>& rope_sin_local,
                          std::optional<double> attention_scale, const std::optional<std::vector<int64_t>>& taps,
                          const std::optional<Tensor>& tap_out) {
  check_ok(kDecoder,
           layer_kind_error(layer, windows.has_value(), rope_cos_local.has_value() || rope_sin_local.has_value(),
                            attention_scale.has_value()));
  const bool gemma3 = layer == "gemma3";
  check_cpu(kDecoder, "x", x);
  check_dtype(kDecoder, "x", x, {ScalarType::Float, ScalarType::BFloat16});
  check_dim(kDecoder, "x", x, 3, "[B, T, H]");
  for (auto [name, c] : {std::pair<const char*, const Tensor*>{"k_cache", &k_cache}, {"v_cache", &v_cache}}) {
    check_cpu(kDecoder, name, *c);
    check_same_dtype(kDecoder, name, *c, "x", x);
    check_dim(kDecoder, name, *c, 5, "[layers, B, Hkv, L, D]");
  }
  MTP_CHECK(same_shape(v_cache, k_cache), kDecoder, ": v_cache must have k_cache's shape ", shape_of(k_cache), ", got ",
            shape_of(v_cache));
  DecoderArgs a;
  a.B = x.size(0);
  a.T = x.size(1);
  a.H = x.size(2);
  a.layers = k_cache.size(0);
  a.Hkv = k_cache.size(2);
  a.L = k_cache.size(3);
  a.D = k_cache.size(4);
  a.Hq = num_heads;
  a.dtype = to_dtype(x.scalar_type());
  check_size(kDecoder, "k_cache", k_cache, 1, a.B, "B (x.size(0))");
  HeadWidths widths;
  check_ok(kDecoder, decoder_heads_error(num_heads, a.Hkv, a.D, eps, &widths));
  check_ok(kDecoder, row_length_error("H (x.size(2))", a.H));
  // k_cache and v_cache are written in place: no overlap with each other, x or the tables.
  check_written(kDecoder, "it is written in place", {{"k_cache", &k_cache}, {"v_cache", &v_cache}},
                {{"x", &x}, {"rope_cos", &rope_cos}, {"rope_sin", &rope_sin}, {"cache_lens", &cache_lens}});
  a.P = check_rope(kDecoder, rope_cos, rope_sin, a.D, "D (k_cache.size(4))");
  const std::vector<int64_t> lens =
      checked_counts(kDecoder, "cache_lens", cache_lens, a.B, "B (x.size(0))", a.L, "L (k_cache.size(3))");
  check_ok(kDecoder, positions_error(lens, a.T, a.L, "k_cache.size(3)", a.P, "rope_cos.size(0)"));

  const int64_t per = gemma3 ? kGemma3LayerTensors : kLayerTensors;
  check_ok(kDecoder, layers_error(a.layers, "k_cache.size(0)", per));
  const int64_t want = per * a.layers + 1;
  MTP_CHECK(int64_t(weights.size()) == want, kDecoder, ": weights must hold ", per, " tensors per layer (",
            gemma3 ? "input_norm, qkv, q_norm, k_norm, o_proj, post_attention_norm, pre_feedforward_norm, gate_up, "
                     "down_proj, post_feedforward_norm"
                   : "input_norm, qkv, o_proj, post_norm, gate_up, down_proj",
            ") for the ", a.layers, " layers of k_cache", gemma3 ? " (layer=\"gemma3\")" : "",
            ", then the final norm: ", want, " tensors, got ", weights.size());
  std::vector<int64_t> window_list;
  bool any_window = false;
  if (gemma3) {
    a.kind = LayerKind::Gemma3;
    if (windows.has_value()) window_list = *windows;
    check_ok(kDecoder, gemma3_windows_error(window_list, windows.has_value(), a.layers, rope_cos_local.has_value(),
                                            rope_sin_local.has_value(), &any_window));
    if (rope_cos_local.has_value()) {
      const Tensor &cl = *rope_cos_local, &sl = *rope_sin_local;
      for (auto [name, t] : {std::pair<const char*, const Tensor*>{"rope_cos_local", &cl}, {"rope_sin_local", &sl}}) {
        check_cpu(kDecoder, name, *t);
        check_dtype(kDecoder, name, *t, {ScalarType::Float});
        check_dim(kDecoder, name, *t, 2, "[P, D]");
        check_size(kDecoder, name, *t, 1, a.D, "D (k_cache.size(4))");
      }
      MTP_CHECK(sl.size(0) == cl.size(0), kDecoder, ": rope_sin_local must have rope_cos_local's shape ", shape_of(cl),
                ", got ", shape_of(sl));
      a.P_local = cl.size(0);
      check_written(kDecoder, "it is written in place", {{"k_cache", &k_cache}, {"v_cache", &v_cache}},
                    {{"rope_cos_local", &cl}, {"rope_sin_local", &sl}});
      check_ok(kDecoder, positions_error(lens, a.T, a.L, "k_cache.size(3)", a.P_local, "rope_cos_local.size(0)"));
    }
    if (attention_scale.has_value()) {
      check_ok(kDecoder, scale_error("attention_scale", *attention_scale));
      a.has_scale = true;
      a.scale = float(*attention_scale);
    }
  }
  const bool q8 = !weight_scales.empty();
  MTP_CHECK(!q8 || int64_t(weight_scales.size()) == kLayerMatrices * a.layers, kDecoder,
            ": weight_scales must be empty (float weights) or hold the Q8 scales of the ", kLayerMatrices,
            " matrices of each layer (qkv, o_proj, gate_up, down_proj): ", kLayerMatrices * a.layers, " tensors, got ",
            weight_scales.size());
  MTP_CHECK(!quantize_x || q8, kDecoder,
            ": quantize_x=True needs int8 weights with their scales (mtp_kernels.quantize_q8), got float weights");
  const std::vector<int64_t> types =
      checked_types(kDecoder, weight_types, kLayerMatrices * a.layers,
                    std::to_string(kLayerMatrices) + " per layer (qkv, o_proj, gate_up, down_proj)");
  const WeightNames names = gemma3 ? WeightNames{{}, a.layers, "layer", "the final norm", kGemma3LayerParts, per}
                                   : WeightNames{{}, a.layers, "layer", "the final norm"};
  std::vector<DecoderLayer> layers =
      gemma3 ? parse_gemma3_layers(kDecoder, weights, a.layers, weight_scales, names, a.H, a.D, widths, x, &a.I, types,
                                   window_list)
             : parse_layers(kDecoder, weights, 0, a.layers, weight_scales, names, a.H, widths, x, "x", &a.I, types);
  const Tensor& final_norm = weights[want - 1];
  check_norm(kDecoder, final_norm, names(want - 1), a.H, x, "x");
  const auto scale_names = [](int64_t i) { return "weight_scales[" + std::to_string(i) + "]"; };
  check_disjoint(kDecoder, {{"k_cache", &k_cache}, {"v_cache", &v_cache}}, weights, names);
  check_disjoint(kDecoder, {{"k_cache", &k_cache}, {"v_cache", &v_cache}}, weight_scales, scale_names);
  std::vector<int64_t> tap_list;
  if (taps.has_value()) tap_list = *taps;
  check_ok(kDecoder, taps_error(tap_list, taps.has_value(), tap_out.has_value(), a.layers));
  if (tap_out.has_value()) {  // [len(taps), B, T, H] in x's dtype, written in place as one block
    const Tensor& t = *tap_out;
    check_cpu(kDecoder, "tap_out", t);
    check_same_dtype(kDecoder, "tap_out", t, "x", x);
    check_dim(kDecoder, "tap_out", t, 4, "[len(taps), B, T, H]");
    check_size(kDecoder, "tap_out", t, 0, int64_t(tap_list.size()), "len(taps)");
    check_size(kDecoder, "tap_out", t, 1, a.B, "B (x.size(0))");
    check_size(kDecoder, "tap_out", t, 2, a.T, "T (x.size(1))");
    check_size(kDecoder, "tap_out", t, 3, a.H, "H (x.size(2))");
    MTP_CHECK(t.is_contiguous(), kDecoder, ": tap_out must be contiguous (it is written in place), got strides ",
              Shape{t.strides()}, " for shape ", shape_of(t));
    check_written(kDecoder, "it is written in place", {{"tap_out", &t}},
                  {{"x", &x},
                   {"k_cache", &k_cache},
                   {"v_cache", &v_cache},
                   {"cache_lens", &cache_lens},
                   {"rope_cos", &rope_cos},
                   {"rope_sin", &rope_sin}});
    for (auto [name, o] : {std::pair<const char*, const std::optional<Tensor>*>{"tree_parents", &tree_parents},
                           {"rope_cos_local", &rope_cos_local},
                           {"rope_sin_local", &rope_sin_local}})
      if (o->has_value()) check_written(kDecoder, "it is written in place", {{"tap_out", &t}}, {{name, &**o}});
    check_disjoint(kDecoder, {{"tap_out", &t}}, weights, names);
    check_disjoint(kDecoder, {{"tap_out", &t}}, weight_scales, scale_names);
  }

  const Tensor xc = torch::stable::contiguous(x), cos = torch::stable::contiguous(rope_cos),
               sin = torch::stable::contiguous(rope_sin);
  std::optional<Tensor> cos_local, sin_local;
  if (rope_cos_local.has_value()) {
    cos_local = torch::stable::contiguous(*rope_cos_local);
    sin_local = torch::stable::contiguous(*rope_sin_local);
    a.rope_cos_local = cos_local->mutable_data_ptr<float>();
    a.rope_sin_local = sin_local->mutable_data_ptr<float>();
  }
  Tensor out = empty_like_on(x, x.sizes());
  a.x = xc.data_ptr();
  a.rope_cos = cos.mutable_data_ptr<float>();
  a.rope_sin = sin.mutable_data_ptr<float>();
  a.k_cache = k_cache.data_ptr();
  a.v_cache = v_cache.data_ptr();
  for (int d = 0; d < 5; ++d) {
    a.k_stride[d] = k_cache.stride(d);
    a.v_stride[d] = v_cache.stride(d);
  }
  a.cache_lens = lens.data();
  const std::vector<int64_t> parents =
      tree_parents ? checked_tree(kDecoder, *tree_parents, a.B, a.T) : std::vector<int64_t>();
  a.tree_parents = tree_parents ? parents.data() : nullptr;
  a.layer = layers.data();
  a.final_norm = final_norm.data_ptr();
  a.eps = float(eps);  // eps_error checked it as a float
  a.quantize_x = quantize_x;
  a.out = out.data_ptr();
  a.taps = tap_list.data();
  a.n_taps = int64_t(tap_list.size());
  a.tap_out = tap_out.has_value() ? tap_out->data_ptr() : nullptr;
  decoder_layers(a, int(torch::stable::get_num_threads()), current_isa(), TorchParallelFor{});
  return out;
}

// A vector of token ids [n], each in [0, V), as int64 values.
std::vector<int64_t> checked_ids(const char* op, const char* name, const Tensor& t, int64_t n, const char* n_what,
                                 int64_t V, const char* v_what) {
  check_cpu(op, name, t);
  check_count_vector(op, name, t, n, n_what);
  std::vector<int64_t> ids(static_cast<size_t>(n));
  dispatch_index(t.scalar_type(), [&](auto index) {
    using index_t = decltype(index);
    const index_t* p = t.mutable_data_ptr<index_t>();
    for (int64_t i = 0; i < n; ++i) {
      ids[size_t(i)] = p[i * t.stride(0)];
      MTP_CHECK(ids[size_t(i)] >= 0 && ids[size_t(i)] < V, op, ": ", name, " must hold token ids in [0, ", v_what,
                ") = [0, ", V, "), got ", name, "[", i, "] = ", ids[size_t(i)]);
    }
  });
  return ids;
}

Tensor head_draft_cpu(const Tensor& hidden, const Tensor& token, const Tensor& k_cache, const Tensor& v_cache,
                      const Tensor& cache_lens, const Tensor& rope_cos, const Tensor& rope_sin, const Tensor& embedding,
                      const std::optional<Tensor>& embedding_scale, const TensorList& weights, const Tensor& lm_head,
                      const std::optional<Tensor>& lm_head_scale, const std::optional<Tensor>& draft_vocab, int64_t k,
                      int64_t num_heads, double eps, int64_t alternatives, int64_t embedding_type, int64_t lm_head_type,
                      const std::optional<std::vector<int64_t>>& weight_types, const std::optional<Tensor>& probs_out) {
  const char* op = kHeadDraft;
  check_cpu(op, "hidden", hidden);
  check_dtype(op, "hidden", hidden, {ScalarType::Float, ScalarType::BFloat16});
  check_dim(op, "hidden", hidden, 2, "[B, H]");
  HeadDraftArgs a;
  a.B = hidden.size(0);
  a.H = hidden.size(1);
  a.K = k;
  a.Hq = num_heads;
  a.dtype = to_dtype(hidden.scalar_type());
  MTP_CHECK(k >= 0, op, ": k (draft steps) must be >= 0, got ", k);
  AttentionArgs cache;  // the cache views, checked like head_attention's
  set_caches(op, cache, k_cache, v_cache, "hidden", hidden, kCpu);
  check_size(op, "k_cache", k_cache, 0, a.B, "B (hidden.size(0))");
  a.Hkv = k_cache.size(1);
  a.L = k_cache.size(2);
  a.D = k_cache.size(3);
  HeadWidths widths;
  check_ok(op, decoder_heads_error(num_heads, a.Hkv, a.D, eps, &widths));
  check_ok(op, row_length_error("H (hidden.size(1))", a.H));
  a.P = check_rope(op, rope_cos, rope_sin, a.D, "D (k_cache.size(3))");
  const std::vector<int64_t> lens =
      checked_counts(op, "cache_lens", cache_lens, a.B, "B (hidden.size(0))", a.L, "L (k_cache.size(2))");
  check_ok(op, draft_positions_error(lens, k, a.P, "rope_cos.size(0)"));

  check_cpu(op, "embedding", embedding);
  check_dim(op, "embedding", embedding, 2, "[V, H]");
  a.V = embedding.size(0);
  MTP_CHECK(embedding_type == -1 || gguf_type_error(embedding_type).empty(), op,
            ": embedding_type: ", gguf_type_error(embedding_type), " (or -1)");
  MTP_CHECK(lm_head_type == -1 || gguf_type_error(lm_head_type).empty(), op,
            ": lm_head_type: ", gguf_type_error(lm_head_type), " (or -1)");
  a.embedding = matrix(op, embedding, embedding_scale, "embedding", a.V, "V", a.H, "H (hidden.size(1))",
                       "embedding_scale", embedding_type);
  const std::vector<int64_t> tokens =
      checked_ids(op, "token", token, a.B, "B (hidden.size(0))", a.V, "V (embedding.size(0))");

  const int64_t n = int64_t(weights.size());
  MTP_CHECK(n >= 4 && (n - 4) % kLayerTensors == 0, op, ": weights must hold embed_norm, hidden_norm, proj, then ",
            kLayerTensors,
            " tensors per block (input_norm, qkv, o_proj, post_norm, gate_up, down_proj), then out_norm: 4 + ",
            kLayerTensors, " x blocks tensors, got ", n);
  a.blocks = (n - 4) / kLayerTensors;
  const WeightNames names{{"embed_norm", "hidden_norm", "proj"}, a.blocks, "block", "out_norm"};
  check_norm(op, weights[0], names(0), a.H, hidden, "hidden");
  check_norm(op, weights[1], names(1), a.H, hidden, "hidden");
  check_norm(op, weights[n - 1], names(n - 1), a.H, hidden, "hidden");
  // weight_types: proj's, then the 4 matrices of each block (a block type: the head's matrices
  // in 8 bits, half a draft's bytes).
  const std::vector<int64_t> types =
      checked_types(op, weight_types, 1 + kLayerMatrices * a.blocks,
                    "proj, then " + std::to_string(kLayerMatrices) + " per block (qkv, o_proj, gate_up, down_proj)");
  a.proj = matrix(op, weights[2], std::nullopt, names(2), a.H, "H", 2 * a.H, "2H", "weight_scales",
                  types.empty() ? -1 : types[0]);
  std::vector<DecoderLayer> blocks =
      parse_layers(op, weights, 3, a.blocks, {}, names, a.H, widths, hidden, "hidden", &a.I,
                   types.empty() ? types : std::vector<int64_t>(types.begin() + 1, types.end()));

  a.Vd = a.V;
  std::vector<int64_t> vocab;
  if (draft_vocab.has_value()) {
    a.Vd = draft_vocab->numel();
    MTP_CHECK(a.Vd >= 1, op, ": draft_vocab must hold at least one token id, got shape ", shape_of(*draft_vocab));
    vocab = checked_ids(op, "draft_vocab", *draft_vocab, a.Vd, "Vd (its length)", a.V, "V (embedding.size(0))");
  }
  // The LM head, read in place (the draft vocabulary's rows only), or those rows as the caller
  // gathered them once ([Vd, H], Vd < V).
  check_dim(op, "lm_head", lm_head, 2, draft_vocab.has_value() ? "[V, H] or [Vd, H]" : "[V, H]");
  a.lm_head_drafted = lm_head_drafted(draft_vocab.has_value(), a.Vd, a.V, lm_head.size(0));
  a.lm_head = matrix(op, lm_head, lm_head_scale, "lm_head", a.lm_head_drafted ? a.Vd : a.V,
                     a.lm_head_drafted         ? "Vd (draft_vocab.size(0))"
                     : draft_vocab.has_value() ? "V (embedding.size(0)) or Vd (draft_vocab.size(0))"
                                               : "V (embedding.size(0))",
                     a.H, "H (hidden.size(1))", "lm_head_scale", lm_head_type);
  check_ok(op, alternatives_error(alternatives, a.Vd, k));
  a.alternatives = alternatives;
  if (probs_out.has_value()) {  // [B, k] float32, any strides: copied in after the draft (no aliasing to check)
    check_cpu(op, "probs_out", *probs_out);
    check_dtype(op, "probs_out", *probs_out, {ScalarType::Float});
    check_dim(op, "probs_out", *probs_out, 2, "[B, k]");
    check_size(op, "probs_out", *probs_out, 0, a.B, "B (hidden.size(0))");
    check_size(op, "probs_out", *probs_out, 1, k, "k");
  }

  const Tensor hc = torch::stable::contiguous(hidden), cos = torch::stable::contiguous(rope_cos),
               sin = torch::stable::contiguous(rope_sin);
  Tensor drafts = empty_like_on(token, {a.B, k + alternatives}, ScalarType::Long);
  a.hidden = hc.data_ptr();
  a.token = tokens.data();
  a.rope_cos = cos.mutable_data_ptr<float>();
  a.rope_sin = sin.mutable_data_ptr<float>();
  a.k_cache = cache.k;
  a.v_cache = cache.v;
  std::copy_n(cache.k_stride, 4, a.k_stride);
  std::copy_n(cache.v_stride, 4, a.v_stride);
  a.cache_lens = lens.data();
  a.embed_norm = weights[0].data_ptr();
  a.hidden_norm = weights[1].data_ptr();
  a.block = blocks.data();
  a.out_norm = weights[n - 1].data_ptr();
  a.draft_vocab = vocab.empty() ? nullptr : vocab.data();
  a.eps = float(eps);
  a.drafts = drafts.mutable_data_ptr<int64_t>();
  std::vector<float> probs(probs_out.has_value() ? size_t(a.B * k) : 0);
  a.probs = probs.empty() ? nullptr : probs.data();
  head_draft(a, int(torch::stable::get_num_threads()), current_isa(), TorchParallelFor{});
  if (a.probs) {
    float* o = probs_out->mutable_data_ptr<float>();
    for (int64_t b = 0; b < a.B; ++b)
      for (int64_t j = 0; j < k; ++j) o[b * probs_out->stride(0) + j * probs_out->stride(1)] = probs[size_t(b * k + j)];
  }
  return drafts;
}

// Rows `tokens` (any shape) of weight [V, H] (float, Q8 int8 with weight_scale, or the bytes of
// a GGUF block type) -> [*tokens.shape, H] in dtype (default: a float weight's own, else fp32).
Tensor embedding_cpu(const Tensor& tokens, const Tensor& weight, const std::optional<Tensor>& weight_scale,
                     std::optional<int64_t> gguf_type, std::optional<ScalarType> dtype) {
  const char* op = kEmbedding;
  check_cpu(op, "tokens", tokens);
  check_cpu(op, "weight", weight);
  check_dim(op, "weight", weight, 2, gguf_type ? "[V, row bytes]" : "[V, H]");
  int64_t H = weight.size(1);
  if (gguf_type) {  // H from the row bytes; matrix() checks they are whole rows of that type
    check_ok(op, gguf_type_error(*gguf_type));
    DType t;
    gguf_dtype(*gguf_type, &t);
    MTP_CHECK(weight.size(1) % block_bytes(t) == 0, op, ": weight: rows of ", weight.size(1), " bytes are not whole ",
              block_type_name(t), " blocks (", block_bytes(t), " bytes per ", block_elems(t), " elements)");
    H = weight.size(1) / block_bytes(t) * block_elems(t);
  }
  EmbeddingArgs a;
  a.table =
      matrix(op, weight, weight_scale, "weight", weight.size(0), "V", H, "H", "weight_scale", gguf_type.value_or(-1));
  a.H = H;
  const bool float_weight = !gguf_type && weight.scalar_type() != ScalarType::Char;
  const ScalarType out_type = dtype.value_or(float_weight ? weight.scalar_type() : ScalarType::Float);
  MTP_CHECK(out_type == ScalarType::Float || out_type == ScalarType::BFloat16, op,
            ": dtype must be torch.float32 or torch.bfloat16, got ", out_type);
  a.n = tokens.numel();
  const std::vector<int64_t> ids = checked_ids(op, "tokens", torch::stable::reshape(tokens, {a.n}), a.n,
                                               "tokens.numel()", weight.size(0), "V (weight.size(0))");
  std::vector<int64_t> shape = sizes_vec(tokens);
  shape.push_back(H);
  Tensor out = empty_like_on(tokens, shape, out_type);
  a.ids = ids.data();
  a.dtype = to_dtype(out_type);
  a.out = out.data_ptr();
  a.out_stride = H;
  embedding(a);
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(mtp, CPU, m) {
  m.impl("decoder_layers", TORCH_BOX(&decoder_layers_cpu));
  m.impl("head_draft", TORCH_BOX(&head_draft_cpu));
  m.impl("embedding", TORCH_BOX(&embedding_cpu));
}

}  // namespace mtp::cpu
