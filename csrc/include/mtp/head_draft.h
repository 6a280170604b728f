// The MTP head's K draft steps in one call, torch-free: per step the embedding of the
// current token and the last hidden state, normed and projected, the head's blocks (decoder
// layers whose attention reads one backbone layer's cache in place, plus the head's own
// keys/values of the steps so far), the draft LM head (the draft vocabulary's rows of the
// backbone's LM head, read in place through LinearArgs::w_rows, or those rows gathered once by
// the caller) and its argmax. The same kernels in
// the same order as reference.head_draft's composition of the ops, so the same drafts;
// what it saves is ~25 dispatches per draft step.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "mtp/argmax.h"
#include "mtp/decoder_layers.h"
#include "mtp/embedding.h"

namespace mtp {

struct HeadDraftArgs {
  int64_t B = 0, K = 0;  // requests, draft steps
  int64_t H = 0, Hq = 0, Hkv = 0, D = 0, I = 0, blocks = 0;
  int64_t L = 0, P = 0, V = 0, Vd = 0;  // cache capacity, RoPE table rows, vocabulary, draft vocabulary
  DType dtype = DType::F32;             // activations, norms and the cache (F32 or BF16)
  const void* hidden = nullptr;         // [B, H] contiguous: the backbone's last hidden state
  const int64_t* token = nullptr;       // [B]: the backbone's next token (at position cache_lens[b])
  DecoderMatrix embedding;              // [V, H]: float, or Q8 (rows dequantized in fp32, then rounded)
  const float* rope_cos = nullptr;      // [P, D] contiguous
  const float* rope_sin = nullptr;
  const void* k_cache = nullptr;  // [B, Hkv, L, D] views of the layer the head reads, element strides
  const void* v_cache = nullptr;
  int64_t k_stride[4] = {0, 0, 0, 0}, v_stride[4] = {0, 0, 0, 0};
  const int64_t* cache_lens = nullptr;  // [B]: draft step j of request b is at position cache_lens[b] + j
  const void* embed_norm = nullptr;     // [H] each
  const void* hidden_norm = nullptr;
  DecoderMatrix proj;                   // [H, 2H]: [normed embedding ; normed hidden state] -> H
  const DecoderLayer* block = nullptr;  // [blocks]
  const void* out_norm = nullptr;
  DecoderMatrix lm_head;                 // [V, H]: float, or Q8; only the draft vocabulary's rows are read
  const int64_t* draft_vocab = nullptr;  // [Vd] token ids (rows of lm_head), or nullptr: every token (Vd == V)
  bool lm_head_drafted = false;          // lm_head is [Vd, H]: row i is token draft_vocab[i]'s (gathered once by the
                                         // caller, which drafts many times: no per-call gather, contiguous reads)
  float eps = 0.f;
  int64_t alternatives = 0;   // the first step's next best drafts also wanted (K >= 1, < Vd)
  int64_t* drafts = nullptr;  // [B, K + alternatives] contiguous: the K steps, then the first step's
                              // 2nd, 3rd, ... best drafts (torch.argmax's order over the rest)
  float* probs = nullptr;     // [B, K] contiguous, or nullptr: each step's draft_probability
};

// The probability the head gives its draft: the softmax over the n logits of `row` (as
// rounded to dt) at the argmax `best`, 1 / sum_i exp(l_i - l_best) in fp32 (NaN where a logit
// is NaN or the largest is infinite, as torch.softmax). Not on the exact path: it only tells
// a caller how many drafts are worth a verify pass, so it equals reference.head_draft's
// torch.softmax to rounding, not bitwise.
inline float draft_probability(const void* row, DType dt, int64_t n, int64_t best) {
  const float top = load_f32(row, dt, best);
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(load_f32(row, dt, i) - top);
  return 1.f / sum;
}

// Whether an lm_head of `rows` rows is the draft vocabulary's own (lm_head_drafted): a draft
// vocabulary of Vd < V tokens and exactly Vd rows. (Vd == V rows are the LM head itself.)
inline bool lm_head_drafted(bool has_vocab, int64_t Vd, int64_t V, int64_t rows) {
  return has_vocab && Vd < V && rows == Vd;
}

// The first `count` (<= n) indices of the n logits of `row` in torch.argmax's order
// (reference.argmax_order): NaNs first, then larger values, equal values (-0.0 == +0.0) and NaNs
// by the lower index. out[0] is the argmax, out[1] the argmax of the rest, and so on (the
// first step's alternatives). One partial sort by argmax_combine's rule: O(n log count).
inline void argmax_order(const void* row, DType dt, int64_t n, int64_t count, int64_t* out) {
  count = std::min(count, n);
  if (count <= 0) return;
  thread_local std::vector<ArgmaxResult> keys;
  keys.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    const float v = load_f32(row, dt, i);
    keys[size_t(i)] = ArgmaxResult{v, i, std::isnan(v)};
  }
  // a before b: argmax_combine picks a (indices are distinct, so this is a strict total order)
  std::partial_sort(keys.begin(), keys.begin() + count, keys.end(), [](const ArgmaxResult& a, const ArgmaxResult& b) {
    return a.idx != b.idx && argmax_combine(a, b).idx == a.idx;
  });
  for (int64_t i = 0; i < count; ++i) out[i] = keys[size_t(i)].idx;
}

