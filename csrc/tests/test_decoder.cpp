// The whole-pass cores (mtp/decoder_layers.h, mtp/head_draft.h), called directly on a tiny random
// model on the selected instruction set: a pass over T tokens gives each token the bits of T
// one-token passes (outputs and cache entries), a request's bits do not depend on the other
// requests of the batch, the thread count changes nothing, and the head's drafts of a batch
// are each request's own; mtp_embedding gives a float or Q8 table's rows, each rounded once.
// The bitwise comparison with the op-by-op composition is in python_tests/test_decoder.py; this
// runs the same code natively, under the sanitizers and on aarch64 under qemu.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "mtp/head_draft.h"
#include "mtp/mtp.h"
#include "mtp/parallel.h"
#include "test_util.h"

namespace {

using mtp::DType;

constexpr int64_t kH = 64, kHq = 4, kHkv = 2, kD = 16, kI = 96, kLayers = 2, kV = 50, kL = 24, kP = 32;

// Bytes holding n values of t, from exactly representable random values of scale s.
std::vector<char> values(DType t, int64_t n, float s, float offset = 0.f) {
  std::vector<char> out(size_t(n * mtp::dtype_size(t)));
  for (int64_t i = 0; i < n; ++i)
    mtp::store_f32(out.data(), t, i, offset + s * std::ldexp(float(int64_t(rng() >> 44) - (1 << 19)), -19));
  return out;
}

// A matrix [N, K]: float in t, or Q8 (int8 + one scale per 32).
struct Matrix {
  std::vector<char> w;
  std::vector<float> scale;
  mtp::DecoderMatrix m;
  Matrix(int64_t N, int64_t K, DType t, bool q8) {
    const float s = 1.f / std::sqrt(float(K));
    if (q8) {
      w.resize(size_t(N * K));
      for (auto& q : w) q = char(int64_t(rng() % 255) - 127);
      scale.assign(size_t(N * mtp::q8_blocks(K)), s / 127.f);
      m = {w.data(), DType::I8, K, scale.data(), mtp::q8_blocks(K)};
    } else {
      w = values(t, N * K, s);
      m = {w.data(), t, K, nullptr, 0};
    }
  }
};

struct Layer {
  std::vector<char> input_norm, post_norm;
  Matrix qkv, o, gate_up, down;
  Layer(DType t, bool q8)
      : input_norm(values(t, kH, 0.25f, 1.f)),
        post_norm(values(t, kH, 0.25f, 1.f)),
        qkv((kHq + 2 * kHkv) * kD, kH, t, q8),
        o(kH, kHq * kD, t, q8),
        gate_up(2 * kI, kH, t, q8),
        down(kH, kI, t, q8) {}
  mtp::DecoderLayer view() const { return {input_norm.data(), qkv.m, o.m, post_norm.data(), gate_up.m, down.m}; }
};

struct Model {
  DType t;
  bool quantize_x;
  std::vector<Layer> layers;
  std::vector<mtp::DecoderLayer> views;
  std::vector<char> final_norm;
  std::vector<float> cos, sin;
  Model(DType t_, bool q8, bool quantize_x_) : t(t_), quantize_x(quantize_x_), final_norm(values(t_, kH, 0.25f, 1.f)) {
    for (int64_t i = 0; i < kLayers; ++i) layers.emplace_back(t, q8);
    for (auto& l : layers) views.push_back(l.view());
    for (int64_t p = 0; p < kP; ++p)
      for (int64_t d = 0; d < kD; ++d) {
        const double a = p * std::pow(10000.0, -double(2 * (d % (kD / 2))) / double(kD));
        cos.push_back(float(std::cos(a)));
        sin.push_back(float(std::sin(a)));
      }
  }
};

// Caches [layers, B, Hkv, L, D] and their lengths.
struct Cache {
  std::vector<char> k, v;
  std::vector<int64_t> lens;
  Cache(DType t, int64_t B, std::vector<int64_t> l)
      : k(size_t(kLayers * B * kHkv * kL * kD * mtp::dtype_size(t))), v(k.size()), lens(std::move(l)) {}
  int64_t B() const { return int64_t(lens.size()); }
};

// One pass of T tokens (x: [B, T, H] in the model's dtype) of model m (Model or Gemma3Model)
// with `threads`, its other arguments set by more(args); returns the output and advances the
// lengths.
template <class M, class More>
std::vector<char> run_pass(const M& m, Cache& c, const std::vector<char>& x, int64_t T, int threads, float eps,
                           More&& more) {
  mtp::DecoderArgs a;
  a.B = c.B();
  a.T = T;
  a.H = kH;
  a.Hq = kHq;
  a.Hkv = kHkv;
  a.D = kD;
  a.I = kI;
  a.layers = kLayers;
  a.L = kL;
  a.P = kP;
  a.dtype = m.t;
  a.x = x.data();
  a.rope_cos = m.cos.data();
  a.rope_sin = m.sin.data();
  a.k_cache = c.k.data();
  a.v_cache = c.v.data();
  const int64_t strides[5] = {c.B() * kHkv * kL * kD, kHkv * kL * kD, kL * kD, kD, 1};
  std::copy_n(strides, 5, a.k_stride);
  std::copy_n(strides, 5, a.v_stride);
  a.cache_lens = c.lens.data();
  a.layer = m.views.data();
  a.final_norm = m.final_norm.data();
  a.eps = eps;
  a.quantize_x = m.quantize_x;
  more(a);
  std::vector<char> out(x.size());
  a.out = out.data();
  mtp::decoder_layers(a, threads, mtp::current_isa(), mtp::ThreadParallelFor{threads});
  for (auto& n : c.lens) n += T;
  return out;
}

// A Llama pass (a tree with parents [B, T]).
std::vector<char> pass(const Model& m, Cache& c, const std::vector<char>& x, int64_t T, int threads,
                       const int64_t* parents = nullptr) {
  return run_pass(m, c, x, T, threads, 1e-5f, [&](mtp::DecoderArgs& a) { a.tree_parents = parents; });
}

// Rows [t0, t1) of request b of x [B, T, H] as a [1, t1 - t0, H] input.
std::vector<char> rows(const std::vector<char>& x, DType t, int64_t T, int64_t b, int64_t t0, int64_t t1) {
  const size_t row = size_t(kH * mtp::dtype_size(t));
  return std::vector<char>(x.begin() + long((b * T + t0) * row), x.begin() + long((b * T + t1) * row));
}

// Request b's cache entries [0, n) of every layer.
bool same_cache(const Cache& a, int64_t ba, const Cache& c, int64_t bc, int64_t n, DType t) {
  const size_t es = size_t(mtp::dtype_size(t)), entry = size_t(kD) * es;
  for (int64_t i = 0; i < kLayers; ++i)
    for (int64_t h = 0; h < kHkv; ++h) {
      const size_t oa = size_t(((i * a.B() + ba) * kHkv + h) * kL * kD) * es;
      const size_t oc = size_t(((i * c.B() + bc) * kHkv + h) * kL * kD) * es;
      if (std::memcmp(a.k.data() + oa, c.k.data() + oc, size_t(n) * entry) ||
          std::memcmp(a.v.data() + oa, c.v.data() + oc, size_t(n) * entry))
        return false;
    }
  return true;
}

void check_decoder(DType t, bool q8, bool quantize_x) {
  const Model m(t, q8, quantize_x);
  const char* what = q8 ? (quantize_x ? "q8dot" : "q8") : mtp::dtype_size(t) == 4 ? "f32" : "bf16";
  const std::vector<int64_t> prompt = {5, 9};  // ragged: two requests
  const int64_t T = 3, B = 2, P0 = 9;
  const std::vector<char> x = values(t, B * P0 * kH, 1.f), next = values(t, B * T * kH, 1.f);
  // Batched: prefill (request 0 uses only its first 5 positions: its length is set back), then T tokens.
  Cache batch(t, B, {0, 0});
  pass(m, batch, x, P0, 2);
  batch.lens = prompt;
  const std::vector<char> out = pass(m, batch, next, T, 2);
  const size_t row = size_t(kH * mtp::dtype_size(t));
  for (int64_t b = 0; b < B; ++b) {
    // Alone, one token at a time, one thread.
    Cache alone(t, 1, {0});
    pass(m, alone, rows(x, t, P0, b, 0, prompt[b]), prompt[b], 1);
    for (int64_t j = 0; j < T; ++j) {
      const std::vector<char> o = pass(m, alone, rows(next, t, T, b, j, j + 1), 1, 1);
      EXPECT(std::memcmp(o.data(), out.data() + (b * T + j) * row, row) == 0,
             "%s: request %lld token %lld: batched T=%lld pass != one-token pass alone", what, (long long)b,
             (long long)j, (long long)T);
    }
    EXPECT(same_cache(batch, b, alone, 0, prompt[b] + T, t), "%s: request %lld: cache entries differ", what,
           (long long)b);
  }
}

// A tree pass (one request: a chain of 3 from the root and two leaves; the other a deeper
// tree) gives each token the bits of a chain of its path, one token at a time, alone; its
// cache entry too.
void check_tree(DType t, bool q8, bool quantize_x) {
  const Model m(t, q8, quantize_x);
  const char* what = q8 ? (quantize_x ? "q8dot" : "q8") : mtp::dtype_size(t) == 4 ? "f32" : "bf16";
  const std::vector<int64_t> prompt = {5, 9};
  constexpr int64_t T = 6, B = 2, P0 = 9;
  const int64_t parents[B * T] = {-1, 0, 1, 2, 0, 0, -1, 0, 0, 2, 1, 4};
  const std::vector<char> x = values(t, B * P0 * kH, 1.f), next = values(t, B * T * kH, 1.f);
  Cache batch(t, B, {0, 0});
  pass(m, batch, x, P0, 2);
  batch.lens = prompt;
  const std::vector<char> out = pass(m, batch, next, T, 2, parents);
  const size_t row = size_t(kH * mtp::dtype_size(t)), es = size_t(mtp::dtype_size(t));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < T; ++j) {
      std::vector<int64_t> path;
      for (int64_t u = j; u >= 0; u = parents[b * T + u]) path.insert(path.begin(), u);
      Cache alone(t, 1, {0});
      pass(m, alone, rows(x, t, P0, b, 0, prompt[b]), prompt[b], 1);
      std::vector<char> o;
      for (int64_t u : path) o = pass(m, alone, rows(next, t, T, b, u, u + 1), 1, 1);
      EXPECT(std::memcmp(o.data(), out.data() + (b * T + j) * row, row) == 0,
             "%s: request %lld tree token %lld != a chain of its path", what, (long long)b, (long long)j);
      const int64_t at = prompt[b] + j, chain_at = prompt[b] + int64_t(path.size()) - 1;  // stored / chain position
      bool same = true;
      for (int64_t i = 0; i < kLayers; ++i)
        for (int64_t h = 0; h < kHkv; ++h) {
          const size_t ob = size_t((((i * B + b) * kHkv + h) * kL + at) * kD) * es;
          const size_t oa = size_t(((i * kHkv + h) * kL + chain_at) * kD) * es;
          same = same && !std::memcmp(batch.k.data() + ob, alone.k.data() + oa, size_t(kD) * es) &&
                 !std::memcmp(batch.v.data() + ob, alone.v.data() + oa, size_t(kD) * es);
        }
      EXPECT(same, "%s: request %lld tree token %lld: cache entry != the chain's", what, (long long)b, (long long)j);
    }
}

