// A whole Llama-family (or Gemma 3) decoder pass in one call, torch-free: every layer (RMSNorm,
// the fused q/k/v projection, RoPE, the cache append, attention over the cache, the output
// projection and residual add, the SiLU-gated MLP; Gemma 3 adds per-head q/k norms, a sliding
// window, norms of the attention and MLP outputs and the GELU-tanh-gated MLP) and the final norm. It runs the same
// kernels in the same order as the op-by-op composition (reference.decoder_layers with ops.KERNELS: mtp.linear with its
// fp32 output rounded to the activation dtype, mtp.rope_, mtp.cache_append, mtp.head_attention, mtp.add_rms_norm,
// mtp.silu_mul), so it gives the same bits; what it saves is the ~11 dispatches per layer of a decode step, which cost
// as much as the arithmetic at a few rows.
#pragma once
#include <algorithm>
#include <type_traits>
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

// The layer of a pass (DecoderArgs::kind).
enum class LayerKind {
  Llama,  // x += o_proj(attention); x += down(silu(gate) * up), each add fused with the next norm
  // Gemma 3: q/k heads RMS-normed per head before RoPE; the attention with the layer's window
  // and RoPE tables; x += post_attention_norm(o_proj(..)); x += post_feedforward_norm(down(
  // gelu_tanh(gate) * up)); post_norm is the pre-feedforward norm.
  Gemma3,
};

// One layer's weights; the norms are [H] vectors in the activation dtype.
struct DecoderLayer {
  const void* input_norm = nullptr;
  DecoderMatrix qkv;                // [(Hq + 2 Hkv) D, H]: the q heads, then k, then v
  DecoderMatrix o;                  // [H, Hq D]
  const void* post_norm = nullptr;  // Gemma 3: pre_feedforward_norm
  DecoderMatrix gate_up;            // [2I, H]: gate rows, then up rows
  DecoderMatrix down;               // [H, I]
  // LayerKind::Gemma3 only: the per-head norms [D], the norms of the attention's and the MLP's
  // outputs [H], and the sliding window (0: global; > 0: the local RoPE tables).
  const void* q_norm = nullptr;
  const void* k_norm = nullptr;
  const void* post_attention_norm = nullptr;
  const void* post_feedforward_norm = nullptr;
  int64_t window = 0;
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
  // [B, T] or nullptr (a chain): each request's tokens as a tree (AttentionArgs::parents);
  // token t sits at position cache_lens[b] + its depth and is stored at cache_lens[b] + t.
  const int64_t* tree_parents = nullptr;
  const DecoderLayer* layer = nullptr;  // [layers]
  const void* final_norm = nullptr;
  float eps = 0.f;
  bool quantize_x = false;  // Q8 weights: mtp.linear's quantize_x for every projection
  void* out = nullptr;      // [B, T, H] contiguous: the final normed hidden states
  LayerKind kind = LayerKind::Llama;
  // Gemma 3: [P_local, D] tables of the layers with a window (nullptr when none has one).
  int64_t P_local = 0;
  const float* rope_cos_local = nullptr;
  const float* rope_sin_local = nullptr;
  bool has_scale = false;  // false: the attention scale is default_attention_scale(D)
  float scale = 1.f;
  // Taps: after layer taps[j] (strictly increasing, each < layers; the caller checks), the
  // residual stream [B, T, H] (the sum after its MLP add, before the next norm) is copied to
  // tap_out + j B T H elements (contiguous [n_taps, B, T, H] in dtype). n_taps = 0: none.
  const int64_t* taps = nullptr;
  int64_t n_taps = 0;
  void* tap_out = nullptr;
};

// The buffers and steps of M rows (B requests x T tokens) through decoder layers, shared by
// the backbone's pass (decoder_layers) and the MTP head's draft steps (head_draft.h).
template <class ParallelFor>
struct LayerPass {
  int64_t M, T, H, Hq, Hkv, D, I;
  DType dt;
  float eps;
  bool quantize_x;
  Isa isa;
  ParallelFor& pf;
  std::vector<float> y, resid[2], h, qkv, att, gate_up, act, proj;  // activations in dt (float storage: aligned)
  std::vector<float> qkv_normed, normed;                            // Gemma 3 only (sized on first use)
  const void* x = nullptr;  // the residual stream: the input, then resid[0] or resid[1]

