// CPU binding of mtp.decoder_layers: a whole Llama-family decoder pass in one call
// (mtp/decoder.h). Checks every tensor against the shapes the first layer's weights and the
// caches imply, then hands pointers and strides to the core.
#include <torch/library.h>

#include <string>

#include "checks.h"
#include "mtp/decoder.h"

namespace mtp::cpu {
namespace {

constexpr const char* kDecoder = "mtp.decoder_layers";
// weights holds, per layer, these tensors in this order, then the final norm.
constexpr const char* kParts[] = {"input_norm", "qkv", "o_proj", "post_norm", "gate_up", "down_proj"};
constexpr int64_t kPerLayer = 6;
// weight_scales holds, per layer, the scales of the four matrices (qkv, o_proj, gate_up, down_proj).
constexpr int64_t kMatricesPerLayer = 4;

std::string weight_name(int64_t index, int64_t layers) {
  if (index == kPerLayer * layers) return "weights[" + std::to_string(index) + "] (the final norm)";
  return "weights[" + std::to_string(index) + "] (layer " + std::to_string(index / kPerLayer) + "'s " +
         kParts[index % kPerLayer] + ")";
}

void check_norm(const at::Tensor& w, const std::string& name, int64_t H, const at::Tensor& x) {
  check_cpu(kDecoder, name.c_str(), w);
  check_same_dtype(kDecoder, name.c_str(), w, "x", x);
  check_dim(kDecoder, name.c_str(), w, 1, "[H]");
  check_size(kDecoder, name.c_str(), w, 0, H, "H (x.size(2))");
}

// A matrix [N, K] (with its Q8 scales [N, ceil(K/32)] when int8), read in place like
// mtp.linear's weight.
DecoderMatrix matrix(const at::Tensor& w, const c10::optional<at::Tensor>& scale, const std::string& name, int64_t N,
                     const char* n_what, int64_t K, const char* k_what) {
  const char* nm = name.c_str();
  check_cpu(kDecoder, nm, w);
  check_dtype(kDecoder, nm, w, {at::kFloat, at::kBFloat16, at::kChar});
  check_dim(kDecoder, nm, w, 2, "[N, K]");
  check_size(kDecoder, nm, w, 0, N, n_what);
  check_size(kDecoder, nm, w, 1, K, k_what);
  const std::string rows = weight_rows_error(K, w.stride(0), w.stride(1));
  TORCH_CHECK(rows.empty(), kDecoder, ": ", name, ": ", rows);
  const bool int8 = w.scalar_type() == at::kChar;
  TORCH_CHECK(int8 == scale.has_value(), kDecoder, ": ", name, " is ", w.scalar_type(),
              int8 ? " but weight_scales is empty: int8 (Q8) weights need their scales"
                   : " but weight_scales is not empty: scales go with int8 (Q8) weights only, all matrices or none");
  DecoderMatrix m;
  m.w = w.data_ptr();
  m.dtype = int8 ? DType::I8 : to_dtype(w.scalar_type());
  m.stride = w.stride(0);
  if (int8) {
    const std::string sn = name + "'s scales";
    const char* snm = sn.c_str();
    const at::Tensor& s = *scale;
    check_cpu(kDecoder, snm, s);
    check_dtype(kDecoder, snm, s, {at::kFloat});
    check_dim(kDecoder, snm, s, 2, kWeightScaleShape);
    check_size(kDecoder, snm, s, 0, N, n_what);
    check_size(kDecoder, snm, s, 1, q8_blocks(K), kWeightScaleBlocks);
    const std::string srows = weight_scale_rows_error(q8_blocks(K), s.stride(0), s.stride(1));
    TORCH_CHECK(srows.empty(), kDecoder, ": ", sn, ": ", srows);
    m.scale = s.data_ptr<float>();
    m.scale_stride = s.stride(0);
  }
  return m;
}

at::Tensor decoder_layers_cpu(const at::Tensor& x, const at::Tensor& k_cache, const at::Tensor& v_cache,
                              const at::Tensor& cache_lens, const at::Tensor& rope_cos, const at::Tensor& rope_sin,
                              at::TensorList weights, at::TensorList weight_scales, int64_t num_heads, double eps,
                              bool quantize_x) {
  check_cpu(kDecoder, "x", x);
  check_dtype(kDecoder, "x", x, {at::kFloat, at::kBFloat16});
  check_dim(kDecoder, "x", x, 3, "[B, T, H]");
  for (auto [name, c] : {std::pair<const char*, const at::Tensor*>{"k_cache", &k_cache}, {"v_cache", &v_cache}}) {
    check_cpu(kDecoder, name, *c);
    check_same_dtype(kDecoder, name, *c, "x", x);
    check_dim(kDecoder, name, *c, 5, "[layers, B, Hkv, L, D]");
  }
  TORCH_CHECK(v_cache.sizes() == k_cache.sizes(), kDecoder, ": v_cache must have k_cache's shape ", k_cache.sizes(),
              ", got ", v_cache.sizes());
  DecoderArgs a;
  a.B = x.size(0); a.T = x.size(1); a.H = x.size(2);
  a.layers = k_cache.size(0); a.Hkv = k_cache.size(2); a.L = k_cache.size(3); a.D = k_cache.size(4);
  a.Hq = num_heads;
  a.dtype = to_dtype(x.scalar_type());
  check_size(kDecoder, "k_cache", k_cache, 1, a.B, "B (x.size(0))");
  TORCH_CHECK(num_heads >= 1, kDecoder, ": num_heads must be >= 1, got ", num_heads);
  check_ok(kDecoder, gqa_error(a.Hq, a.Hkv));
  TORCH_CHECK(a.D % 2 == 0, kDecoder, ": the head dim D (k_cache.size(4)) must be even (RoPE rotates two halves), got ",
              a.D);
  TORCH_CHECK(std::isfinite(eps) && eps >= 0, kDecoder, ": eps must be a finite number >= 0, got ", eps);
  for (auto [name, t] : {std::pair<const char*, const at::Tensor*>{"rope_cos", &rope_cos}, {"rope_sin", &rope_sin}}) {
    check_cpu(kDecoder, name, *t);
    check_dtype(kDecoder, name, *t, {at::kFloat});
    check_dim(kDecoder, name, *t, 2, "[P, D]");
    check_size(kDecoder, name, *t, 1, a.D, "D (k_cache.size(4))");
  }
  TORCH_CHECK(rope_sin.size(0) == rope_cos.size(0), kDecoder, ": rope_sin must have rope_cos's shape ",
              rope_cos.sizes(), ", got ", rope_sin.sizes());
  a.P = rope_cos.size(0);
  const std::vector<int64_t> lens =
      checked_counts(kDecoder, "cache_lens", cache_lens, a.B, "B (x.size(0))", a.L, "L (k_cache.size(3))");
  for (int64_t b = 0; b < a.B; ++b) {
    TORCH_CHECK(lens[b] + a.T <= a.L, kDecoder, ": request ", b, " would pass the cache capacity: cache_lens[", b,
                "] + T = ", lens[b], " + ", a.T, " > L = ", a.L, " (k_cache.size(3)); nothing was written");
    TORCH_CHECK(lens[b] + a.T <= a.P, kDecoder, ": request ", b, " would pass the RoPE tables: cache_lens[", b,
                "] + T = ", lens[b], " + ", a.T, " > P = ", a.P, " (rope_cos.size(0)) positions");
  }

  const int64_t want = kPerLayer * a.layers + 1;
  TORCH_CHECK(int64_t(weights.size()) == want, kDecoder, ": weights must hold ", kPerLayer,
              " tensors per layer (input_norm, qkv, o_proj, post_norm, gate_up, down_proj) for the ", a.layers,
              " layers of k_cache, then the final norm: ", want, " tensors, got ", weights.size());
  const bool q8 = !weight_scales.empty();
  TORCH_CHECK(!q8 || int64_t(weight_scales.size()) == kMatricesPerLayer * a.layers, kDecoder,
              ": weight_scales must be empty (float weights) or hold the Q8 scales of the ", kMatricesPerLayer,
              " matrices of each layer (qkv, o_proj, gate_up, down_proj): ", kMatricesPerLayer * a.layers,
              " tensors, got ", weight_scales.size());
  TORCH_CHECK(!quantize_x || q8, kDecoder,
              ": quantize_x=True needs int8 weights with their scales (mtp_kernels.quantize_q8), got float weights");
  // The MLP width comes from the first gate_up: [2I, H].
  if (a.layers > 0) {
    const at::Tensor& gu = weights[4];
    check_dim(kDecoder, weight_name(4, a.layers).c_str(), gu, 2, "[2I, H]");
    TORCH_CHECK(gu.size(0) % 2 == 0, kDecoder, ": ", weight_name(4, a.layers), ".size(0) must be even [2I, H], got ",
                gu.size(0));
    a.I = gu.size(0) / 2;
  }
  const at::Tensor xc = x.contiguous();
  std::vector<DecoderLayer> layers(size_t(a.layers));
  for (int64_t i = 0; i < a.layers; ++i) {
    const int64_t w0 = kPerLayer * i, s0 = kMatricesPerLayer * i;
    auto scale = [&](int64_t j) { return q8 ? c10::optional<at::Tensor>(weight_scales[s0 + j]) : c10::nullopt; };
    auto name = [&](int64_t j) { return weight_name(w0 + j, a.layers); };
    check_norm(weights[w0], name(0), a.H, x);
    check_norm(weights[w0 + 3], name(3), a.H, x);
    DecoderLayer& l = layers[size_t(i)];
    l.input_norm = weights[w0].data_ptr();
    l.post_norm = weights[w0 + 3].data_ptr();
    l.qkv = matrix(weights[w0 + 1], scale(0), name(1), (a.Hq + 2 * a.Hkv) * a.D, "(Hq + 2 Hkv) D", a.H, "H");
    l.o = matrix(weights[w0 + 2], scale(1), name(2), a.H, "H", a.Hq * a.D, "Hq D");
    l.gate_up = matrix(weights[w0 + 4], scale(2), name(4), 2 * a.I, "2I", a.H, "H");
    l.down = matrix(weights[w0 + 5], scale(3), name(5), a.H, "H", a.I, "I");
  }
  const at::Tensor& final_norm = weights[want - 1];
  check_norm(final_norm, weight_name(want - 1, a.layers), a.H, x);

  const at::Tensor cos = rope_cos.contiguous(), sin = rope_sin.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options());
  a.x = xc.data_ptr();
  a.rope_cos = cos.data_ptr<float>();
  a.rope_sin = sin.data_ptr<float>();
  a.k_cache = k_cache.data_ptr();
  a.v_cache = v_cache.data_ptr();
  for (int d = 0; d < 5; ++d) {
    a.k_stride[d] = k_cache.stride(d);
    a.v_stride[d] = v_cache.stride(d);
  }
  a.cache_lens = lens.data();
  a.layer = layers.data();
  a.final_norm = final_norm.data_ptr();
  a.eps = float(eps);
  a.quantize_x = quantize_x;
  a.out = out.data_ptr();
  decoder(a, at::get_num_threads(), current_isa(), TorchParallelFor{});
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(mtp, CPU, m) { m.impl("decoder_layers", &decoder_layers_cpu); }

}  // namespace mtp::cpu