// A contiguous mtp_tensor over p (DType values are mtp_dtype values).
mtp_tensor view(const void* p, DType t, std::initializer_list<int64_t> sizes) {
  return mtp_contiguous(p, mtp_dtype(int(t)), int32_t(sizes.size()), sizes.begin());
}

void check_head_draft(DType t, bool q8) {
  const Model m(t, q8, false);
  const int64_t K = 3, B = 2, Vd = 20;
  const std::vector<int64_t> prompt = {6, 11};
  const Matrix embedding(kV, kH, t, q8), proj(kH, 2 * kH, t, false);  // the LM head: the embedding (tied)
  const Layer block(t, false);
  const mtp::DecoderLayer block_view = block.view();
  const std::vector<char> embed_norm = values(t, kH, 0.25f, 1.f), hidden_norm = values(t, kH, 0.25f, 1.f),
                          out_norm = values(t, kH, 0.25f, 1.f), hidden = values(t, B * kH, 1.f);
  std::vector<int64_t> vocab(Vd), token = {7, 31};
  for (int64_t i = 0; i < Vd; ++i) vocab[size_t(i)] = (i * 7 + 3) % kV;
  Cache cache(t, B, {0, 0});
  pass(m, cache, values(t, B * 11 * kH, 1.f), 11, 1);
  cache.lens = prompt;
  auto draft = [&](int64_t b0, int64_t n, int threads, int64_t alternatives = 0,
                   std::vector<float>* probs = nullptr) {  // requests [b0, b0 + n)
    mtp::HeadDraftArgs a;
    a.B = n;
    a.K = K;
    a.H = kH;
    a.Hq = kHq;
    a.Hkv = kHkv;
    a.D = kD;
    a.I = kI;
    a.blocks = 1;
    a.L = kL;
    a.P = kP;
    a.V = kV;
    a.Vd = Vd;
    a.dtype = t;
    a.hidden = hidden.data() + b0 * kH * mtp::dtype_size(t);
    a.token = token.data() + b0;
    a.embedding = embedding.m;
    a.rope_cos = m.cos.data();
    a.rope_sin = m.sin.data();
    const int64_t es = mtp::dtype_size(t), layer = 1;  // the head reads the last layer's cache
    a.k_cache = cache.k.data() + ((layer * B + b0) * kHkv * kL * kD) * es;
    a.v_cache = cache.v.data() + ((layer * B + b0) * kHkv * kL * kD) * es;
    const int64_t strides[4] = {kHkv * kL * kD, kL * kD, kD, 1};
    std::copy_n(strides, 4, a.k_stride);
    std::copy_n(strides, 4, a.v_stride);
    a.cache_lens = cache.lens.data() + b0;
    a.embed_norm = embed_norm.data();
    a.hidden_norm = hidden_norm.data();
    a.proj = proj.m;
    a.block = &block_view;
    a.out_norm = out_norm.data();
    a.lm_head = embedding.m;
    a.draft_vocab = vocab.data();
    a.eps = 1e-5f;
    a.alternatives = alternatives;
    std::vector<int64_t> drafts(size_t(n * (K + alternatives)), -1);
    a.drafts = drafts.data();
    if (probs) probs->assign(size_t(n * K), -1.f), a.probs = probs->data();
    mtp::head_draft(a, threads, mtp::current_isa(), mtp::ThreadParallelFor{threads});
    return drafts;
  };
  const std::vector<int64_t> both = draft(0, B, 2);
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<int64_t> alone = draft(b, 1, 1);
    for (int64_t j = 0; j < K; ++j) {
      const int64_t d = both[size_t(b * K + j)];
      EXPECT(d == alone[size_t(j)], "head_draft %s: request %lld draft %lld: %lld batched, %lld alone",
             q8 ? "q8 embedding" : "float", (long long)b, (long long)j, (long long)d, (long long)alone[size_t(j)]);
      EXPECT(std::find(vocab.begin(), vocab.end(), d) != vocab.end(), "draft %lld is not in the draft vocabulary",
             (long long)d);
    }
  }

  // The C API (mtp_head_draft): the same drafts, written as int32 into a strided [B, K] view;
  // bad input returns a status and message and writes nothing.
  const char* what = q8 ? "mtp_head_draft q8 embedding" : "mtp_head_draft float";
  const int64_t es = mtp::dtype_size(t), layer = 1;
  std::vector<mtp_tensor> w = {view(embed_norm.data(), t, {kH}),
                               view(hidden_norm.data(), t, {kH}),
                               view(proj.w.data(), t, {kH, 2 * kH}),
                               view(block.input_norm.data(), t, {kH}),
                               view(block.qkv.w.data(), t, {(kHq + 2 * kHkv) * kD, kH}),
                               view(block.o.w.data(), t, {kH, kHq * kD}),
                               view(block.post_norm.data(), t, {kH}),
                               view(block.gate_up.w.data(), t, {2 * kI, kH}),
                               view(block.down.w.data(), t, {kH, kI}),
                               view(out_norm.data(), t, {kH})};
  struct Call {
    std::vector<const mtp_tensor*> wp;
    mtp_tensor hidden, token, k, v, lens, cos, sin, emb, emb_scale, vocab, drafts;
    const mtp_tensor* scale;
    const mtp_tensor* probs = nullptr;  // with probs_call: mtp_head_draft_probs
    bool probs_call = false;
    int64_t k_steps = K, heads = kHq, alternatives = -1;  // >= 0: mtp_head_draft_alternatives
    mtp_status run() const {
      if (probs_call)
        return mtp_head_draft_probs(&hidden, &token, &k, &v, &lens, &cos, &sin, &emb, scale, wp.data(),
                                    int32_t(wp.size()), &emb, scale, &vocab, k_steps, heads, 1e-5f, &drafts, probs, 2);
      if (alternatives >= 0)
        return mtp_head_draft_alternatives(&hidden, &token, &k, &v, &lens, &cos, &sin, &emb, scale, wp.data(),
                                           int32_t(wp.size()), &emb, scale, &vocab, k_steps, heads, 1e-5f, alternatives,
                                           &drafts, 2);
      return mtp_head_draft(&hidden, &token, &k, &v, &lens, &cos, &sin, &emb, scale, wp.data(), int32_t(wp.size()),
                            &emb, scale, &vocab, k_steps, heads, 1e-5f, &drafts, 2);
    }
  };
  std::vector<int32_t> out(size_t(B * 2 * K), -7);  // [B, K] in every other column
  auto call = [&] {
    Call c;
    for (auto& v : w) c.wp.push_back(&v);
    c.hidden = view(hidden.data(), t, {B, kH});
    c.token = view(token.data(), DType::F32, {B});
    c.token.dtype = MTP_INT64;
    const int64_t cs[4] = {kHkv * kL * kD, kL * kD, kD, 1};
    c.k = view(cache.k.data() + layer * B * cs[0] * es, t, {B, kHkv, kL, kD});
    c.v = view(cache.v.data() + layer * B * cs[0] * es, t, {B, kHkv, kL, kD});
    c.lens = view(cache.lens.data(), DType::F32, {B});
    c.lens.dtype = MTP_INT64;
    c.cos = view(m.cos.data(), DType::F32, {kP, kD});
    c.sin = view(m.sin.data(), DType::F32, {kP, kD});
    c.emb = view(embedding.w.data(), embedding.m.dtype, {kV, kH});
    c.emb_scale = view(embedding.scale.data(), DType::F32, {kV, mtp::q8_blocks(kH)});
    c.scale = q8 ? &c.emb_scale : nullptr;
    c.vocab = view(vocab.data(), DType::F32, {Vd});
    c.vocab.dtype = MTP_INT64;
    c.drafts = view(out.data(), DType::F32, {B, K});
    c.drafts.dtype = MTP_INT32;
    c.drafts.strides[0] = 2 * K;
    c.drafts.strides[1] = 2;
    return c;
  };
  EXPECT(call().run() == MTP_OK, "%s: %s", what, mtp_last_error());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < K; ++j) {
      EXPECT(out[size_t(b * 2 * K + 2 * j)] == both[size_t(b * K + j)], "%s: request %lld draft %lld: %d, core %lld",
             what, (long long)b, (long long)j, out[size_t(b * 2 * K + 2 * j)], (long long)both[size_t(b * K + j)]);
      EXPECT(out[size_t(b * 2 * K + 2 * j + 1)] == -7, "%s: wrote between the strided drafts", what);
    }
  const std::vector<int32_t> good = out;
  std::vector<int64_t> far = {0, kV};  // a token id past the vocabulary
  auto bad = [&](auto&& mutate, mtp_status status, const char* needle) {
    std::fill(out.begin(), out.end(), -7);
    Call c = call();
    mutate(c);
    expect_error(c.run(), status, needle, what);
    EXPECT(std::all_of(out.begin(), out.end(), [](int32_t v) { return v == -7; }), "%s: written on failure (%s)", what,
           needle);
  };
  bad([](Call& c) { c.wp.pop_back(); }, MTP_ERROR_INVALID_ARGUMENT, "weights must hold embed_norm, hidden_norm, proj");
  bad([&](Call& c) { c.token.data = far.data(); }, MTP_ERROR_INVALID_ARGUMENT,
      "token must hold token ids in [0, V (embedding.sizes[0])) = [0, 50), got token[1] = 50");
  bad([&](Call& c) { c.vocab = view(far.data(), DType::F32, {2}), c.vocab.dtype = MTP_INT64; },
      MTP_ERROR_INVALID_ARGUMENT, "draft_vocab must hold token ids in [0, V (embedding.sizes[0]))");
  bad([](Call& c) { c.k_steps = -1; }, MTP_ERROR_INVALID_ARGUMENT, "k (draft steps) must be >= 0, got -1");
  bad([](Call& c) { c.k_steps = 22; }, MTP_ERROR_INVALID_ARGUMENT,
      "request 1's drafts would pass the RoPE tables: cache_lens[1] + k = 11 + 22 > P = 32");
  bad([](Call& c) { c.drafts.sizes[1] = 1; }, MTP_ERROR_INVALID_ARGUMENT, "drafts.sizes[1] must equal k = 3");
  bad([](Call& c) { c.hidden.dtype = MTP_FLOAT16; }, MTP_ERROR_UNSUPPORTED_DTYPE, "hidden must be float32 or bfloat16");
  bad([](Call& c) { c.wp[2] = &c.hidden; }, MTP_ERROR_INVALID_ARGUMENT, "weights[2] (proj).sizes[0] must equal H");
  if (q8)
    bad([](Call& c) { c.scale = nullptr; }, MTP_ERROR_UNSUPPORTED_DTYPE,
        "embedding is int8 but embedding_scale is empty");
  out = good;

  // mtp_head_draft_alternatives: the core's chain and first-step alternatives, into [B, K + 2].
  const std::vector<int64_t> tree = draft(0, B, 2, 2);
  std::vector<int64_t> with_alt(size_t(B * (K + 2)), -7);
  Call ca = call();
  ca.alternatives = 2;
  ca.drafts = view(with_alt.data(), DType::F32, {B, K + 2});
  ca.drafts.dtype = MTP_INT64;
  EXPECT(ca.run() == MTP_OK, "%s alternatives: %s", what, mtp_last_error());
  EXPECT(with_alt == tree, "%s: mtp_head_draft_alternatives != the core's drafts", what);
  for (int64_t b = 0; b < B; ++b) {
    EXPECT(std::equal(both.begin() + b * K, both.begin() + (b + 1) * K, tree.begin() + b * (K + 2)),
           "%s: the chain changed with alternatives", what);
    const int64_t* first = &tree[size_t(b * (K + 2))];
    EXPECT(first[0] != first[K] && first[0] != first[K + 1] && first[K] != first[K + 1],
           "%s: request %lld: first drafts repeat", what, (long long)b);
  }
  ca.alternatives = Vd;
  expect_error(ca.run(), MTP_ERROR_INVALID_ARGUMENT, "alternatives must be in [0, 20)", what);
  ca.alternatives = 2;
  ca.drafts.sizes[1] = K;
  expect_error(ca.run(), MTP_ERROR_INVALID_ARGUMENT, "drafts.sizes[1] must equal k + alternatives = 5", what);

  // mtp_head_draft_probs: the same chain, and the core's probabilities (each the largest of the
  // Vd softmax values) into a strided [B, K] float32 view; bad probs write nothing.
  std::vector<float> core_probs, probs(size_t(B * 2 * K), -7.f);
  const std::vector<int64_t> chain = draft(0, B, 2, 0, &core_probs);
  EXPECT(chain == both, "%s: the chain changed with probs", what);
  std::vector<int64_t> chain_out(size_t(B * K), -7);
  Call cp = call();
  mtp_tensor pv = view(probs.data(), DType::F32, {B, K});
  pv.strides[0] = 2 * K, pv.strides[1] = 2;
  cp.probs_call = true, cp.probs = &pv;
  cp.drafts = view(chain_out.data(), DType::F32, {B, K});
  cp.drafts.dtype = MTP_INT64;
  EXPECT(cp.run() == MTP_OK, "%s probs: %s", what, mtp_last_error());
  EXPECT(chain_out == both, "%s: mtp_head_draft_probs's drafts != the core's", what);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < K; ++j) {
      const float got = probs[size_t(b * 2 * K + 2 * j)], want = core_probs[size_t(b * K + j)];
      EXPECT(got == want && want >= 1.f / float(Vd) * 0.999f && want <= 1.f,
             "%s: request %lld step %lld: probability %g, core %g", what, (long long)b, (long long)j, got, want);
      EXPECT(probs[size_t(b * 2 * K + 2 * j + 1)] == -7.f, "%s: wrote between the strided probabilities", what);
    }
  auto bad_probs = [&](auto&& mutate, mtp_status status, const char* needle) {
    std::fill(probs.begin(), probs.end(), -7.f);
    Call c = cp;
    mtp_tensor p = pv;
    c.probs = &p;
    mutate(c, p);
    expect_error(c.run(), status, needle, what);
    EXPECT(std::all_of(probs.begin(), probs.end(), [](float v) { return v == -7.f; }), "%s: written on failure (%s)",
           what, needle);
  };
  bad_probs([](Call& c, mtp_tensor&) { c.probs = nullptr; }, MTP_ERROR_NULL_POINTER, "probs is NULL");
  bad_probs([](Call&, mtp_tensor& p) { p.dtype = MTP_BFLOAT16; }, MTP_ERROR_UNSUPPORTED_DTYPE, "probs must be float32");
  bad_probs([](Call&, mtp_tensor& p) { p.sizes[1] = K + 1; }, MTP_ERROR_INVALID_ARGUMENT,
            "probs.sizes[1] must equal k");
  bad_probs([&](Call&, mtp_tensor& p) { p.data = chain_out.data(); }, MTP_ERROR_INVALID_ARGUMENT,
            "probs and drafts overlap");
}