  LayerPass(int64_t M_, int64_t T_, int64_t H_, int64_t Hq_, int64_t Hkv_, int64_t D_, int64_t I_, DType dt_,
            float eps_, bool quantize_x_, Isa isa_, ParallelFor& pf_)
      : M(M_),
        T(T_),
        H(H_),
        Hq(Hq_),
        Hkv(Hkv_),
        D(D_),
        I(I_),
        dt(dt_),
        eps(eps_),
        quantize_x(quantize_x_),
        isa(isa_),
        pf(pf_),
        y(size_t(M * std::max({width(), 2 * I, H}))),
        resid{buffer(M * H), buffer(M * H)},
        h(buffer(M * H)),
        qkv(buffer(M * width())),
        att(buffer(M * Hq * D)),
        gate_up(buffer(M * 2 * I)),
        act(buffer(M * I)),
        proj(buffer(M * H)) {}

  int64_t width() const { return (Hq + 2 * Hkv) * D; }  // of a qkv row
  std::vector<float> buffer(int64_t n) const { return std::vector<float>(size_t((n * dtype_size(dt) + 3) / 4)); }
  // The q/k/v heads of token (b, t) sit in row b*T + t of qkv: [B, T, heads, D] strides.
  void head_strides(int64_t* s) const {
    s[0] = T * width();
    s[1] = width();
    s[2] = D;
    s[3] = 1;
  }
  const char* head_bytes(int64_t first_head) const {
    return reinterpret_cast<const char*>(qkv.data()) + first_head * D * dtype_size(dt);
  }

  // x [M, K] @ m.T -> out [M, N] in dt: mtp.linear's fp32 result rounded as torch's .to().
  // rows: [N] rows of m read in place (LinearArgs::w_rows), or nullptr: rows 0..N-1.
  void project(const DecoderMatrix& m, const void* in, int64_t K, int64_t N, void* out, const int64_t* rows = nullptr) {
    LinearArgs l;
    l.M = M;
    l.N = N;
    l.K = K;
    l.x = in;
    l.x_dtype = dt;
    l.x_stride = K;
    l.w = m.w;
    l.w_dtype = m.dtype;
    l.w_stride = m.stride;
    l.w_scale = m.scale;
    l.w_scale_stride = m.scale_stride;
    l.w_rows = rows;
    if (dt != DType::F32 && y.size() < size_t(M * N))
      y.resize(size_t(M * N));  // a wide LM head (the head's full vocabulary)
    l.y = dt == DType::F32 ? static_cast<float*>(out) : y.data();
    l.y_stride = N;
    l.quantize_x = quantize_x && m.dtype == DType::I8;
    if (dt == DType::F32)
      linear(l, isa, pf);
    else
      linear_to_bf16(l, static_cast<uint16_t*>(out), N, isa, pf);
  }
  // fn(r0, r1) over the M rows of a row-local step (linear.h: split_rows).
  template <class Fn>
  void split_rows(Fn&& fn) const {
    mtp::split_rows(M, pf, fn);
  }
  // p advanced by r rows of `stride` elements of dt.
  template <class P>
  P* row(P* p, int64_t r, int64_t stride) const {
    using Byte = std::conditional_t<std::is_const_v<P>, const char, char>;
    return p ? reinterpret_cast<P*>(reinterpret_cast<Byte*>(p) + r * stride * dtype_size(dt)) : p;
  }
  // out = RMSNorm(in (+ residual, the sum written to `sum`)) with weight w; out's rows
  // out_stride apart (default H).
  void norm(const void* in, const void* residual, void* sum, const void* w, void* out, int64_t out_stride = 0) const {
    const int64_t os = out_stride ? out_stride : H;
    split_rows([&](int64_t r0, int64_t r1) {
      RmsNormArgs n;
      n.M = r1 - r0;
      n.H = H;
      n.dtype = dt;
      n.x = row(in, r0, H);
      n.x_stride = H;
      n.residual = row(residual, r0, H);
      n.residual_stride = H;
      n.sum = row(sum, r0, H);
      n.sum_stride = H;
      n.out = row(out, r0, os);
      n.out_stride = os;
      n.weight = w;
      n.w_dtype = dt;
      n.eps = eps;
      rms_norm(n, isa);
    });
  }
  // x += residual, and out = its norm with weight w (each add writes the buffer x is not in).
  void add_norm(const void* residual, const void* w, void* out) {
    void* sum = x == resid[0].data() ? resid[1].data() : resid[0].data();
    norm(x, residual, sum, w, out);
    x = sum;
  }

