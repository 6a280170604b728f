// A whole Llama-family decoder pass in one call, torch-free: every layer (RMSNorm, the fused
// q/k/v projection, RoPE, the cache append, attention over the cache, the output projection
// and residual add, the SiLU-gated MLP) and the final norm. It runs the same kernels in the
// same order as the op-by-op composition (mtp_kernels/models/llama.py: mtp.linear with its
// fp32 output rounded to the activation dtype, mtp.rope_, mtp.cache_append,
// mtp.head_attention, mtp.add_rms_norm, mtp.silu_mul), so it gives the same bits; what it
// saves is the ~11 dispatches per layer of a decode step, which cost as much as the
// arithmetic at a few rows.
#pragma once
#include <algorithm>
#include <vector>

#include "mtp/attention.h"
#include "mtp/cache.h"
#include "mtp/linear.h"
#include "mtp/op_args.h"
#include "mtp/rowwise.h"

namespace mtp {

// One weight matrix [N, K] as mtp.linear reads it: unit-stride rows, float or Q8 (int8 with
// fp32 scales [N, q8_blocks(K)]).
struct DecoderMatrix {
  const void* w = nullptr;
  DType dtype = DType::F32;
  int64_t stride = 0;
  const float* scale = nullptr;  // I8 only
  int64_t scale_stride = 0;
};

// One layer's weights; the norms are [H] vectors in the activation dtype.
struct DecoderLayer {
  const void* input_norm = nullptr;
  DecoderMatrix qkv;  // [(Hq + 2 Hkv) D, H]: the q heads, then k, then v
  DecoderMatrix o;    // [H, Hq D]
  const void* post_norm = nullptr;
  DecoderMatrix gate_up;  // [2I, H]: gate rows, then up rows
  DecoderMatrix down;     // [H, I]
};

struct DecoderArgs {
  int64_t B = 0, T = 0, H = 0, Hq = 0, Hkv = 0, D = 0, I = 0;
  int64_t layers = 0, L = 0, P = 0;  // L: cache capacity; P: rows of the RoPE tables
  DType dtype = DType::F32;          // activations, norms and caches: F32 or BF16 (not F16)
  const void* x = nullptr;           // [B, T, H] contiguous: the token embeddings
  const float* rope_cos = nullptr;   // [P, D] contiguous: the angles of position p in row p
  const float* rope_sin = nullptr;
  void* k_cache = nullptr;  // [layers, B, Hkv, L, D], element strides
  void* v_cache = nullptr;
  int64_t k_stride[5] = {0, 0, 0, 0, 0}, v_stride[5] = {0, 0, 0, 0, 0};
  // [B]: request b's tokens go to positions cache_lens[b] + t, which must be < min(L, P)
  // (the caller checks). Not advanced: the caller owns the lengths.
  const int64_t* cache_lens = nullptr;
  const DecoderLayer* layer = nullptr;  // [layers]
  const void* final_norm = nullptr;
  float eps = 0.f;
  bool quantize_x = false;  // Q8 weights: mtp.linear's quantize_x for every projection
  void* out = nullptr;      // [B, T, H] contiguous: the final normed hidden states
};

// out = the final norm of the last layer's residual stream. Writes the new keys/values into
// the caches. parallel_for runs the projections and the attention (see
// linear.h, attention.h); `threads` only shapes the attention's work split.
template <class ParallelFor>
void decoder(const DecoderArgs& a, int threads, Isa isa, ParallelFor&& pf) {
  const int64_t M = a.B * a.T, H = a.H, D = a.D, Hqd = a.Hq * D, W = (a.Hq + 2 * a.Hkv) * D, I = a.I;
  if (M == 0) return;
  const DType dt = a.dtype;
  const int64_t es = dtype_size(dt);
  // Activation buffers in dt (float storage: aligned for every dtype).
  auto buffer = [&](int64_t n) { return std::vector<float>(size_t((n * es + 3) / 4)); };
  std::vector<float> y(size_t(M * std::max({W, 2 * I, H})));  // fp32 projection outputs
  std::vector<float> resid[2] = {buffer(M * H), buffer(M * H)}, h = buffer(M * H), qkv = buffer(M * W),
                     att = buffer(M * Hqd), gate_up = buffer(M * 2 * I), act = buffer(M * I), proj = buffer(M * H);
  // RoPE angles of each new token's position, and the lengths once the tokens are in.
  std::vector<float> cos(size_t(M * D)), sin(size_t(M * D));
  std::vector<int64_t> new_lens(size_t(a.B));
  for (int64_t b = 0; b < a.B; ++b) {
    new_lens[b] = a.cache_lens[b] + a.T;
    for (int64_t t = 0; t < a.T; ++t) {
      std::copy_n(a.rope_cos + (a.cache_lens[b] + t) * D, D, cos.data() + (b * a.T + t) * D);
      std::copy_n(a.rope_sin + (a.cache_lens[b] + t) * D, D, sin.data() + (b * a.T + t) * D);
    }
  }

  // x [M, K] @ m.T -> out [M, N] in dt: mtp.linear's fp32 result rounded as torch's .to().
  auto project = [&](const DecoderMatrix& m, const void* x, int64_t K, int64_t N, void* out) {
    LinearArgs l;
    l.M = M; l.N = N; l.K = K;
    l.x = x; l.x_dtype = dt; l.x_stride = K;
    l.w = m.w; l.w_dtype = m.dtype; l.w_stride = m.stride;
    l.w_scale = m.scale; l.w_scale_stride = m.scale_stride;
    l.y = dt == DType::F32 ? static_cast<float*>(out) : y.data();
    l.y_stride = N;
    l.quantize_x = a.quantize_x && m.dtype == DType::I8;
    linear(l, isa, pf);
    if (dt == DType::BF16) {  // a plain loop of selects: it vectorises
      uint16_t* o = static_cast<uint16_t*>(out);
      for (int64_t i = 0; i < M * N; ++i) o[i] = f32_to_bf16(y[size_t(i)]);
    }
  };
  // out = RMSNorm(x (+ residual, the sum written to `sum`)) with weight w.
  auto norm = [&](const void* x, const void* residual, void* sum, const void* w, void* out) {
    RmsNormArgs n;
    n.M = M; n.H = H; n.dtype = dt;
    n.x = x; n.x_stride = H;
    n.residual = residual; n.residual_stride = H;
    n.sum = sum; n.sum_stride = H;
    n.out = out; n.out_stride = H;
    n.weight = w; n.w_dtype = dt;
    n.eps = a.eps;
    rms_norm(n, isa);
  };
  // The weight of the norm that follows layer i's MLP: the next layer's input norm.
  auto norm_after = [&](int64_t i) { return i + 1 < a.layers ? a.layer[i + 1].input_norm : a.final_norm; };
  // The q/k/v heads of token (b, t) sit in row b*T + t of qkv: [B, T, heads, D] strides.
  const int64_t head_strides[4] = {a.T * W, W, D, 1};
  char* const qkv_bytes = reinterpret_cast<char*>(qkv.data());

  const void* x = a.x;  // the residual stream; each add writes the buffer x is not in
  auto other = [&] { return static_cast<void*>(x == resid[0].data() ? resid[1].data() : resid[0].data()); };
  norm(x, nullptr, nullptr, a.layers > 0 ? a.layer[0].input_norm : a.final_norm, a.layers > 0 ? h.data() : a.out);
  for (int64_t i = 0; i < a.layers; ++i) {
    const DecoderLayer& w = a.layer[i];
    project(w.qkv, h.data(), H, W, qkv.data());

    RopeArgs r;  // the q and k heads, in place
    r.B = a.B; r.T = a.T; r.H = a.Hq + a.Hkv; r.D = D; r.dtype = dt;
    r.x = qkv.data();
    std::copy_n(head_strides, 4, r.x_stride);
    r.cos = cos.data(); r.sin = sin.data();
    r.cos_stride[0] = r.sin_stride[0] = a.T * D;
    r.cos_stride[1] = r.sin_stride[1] = D;
    r.cos_stride[2] = r.sin_stride[2] = 1;
    rope(r, isa);

    char* const k_layer = static_cast<char*>(a.k_cache) + i * a.k_stride[0] * es;
    char* const v_layer = static_cast<char*>(a.v_cache) + i * a.v_stride[0] * es;
    CacheAppendArgs c;
    c.B = a.B; c.T = a.T; c.Hkv = a.Hkv; c.D = D; c.L = a.L; c.dtype = dt;
    set_cache_views(c, static_cast<void*>(k_layer), a.k_stride + 1, static_cast<void*>(v_layer), a.v_stride + 1,
                    a.cache_lens);
    set_new_views(c, qkv_bytes + Hqd * es, head_strides, qkv_bytes + (Hqd + a.Hkv * D) * es, head_strides);
    cache_append(c, [](int64_t n, auto&& fn) { fn(int64_t(0), n); });  // a few rows: not worth a thread

    AttentionArgs at;
    at.B = a.B; at.T = a.T; at.Hq = a.Hq; at.Hkv = a.Hkv; at.D = D; at.dtype = dt;
    at.q = qkv.data();
    std::copy_n(head_strides, 4, at.q_stride);
    set_cache_views(at, static_cast<const void*>(k_layer), a.k_stride + 1, static_cast<const void*>(v_layer),
                    a.v_stride + 1, static_cast<const int64_t*>(new_lens.data()));
    at.scale = default_attention_scale(D);
    at.causal = true;
    at.out = att.data();
    attention(at, threads, isa, pf);

    project(w.o, att.data(), Hqd, H, proj.data());
    void* sum = other();
    norm(x, proj.data(), sum, w.post_norm, h.data());
    x = sum;
    project(w.gate_up, h.data(), H, 2 * I, gate_up.data());
    SiluMulArgs s;
    s.M = M; s.I = I; s.dtype = dt;
    s.x = gate_up.data(); s.x_stride = 2 * I;
    s.out = act.data(); s.out_stride = I;
    silu_mul(s, isa);
    project(w.down, act.data(), I, H, proj.data());
    sum = other();
    norm(x, proj.data(), sum, norm_after(i), i + 1 < a.layers ? h.data() : a.out);
    x = sum;
  }
}

}  // namespace mtp