// ---- mtp_embedding (the C API) of a float or Q8 table: each row's bits as computed here

// mtp_embedding(tokens [n], weight [V, 40], weight_scale, out [n, 40]), valid until mutated.
struct EmbeddingCall {
  static constexpr int64_t H = 40;  // Q8: a partial last block
  Matrix table;
  std::vector<int64_t> ids = {7, 0, kV - 1, 7, 31};
  std::vector<float> outs = std::vector<float>(size_t(5 * H), -3.f);
  mtp_tensor tokens = view(ids.data(), DType::F32, {5}), w = view(table.w.data(), table.m.dtype, {kV, H}),
             sc = view(table.scale.data(), DType::F32, {kV, mtp::q8_blocks(H)}),
             out = view(outs.data(), DType::F32, {5, H});
  const mtp_tensor* scale;
  explicit EmbeddingCall(DType t) : table(kV, H, t, t == DType::I8), scale(t == DType::I8 ? &sc : nullptr) {
    tokens.dtype = MTP_INT64;
  }
  EmbeddingCall(const EmbeddingCall&) = delete;  // the views point into this object
  mtp_status run() const { return mtp_embedding(&tokens, &w, scale, &out); }
  bool untouched() const {
    return std::all_of(outs.begin(), outs.end(), [](float v) { return v == -3.f; });
  }
};

