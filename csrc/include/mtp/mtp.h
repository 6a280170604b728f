/* mtp.h: the C API of the torch-free core (libmtp_core). Plain C (C99 and later) and C++.
 *
 * Arrays are passed as mtp_tensor views: a data pointer, a dtype, sizes and strides in
 * elements (any non-negative strides: slices of bigger buffers are fine, nothing is copied).
 * Every function validates all its arguments and returns a status; it never aborts or throws.
 * On failure mtp_last_error() gives a message naming the function, the argument, what was
 * expected and what came, and the outputs are left untouched (all checks precede any write).
 *
 * The kernels are the same ones the torch ops (torch.ops.mtp.*) run: same results, bit for bit.
 *
 * Sizes: every product or sum of sizes and counts a check forms is done in checked int64
 * arithmetic; one that would overflow is MTP_ERROR_INVALID_ARGUMENT naming the argument.
 *
 * Aliasing: an output (a view the call writes: out, y, accepted, out_tokens, drafts, and the
 * caches of mtp_cache_append and mtp_decoder_layers(_tree)) must not have overlapping
 * elements (no stride 0 over a size > 1: expanded views are rejected) and must share no memory
 * with any other argument, input or output. Two views share memory when their byte ranges
 * [first byte, last byte] intersect, even if their elements interleave. Violations are
 * MTP_ERROR_INVALID_ARGUMENT naming both views; nothing is written.
 *
 * Scalars: float arguments (scale, eps) are checked as the float32 the kernels use: finite
 * (eps also >= 0).
 *
 * Threads: num_threads is in [0, MTP_MAX_THREADS]; 0 means one per hardware thread, capped at
 * MTP_MAX_THREADS. Larger values are MTP_ERROR_INVALID_ARGUMENT. The process-wide pool never
 * holds more than MTP_MAX_THREADS - 1 workers. fork() is supported: a child process starts a
 * fresh pool on its first threaded call (the parent's workers do not exist in the child).
 */
#ifndef MTP_MTP_H_
#define MTP_MTP_H_

#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define MTP_API __attribute__((visibility("default")))
#else
#define MTP_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mtp_status {
  MTP_OK = 0,
  MTP_ERROR_NULL_POINTER = 1,      /* a required pointer is NULL */
  MTP_ERROR_INVALID_ARGUMENT = 2,  /* wrong rank, size, stride or value */
  MTP_ERROR_UNSUPPORTED_DTYPE = 3, /* unknown dtype, or one the argument does not take */
  MTP_ERROR_UNSUPPORTED = 4,       /* e.g. an instruction set this CPU lacks */
  MTP_ERROR_OUT_OF_MEMORY = 5,
  MTP_ERROR_INTERNAL = 6
} mtp_status;

/* Element types. The values are part of the ABI. */
typedef enum mtp_dtype {
  MTP_FLOAT32 = 0,
  MTP_BFLOAT16 = 1,
  MTP_FLOAT16 = 2,
  MTP_INT32 = 3,
  MTP_INT64 = 4,
  MTP_INT8 = 5, /* int8 weights of mtp_linear_q8 */
  /* GGUF block-quantized weights, read in place exactly as stored in the .gguf file:
   * 100 + the GGML type number. A weight view of a block dtype has sizes [N, K] in ELEMENTS
   * (the logical shape; K a multiple of the block: 32, or 256 for the K-quants), strides[0] =
   * BYTES between rows (>= the row's K / block * block-bytes; a tensor's rows are packed in the
   * file, so that row size) and strides[1] = 1; data points to the first row's first block.
   * Weights only (mtp_linear, the matrices of mtp_decoder_layers and mtp_head_draft, the table of
   * mtp_embedding); a product with one quantizes each activation row to int8 in blocks of 32 and
   * sums in a fixed order (mtp/gguf.h): a row's bits never depend on M, num_threads or the
   * instruction set. */
  MTP_Q4_0 = 102, /* 18 bytes per 32: fp16 d, 16 bytes of nibbles */
  MTP_Q4_1 = 103, /* 20 bytes per 32: fp16 d, fp16 m, 16 bytes of nibbles */
  MTP_Q5_0 = 106, /* 22 bytes per 32: fp16 d, 4 bytes of 5th bits, 16 bytes of nibbles */
  MTP_Q8_0 = 108, /* 34 bytes per 32: fp16 d, 32 int8 */
  MTP_Q4_K = 112, /* 144 bytes per 256 */
  MTP_Q6_K = 114, /* 210 bytes per 256 */
  /* The x8 layout of Q4_0, Q4_1, Q8_0, Q4_K, Q6_K (mtp/gguf.h): the same bytes as the file's
   * rows in a new order, 8 rows interleaved (rows 8g..8g+7 take 8 x row bytes; in them block b
   * holds the 8 rows' scales, then their values in 4-byte lanes), so the SIMD kernels get 8 columns per
   * vector. Made from the file's rows by mtp_gguf_repack_x8. A weight view as above (sizes in
   * elements, strides {row bytes, 1}: mtp_gguf_matrix) with N a multiple of 8 and the rows
   * contiguous (strides[0] = the row's bytes exactly). The product's bits are exactly those of
   * the file layout (the same weight given as MTP_Q4_0 / ... / MTP_Q6_K). */
  MTP_Q4_0_X8 = 202,
  MTP_Q4_1_X8 = 203,
  MTP_Q8_0_X8 = 208,
  MTP_Q4_K_X8 = 212,
  MTP_Q6_K_X8 = 214
} mtp_dtype;