  // RoPE of the q and k heads in qkv (angles cos/sin [M, D]).
  void rope_heads(const float* cos, const float* sin) {
    split_rows([&](int64_t r0, int64_t r1) {  // rows r0..r1 as requests of one token: row m = b*T + t
      RopeArgs r;
      r.B = r1 - r0;
      r.T = 1;
      r.H = Hq + Hkv;
      r.D = D;
      r.dtype = dt;
      r.x = row(static_cast<void*>(qkv.data()), r0, width());
      r.x_stride[0] = r.x_stride[1] = width();
      r.x_stride[2] = D;
      r.x_stride[3] = 1;
      r.cos = cos + r0 * D;
      r.sin = sin + r0 * D;
      r.cos_stride[0] = r.sin_stride[0] = r.cos_stride[1] = r.sin_stride[1] = D;
      r.cos_stride[2] = r.sin_stride[2] = 1;
      rope(r, isa);
    });
  }
  // act = act(gate) * up of gate_up, rowwise.
  void gated(GatedAct kind) {
    split_rows([&](int64_t r0, int64_t r1) {
      GatedMulArgs s;
      s.act = kind;
      s.M = r1 - r0;
      s.I = I;
      s.dtype = dt;
      s.x = row(static_cast<const void*>(gate_up.data()), r0, 2 * I);
      s.x_stride = 2 * I;
      s.out = row(static_cast<void*>(act.data()), r0, I);
      s.out_stride = I;
      gated_mul(s, isa);
    });
  }

  // One layer on the residual stream x, whose input norm is in h: the qkv projection, RoPE
  // of the q and k heads (angles cos/sin [M, D]), attend() (reads the heads in qkv, writes
  // att [M, Hq D]), the output projection, the MLP. Leaves next_norm(x) in `out`.
  template <class Attend>
  void layer(const DecoderLayer& w, const float* cos, const float* sin, Attend&& attend, const void* next_norm,
             void* out) {
    project(w.qkv, h.data(), H, width(), qkv.data());
    rope_heads(cos, sin);
    attend();
    project(w.o, att.data(), Hq * D, H, proj.data());
    add_norm(proj.data(), w.post_norm, h.data());
    project(w.gate_up, h.data(), H, 2 * I, gate_up.data());
    gated(GatedAct::Silu);
    project(w.down, act.data(), I, H, proj.data());
    add_norm(proj.data(), next_norm, out);
  }

