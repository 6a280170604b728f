/* One speculative decoding step through the C API of libmtp_core, on a tiny model with made-up
 * weights (2 layers, hidden 32, vocabulary 64): prefill a prompt with mtp_decoder_layers (its
 * embedding rows gathered by mtp_embedding), take the next token from the LM head (mtp_linear,
 * then mtp_verify with no drafts: its argmax), let an MTP head draft 2 tokens (mtp_head_draft,
 * reading layer 1's cache in place), verify them in one pass over 3 positions
 * (mtp_decoder_layers + mtp_linear + mtp_verify), and check the committed tokens against 3 plain
 * one-token greedy steps: they are the same, bit for bit, whatever the drafts (the head here is
 * untrained, so its drafts are shown beside drafts that are right by construction). Only the
 * token values depend on the instruction set. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "mtp/mtp.h"

enum { H = 32, Hq = 2, Hkv = 1, D = 16, I = 48, LAYERS = 2, V = 64, L = 16, P = 16, PROMPT = 4, K = 2 };
enum { QKV = (Hq + 2 * Hkv) * D, LAYER_SIZE = H + QKV * H + H * Hq * D + H + 2 * I * H + H * I };

static float embedding[V * H], layers[LAYERS * LAYER_SIZE], final_norm[H], head[4 * H + 2 * H * H + LAYER_SIZE];
static float rope_cos[P * D], rope_sin[P * D];
static float k_cache[LAYERS * L * Hkv * D], v_cache[LAYERS * L * Hkv * D]; /* [layers, B=1, Hkv, L, D] */

static float made_up(unsigned* s, float scale) { /* a fixed pseudo-random sequence in [-scale, scale) */
  *s = *s * 1664525u + 1013904223u;
  return scale * ((float)(*s >> 8) / 8388608.0f - 1.0f);
}

static mtp_tensor t1(float* p, int64_t n) { return mtp_contiguous(p, MTP_FLOAT32, 1, &n); }
static mtp_tensor t2(float* p, int64_t a, int64_t b) {
  int64_t s[2];
  s[0] = a;
  s[1] = b;
  return mtp_contiguous(p, MTP_FLOAT32, 2, s);
}
static mtp_tensor t3(float* p, int64_t a, int64_t b, int64_t c) {
  int64_t s[3];
  s[0] = a;
  s[1] = b;
  s[2] = c;
  return mtp_contiguous(p, MTP_FLOAT32, 3, s);
}

/* The 6 views of one decoder layer stored at w (input_norm, qkv, o_proj, post_norm, gate_up, down_proj). */
static float* layer_views(float* w, mtp_tensor* out) {
  out[0] = t1(w, H);
  w += H;
  out[1] = t2(w, QKV, H);
  w += QKV * H;
  out[2] = t2(w, H, Hq * D);
  w += H * Hq * D;
  out[3] = t1(w, H);
  w += H;
  out[4] = t2(w, 2 * I, H);
  w += 2 * I * H;
  out[5] = t2(w, H, I);
  w += H * I;
  return w;
}

static mtp_tensor backbone[6 * LAYERS + 1];
static const mtp_tensor* backbone_ptrs[6 * LAYERS + 1];

static int check(mtp_status st) {
  if (st != MTP_OK) fprintf(stderr, "%s: %s\n", mtp_status_name(st), mtp_last_error());
  return st == MTP_OK;
}

/* Runs T tokens at positions *len.. through the backbone: the final hidden states in hidden
 * [T, H] and the logits in logits [T, V] (the LM head is the tied embedding). Advances *len. */
static int forward(const int64_t* tokens, int64_t T, int64_t* len, float* hidden, float* logits) {
  float x[(K + 1 > PROMPT ? K + 1 : PROMPT) * H];
  int64_t cache_sizes[5] = {LAYERS, 1, Hkv, L, D}, one = 1;
  mtp_tensor xv = t3(x, 1, T, H), x2 = t2(x, T, H), hv = t3(hidden, 1, T, H);
  mtp_tensor ids = mtp_contiguous(tokens, MTP_INT64, 1, &T), lens = mtp_contiguous(len, MTP_INT64, 1, &one);
  mtp_tensor kc = mtp_contiguous(k_cache, MTP_FLOAT32, 5, cache_sizes);
  mtp_tensor vc = mtp_contiguous(v_cache, MTP_FLOAT32, 5, cache_sizes);
  mtp_tensor cos_view = t2(rope_cos, P, D), sin_view = t2(rope_sin, P, D);
  mtp_tensor h2 = t2(hidden, T, H), emb = t2(embedding, V, H), lv = t2(logits, T, V);
  if (!check(mtp_embedding(&ids, &emb, NULL, &x2)) ||
      !check(mtp_decoder_layers(&xv, &kc, &vc, &lens, &cos_view, &sin_view, backbone_ptrs, 6 * LAYERS + 1, NULL, 0, Hq,
                                1e-5f, 0, &hv, 1)) ||
      !check(mtp_linear(&h2, &emb, NULL, &lv, 1)))
    return 0;
  *len += T;
  return 1;
}

/* mtp_verify of drafts[0..k) against logits [k+1, V]: returns the accepted count n and the
 * committed tokens (the n drafts, then the backbone's own) in out[0..n]; -1 on error. With
 * k = 0 it is the argmax of one row. */