#define MTP_MAX_DIMS 6

/* The largest num_threads any call takes (see "Threads" above). */
#define MTP_MAX_THREADS 256

/* A strided view. dtype is an int32_t holding an mtp_dtype, so that a bad value can be
 * reported rather than being undefined behaviour. Inputs are only read through `data`. */
typedef struct mtp_tensor {
  void* data;
  int32_t dtype;
  int32_t ndim;
  int64_t sizes[MTP_MAX_DIMS];
  int64_t strides[MTP_MAX_DIMS]; /* in elements (a block dtype's strides[0]: bytes, see mtp_dtype) */
} mtp_tensor;

/* A row-major contiguous view of `ndim` (<= MTP_MAX_DIMS) sizes (float and integer dtypes;
 * a block dtype's view: mtp_gguf_matrix). */
static inline mtp_tensor mtp_contiguous(const void* data, mtp_dtype dtype, int32_t ndim, const int64_t* sizes) {
  mtp_tensor t;
  int32_t d;
  int64_t stride = 1;
  t.data = (void*)data;
  t.dtype = (int32_t)dtype;
  t.ndim = ndim;
  for (d = 0; d < MTP_MAX_DIMS; ++d) {
    t.sizes[d] = 0;
    t.strides[d] = 0;
  }
  for (d = ndim - 1; d >= 0 && d < MTP_MAX_DIMS; --d) {
    t.sizes[d] = sizes[d];
    t.strides[d] = stride;
    /* saturates instead of overflowing: the call then reports the view as too large */
    stride = sizes[d] > 0 && stride > INT64_MAX / sizes[d] ? INT64_MAX : stride * (sizes[d] > 0 ? sizes[d] : 0);
  }
  return t;
}

/* A [rows, cols] weight view of a block dtype whose rows are packed, as a .gguf file stores a
 * tensor: strides {row bytes, 1}, row bytes = cols / block elements * block bytes (0 when the
 * dtype is not a block dtype or cols not a multiple of its block: the call using the view then
 * reports it); an x8 dtype: its file type's row bytes (the view of mtp_gguf_repack_x8's dst).
 * Any other dtype: mtp_contiguous's [rows, cols] view. */
static inline mtp_tensor mtp_gguf_matrix(const void* data, mtp_dtype dtype, int64_t rows, int64_t cols) {
  int64_t elems = 0, bytes = 0;
  mtp_tensor t;
  int32_t d;
  switch (dtype) {
    case MTP_Q4_0:
    case MTP_Q4_0_X8:
      elems = 32;
      bytes = 18;
      break;
    case MTP_Q4_1:
    case MTP_Q4_1_X8:
      elems = 32;
      bytes = 20;
      break;
    case MTP_Q5_0:
      elems = 32;
      bytes = 22;
      break;
    case MTP_Q8_0:
    case MTP_Q8_0_X8:
      elems = 32;
      bytes = 34;
      break;
    case MTP_Q4_K:
    case MTP_Q4_K_X8:
      elems = 256;
      bytes = 144;
      break;
    case MTP_Q6_K:
    case MTP_Q6_K_X8:
      elems = 256;
      bytes = 210;
      break;
    default: break;
  }
  t.data = (void*)data;
  t.dtype = (int32_t)dtype;
  t.ndim = 2;
  for (d = 0; d < MTP_MAX_DIMS; ++d) {
    t.sizes[d] = 0;
    t.strides[d] = 0;
  }
  t.sizes[0] = rows;
  t.sizes[1] = cols;
  t.strides[0] = !elems ? cols : cols % elems == 0 ? cols / elems * bytes : 0;
  t.strides[1] = 1;
  return t;
}

/* Greedy chain verification (torch.ops.mtp.verify).
 *   draft_tokens  [B, K]      int32 | int64
 *   target_logits [B, K+1, V] float32 | bfloat16 | float16, V >= 1, any strides
 *   num_drafts    [B]         int32 | int64, each in [0, K]; NULL: all K
 *   accepted      [B]         output, dtype of draft_tokens
 *   out_tokens    [B, K+1]    output, dtype of draft_tokens
 * accepted[b] = the longest prefix n <= num_drafts[b] with draft == argmax of the logits
 * (ties, NaN and -0.0 as torch.argmax); out_tokens[b] = the n drafts, the backbone's token at
 * position n, then pad_id. A draft id outside [0, V) never matches.
 * num_threads: 1 = serial on the calling thread, 0 = one per hardware thread; results never
 * depend on it. Threads come from a process-wide pool of parked workers (started on first use;
 * a call made while another thread's call holds the pool starts threads of its own). */