// A table of t (I8: Q8, random scales): every row as the table gives it (a float value,
// q * scale in fp32) rounded once to out's dtype, for fp32 and bf16 out, int32 and int64 ids,
// contiguous and strided views (ids 2 apart, out's rows padded and their elements 2 apart).
void check_embedding(DType t) {
  const bool q8 = t == DType::I8;
  const char* what = q8 ? "mtp_embedding q8" : t == DType::F32 ? "mtp_embedding f32" : "mtp_embedding bf16";
  constexpr int64_t H = EmbeddingCall::H;
  EmbeddingCall c(t);
  for (float& s : c.table.scale) s = std::ldexp(float(uniform(1, 255)), -14);  // a scale per block
  const int64_t n = int64_t(c.ids.size());
  for (DType ot : {DType::F32, DType::BF16})
    for (mtp_dtype it : {MTP_INT32, MTP_INT64})
      for (int64_t step : {1, 2}) {
        const int64_t es = mtp::dtype_size(ot), row = H * step + 3;
        std::vector<char> out(size_t(n * row * es), char(0x5A)), want = out;
        std::vector<int64_t> ids64(size_t(n * step), -1);
        std::vector<int32_t> ids32(ids64.size(), -1);
        for (int64_t i = 0; i < n; ++i) {
          const int64_t id = c.ids[size_t(i)];
          ids64[size_t(i * step)] = id, ids32[size_t(i * step)] = int32_t(id);
          for (int64_t k = 0; k < H; ++k) {
            const float v = q8 ? float(int8_t(c.table.w[size_t(id * H + k)])) *
                                     c.table.scale[size_t(id * mtp::q8_blocks(H) + k / 32)]
                               : mtp::load_f32(c.table.w.data(), t, id * H + k);
            mtp::store_f32(want.data(), ot, i * row + k * step, v);
          }
        }
        c.tokens = mtp_contiguous(it == MTP_INT32 ? static_cast<void*>(ids32.data()) : ids64.data(), it, 1, &n);
        c.tokens.strides[0] = step;
        c.out = view(out.data(), ot, {n, H});
        c.out.strides[0] = row, c.out.strides[1] = step;
        EXPECT(c.run() == MTP_OK, "%s: %s", what, mtp_last_error());
        EXPECT(out == want, "%s out %s ids %s step %lld: rows != the table's rounded once", what,
               ot == DType::F32 ? "f32" : "bf16", it == MTP_INT32 ? "int32" : "int64", (long long)step);
      }
  // n = 0: fine (NULL data included).
  c.tokens.sizes[0] = c.out.sizes[0] = 0;
  c.tokens.data = c.out.data = nullptr;
  EXPECT(c.run() == MTP_OK, "%s n = 0: %s", what, mtp_last_error());
}