  // Gemma 3's layer (LayerKind::Gemma3) on the residual stream x, whose input norm is in h, as
  // the op-by-op path runs it: the qkv projection, RMS norms of each q head (q_norm [D]) and k
  // head (k_norm [D]) into a copy of qkv (v copied as is), RoPE of the q and k heads, attend(),
  // the output projection and its norm, x += that (add_norm with the pre-feedforward norm),
  // the GELU-tanh-gated MLP, its norm, x += that. Leaves next_norm(x) in `out`.
  template <class Attend>
  void gemma3_layer(const DecoderLayer& w, const float* cos, const float* sin, Attend&& attend, const void* next_norm,
                    void* out) {
    if (qkv_normed.size() != qkv.size()) qkv_normed.resize(qkv.size());
    if (normed.empty()) normed = buffer(M * H);
    project(w.qkv, h.data(), H, width(), qkv.data());
    const int64_t es = dtype_size(dt);
    split_rows([&](int64_t r0, int64_t r1) {
      for (int64_t m = r0; m < r1; ++m) {
        const char* in = reinterpret_cast<const char*>(qkv.data()) + m * width() * es;
        char* to = reinterpret_cast<char*>(qkv_normed.data()) + m * width() * es;
        for (int part = 0; part < 2; ++part) {  // the q heads, then the k heads
          RmsNormArgs n;
          n.M = part == 0 ? Hq : Hkv;
          n.H = D;
          n.dtype = dt;
          const int64_t first = part == 0 ? 0 : Hq;
          n.x = in + first * D * es;
          n.x_stride = D;
          n.out = to + first * D * es;
          n.out_stride = D;
          n.weight = part == 0 ? w.q_norm : w.k_norm;
          n.w_dtype = dt;
          n.eps = eps;
          rms_norm(n, isa);
        }
        std::copy_n(in + (Hq + Hkv) * D * es, Hkv * D * es, to + (Hq + Hkv) * D * es);  // v as projected
      }
    });
    qkv.swap(qkv_normed);
    rope_heads(cos, sin);
    attend();
    project(w.o, att.data(), Hq * D, H, proj.data());
    norm(proj.data(), nullptr, nullptr, w.post_attention_norm, normed.data());
    add_norm(normed.data(), w.post_norm, h.data());
    project(w.gate_up, h.data(), H, 2 * I, gate_up.data());
    gated(GatedAct::GeluTanh);
    project(w.down, act.data(), I, H, proj.data());
    norm(proj.data(), nullptr, nullptr, w.post_feedforward_norm, normed.data());
    add_norm(normed.data(), next_norm, out);
  }

  // Writes the k and v heads of qkv into a cache [B, Hkv, L, D] view at positions lens[b] + t
  // (on this thread: a few rows are not worth a parallel region).
  void append_heads(void* k, const int64_t* k_stride, void* v, const int64_t* v_stride, int64_t L,
                    const int64_t* lens) const {
    CacheAppendArgs c;
    c.B = M / T;
    c.T = T;
    c.Hkv = Hkv;
    c.D = D;
    c.L = L;
    c.dtype = dt;
    set_cache_views(c, k, k_stride, v, v_stride, lens);
    int64_t heads[4];
    head_strides(heads);
    set_new_views(c, head_bytes(Hq), heads, head_bytes(Hq + Hkv), heads);
    cache_append(c, [](int64_t n, auto&& fn) { fn(int64_t(0), n); });
  }

  // The attention arguments of the q heads in qkv over a cache layer [B, Hkv, L, D] view.
  AttentionArgs attention_args(const void* k, const int64_t* k_stride, const void* v, const int64_t* v_stride,
                               const int64_t* lens) {
    AttentionArgs at;
    at.B = M / T;
    at.T = T;
    at.Hq = Hq;
    at.Hkv = Hkv;
    at.D = D;
    at.dtype = dt;
    at.q = qkv.data();
    head_strides(at.q_stride);
    set_cache_views(at, k, k_stride, v, v_stride, lens);
    at.scale = default_attention_scale(D);
    at.out = att.data();
    return at;
  }
};

// The RoPE angles [B*T, D] of positions lens[b] + offset + t (with depth [B*T]: lens[b] +
// offset + depth[b*T + t]), rows of the tables [P, D].
inline void gather_angles(const float* table, const int64_t* lens, int64_t offset, int64_t B, int64_t T, int64_t D,
                          float* out, const int64_t* depth = nullptr) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      std::copy_n(table + (lens[b] + offset + (depth ? depth[b * T + t] : t)) * D, D, out + (b * T + t) * D);
}