MTP_API mtp_status mtp_verify(const mtp_tensor* draft_tokens, const mtp_tensor* target_logits,
                              const mtp_tensor* num_drafts, int64_t pad_id, const mtp_tensor* accepted,
                              const mtp_tensor* out_tokens, int32_t num_threads);

/* mtp_verify in the flattened ragged layout of continuous batching (torch.ops.mtp.verify_ragged):
 *   draft_token_ids     [N]         int32 | int64: every request's drafts, one after the other
 *   cu_num_draft_tokens [B]         int32 | int64, inclusive cumulative counts: request b has
 *                                   K_b = cu[b] - cu[b-1] drafts (cu[-1] = 0), non-decreasing, cu[B-1] = N
 *   target_logits       [N + B, V]  float32 | bfloat16 | float16, V >= 1, any strides: request b's
 *                                   K_b + 1 rows start at row cu[b-1] + b (the last: the bonus token)
 *   pad_id                          must fit the id dtype
 *   accepted            [B]         output, dtype of draft_token_ids
 *   out_tokens          [B, W]      output, dtype of draft_token_ids; W - 1 >= every K_b
 * Per request exactly mtp_verify of its K_b drafts and rows, its out_tokens row padded with
 * pad_id up to W. num_threads as mtp_verify. */
MTP_API mtp_status mtp_verify_ragged(const mtp_tensor* draft_token_ids, const mtp_tensor* cu_num_draft_tokens,
                                     const mtp_tensor* target_logits, int64_t pad_id, const mtp_tensor* accepted,
                                     const mtp_tensor* out_tokens, int32_t num_threads);

/* Lossless chain rejection sampling (torch.ops.mtp.verify_sampled): the emitted tokens follow
 * the target distribution softmax(logits / T) whatever the drafts are.
 *   draft_tokens  [B, K]      int32 | int64
 *   draft_probs   [B, K, V]   float32 | bfloat16 | float16, finite and >= 0: the distributions the
 *                             drafts were sampled from; NULL: one-hot (greedy) drafts
 *   target_logits [B, K+1, V] float32 | bfloat16 | float16, V >= 1, any strides
 *   temperature   [B]         float32, finite and >= 0 (0: greedy, the same result as mtp_verify)
 *   seeds         [B]         int64;  offsets [B] int64 or NULL (all 0)
 *   num_drafts, pad_id, accepted, out_tokens, num_threads: as mtp_verify
 * Randomness is keyed by (seeds[b], offsets[b] + position) only, so a request's tokens do not
 * depend on the batch, the thread count or the backend (torch CPU op, Triton). */
MTP_API mtp_status mtp_verify_sampled(const mtp_tensor* draft_tokens, const mtp_tensor* draft_probs,
                                      const mtp_tensor* target_logits, const mtp_tensor* temperature,
                                      const mtp_tensor* seeds, const mtp_tensor* offsets, const mtp_tensor* num_drafts,
                                      int64_t pad_id, const mtp_tensor* accepted, const mtp_tensor* out_tokens,
                                      int32_t num_threads);

/* mtp_verify_sampled against the filtered distribution of each request (vLLM's order after
 * the temperature: min_p, top_k, top_p; torch.ops.mtp.verify_sampled's top_k / top_p / min_p,
 * docs/ops/verify_sampled.md):
 *   top_k  [B]  int32 | int64, >= 0 (0: off): keep the top_k largest logits (ties at the cut all kept)
 *   top_p  [B]  float32 in (0, 1] (1: off): keep the smallest top set of mass >= top_p (ties kept)
 *   min_p  [B]  float32 in [0, 1) (0: off): keep p >= min_p * max p
 * each NULL: off for every request. The rest as mtp_verify_sampled (which is this with three NULLs). */
MTP_API mtp_status mtp_verify_sampled_filtered(const mtp_tensor* draft_tokens, const mtp_tensor* draft_probs,
                                               const mtp_tensor* target_logits, const mtp_tensor* temperature,
                                               const mtp_tensor* top_k, const mtp_tensor* top_p,
                                               const mtp_tensor* min_p, const mtp_tensor* seeds,
                                               const mtp_tensor* offsets, const mtp_tensor* num_drafts, int64_t pad_id,
                                               const mtp_tensor* accepted, const mtp_tensor* out_tokens,
                                               int32_t num_threads);