template <class ParallelFor>
void head_draft(const HeadDraftArgs& a, int threads, Isa isa, ParallelFor&& pf) {
  const int64_t B = a.B, H = a.H, D = a.D, es = dtype_size(a.dtype);
  if (B == 0 || a.K == 0) return;
  LayerPass<ParallelFor> p(B, 1, H, a.Hq, a.Hkv, D, a.I, a.dtype, a.eps, false, isa, pf);
  std::vector<float> in = p.buffer(B * 2 * H), x = p.buffer(B * H), e = p.buffer(B * H), normed = p.buffer(B * H),
                     logits = p.buffer(B * a.Vd), cos(size_t(B * D)), sin(size_t(B * D));
  // The head's own keys/values of the steps so far, [B, Hkv, K, D] per block.
  std::vector<std::vector<float>> local_k, local_v;
  for (int64_t i = 0; i < a.blocks; ++i) {
    local_k.push_back(p.buffer(B * a.Hkv * a.K * D));
    local_v.push_back(p.buffer(B * a.Hkv * a.K * D));
  }
  const int64_t local_strides[4] = {a.Hkv * a.K * D, a.K * D, D, 1};
  // An x8 LM head read through the draft vocabulary: its rows gathered into whole x8 groups
  // once per call (x8_gather), not once per step; the same bytes per column, the same bits.
  // (For Gemma 3's 4096 of 262,144 rows that gather is most of a short draft's time: callers
  // that draft many times pass the rows gathered, lm_head_drafted.)
  DecoderMatrix lm_head = a.lm_head;
  const int64_t* vocab = a.lm_head_drafted ? nullptr : a.draft_vocab;
  thread_local std::vector<uint8_t> draft_rows;
  if (is_x8(lm_head.dtype) && vocab && a.Vd > 0) {
    const int64_t group = kX8Rows * block_row_bytes(lm_head.dtype, H);
    draft_rows.resize(size_t((a.Vd + kX8Rows - 1) / kX8Rows * group));
    for (int64_t n = 0; n < a.Vd; n += kX8Rows)
      x8_gather(lm_head.dtype, static_cast<const uint8_t*>(lm_head.w), lm_head.stride, H, vocab, n, a.Vd,
                draft_rows.data() + n / kX8Rows * group);
    lm_head.w = draft_rows.data(), lm_head.stride = block_row_bytes(lm_head.dtype, H), vocab = nullptr;
  }
  std::vector<int64_t> token(a.token, a.token + B), step(static_cast<size_t>(B));  // step: j for every request
  std::vector<int64_t> order;  // the first step's argmax_order (alternatives)
  const void* h = a.hidden;
  char* const in_bytes = reinterpret_cast<char*>(in.data());

  for (int64_t j = 0; j < a.K; ++j) {
    std::fill(step.begin(), step.end(), j);
    gather_angles(a.rope_cos, a.cache_lens, j, B, 1, D, cos.data());
    gather_angles(a.rope_sin, a.cache_lens, j, B, 1, D, sin.data());
    for (int64_t b = 0; b < B; ++b)
      embedding_row(a.embedding, H, token[size_t(b)], a.dtype, reinterpret_cast<char*>(e.data()) + b * H * es);
    // in = [norm(embedding) ; norm(h)] per row: each norm writes its half of the rows.
    p.norm(e.data(), nullptr, nullptr, a.embed_norm, in_bytes, 2 * H);
    p.norm(h, nullptr, nullptr, a.hidden_norm, in_bytes + H * es, 2 * H);
    p.project(a.proj, in.data(), 2 * H, H, x.data());
    p.x = x.data();
    void* const out = normed.data();  // the norm in front of the draft LM head
    p.norm(x.data(), nullptr, nullptr, a.blocks > 0 ? a.block[0].input_norm : a.out_norm,
           a.blocks > 0 ? p.h.data() : out);
    for (int64_t i = 0; i < a.blocks; ++i) {
      auto attend =
          [&] {  // this step's k/v heads into the local segment (at position j), then attend over cache + segment
            p.append_heads(local_k[size_t(i)].data(), local_strides, local_v[size_t(i)].data(), local_strides, a.K,
                           step.data());
            AttentionArgs at = p.attention_args(a.k_cache, a.k_stride, a.v_cache, a.v_stride, a.cache_lens);
            set_local_views(at, j + 1, local_k[size_t(i)].data(), local_strides, local_v[size_t(i)].data(),
                            local_strides);
            attention(at, threads, isa, pf);
          };
      const bool last = i + 1 == a.blocks;
      p.layer(a.block[i], cos.data(), sin.data(), attend, last ? a.out_norm : a.block[i + 1].input_norm,
              last ? out : p.h.data());
    }
    h = p.x;  // the next step's hidden state: the head's residual stream
    p.project(lm_head, out, H, a.Vd, logits.data(), vocab);
    for (int64_t b = 0; b < B; ++b) {  // torch.argmax over the logits as rounded to dt
      const char* row = reinterpret_cast<const char*>(logits.data()) + b * a.Vd * es;
      const ArgmaxResult best = argmax_range(row, a.dtype, 1, 0, a.Vd, isa);
      token[size_t(b)] = a.draft_vocab ? a.draft_vocab[best.idx] : best.idx;
      const int64_t width = a.K + a.alternatives;
      a.drafts[b * width + j] = token[size_t(b)];
      if (a.probs) a.probs[b * a.K + j] = draft_probability(row, a.dtype, a.Vd, best.idx);
      if (j > 0 || a.alternatives == 0) continue;
      // The next best after best.idx, in torch.argmax's order (draft-vocabulary indices): order[0]
      // is best.idx (the same rule), skipped by value so the m drafts are always the m after it.
      order.resize(size_t(a.alternatives + 1));
      argmax_order(row, a.dtype, a.Vd, a.alternatives + 1, order.data());
      int64_t m = 0;
      for (const int64_t i : order)
        if (i != best.idx && m < a.alternatives) a.drafts[b * width + a.K + m++] = a.draft_vocab ? a.draft_vocab[i] : i;
    }
  }
}

}  // namespace mtp