// Bad input: a status and message, nothing written.
void check_embedding_errors() {
  constexpr auto INVALID = MTP_ERROR_INVALID_ARGUMENT;
  constexpr auto DTYPE = MTP_ERROR_UNSUPPORTED_DTYPE;
  constexpr auto NUL = MTP_ERROR_NULL_POINTER;
  struct Call : EmbeddingCall {
    Call() : EmbeddingCall(DType::F32) {}
  };
  struct Q8Call : EmbeddingCall {
    Q8Call() : EmbeddingCall(DType::I8) {}
  };
  EXPECT(Call().run() == MTP_OK && Q8Call().run() == MTP_OK, "mtp_embedding: the valid calls: %s", mtp_last_error());
  BAD_CALL(Call, c.ids[2] = kV, INVALID,
           "mtp_embedding: tokens must hold token ids in [0, V (weight.sizes[0])) = [0, 50), got tokens[2] = 50");
  BAD_CALL(Call, c.ids[4] = -1, INVALID, "got tokens[4] = -1");
  BAD_CALL(Call, c.ids[0] = INT64_MIN, INVALID, "got tokens[0] = -9223372036854775808");
  BAD_CALL(Call, c.tokens.dtype = MTP_FLOAT32, DTYPE, "mtp_embedding: tokens must be int32 or int64, got float32");
  BAD_CALL(Call, c.tokens.ndim = 2, INVALID, "tokens must be 1-D [n], got ndim = 2");
  BAD_CALL(Call, c.tokens.data = nullptr, NUL, "tokens.data is NULL");
  BAD_CALL(Call, c.out.dtype = MTP_FLOAT16, DTYPE, "mtp_embedding: out must be float32 or bfloat16, got float16");
  BAD_CALL(Call, c.out.sizes[0] = 4, INVALID, "out.sizes[0] must equal n (tokens.sizes[0]) = 5, got 4");
  BAD_CALL(Call, c.out.ndim = 3, INVALID, "out must be 2-D [n, H], got ndim = 3");
  BAD_CALL(Call, c.out.sizes[1] = 32, INVALID,
           "mtp_embedding: weight.sizes[1] must equal H (out.sizes[1]) = 32, got 40");
  BAD_CALL(Call, c.w.dtype = MTP_FLOAT16, DTYPE,
           "mtp_embedding: weight must be float32 or bfloat16 or int8 or Q4_0 or Q4_1 or Q5_0 or Q8_0 or Q4_K or Q6_K "
           "or Q4_0_X8 or Q4_1_X8 or Q8_0_X8 or Q4_K_X8 or Q6_K_X8, got float16 (dtype value 2)");
  BAD_CALL(Call, c.w.ndim = 1, INVALID, "weight must be 2-D [V, H], got ndim = 1");
  BAD_CALL(Call, (c.w.strides[0] = 2 * EmbeddingCall::H, c.w.strides[1] = 2), INVALID,
           "mtp_embedding: weight: weight rows must be contiguous (stride 1 along K), got strides [80, 2]");
  BAD_CALL(Call, c.w.data = nullptr, NUL, "mtp_embedding: weight.data is NULL for a non-empty [50, 40] view");
  BAD_CALL(Call, c.scale = &c.sc, DTYPE,
           "mtp_embedding: weight is float32 but weight_scale is not empty: with scales the matrix is int8 (Q8)");
  BAD_CALL(Q8Call, c.scale = nullptr, DTYPE,
           "mtp_embedding: weight is int8 but weight_scale is empty: int8 (Q8) weights need their scales");
  BAD_CALL(Q8Call, c.sc.sizes[1] = 1, INVALID,
           "weight's scales.sizes[1] must equal ceil(K/32) (blocks of 32 along K) = 2, got 1");
  BAD_CALL(Q8Call, c.sc.sizes[0] = 49, INVALID, "weight's scales.sizes[0] must equal V = 50, got 49");
  BAD_CALL(Q8Call, c.sc.dtype = MTP_BFLOAT16, DTYPE, "weight's scales must be float32, got bfloat16");
  BAD_CALL(Q8Call, c.sc.data = nullptr, NUL, "weight's scales.data is NULL");
  BAD_CALL(Q8Call, c.out.dtype = MTP_INT8, DTYPE, "out must be float32 or bfloat16, got int8");
  BAD_CALL(Call, c.out.data = c.table.w.data(), INVALID, "mtp_embedding: out and weight overlap in memory");
  BAD_CALL(Call, c.out.strides[0] = 0, INVALID, "out must not have overlapping elements (it is an output)");
}

// ---- mtp_decoder_layers (the C API): the core's bits through mtp_tensor views, and bad input

// The C API's arguments for a model and caches: views of the same buffers the core reads.
struct CapiCall {
  std::vector<mtp_tensor> w, s;
  std::vector<const mtp_tensor*> wp, sp;
  mtp_tensor x, k, v, lens, cos, sin, out;
  int64_t heads = kHq;
  float eps = 1e-5f;
  int32_t quantize_x;
  CapiCall(const Model& m, Cache& c, const std::vector<char>& xs, int64_t T, std::vector<char>& o)
      : quantize_x(m.quantize_x) {
    auto matrix = [&](const Matrix& a, int64_t N, int64_t K) {
      w.push_back(view(a.w.data(), a.m.dtype, {N, K}));
      if (a.m.dtype == DType::I8) s.push_back(view(a.scale.data(), DType::F32, {N, mtp::q8_blocks(K)}));
    };
    for (const Layer& l : m.layers) {
      w.push_back(view(l.input_norm.data(), m.t, {kH}));
      matrix(l.qkv, (kHq + 2 * kHkv) * kD, kH);
      matrix(l.o, kH, kHq * kD);
      w.push_back(view(l.post_norm.data(), m.t, {kH}));
      matrix(l.gate_up, 2 * kI, kH);
      matrix(l.down, kH, kI);
    }
    w.push_back(view(m.final_norm.data(), m.t, {kH}));
    for (auto& t : w) wp.push_back(&t);
    for (auto& t : s) sp.push_back(&t);
    x = view(xs.data(), m.t, {c.B(), T, kH});
    k = view(c.k.data(), m.t, {kLayers, c.B(), kHkv, kL, kD});
    v = view(c.v.data(), m.t, {kLayers, c.B(), kHkv, kL, kD});
    lens = view(c.lens.data(), DType::F32, {c.B()});
    lens.dtype = MTP_INT64;
    cos = view(m.cos.data(), DType::F32, {kP, kD});
    sin = view(m.sin.data(), DType::F32, {kP, kD});
    out = view(o.data(), m.t, {c.B(), T, kH});
  }
  const mtp_tensor* tree = nullptr;  // tree_parents: mtp_decoder_layers_tree
  mtp_status run(int threads = 2) const {
    if (tree)
      return mtp_decoder_layers_tree(&x, &k, &v, &lens, &cos, &sin, wp.data(), int32_t(wp.size()), sp.data(),
                                     int32_t(sp.size()), heads, eps, quantize_x, tree, &out, threads);
    return mtp_decoder_layers(&x, &k, &v, &lens, &cos, &sin, wp.data(), int32_t(wp.size()), sp.data(),
                              int32_t(sp.size()), heads, eps, quantize_x, &out, threads);
  }
};

// mtp_decoder_layers_tree: the core's tree pass through a strided int32 tree_parents view,
// and bad trees (a status and message, nothing written).
void check_capi_tree(DType t, bool q8, bool quantize_x) {
  const Model m(t, q8, quantize_x);
  const char* what = q8 ? (quantize_x ? "tree q8dot" : "tree q8") : mtp::dtype_size(t) == 4 ? "tree f32" : "tree bf16";
  constexpr int64_t B = 2, T = 6;
  const int64_t parents[B * T] = {-1, 0, 1, 2, 0, 0, -1, 0, 0, 2, 1, 4};
  std::vector<int32_t> every_other(size_t(2 * B * T), 99);  // [B, T] in every other column
  for (int64_t i = 0; i < B * T; ++i) every_other[size_t(2 * i)] = int32_t(parents[i]);
  mtp_tensor tree = view(every_other.data(), DType::F32, {B, T});
  tree.dtype = MTP_INT32;
  tree.strides[0] = 2 * T;
  tree.strides[1] = 2;
  const std::vector<char> x = values(t, B * T * kH, 1.f);
  Cache core(t, B, {3, 7}), capi(t, B, {3, 7});
  const std::vector<char> want = pass(m, core, x, T, 2, parents);
  std::vector<char> got(want.size());
  CapiCall call(m, capi, x, T, got);
  call.tree = &tree;
  EXPECT(call.run() == MTP_OK, "%s: %s", what, mtp_last_error());
  EXPECT(got == want && capi.k == core.k && capi.v == core.v, "%s: mtp_decoder_layers_tree != the core's pass", what);
  auto bad = [&](int64_t at, int32_t value, int64_t cols, mtp_status status, const char* needle) {
    std::vector<int32_t> p = every_other;
    p[size_t(2 * at)] = value;
    mtp_tensor bad_tree = tree;
    bad_tree.data = p.data();
    bad_tree.sizes[1] = cols;
    Cache c(t, B, {3, 7});
    std::vector<char> o(want.size(), char(0x11));
    const std::vector<char> o0 = o, k0 = c.k;
    CapiCall bc(m, c, x, T, o);
    bc.tree = &bad_tree;
    expect_error(bc.run(), status, needle, what);
    EXPECT(c.k == k0 && o == o0, "%s: written on failure (%s)", what, needle);
  };
  bad(0, 0, T, MTP_ERROR_INVALID_ARGUMENT,
      "mtp_decoder_layers_tree: tree_parents[0][0] must be -1 (row 0 is the root)");
  bad(T + 3, 4, T, MTP_ERROR_INVALID_ARGUMENT, "tree_parents[1][3] must be an earlier row in [0, 3), got 4");
  bad(2, -1, T, MTP_ERROR_INVALID_ARGUMENT, "tree_parents[0][2] must be an earlier row in [0, 2), got -1");
  bad(0, -1, T - 1, MTP_ERROR_INVALID_ARGUMENT, "tree_parents.sizes[1] must equal T (x.sizes[1])");
}