/* mtp_verify_sampled_filtered in the flattened ragged layout of mtp_verify_ragged
 * (torch.ops.mtp.verify_sampled_ragged):
 *   draft_token_ids, cu_num_draft_tokens, target_logits [N + B, V], pad_id, accepted [B],
 *   out_tokens [B, W] (W - 1 >= every K_b), num_threads: as mtp_verify_ragged
 *   draft_probs   [N, V]  float32 | bfloat16 | float16, finite and >= 0, or NULL (one-hot drafts):
 *                         row cu[b-1] + j is the distribution request b's draft j was sampled from
 *   temperature, top_k, top_p, min_p, seeds, offsets [B]: as mtp_verify_sampled_filtered
 * Request b's outputs are exactly mtp_verify_sampled_filtered's for that request alone (its
 * drafts, rows, q rows, seed, offset, filters), its out_tokens row padded with pad_id up to W. */
MTP_API mtp_status mtp_verify_sampled_ragged(const mtp_tensor* draft_token_ids, const mtp_tensor* draft_probs,
                                             const mtp_tensor* cu_num_draft_tokens, const mtp_tensor* target_logits,
                                             const mtp_tensor* temperature, const mtp_tensor* top_k,
                                             const mtp_tensor* top_p, const mtp_tensor* min_p, const mtp_tensor* seeds,
                                             const mtp_tensor* offsets, int64_t pad_id, const mtp_tensor* accepted,
                                             const mtp_tensor* out_tokens, int32_t num_threads);

/* accepted[b] = longest n <= num_drafts[b] with draft_tokens[b, t] == target_tokens[b, t] for
 * t < n (torch.ops.mtp.accept_prefix).
 *   draft_tokens [B, K] int32 | int64;  target_tokens [B, K+1] or [B, K] int32 | int64
 *   num_drafts   [B] int32 | int64 or NULL;  accepted [B] output, dtype of draft_tokens */
MTP_API mtp_status mtp_accept_prefix(const mtp_tensor* draft_tokens, const mtp_tensor* target_tokens,
                                     const mtp_tensor* num_drafts, const mtp_tensor* accepted);

/* Decode-style attention of a few queries over a strided KV cache, read in place
 * (torch.ops.mtp.head_attention). fp32 accumulation; each output row has the same bits
 * whatever T, B, the strides, num_threads and the other requests' lengths are.
 *   q          [B, T, Hq, D]   float32 | bfloat16 | float16, any strides
 *   k_cache    [B, Hkv, L, D]  q's dtype, any strides (e.g. a layer of a [layers, B, Lmax, Hkv, D]
 *   v_cache    [B, Hkv, L, D]  buffer seen as [B, Hkv, Lmax, D]); Hq a multiple of Hkv (GQA)
 *   cache_lens [B]             int32 | int64, each in [0, L]: only these first keys are read
 *   k_local, v_local [B, Hkv, S, D] q's dtype, or both NULL: an extra segment attended causally,
 *              the T queries being its last T positions (query t sees entries s <= S - T + t)
 *   scale      NULL: 1/sqrt(D)
 *   causal     0: every query sees all cache_lens[b] keys; 1: the queries are the last T cached
 *              positions (cache_lens[b] >= T) and query t sees keys [0, cache_lens[b] - T + t]
 *   out        [B, T, Hq, D]   output, q's dtype, any strides; a row with no visible key is 0, a
 *              row with a non-finite fp32 score or value among those it sees is all NaN (the same
 *              on every path; docs/ops/head_attention.md, "Extreme values") */
MTP_API mtp_status mtp_head_attention(const mtp_tensor* q, const mtp_tensor* k_cache, const mtp_tensor* v_cache,
                                      const mtp_tensor* cache_lens, const mtp_tensor* k_local,
                                      const mtp_tensor* v_local, const float* scale, int32_t causal,
                                      const mtp_tensor* out, int32_t num_threads);

/* mtp_head_attention with a sliding window (torch.ops.mtp.head_attention's window; Gemma 3's
 * local layers): window = 0 is mtp_head_attention exactly; window > 0 keeps each query to the
 * last `window` of the cache keys it would otherwise see: with causal, query t (at position
 * p = cache_lens[b] - T + t) sees keys p - window < j <= p; without, every query sees the last
 * `window` keys [cache_lens[b] - window, cache_lens[b]). Older keys are never read. Each row
 * has the bits of the same row computed alone (a verify pass row == its one-token step).
 *   window     >= 0; with k_local / v_local it must be 0 (MTP_ERROR_INVALID_ARGUMENT)
 *   the other arguments: as mtp_head_attention */
MTP_API mtp_status mtp_head_attention_window(const mtp_tensor* q, const mtp_tensor* k_cache, const mtp_tensor* v_cache,
                                             const mtp_tensor* cache_lens, const mtp_tensor* k_local,
                                             const mtp_tensor* v_local, const float* scale, int32_t causal,
                                             int64_t window, const mtp_tensor* out, int32_t num_threads);

