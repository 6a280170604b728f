// The arguments of head_attention and the visibility rule of its rows, shared by the CPU
// core (mtp/attention.h) and the CUDA kernels (host and device; no CPU intrinsics here).
#pragma once
#include <cstdint>

#include "mtp/common.h"

namespace mtp {

// Keys are cut into chunks at multiples of kAttnChunk (absolute positions) on every backend.
constexpr int64_t kAttnChunk = 256;

struct AttentionArgs {
  int64_t B = 0, T = 0, Hq = 0, Hkv = 0, D = 0;
  DType dtype = DType::F32;  // of q, the caches, the local segment and out
  const void* q = nullptr;   // [B, T, Hq, D]
  int64_t q_stride[4] = {0, 0, 0, 0};
  const void* k = nullptr;  // [B, Hkv, L, D] views, element strides
  const void* v = nullptr;
  int64_t k_stride[4] = {0, 0, 0, 0}, v_stride[4] = {0, 0, 0, 0};
  const int64_t* cache_lens = nullptr;  // [B] (device memory for the CUDA kernels); causal needs >= T
  int64_t S = 0;                        // local segment length (0: none)
  const void* k_local = nullptr;        // [B, Hkv, S, D]
  const void* v_local = nullptr;
  int64_t kl_stride[4] = {0, 0, 0, 0}, vl_stride[4] = {0, 0, 0, 0};
  float scale = 1.f;
  bool causal = false;  // query t sees cache keys [0, cache_lens[b] - T + t]
  // causal only, CPU only: [B, T] or nullptr (a chain). Request b's T queries form a tree:
  // parents[b][0] = -1 (the root), parents[b][t] in [0, t). Query t sees the cache's first
  // cache_lens[b] - T keys, then the keys of its path from the root (row u's key stored at
  // cache_lens[b] - T + u), read as if they sat at the next positions: a chain's bits.
  const int64_t* parents = nullptr;
  // Sliding window (0: none): a query sees only the last `window` of the cache keys it would
  // see without one, itself included when causal (Gemma 3 / transformers: the query at
  // position p sees keys p - window < j <= p). Non-causal queries count from the last key
  // (all T sit at cache_lens[b] - 1); a tree query from its chain position (the window spans
  // the cache keys and its path alike). Not with a local segment (checked: window_error).
  int64_t window = 0;
  void* out = nullptr;  // contiguous [B, T, Hq, D]
};

MTP_HOST_DEVICE inline int64_t attn_chunks(int64_t n) { return ((n > 0 ? n : 0) + kAttnChunk - 1) / kAttnChunk; }

// Cache keys visible to query t of request b.
MTP_HOST_DEVICE inline int64_t visible_cache(const AttentionArgs& a, int64_t b, int64_t t) {
  const int64_t n = a.causal ? a.cache_lens[b] - a.T + t + 1 : a.cache_lens[b];
  return n > 0 ? n : 0;
}
// The first cache key visible to a row that sees n keys without a window (keys [0, n); in a
// tree, positions of its chain view): older keys are never read.
MTP_HOST_DEVICE inline int64_t first_visible(const AttentionArgs& a, int64_t n) {
  return a.window > 0 && n > a.window ? n - a.window : 0;
}
// Local entries visible to query t: the T queries are the last T of the S local positions,
// query t sees local s <= S - T + t (s <= t when S == T; a single query sees all S, as a
// recurrent draft step needs).
MTP_HOST_DEVICE inline int64_t visible_local(const AttentionArgs& a, int64_t t) {
  const int64_t n = a.S - a.T + t + 1;
  return n < 0 ? 0 : n > a.S ? a.S : n;
}

}  // namespace mtp