// xs [rows, H] laid out with rows H + pad elements apart (the pad filled with 0x55 bytes).
std::vector<char> padded(const std::vector<char>& xs, DType t, int64_t rows, int64_t pad) {
  const size_t es = size_t(mtp::dtype_size(t));
  std::vector<char> out(size_t(rows * (kH + pad)) * es, char(0x55));
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(out.data() + size_t(r * (kH + pad)) * es, xs.data() + size_t(r * kH) * es, size_t(kH) * es);
  return out;
}

void check_capi_decoder(DType t, bool q8, bool quantize_x) {
  const Model m(t, q8, quantize_x);
  const char* what = q8 ? (quantize_x ? "q8dot" : "q8") : mtp::dtype_size(t) == 4 ? "f32" : "bf16";
  const int64_t B = 2, es = mtp::dtype_size(t);
  for (int64_t T : {int64_t(1), int64_t(9)}) {  // a step, and a prefill of 18 rows (split over the threads)
    const std::vector<char> x = values(t, B * T * kH, 1.f);
    Cache core(t, B, {3, 7}), capi(t, B, {3, 7});
    const std::vector<char> want = pass(m, core, x, T, 2);
    std::vector<char> got(want.size());
    CapiCall call(m, capi, x, T, got);
    EXPECT(call.run() == MTP_OK, "%s T=%lld: %s", what, (long long)T, mtp_last_error());
    EXPECT(got == want, "%s T=%lld: mtp_decoder_layers != the core's pass", what, (long long)T);
    EXPECT(capi.k == core.k && capi.v == core.v, "%s T=%lld: the caches differ", what, (long long)T);
    EXPECT(capi.lens[0] == 3 && capi.lens[1] == 7, "%s: cache_lens advanced (the caller owns them)", what);
    // Strided x and out (rows 8 elements apart beyond H): the same bits, nothing else written.
    Cache strided(t, B, {3, 7});
    std::vector<char> xs = padded(x, t, B * T, 8), os = padded(std::vector<char>(want.size()), t, B * T, 8);
    CapiCall sc(m, strided, xs, T, os);
    for (mtp_tensor* v : {&sc.x, &sc.out}) {
      v->strides[1] = kH + 8;
      v->strides[0] = T * (kH + 8);
    }
    EXPECT(sc.run(1) == MTP_OK, "%s strided: %s", what, mtp_last_error());
    EXPECT(os == padded(want, t, B * T, 8), "%s T=%lld: strided x/out give other bits", what, (long long)T);
  }

  // Bad input: a clear status and message, and nothing written (caches, out).
  const int64_t T = 9;
  const std::vector<char> x = values(t, B * T * kH, 1.f);
  using C = CapiCall;
  using Buf = std::vector<char>;
  auto bad = [&](auto&& mutate, mtp_status status, const char* needle) {
    Cache c(t, B, {3, 7});
    std::vector<char> o(size_t(B * T * kH * es), char(0x11));
    const std::vector<char> o0 = o, k0 = c.k;
    CapiCall call(m, c, x, T, o);
    Buf strided_norm(size_t(2 * kH * es));
    mutate(call, strided_norm);
    expect_error(call.run(), status, needle, what);
    EXPECT(c.k == k0 && c.v == k0 && o == o0, "%s: written on failure (%s)", what, needle);
  };
  bad([](C& c, Buf&) { c.wp.pop_back(); }, MTP_ERROR_INVALID_ARGUMENT, "weights must hold 6 tensors per layer");
  bad([](C& c, Buf&) { c.wp[3] = nullptr; }, MTP_ERROR_NULL_POINTER, "weights[3] (layer 0's post_norm) is NULL");
  bad(
      [](C& c, Buf& b) {
        c.w[9].data = b.data();
        c.w[9].strides[0] = 2;
      },
      MTP_ERROR_INVALID_ARGUMENT, "weights[9] (layer 1's post_norm): norm weights must be contiguous");
  bad([](C& c, Buf&) { c.w[7].sizes[0] -= 1; }, MTP_ERROR_INVALID_ARGUMENT, "weights[7] (layer 1's qkv).sizes[0]");
  bad([](C& c, Buf&) { c.w[4].sizes[0] = 2 * kI - 1; }, MTP_ERROR_INVALID_ARGUMENT,
      "weights[4] (layer 0's gate_up).sizes[0] must be even");
  bad([](C& c, Buf&) { c.lens.data = nullptr; }, MTP_ERROR_NULL_POINTER, "cache_lens.data is NULL");
  bad([](C& c, Buf&) { c.heads = 3; }, MTP_ERROR_INVALID_ARGUMENT, "must be a multiple of k_cache's head count");
  bad([](C& c, Buf&) { c.eps = NAN; }, MTP_ERROR_INVALID_ARGUMENT, "eps must be a finite number >= 0");
  bad([](C& c, Buf&) { c.cos.sizes[0] = 10; }, MTP_ERROR_INVALID_ARGUMENT, "rope_sin must have rope_cos's sizes");
  bad([](C& c, Buf&) { c.x.dtype = MTP_FLOAT16; }, MTP_ERROR_UNSUPPORTED_DTYPE, "x must be float32 or bfloat16");
  bad([](C& c, Buf&) { c.out.sizes[1] = 1; }, MTP_ERROR_INVALID_ARGUMENT, "out must have x's sizes");
  if (q8) {
    bad([](C& c, Buf&) { c.sp.pop_back(); }, MTP_ERROR_INVALID_ARGUMENT, "weight_scales must be empty (float weights)");
    bad([](C& c, Buf&) { c.sp.clear(), c.quantize_x = 0; }, MTP_ERROR_UNSUPPORTED_DTYPE,
        "weights[1] (layer 0's qkv) is int8 but weight_scales is empty");
    bad([](C& c, Buf&) { c.s[5].sizes[1] = 1; }, MTP_ERROR_INVALID_ARGUMENT,
        "weights[8] (layer 1's o_proj)'s scales.sizes[1] must equal ceil(K/32)");
  } else {
    bad([](C& c, Buf&) { c.quantize_x = 1; }, MTP_ERROR_INVALID_ARGUMENT, "quantize_x = 1 needs int8 weights");
    bad([](C& c, Buf&) { c.sp = c.wp; }, MTP_ERROR_INVALID_ARGUMENT, "weight_scales must be empty (float weights)");
  }
  // Over capacity (L = 24): request 1 at 7 + 9 fits, at 16 + 9 does not.
  {
    Cache c(t, B, {3, 16});
    std::vector<char> o(size_t(B * T * kH * es));
    const std::vector<char> k0 = c.k;
    CapiCall call(m, c, x, T, o);
    expect_error(call.run(), MTP_ERROR_INVALID_ARGUMENT,
                 "request 1 would pass the cache capacity: cache_lens[1] + T = 16 + 9 > L = 24", what);
    EXPECT(c.k == k0, "%s: cache written on failure", what);
  }
}

// ---- mtp_decoder_layers_gemma3 (the C API): the core's Gemma 3 bits, and bad input

// A tiny Gemma 3 model: layer 0 sliding (window 4, shorter than the cache) on local RoPE tables
// of another base, layer 1 global; an attention scale other than 1/sqrt(D).
struct Gemma3Model {
  DType t;
  bool quantize_x;
  std::vector<std::vector<char>> norms;  // per layer input, q, k, post_attention, pre_ff, post_ff
  std::vector<Matrix> mats;              // per layer qkv, o, gate_up, down
  std::vector<mtp::DecoderLayer> views;
  std::vector<char> final_norm;
  std::vector<float> cos, sin, cos_local, sin_local;
  std::vector<int64_t> windows = {4, 0};
  float scale = 0.2f;
  Gemma3Model(DType t_, bool q8, bool quantize_x_)
      : t(t_), quantize_x(quantize_x_), final_norm(values(t_, kH, 0.25f, 1.f)) {
    for (int64_t i = 0; i < kLayers; ++i) {
      for (int64_t n : {kH, kD, kD, kH, kH, kH}) norms.push_back(values(t, n, 0.25f, 1.f));
      mats.emplace_back((kHq + 2 * kHkv) * kD, kH, t, q8);
      mats.emplace_back(kH, kHq * kD, t, q8);
      mats.emplace_back(2 * kI, kH, t, q8);
      mats.emplace_back(kH, kI, t, q8);
    }
    for (int64_t i = 0; i < kLayers; ++i) {
      mtp::DecoderLayer l{};
      auto n = [&](int j) { return norms[size_t(6 * i + j)].data(); };
      l.input_norm = n(0);
      l.q_norm = n(1);
      l.k_norm = n(2);
      l.post_attention_norm = n(3);
      l.post_norm = n(4);
      l.post_feedforward_norm = n(5);
      l.qkv = mats[size_t(4 * i)].m;
      l.o = mats[size_t(4 * i + 1)].m;
      l.gate_up = mats[size_t(4 * i + 2)].m;
      l.down = mats[size_t(4 * i + 3)].m;
      l.window = windows[size_t(i)];
      views.push_back(l);
    }
    for (int64_t p = 0; p < kP; ++p)
      for (int64_t d = 0; d < kD; ++d) {
        const double e = -double(2 * (d % (kD / 2))) / double(kD);
        cos.push_back(float(std::cos(p * std::pow(1e6, e))));
        sin.push_back(float(std::sin(p * std::pow(1e6, e))));
        cos_local.push_back(float(std::cos(p * std::pow(1e4, e))));
        sin_local.push_back(float(std::sin(p * std::pow(1e4, e))));
      }
  }
};