/* Writes k_new[b, t] and v_new[b, t] into the caches at position cache_lens[b] + t, in place
 * (torch.ops.mtp.cache_append). Does not change cache_lens (the caller advances it; rejected
 * drafts are dropped by lowering it). If any request would pass the capacity L, nothing is
 * written and MTP_ERROR_INVALID_ARGUMENT names it.
 *   k_cache, v_cache [B, Hkv, L, D] output, float32 | bfloat16 | float16, any strides
 *   k_new, v_new     [B, T, Hkv, D] the caches' dtype, any strides
 *   cache_lens       [B] int32 | int64, each in [0, L] */
MTP_API mtp_status mtp_cache_append(const mtp_tensor* k_cache, const mtp_tensor* v_cache, const mtp_tensor* k_new,
                                    const mtp_tensor* v_new, const mtp_tensor* cache_lens, int32_t num_threads);

/* y[m, n] = sum_k x[m, k] * weight[n, k] (+ bias[n]) (torch.ops.mtp.linear on 2-D x), fp32
 * accumulation in a fixed order per element: row m's bits never depend on M or num_threads.
 *   x      [M, K] float32 | bfloat16 | float16, any strides
 *   weight [N, K] float32 | bfloat16 | float16, rows unit-stride (read in place); int8: mtp_linear_q8;
 *                 or a GGUF block dtype (MTP_Q4_0 .. MTP_Q6_K, read in place as stored: sizes in
 *                 elements, strides[0] in bytes, see mtp_dtype), K a multiple of its block; x is
 *                 then quantized to int8 per row in blocks of 32 (mtp/gguf.h's fixed order); or
 *                 an x8 layout (MTP_Q4_0_X8 ..: N a multiple of 8, rows contiguous), the bits of
 *                 its file type
 *   bias   [N]    float32 | bfloat16 | float16, or NULL
 *   y      [M, N] output, float32 or x's dtype (rounded to nearest even), any strides */
MTP_API mtp_status mtp_linear(const mtp_tensor* x, const mtp_tensor* weight, const mtp_tensor* bias,
                              const mtp_tensor* y, int32_t num_threads);

/* mtp_linear with weight-only int8 weights in blocks of 32 along K ("Q8", like ggml's Q8_0;
 * torch.ops.mtp.linear with weight_scale): weight element (n, k) = weight[n, k] *
 * weight_scale[n, k / 32]. Per element, each whole block's 32 products are summed in fp32, then
 * scaled and accumulated; a partial last block (K % 32) likewise. Row m's bits never depend on
 * M or num_threads.
 *   x            [M, K]            float32 | bfloat16 | float16, any strides
 *   weight       [N, K]            int8, rows unit-stride (read in place)
 *   weight_scale [N, ceil(K / 32)] float32, rows unit-stride (read in place)
 *   bias, y, num_threads: as mtp_linear */
MTP_API mtp_status mtp_linear_q8(const mtp_tensor* x, const mtp_tensor* weight, const mtp_tensor* weight_scale,
                                 const mtp_tensor* bias, const mtp_tensor* y, int32_t num_threads);

/* mtp_linear_q8 with the activations quantized too (torch.ops.mtp.linear with quantize_x):
 * each row of x in blocks of 32 along K gets scale = amax / 127 and int8 values
 * round_half_even(x / scale) (reference.quantize_rows_q8), then every block is an exact
 * int32 dot product, scaled by x scale * weight scale and accumulated in fp32 in a fixed
 * order: row m's bits never depend on M or num_threads. A NaN or infinity in a row of x makes
 * that row's outputs NaN. Integer dot instructions where the CPU has them (VNNI).
 *   arguments: as mtp_linear_q8 */
MTP_API mtp_status mtp_linear_q8dot(const mtp_tensor* x, const mtp_tensor* weight, const mtp_tensor* weight_scale,
                                    const mtp_tensor* bias, const mtp_tensor* y, int32_t num_threads);

/* Embedding rows (torch.ops.mtp.embedding, the same bits): out[i] = row tokens[i] of weight in fp32
 * (a Q8 row q * scale, a GGUF row dequantized as mtp/gguf.h does), rounded once to out's dtype:
 * mtp_decoder_layers' x, or the rows mtp_head_draft's embedding gives a token.
 *   tokens       [n] int32 | int64, any stride, each in [0, V)
 *   weight       [V, H] as mtp_head_draft's embedding: float32 | bfloat16 with unit-stride rows, or
 *                int8 with weight_scale, or a GGUF block dtype (H a multiple of its block; an x8
 *                layout: V a multiple of 8, rows contiguous)
 *   weight_scale [V, ceil(H/32)] float32, rows unit-stride, with an int8 weight; else NULL
 *   out          [n, H] output float32 | bfloat16, any strides
 * One thread (a step gathers a few rows). */