static int64_t verify(const int64_t* drafts, int64_t k, float* logits, int64_t* out) {
  int64_t ds[2], ls[3], os[2], one = 1, accepted = 0;
  mtp_tensor d, l, a, o;
  ds[0] = 1;
  ds[1] = k;
  ls[0] = 1;
  ls[1] = k + 1;
  ls[2] = V;
  os[0] = 1;
  os[1] = k + 1;
  d = mtp_contiguous(drafts, MTP_INT64, 2, ds);
  l = mtp_contiguous(logits, MTP_FLOAT32, 3, ls);
  a = mtp_contiguous(&accepted, MTP_INT64, 1, &one);
  o = mtp_contiguous(out, MTP_INT64, 2, os);
  return check(mtp_verify(&d, &l, NULL, -1, &a, &o, 1)) ? accepted : -1;
}

int main(void) {
  unsigned s = 1;
  int64_t i, j, prompt[PROMPT] = {1, 5, 9, 13}, len = 0, greedy[K + 2], t0, pos, n;
  int64_t drafts[K], committed[K + 1], one = 1, layer_sizes[4] = {1, Hkv, L, D}, draft_sizes[2] = {1, K};
  float hidden[PROMPT * H], logits[PROMPT * V], *w;
  mtp_tensor head_views[10], kc, vc, lens, hv, tok, cos_view, sin_view, emb, dv;
  const mtp_tensor* head_ptrs[10];

  for (i = 0; i < V * H; ++i) embedding[i] = made_up(&s, 1.0f);
  for (i = 0; i < LAYERS * LAYER_SIZE; ++i) layers[i] = made_up(&s, 0.2f);
  for (i = 0; i < (int64_t)(sizeof head / sizeof head[0]); ++i) head[i] = made_up(&s, 0.2f);
  for (i = 0; i < H; ++i) final_norm[i] = 1.0f;
  for (i = 0; i < P; ++i)
    for (j = 0; j < D / 2; ++j) { /* position i, frequency 10000^(-2j/D), half-split layout */
      const double a = (double)i * pow(10000.0, -2.0 * (double)j / D);
      rope_cos[i * D + j] = rope_cos[i * D + j + D / 2] = (float)cos(a);
      rope_sin[i * D + j] = rope_sin[i * D + j + D / 2] = (float)sin(a);
    }
  for (w = layers, i = 0; i < LAYERS; ++i) w = layer_views(w, backbone + 6 * i);
  backbone[6 * LAYERS] = t1(final_norm, H);
  for (i = 0; i < 6 * LAYERS + 1; ++i) backbone_ptrs[i] = &backbone[i];

  /* Prefill; the token after the prompt is the argmax of the last row. */
  if (!forward(prompt, PROMPT, &len, hidden, logits) || verify(NULL, 0, logits + (PROMPT - 1) * V, &t0) < 0) return 1;
  pos = len;

  /* Plain greedy: K + 1 one-token steps; then the cache is set back to the prompt. */
  greedy[0] = t0;
  for (i = 0; i <= K; ++i) {
    float h[H], l[V];
    if (!forward(greedy + i, 1, &len, h, l) || verify(NULL, 0, l, greedy + i + 1) < 0) return 1;
  }

  /* The head drafts K tokens from the prompt's last hidden state, reading layer 1's cache. */
  w = head;
  head_views[0] = t1(w, H);
  w += H; /* embed_norm */
  head_views[1] = t1(w, H);
  w += H; /* hidden_norm */
  head_views[2] = t2(w, H, 2 * H);
  w += 2 * H * H;                     /* proj */
  w = layer_views(w, head_views + 3); /* one block */
  head_views[9] = t1(w, H);           /* out_norm */
  for (i = 0; i < 10; ++i) head_ptrs[i] = &head_views[i];
  len = pos;
  kc = mtp_contiguous(k_cache + 1 * L * Hkv * D, MTP_FLOAT32, 4, layer_sizes);
  vc = mtp_contiguous(v_cache + 1 * L * Hkv * D, MTP_FLOAT32, 4, layer_sizes);
  lens = mtp_contiguous(&len, MTP_INT64, 1, &one);
  hv = t2(hidden + (PROMPT - 1) * H, 1, H);
  tok = mtp_contiguous(&t0, MTP_INT64, 1, &one);
  cos_view = t2(rope_cos, P, D);
  sin_view = t2(rope_sin, P, D);
  emb = t2(embedding, V, H);
  dv = mtp_contiguous(drafts, MTP_INT64, 2, draft_sizes);
  if (!check(mtp_head_draft(&hv, &tok, &kc, &vc, &lens, &cos_view, &sin_view, &emb, NULL, head_ptrs, 10, &emb, NULL,
                            NULL, K, Hq, 1e-5f, &dv, 1)))
    return 1;

  /* Verify [t0, drafts] in one pass: the head's drafts, then drafts right by construction. */
  for (j = 0; j < 2; ++j) {
    const int64_t* d = j == 0 ? drafts : greedy + 1;
    float h[(K + 1) * H], l[(K + 1) * V];
    int64_t tokens[K + 1];
    int same = 1;
    len = pos;
    tokens[0] = t0;
    memcpy(tokens + 1, d, sizeof(int64_t) * K);
    if (!forward(tokens, K + 1, &len, h, l) || (n = verify(d, K, l, committed)) < 0) return 1;
    len = pos + 1 + n; /* keep t0 and the accepted drafts: the rest is dropped by length */
    for (i = 0; i <= n; ++i) same &= committed[i] == greedy[i + 1];
    printf("%s drafts: %lld of %d accepted, one pass commits %lld token(s), %s plain greedy\n",
           j == 0 ? "head" : "right", (long long)n, K, (long long)(n + 1), same ? "the same as" : "NOT the same as");
    if (!same) return 1;
  }
  return 0;
}