std::vector<char> gemma3_pass(const Gemma3Model& m, Cache& c, const std::vector<char>& x, int64_t T, int threads) {
  return run_pass(m, c, x, T, threads, 1e-6f, [&](mtp::DecoderArgs& a) {
    a.kind = mtp::LayerKind::Gemma3;
    a.P_local = kP;
    a.rope_cos_local = m.cos_local.data();
    a.rope_sin_local = m.sin_local.data();
    a.has_scale = true;
    a.scale = m.scale;
  });
}

// mtp_decoder_layers_gemma3's arguments: views of the model's and the cache's buffers.
struct Gemma3Call {
  std::vector<mtp_tensor> w, s;
  std::vector<const mtp_tensor*> wp, sp;
  mtp_tensor x, k, v, lens, cos, sin, cos_local, sin_local, out;
  const mtp_tensor *cl = &cos_local, *sl = &sin_local;
  std::vector<int64_t> windows;
  const int64_t* win;
  int64_t heads = kHq;
  float eps = 1e-6f, scale;
  int32_t quantize_x;
  Gemma3Call(const Gemma3Model& m, Cache& c, const std::vector<char>& xs, int64_t T, std::vector<char>& o)
      : windows(m.windows), scale(m.scale), quantize_x(m.quantize_x) {
    win = windows.data();
    auto matrix = [&](const Matrix& a, int64_t N, int64_t K) {
      w.push_back(view(a.w.data(), a.m.dtype, {N, K}));
      if (a.m.dtype == DType::I8) s.push_back(view(a.scale.data(), DType::F32, {N, mtp::q8_blocks(K)}));
    };
    for (int64_t i = 0; i < kLayers; ++i) {
      auto norm = [&](int j, int64_t n) { w.push_back(view(m.norms[size_t(6 * i + j)].data(), m.t, {n})); };
      norm(0, kH);
      matrix(m.mats[size_t(4 * i)], (kHq + 2 * kHkv) * kD, kH);
      norm(1, kD);
      norm(2, kD);
      matrix(m.mats[size_t(4 * i + 1)], kH, kHq * kD);
      norm(3, kH);
      norm(4, kH);
      matrix(m.mats[size_t(4 * i + 2)], 2 * kI, kH);
      matrix(m.mats[size_t(4 * i + 3)], kH, kI);
      norm(5, kH);
    }
    w.push_back(view(m.final_norm.data(), m.t, {kH}));
    for (auto& t : w) wp.push_back(&t);
    for (auto& t : s) sp.push_back(&t);
    x = view(xs.data(), m.t, {c.B(), T, kH});
    k = view(c.k.data(), m.t, {kLayers, c.B(), kHkv, kL, kD});
    v = view(c.v.data(), m.t, {kLayers, c.B(), kHkv, kL, kD});
    lens = view(c.lens.data(), DType::F32, {c.B()});
    lens.dtype = MTP_INT64;
    cos = view(m.cos.data(), DType::F32, {kP, kD});
    sin = view(m.sin.data(), DType::F32, {kP, kD});
    cos_local = view(m.cos_local.data(), DType::F32, {kP, kD});
    sin_local = view(m.sin_local.data(), DType::F32, {kP, kD});
    out = view(o.data(), m.t, {c.B(), T, kH});
  }
  mtp_status run(int threads = 2) const {
    return mtp_decoder_layers_gemma3(&x, &k, &v, &lens, &cos, &sin, cl, sl, win, wp.data(), int32_t(wp.size()),
                                     sp.data(), int32_t(sp.size()), heads, eps, scale, quantize_x, nullptr, &out,
                                     threads);
  }
};