MTP_API mtp_status mtp_embedding(const mtp_tensor* tokens, const mtp_tensor* weight, const mtp_tensor* weight_scale,
                                 const mtp_tensor* out);

/* A whole Llama-family decoder pass over T new tokens per request (torch.ops.mtp.decoder_layers):
 * per layer RMSNorm, the fused q/k/v projection, RoPE, the cache append, causal attention over the
 * cache, the output projection and residual add, the SiLU-gated MLP; then the final norm. The same
 * kernels in the same order as the torch op, so the same bits, and a pass over T tokens gives each
 * token the bits of T one-token passes (speculative decoding stays exact). The new keys/values go to
 * positions cache_lens[b] + t; cache_lens is not advanced (the caller owns it, and drops rejected
 * drafts by lowering it).
 *   x                [B, T, H]              float32 | bfloat16: the token embeddings, any strides
 *   k_cache, v_cache [layers, B, Hkv, L, D] x's dtype, any strides, written in place
 *   cache_lens       [B] int32 | int64, with cache_lens[b] + T <= L and <= P
 *   rope_cos, rope_sin [P, D] float32: the angles of position p in row p (half-split layout)
 *   weights          num_weights = 6 * layers + 1 views: per layer input_norm [H], qkv
 *                    [(Hq + 2 Hkv) D, H] (the q heads' rows, then k's, then v's), o_proj [H, Hq D],
 *                    post_norm [H], gate_up [2I, H] (the gate rows, then the up rows), down_proj
 *                    [H, I]; then the final norm [H]. Norms in x's dtype, unit stride; matrices
 *                    float32 | bfloat16 with unit-stride rows, or all int8 (Q8) with their scales;
 *                    without scales each matrix may also be a GGUF block dtype (any mix of them and
 *                    float: e.g. Q4_K and Q6_K), its K (H, Hq D or I) a multiple of its block (an x8
 *                    layout: also its N a multiple of 8, rows contiguous)
 *   weight_scales    num_weight_scales = 0 (float matrices) or 4 * layers views: the Q8 scales
 *                    [N, ceil(K/32)] float32 of each layer's qkv, o_proj, gate_up, down_proj
 *   num_heads        Hq, a multiple of Hkv; D even;  eps finite and >= 0
 *   quantize_x       1: int8 weights take int8 activations too (as mtp_linear_q8dot)
 *   out              [B, T, H] output, x's dtype, any strides: the final normed hidden states
 * num_threads as mtp_verify. */
MTP_API mtp_status mtp_decoder_layers(const mtp_tensor* x, const mtp_tensor* k_cache, const mtp_tensor* v_cache,
                                      const mtp_tensor* cache_lens, const mtp_tensor* rope_cos,
                                      const mtp_tensor* rope_sin, const mtp_tensor* const* weights, int32_t num_weights,
                                      const mtp_tensor* const* weight_scales, int32_t num_weight_scales,
                                      int64_t num_heads, float eps, int32_t quantize_x, const mtp_tensor* out,
                                      int32_t num_threads);

/* mtp_decoder_layers over a tree of tokens per request (torch.ops.mtp.decoder_layers with
 * tree_parents; the drafts of several first candidates verified in one pass):
 *   tree_parents     [B, T] int32 | int64, any strides: row 0 of each request -1 (the root), row
 *                    t's parent an earlier row; NULL: a chain (mtp_decoder_layers)
 * Token t is stored at cache_lens[b] + t but takes position cache_lens[b] + its depth and attends to
 * the cache and its own path from the root: it gets the bits of a chain of its path's tokens (output
 * and cache entry). Other arguments as mtp_decoder_layers. */
MTP_API mtp_status mtp_decoder_layers_tree(const mtp_tensor* x, const mtp_tensor* k_cache, const mtp_tensor* v_cache,
                                           const mtp_tensor* cache_lens, const mtp_tensor* rope_cos,
                                           const mtp_tensor* rope_sin, const mtp_tensor* const* weights,
                                           int32_t num_weights, const mtp_tensor* const* weight_scales,
                                           int32_t num_weight_scales, int64_t num_heads, float eps, int32_t quantize_x,
                                           const mtp_tensor* tree_parents, const mtp_tensor* out, int32_t num_threads);