// out = the final norm of the last layer's residual stream; tap_out[j] the residual stream
// after layer taps[j]. Writes the new keys/values into the caches. parallel_for runs the
// projections and the attention (see linear.h, attention.h); `threads` only shapes the
// attention's work split.
template <class ParallelFor>
void decoder_layers(const DecoderArgs& a, int threads, Isa isa, ParallelFor&& pf) {
  const int64_t M = a.B * a.T, D = a.D;
  if (M == 0) return;
  LayerPass<ParallelFor> p(M, a.T, a.H, a.Hq, a.Hkv, D, a.I, a.dtype, a.eps, a.quantize_x, isa, pf);
  const int64_t es = dtype_size(a.dtype);
  std::vector<float> cos(size_t(M * D)), sin(size_t(M * D));
  const std::vector<int64_t> depth =
      a.tree_parents ? TreePaths(a.tree_parents, a.B, a.T).depth : std::vector<int64_t>();
  gather_angles(a.rope_cos, a.cache_lens, 0, a.B, a.T, D, cos.data(), a.tree_parents ? depth.data() : nullptr);
  gather_angles(a.rope_sin, a.cache_lens, 0, a.B, a.T, D, sin.data(), a.tree_parents ? depth.data() : nullptr);
  std::vector<float> cos_local, sin_local;  // Gemma 3's layers with a window
  if (a.rope_cos_local) {
    cos_local.resize(size_t(M * D));
    sin_local.resize(size_t(M * D));
    gather_angles(a.rope_cos_local, a.cache_lens, 0, a.B, a.T, D, cos_local.data(),
                  a.tree_parents ? depth.data() : nullptr);
    gather_angles(a.rope_sin_local, a.cache_lens, 0, a.B, a.T, D, sin_local.data(),
                  a.tree_parents ? depth.data() : nullptr);
  }
  std::vector<int64_t> new_lens(size_t(a.B));  // the lengths once the tokens are in
  for (int64_t b = 0; b < a.B; ++b) new_lens[b] = a.cache_lens[b] + a.T;
  p.x = a.x;
  int64_t tap = 0;  // the next of a.taps
  p.norm(a.x, nullptr, nullptr, a.layers > 0 ? a.layer[0].input_norm : a.final_norm, a.layers > 0 ? p.h.data() : a.out);
  for (int64_t i = 0; i < a.layers; ++i) {
    char* const k_layer = static_cast<char*>(a.k_cache) + i * a.k_stride[0] * es;
    char* const v_layer = static_cast<char*>(a.v_cache) + i * a.v_stride[0] * es;
    const DecoderLayer& w = a.layer[i];
    auto attend = [&] {  // append the new keys/values, then attend causally over the cache
      p.append_heads(k_layer, a.k_stride + 1, v_layer, a.v_stride + 1, a.L, a.cache_lens);
      AttentionArgs at = p.attention_args(k_layer, a.k_stride + 1, v_layer, a.v_stride + 1, new_lens.data());
      at.causal = true;
      at.parents = a.tree_parents;
      if (a.kind == LayerKind::Gemma3) {
        at.window = w.window;
        if (a.has_scale) at.scale = a.scale;
      }
      attention(at, threads, isa, pf);
    };
    const bool last = i + 1 == a.layers;
    const void* next = last ? a.final_norm : a.layer[i + 1].input_norm;
    void* out = last ? a.out : p.h.data();
    if (a.kind == LayerKind::Gemma3) {
      const bool local = w.window > 0;
      p.gemma3_layer(w, local ? cos_local.data() : cos.data(), local ? sin_local.data() : sin.data(), attend, next,
                     out);
    } else {
      p.layer(w, cos.data(), sin.data(), attend, next, out);
    }
    if (tap < a.n_taps && a.taps[tap] == i) {  // p.x: the residual stream after layer i (add_norm's sum)
      const int64_t bytes = M * a.H * es;
      std::copy_n(static_cast<const char*>(p.x), bytes, static_cast<char*>(a.tap_out) + tap * bytes);
      ++tap;
    }
  }
}

}  // namespace mtp