void check_capi_gemma3(DType t, bool q8, bool quantize_x) {
  const Gemma3Model m(t, q8, quantize_x);
  const char* what = q8                        ? (quantize_x ? "gemma3 q8dot" : "gemma3 q8")
                     : mtp::dtype_size(t) == 4 ? "gemma3 f32"
                                               : "gemma3 bf16";
  const int64_t B = 2, T = 9, es = mtp::dtype_size(t);
  const std::vector<char> x = values(t, B * T * kH, 1.f);
  Cache core(t, B, {3, 7}), capi(t, B, {3, 7}), one(t, B, {3, 7});
  const std::vector<char> want = gemma3_pass(m, core, x, T, 2);
  std::vector<char> got(want.size());
  Gemma3Call call(m, capi, x, T, got);
  EXPECT(call.run() == MTP_OK, "%s: %s", what, mtp_last_error());
  EXPECT(got == want, "%s: mtp_decoder_layers_gemma3 != the core's pass", what);
  EXPECT(capi.k == core.k && capi.v == core.v, "%s: the caches differ", what);
  EXPECT(capi.lens[0] == 3 && capi.lens[1] == 7, "%s: cache_lens advanced (the caller owns them)", what);
  // One thread: the same bits.
  Cache c1(t, B, {3, 7});
  std::vector<char> got1(want.size());
  Gemma3Call call1(m, c1, x, T, got1);
  EXPECT(call1.run(1) == MTP_OK, "%s 1 thread: %s", what, mtp_last_error());
  EXPECT(got1 == want && c1.k == core.k && c1.v == core.v, "%s: 1 thread != 2 threads", what);
  // T one-token passes give the T-token pass's bits (outputs and caches); past the window of 4.
  const size_t row = size_t(kH * es);
  for (int64_t i = 0; i < T; ++i) {
    std::vector<char> xi, oi(size_t(B) * row);
    for (int64_t b = 0; b < B; ++b) {
      const std::vector<char> r = rows(x, t, T, b, i, i + 1);
      xi.insert(xi.end(), r.begin(), r.end());
    }
    Gemma3Call ci(m, one, xi, 1, oi);
    EXPECT(ci.run() == MTP_OK, "%s token %lld: %s", what, (long long)i, mtp_last_error());
    for (int64_t b = 0; b < B; ++b)
      EXPECT(std::memcmp(oi.data() + size_t(b) * row, want.data() + size_t(b * T + i) * row, row) == 0,
             "%s: request %lld token %lld: one-token pass != the %lld-token pass", what, (long long)b, (long long)i,
             (long long)T);
    for (auto& n : one.lens) n += 1;
  }
  EXPECT(one.k == core.k && one.v == core.v, "%s: one-token passes leave other caches", what);
  // The global and local tables matter: swapping them changes the bits.
  {
    Cache cs(t, B, {3, 7});
    std::vector<char> os(want.size());
    Gemma3Call sw(m, cs, x, T, os);
    std::swap(sw.cos, sw.cos_local);
    std::swap(sw.sin, sw.sin_local);
    EXPECT(sw.run() == MTP_OK && os != want, "%s: the local tables are not used", what);
    Cache cs2(t, B, {3, 7});
    Gemma3Call sc(m, cs2, x, T, os);
    sc.scale = 0;  // 1/sqrt(D) = 0.25
    EXPECT(sc.run() == MTP_OK && os != want, "%s: attention_scale is not used", what);
  }

  // Bad input: the torch binding's checks and messages, nothing written.
  using C = Gemma3Call;
  auto bad = [&](auto&& mutate, mtp_status status, const char* needle) {
    Cache c(t, B, {3, 7});
    std::vector<char> o(size_t(B * T * kH * es), char(0x11));
    const std::vector<char> o0 = o, k0 = c.k;
    Gemma3Call bc(m, c, x, T, o);
    mutate(bc);
    expect_error(bc.run(), status, needle, what);
    EXPECT(c.k == k0 && c.v == k0 && o == o0, "%s: written on failure (%s)", what, needle);
  };
  bad([](C& c) { c.wp.pop_back(); }, MTP_ERROR_INVALID_ARGUMENT,
      "mtp_decoder_layers_gemma3: weights must hold 10 tensors per layer (input_norm, qkv, q_norm, k_norm, o_proj, "
      "post_attention_norm, pre_feedforward_norm, gate_up, down_proj, post_feedforward_norm) for the 2 layers of "
      "k_cache, then the final norm: 21 tensors, got num_weights = 20");
  bad([](C& c) { c.windows[1] = -1; }, MTP_ERROR_INVALID_ARGUMENT, "windows[1]: window must be >= 0");
  bad([](C& c) { c.cl = c.sl = nullptr; }, MTP_ERROR_INVALID_ARGUMENT,
      "a layer with a window (windows holds values > 0) takes its RoPE angles from rope_cos_local");
  bad([](C& c) { c.sl = nullptr; }, MTP_ERROR_INVALID_ARGUMENT,
      "rope_cos_local and rope_sin_local go together, got only rope_cos_local");
  bad([](C& c) { c.cos_local.sizes[0] = c.sin_local.sizes[0] = 12; }, MTP_ERROR_INVALID_ARGUMENT,
      "request 1 would pass the RoPE tables: cache_lens[1] + T = 7 + 9 > P = 12 (rope_cos_local.sizes[0])");
  bad([](C& c) { c.sin_local.sizes[1] = 8; }, MTP_ERROR_INVALID_ARGUMENT,
      "rope_sin_local must have rope_cos_local's sizes");
  bad([](C& c) { c.w[2].sizes[0] = kH; }, MTP_ERROR_INVALID_ARGUMENT,
      "weights[2] (layer 0's q_norm).sizes[0] must equal D");
  bad([](C& c) { c.w[13].sizes[0] = kH; }, MTP_ERROR_INVALID_ARGUMENT,
      "weights[13] (layer 1's k_norm).sizes[0] must equal D");
  bad([](C& c) { c.w[15].sizes[0] = kD; }, MTP_ERROR_INVALID_ARGUMENT,
      "weights[15] (layer 1's post_attention_norm).sizes[0] must equal H");
  bad([](C& c) { c.w[19].dtype = MTP_INT8; }, MTP_ERROR_UNSUPPORTED_DTYPE,
      "weights[19] (layer 1's post_feedforward_norm)");
  bad([](C& c) { c.scale = NAN; }, MTP_ERROR_INVALID_ARGUMENT, "attention_scale must be finite");
  bad([](C& c) { c.w[7].sizes[0] = 2 * kI - 1; }, MTP_ERROR_INVALID_ARGUMENT,
      "weights[7] (layer 0's gate_up).sizes[0] must be even");
  if (!q8)
    bad([](C& c) { c.quantize_x = 1; }, MTP_ERROR_INVALID_ARGUMENT, "quantize_x = 1 needs int8 weights");
  else
    bad([](C& c) { c.sp.pop_back(); }, MTP_ERROR_INVALID_ARGUMENT, "weight_scales must be empty (float weights)");
  // No windows (NULL) and no local tables: every layer global, fine.
  {
    Cache c(t, B, {3, 7});
    std::vector<char> o(want.size());
    Gemma3Call g(m, c, x, T, o);
    g.win = nullptr;
    g.cl = g.sl = nullptr;
    EXPECT(g.run() == MTP_OK, "%s global: %s", what, mtp_last_error());
  }
}

// The old selection of head_draft's alternatives (m scans, O(n m^2)), kept as the oracle of
// mtp::argmax_order: the best of the n logits by torch.argmax's rule, leaving out skip[0..m).
int64_t argmax_skipping(const void* row, DType dt, int64_t n, const int64_t* skip, int64_t m) {
  mtp::ArgmaxResult best{0.f, 0, false};
  bool any = false;
  for (int64_t i = 0; i < n; ++i) {
    if (std::find(skip, skip + m, i) != skip + m) continue;
    const float v = mtp::load_f32(row, dt, i);
    const mtp::ArgmaxResult r{v, i, std::isnan(v)};
    best = any ? mtp::argmax_merge(best, r) : r;
    any = true;
  }
  return best.idx;
}

// mtp::argmax_order (one partial sort) gives the indices of the m-fold argmax, bitwise, on random
// and adversarial rows: ties, NaNs, +-inf, -0.0 / +0.0, all equal, count >= n (only n written).
void check_argmax_order(mtp::Isa isa) {
  const float nan = std::nanf(""), inf = INFINITY;
  const float specials[] = {nan, inf, -inf, 0.f, -0.f, 1.f, -1.f, 3.f, 1e-45f, -3e38f};
  for (DType t : {DType::F32, DType::BF16}) {
    for (int trial = 0; trial < 120; ++trial) {
      const int64_t n = trial < 4 ? trial + 1 : uniform(1, trial % 10 == 0 ? 700 : 90);
      const int kind = trial % 6;  // 0 random, 1 few values (ties), 2 specials, 3 all equal, 4 all NaN, 5 mixed
      const float same = specials[size_t(uniform(0, 9))];
      std::vector<char> row(size_t(n * mtp::dtype_size(t)));
      for (int64_t i = 0; i < n; ++i) {
        float v = float(std::ldexp(double(int64_t(rng() >> 40) - (1 << 23)), -20));
        if (kind == 1) v = float(uniform(-2, 2));
        if (kind == 2 || (kind == 5 && uniform(0, 3) == 0)) v = specials[size_t(uniform(0, 9))];
        if (kind == 3) v = same;
        if (kind == 4) v = nan;
        mtp::store_f32(row.data(), t, i, v);
      }
      std::vector<int64_t> want;
      for (int64_t m = 0; m < n; ++m) want.push_back(argmax_skipping(row.data(), t, n, want.data(), m));
      EXPECT(want[0] == mtp::argmax_range(row.data(), t, 1, 0, n, isa).idx,
             "argmax_order: the oracle's first != argmax");
      for (int64_t count : {int64_t(1), int64_t(2), n / 2, n, n + 3}) {
        std::vector<int64_t> got(size_t(n + 3), -7);
        mtp::argmax_order(row.data(), t, n, count, got.data());
        const int64_t c = std::min(count, n);
        EXPECT(std::equal(got.begin(), got.begin() + std::max<int64_t>(c, 0), want.begin()),
               "argmax_order %s n=%lld count=%lld kind=%d: != the m-fold argmax", t == DType::F32 ? "f32" : "bf16",
               (long long)n, (long long)count, kind);
        EXPECT(std::all_of(got.begin() + std::max<int64_t>(c, 0), got.end(), [](int64_t x) { return x == -7; }),
               "argmax_order n=%lld count=%lld: wrote past min(count, n)", (long long)n, (long long)count);
      }
    }
  }
}

}  // namespace

void test_decoder() {
  check_argmax_order(mtp::current_isa());
  for (DType t : {DType::F32, DType::BF16}) {
    check_decoder(t, false, false);
    check_decoder(t, true, false);
    check_decoder(t, true, true);
    check_tree(t, false, false);
    check_tree(t, true, true);
    check_capi_tree(t, false, false);
    check_capi_tree(t, true, true);
    check_head_draft(t, false);
    check_head_draft(t, true);
    check_capi_decoder(t, false, false);
    check_capi_decoder(t, true, false);
    check_capi_decoder(t, true, true);
    check_capi_gemma3(t, false, false);
    check_capi_gemma3(t, true, true);
  }
  for (DType t : {DType::F32, DType::BF16, DType::I8}) check_embedding(t);
  check_embedding_errors();
}