/* Gemma 3's decoder pass (torch.ops.mtp.decoder_layers with layer="gemma3"; the same bits): per
 * layer RMSNorm, the fused q/k/v projection, RMS norms of each q and k head, RoPE (the local tables
 * for a layer with a window), the cache append, attention over the cache (the layer's sliding window,
 * attention_scale), the output projection, its norm and the residual add, then the pre-MLP norm, the
 * GELU-tanh-gated MLP, its norm and the residual add; then the final norm (norms scale by w, as
 * mtp_decoder_layers': fold Gemma's 1 + w in when loading). A pass over T tokens gives each token
 * the bits of T one-token passes.
 *   rope_cos_local, rope_sin_local [P_local, D] float32, both or NULL: the angles of the layers with
 *                    a window (needed when one has), with cache_lens[b] + T <= P_local
 *   windows          [layers] values >= 0, or NULL: layer i's sliding window (the keys a query sees,
 *                    itself included; 0: global)
 *   weights          num_weights = 10 * layers + 1 views: per layer input_norm [H], qkv, q_norm [D],
 *                    k_norm [D], o_proj, post_attention_norm [H], pre_feedforward_norm [H], gate_up,
 *                    down_proj, post_feedforward_norm [H] (matrices as mtp_decoder_layers'); then the
 *                    final norm [H]
 *   weight_scales    0 or 4 * layers views, as mtp_decoder_layers (qkv, o_proj, gate_up, down_proj)
 *   attention_scale  finite: the scale of q.k (Gemma 3: query_pre_attn_scalar ** -0.5); 0: 1/sqrt(D)
 *   tree_parents     NULL (a chain) or as mtp_decoder_layers_tree
 * Other arguments as mtp_decoder_layers. */
MTP_API mtp_status mtp_decoder_layers_gemma3(const mtp_tensor* x, const mtp_tensor* k_cache, const mtp_tensor* v_cache,
                                             const mtp_tensor* cache_lens, const mtp_tensor* rope_cos,
                                             const mtp_tensor* rope_sin, const mtp_tensor* rope_cos_local,
                                             const mtp_tensor* rope_sin_local, const int64_t* windows,
                                             const mtp_tensor* const* weights, int32_t num_weights,
                                             const mtp_tensor* const* weight_scales, int32_t num_weight_scales,
                                             int64_t num_heads, float eps, float attention_scale, int32_t quantize_x,
                                             const mtp_tensor* tree_parents, const mtp_tensor* out,
                                             int32_t num_threads);

/* The MTP head's k draft steps in one call (torch.ops.mtp.head_draft, the same drafts): per step
 * the embedding of the current token and the last hidden state, each normed, concatenated and
 * projected; the head's blocks (decoder layers whose attention reads one backbone layer's cache in
 * place, plus the head's own keys/values of the steps so far); the draft LM head (only the draft
 * vocabulary's rows of lm_head, read in place, or those rows gathered once by the caller) and its argmax.
 *   hidden           [B, H] float32 | bfloat16, any strides: the backbone's last hidden state
 *   token            [B] int32 | int64 in [0, V): the backbone's next token (at cache_lens[b])
 *   k_cache, v_cache [B, Hkv, L, D] hidden's dtype, any strides: the backbone layer the head reads
 *   cache_lens       [B] int32 | int64 in [0, L], with cache_lens[b] + k <= P
 *   rope_cos, rope_sin [P, D] float32 (as mtp_decoder_layers)
 *   embedding        [V, H] float32 | bfloat16 with unit-stride rows, or int8 with embedding_scale
 *                    [V, ceil(H/32)] float32 (else NULL), or a GGUF block dtype (H a multiple of its
 *                    block; an x8 layout: V a multiple of 8): the token's row dequantized in fp32,
 *                    then rounded to hidden's dtype
 *   weights          num_weights = 4 + 6 * blocks views: embed_norm [H], hidden_norm [H], proj
 *                    [H, 2H], each block's 6 tensors as in mtp_decoder_layers, then out_norm [H];
 *                    matrices float or GGUF block dtypes (no int8); norms in hidden's dtype, unit stride
 *   lm_head          [V, H] as embedding, with lm_head_scale (or NULL); or, with a draft_vocab of
 *                    Vd < V tokens, [Vd, H]: its rows gathered once (row i is token draft_vocab[i]'s), so
 *                    that a caller drafting many times does not pay for the gather on every call
 *   draft_vocab      [Vd] int32 | int64 token ids in [0, V) (rows of lm_head), or NULL: all V
 *   k                draft steps >= 0;  num_heads, eps as mtp_decoder_layers
 *   drafts           [B, k] output int32 | int64, any strides: token ids
 * num_threads as mtp_verify. */
MTP_API mtp_status mtp_head_draft(const mtp_tensor* hidden, const mtp_tensor* token, const mtp_tensor* k_cache,
                                  const mtp_tensor* v_cache, const mtp_tensor* cache_lens, const mtp_tensor* rope_cos,
                                  const mtp_tensor* rope_sin, const mtp_tensor* embedding,
                                  const mtp_tensor* embedding_scale, const mtp_tensor* const* weights,
                                  int32_t num_weights, const mtp_tensor* lm_head, const mtp_tensor* lm_head_scale,
                                  const mtp_tensor* draft_vocab, int64_t k, int64_t num_heads, float eps,
                                  const mtp_tensor* drafts, int32_t num_threads);

/* mtp_head_draft, and the first step's next best drafts (a tree's other first candidates):
 *   alternatives     m in [0, Vd), k >= 1 when m > 0
 *   drafts           [B, k + m] output: the k steps, then the first step's 2nd..(m+1)-th best drafts
 *                    (torch.argmax's order over what is left: NaN first, larger, ties to the lower
 *                    draft-vocabulary index)
 * Other arguments as mtp_head_draft. */
MTP_API mtp_status mtp_head_draft_alternatives(
    const mtp_tensor* hidden, const mtp_tensor* token, const mtp_tensor* k_cache, const mtp_tensor* v_cache,
    const mtp_tensor* cache_lens, const mtp_tensor* rope_cos, const mtp_tensor* rope_sin, const mtp_tensor* embedding,
    const mtp_tensor* embedding_scale, const mtp_tensor* const* weights, int32_t num_weights, const mtp_tensor* lm_head,
    const mtp_tensor* lm_head_scale, const mtp_tensor* draft_vocab, int64_t k, int64_t num_heads, float eps,
    int64_t alternatives, const mtp_tensor* drafts, int32_t num_threads);

/* mtp_head_draft, and each draft's probability under the head (EAGLE-2's signal: how many of
 * the drafts a caller verifies, e.g. those before the first whose running product falls below a
 * threshold, as `mtp generate` does):
 *   probs            [B, k] output float32, any strides: probs[b, j] = the softmax of step j's draft
 *                    logits at its draft, 1 / sum_i exp(l_i - l_draft) in fp32 (NaN where a logit is NaN
 *                    or the largest is infinite); not on the exact path, so torch.softmax's to rounding
 * Other arguments as mtp_head_draft; probs must not overlap any input or drafts. */
MTP_API mtp_status mtp_head_draft_probs(const mtp_tensor* hidden, const mtp_tensor* token, const mtp_tensor* k_cache,
                                        const mtp_tensor* v_cache, const mtp_tensor* cache_lens,
                                        const mtp_tensor* rope_cos, const mtp_tensor* rope_sin,
                                        const mtp_tensor* embedding, const mtp_tensor* embedding_scale,
                                        const mtp_tensor* const* weights, int32_t num_weights,
                                        const mtp_tensor* lm_head, const mtp_tensor* lm_head_scale,
                                        const mtp_tensor* draft_vocab, int64_t k, int64_t num_heads, float eps,
                                        const mtp_tensor* drafts, const mtp_tensor* probs, int32_t num_threads);

/* Repacks a GGUF matrix from the file's layout into the x8 layout (see MTP_Q4_0_X8): the same
 * bytes in a new order, 8 rows interleaved; a weight view of dst (mtp_gguf_matrix(dst,
 * MTP_Q4_0_X8, rows, cols) for MTP_Q4_0, ...) then gives mtp_linear, mtp_decoder_layers(_tree)
 * and mtp_head_draft(_alternatives) the bits of src's view of the file type, faster.
 *   dtype  MTP_Q4_0, MTP_Q4_1, MTP_Q8_0, MTP_Q4_K or MTP_Q6_K (an int32_t holding an
 *          mtp_dtype, as mtp_tensor's): src's type, the file's
 *   src    rows packed rows of cols elements of dtype (row bytes = cols / block elements *
 *          block bytes), as a
 *          .gguf file stores the tensor; read only
 *   rows   >= 0, a multiple of 8;  cols >= 0, a multiple of the block (32, K-quants 256)
 *   dst    output, rows * row bytes bytes, sharing no byte with src's rows * row bytes
 * src and dst may be NULL only when rows * row bytes is 0. Sizes whose byte count overflows
 * int64 are MTP_ERROR_INVALID_ARGUMENT; nothing is written on failure. */
MTP_API mtp_status mtp_gguf_repack_x8(int32_t dtype, const void* src, int64_t rows, int64_t cols, void* dst);

/* The message of this thread's last failed call ("" after a successful one). Valid until the
 * thread's next mtp_* call. */
MTP_API const char* mtp_last_error(void);

/* "MTP_OK", "MTP_ERROR_NULL_POINTER", ... ("unknown status" otherwise). */
MTP_API const char* mtp_status_name(mtp_status status);

/* Instruction sets: "generic", "avx2", "avx512", "avx512_bf16", "neon", "neon_fp16". The best one the CPU
 * supports is chosen at load time unless the environment variable MTP_ISA names another. */
MTP_API const char* mtp_get_isa(void);
MTP_API int mtp_isa_supported(const char* name);  /* 1 or 0 (0 for an unknown name) */
MTP_API mtp_status mtp_set_isa(const char* name); /* process-wide */

#ifdef __cplusplus
}
#endif

#endif /* MTP_MTP_H_ */
