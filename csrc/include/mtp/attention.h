// Decode-style attention of a few queries over a strided KV cache, torch-free.
//
// Exactness by construction: each output row (b, t, h) is a function of its own visible
// keys only, never of T, B, the strides or the threads.
//  - A row's visible key range is cut into chunks at fixed absolute positions (multiples
//    of kAttnChunk keys). A chunk's partial (max m, sum l, acc[D]) is computed by per-row
//    code whose operation order depends only on the chunk's keys of that row.
//  - Partials are merged strictly left to right, the local segment's chunks last, by one
//    scalar function (merge_partial).
//  - Threads only decide who computes which (b, hkv, chunk): with enough (b, hkv) pairs a
//    thread takes whole pairs and folds their chunks as they come; otherwise the chunks
//    are spread over threads (flash-decoding) and folded afterwards. Same folds, same order.
//  - All G*T rows sharing a KV head are processed together against each key (K/V read
//    from memory once).
// The build must not contract a*b+c into fma implicitly (-ffp-contract=off, set on the
// mtp_headers target): the same scalar code is inlined into differently targeted callers.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "mtp/attention_args.h"
#include "mtp/common.h"
#include "mtp/isa.h"
#include "mtp/kv_rows.h"

namespace mtp {

// The tree of AttentionArgs::parents: per (b, t) its depth and its path from the root
// (path[(b * T + t) * T + d] = the row at depth d, d <= depth).
struct TreePaths {
  std::vector<int64_t> depth, path;
  TreePaths(const int64_t* parents, int64_t B, int64_t T) : depth(size_t(B * T)), path(size_t(B * T * T)) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t p = parents[b * T + t], i = b * T + t;
        depth[size_t(i)] = p < 0 ? 0 : depth[size_t(b * T + p)] + 1;
        if (p >= 0) std::copy_n(&path[size_t((b * T + p) * T)], depth[size_t(i)], &path[size_t(i * T)]);
        path[size_t(i * T + depth[size_t(i)])] = t;
      }
  }
};

// A partial is [m, l, acc[D]]. Folds chunk partial p into the running state st, p
// covering later keys. Plain scalar code: the same bits wherever it is inlined. A NaN l (a
// chunk with a non-finite score) stays NaN whatever m is.
inline void merge_partial(float* st, const float* p, int64_t D) {
  const float m = std::max(st[0], p[0]);
  const float a = std::exp(st[0] - m), c = std::exp(p[0] - m);
  st[0] = m;
  st[1] = st[1] * a + p[1] * c;
  for (int64_t d = 0; d < D; ++d) st[2 + d] = st[2 + d] * a + p[2 + d] * c;
}

// One chunk of one (b, hkv): rows r = t*G + g, row r seeing keys [lo[r], n[r]) of this chunk
// (n[r] == 0: none; the rows that see some are contiguous, lo and n non-decreasing over them),
// q packed fp32 [R][D], scratch s [R][kAttnChunk] and cnt [R], partials out [R][D+2].
// K provides scores / softmax / accumulate (generic or one instruction set). Keys before the
// first row's lo are not read; a row's arithmetic depends on its own range only (its scores
// are per key, its softmax and accumulation start at its own lo).
template <class K>
void attend_chunk(const float* qp, int64_t R, const int64_t* lo, const int64_t* n, const KvRows& k, const KvRows& v,
                  int64_t D, float scale, float* s, int64_t* cnt, float* part) {
  int64_t r0 = 0, r1 = R;
  while (r0 < R && n[r0] == 0) ++r0;
  while (r1 > r0 && n[r1 - 1] == 0) --r1;
  if (r0 == r1) return;
  const int64_t o = lo[r0];  // scores of keys [o, n[r]) per row, at s[r][j - o]
  if (o == 0) {
    K::scores(qp, r0, r1, n, k, D, scale, s);
  } else {
    for (int64_t r = r0; r < r1; ++r) cnt[r] = n[r] - o;
    K::scores(qp, r0, r1, cnt, k.from(o), D, scale, s);
  }
  for (int64_t r = r0; r < r1; ++r)
    K::softmax(s + r * kAttnChunk + lo[r] - o, n[r] - lo[r], part + r * (D + 2), part + r * (D + 2) + 1);
  for (int64_t r = r0; r < r1;) {  // runs of rows with equal key ranges share each V load
    int64_t e = r;
    while (e < r1 && n[e] == n[r] && lo[e] == lo[r]) ++e;
    K::accumulate(s + r * kAttnChunk + lo[r] - o, e - r, n[r] - lo[r], lo[r] ? v.from(lo[r]) : v, D,
                  part + r * (D + 2) + 2, D + 2);
    r = e;
  }
}

// Folds a row's next chunk partial p into its state st (the first one is copied).
inline void fold_partial(float* st, const float* p, int64_t D, bool* any) {
  if (*any)
    merge_partial(st, p, D);
  else
    std::copy(p, p + D + 2, st);
  *any = true;
}

// Normalised output row `row` (flat b*T*Hq + t*Hq + h) from its merged state; no key: zeros.
// A row is finite or all NaN: l is NaN when a score was not finite (softmax), and a non-finite
// value reaches acc as inf or NaN depending on its weight (0 * inf), so any non-finite l or acc
// element makes the whole row NaN, the same on every path (per row, after the keys).
inline void write_row(const AttentionArgs& a, int64_t row, const float* st, bool any) {
  bool finite = !any || std::isfinite(st[1]);
  for (int64_t d = 0; d < a.D && finite; ++d) finite = std::isfinite(st[2 + d]);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t d = 0; d < a.D; ++d)
    store_f32(a.out, a.dtype, row * a.D + d, !any ? 0.f : finite ? st[2 + d] / st[1] : nan);
}

// Below this many multiply-adds a call runs on the calling thread (handing work to other
// threads would dominate); threads never change the bits.
constexpr int64_t kAttnSerialWork = int64_t(1) << 18;

template <class K, class ParallelFor>
void attention_with(const AttentionArgs& a, int threads, ParallelFor&& parallel_for) {
  const int64_t B = a.B, T = a.T, Hkv = a.Hkv, D = a.D, G = a.Hq / a.Hkv, R = G * T, P = D + 2;
  if (B == 0 || T == 0 || a.Hq == 0) return;
  // q as fp32, grouped by kv head: qp[b][hkv][t*G + g][D].
  std::vector<float> qp(static_cast<size_t>(B * Hkv * R * D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < a.Hq; ++h) {
        float* dst = qp.data() + ((b * Hkv + h / G) * R + t * G + h % G) * D;
        const int64_t base = b * a.q_stride[0] + t * a.q_stride[1] + h * a.q_stride[2];
        for (int64_t d = 0; d < D; ++d) dst[d] = load_f32(a.q, a.dtype, base + d * a.q_stride[3]);
      }

  // Cache keys visible to query t of request b (a tree query: by its depth).
  const std::unique_ptr<TreePaths> tree(a.parents ? new TreePaths(a.parents, B, T) : nullptr);
  auto visible = [&](int64_t b, int64_t t) {
    return tree ? a.cache_lens[b] - T + tree->depth[size_t(b * T + t)] + 1 : visible_cache(a, b, t);
  };
  // The first cache chunk of (b, hkv) any of its rows reads (a window skips the older ones).
  auto first_chunk = [&](int64_t b) {
    if (a.window == 0) return int64_t(0);
    int64_t lo = a.cache_lens[b];
    for (int64_t t = 0; t < T; ++t) lo = std::min(lo, first_visible(a, visible(b, t)));
    return lo / kAttnChunk;
  };
  // Chunk c of (b, hkv) = bh: cache chunks [0, Cc), then the local segment's [Cc, C).
  int64_t lmax = 0;
  for (int64_t b = 0; b < B; ++b) lmax = std::max(lmax, a.cache_lens[b]);
  const int64_t Cc = attn_chunks(lmax), C = Cc + attn_chunks(a.S);  // a single query sees all S local entries
  auto chunks_of = [&](int64_t bh, std::vector<int64_t>* out) {
    for (int64_t c = first_chunk(bh / Hkv); c < attn_chunks(a.cache_lens[bh / Hkv]); ++c) out->push_back(c);
    for (int64_t c = Cc; c < C; ++c) out->push_back(c);
  };
  // Partials [R][P] of rows [r0, r1) of chunk c of bh into dst; row r sees keys [lo[r], n[r])
  // of it (n[r] == 0: none, untouched); scratch s [R][kAttnChunk], cnt [R].
  auto compute_chunk = [&](int64_t bh, int64_t c, float* dst, float* s, int64_t* lo, int64_t* n, int64_t* cnt,
                           int64_t r0, int64_t r1) {
    const int64_t b = bh / Hkv, h = bh % Hkv;
    const bool local = c >= Cc;
    const int64_t c0 = (local ? c - Cc : c) * kAttnChunk;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t vis = local ? visible_local(a, r / G) : visible(b, r / G);
      n[r] = std::clamp<int64_t>(vis - c0, 0, kAttnChunk);
      lo[r] = local ? 0 : std::clamp<int64_t>(first_visible(a, vis) - c0, 0, kAttnChunk);
      if (n[r] <= lo[r]) n[r] = lo[r] = 0;
    }
    const int64_t* ks = local ? a.kl_stride : a.k_stride;
    const int64_t* vs = local ? a.vl_stride : a.v_stride;
    const int64_t es = dtype_size(a.dtype);
    const char* kb = static_cast<const char*>(local ? a.k_local : a.k);
    const char* vb = static_cast<const char*>(local ? a.v_local : a.v);
    KvRows kr{kb + (b * ks[0] + h * ks[1] + c0 * ks[2]) * es, ks[2], ks[3], a.dtype};
    KvRows vr{vb + (b * vs[0] + h * vs[1] + c0 * vs[2]) * es, vs[2], vs[3], a.dtype};
    const int64_t base = a.cache_lens[b] - T;  // a tree's first new key
    if (!tree || local || (c0 + kAttnChunk <= base && a.window == 0))
      return attend_chunk<K>(qp.data() + (bh * R + r0) * D, r1 - r0, lo + r0, n + r0, kr, vr, D, a.scale, s, cnt + r0,
                             dst + r0 * P);
    // The chunk holds new keys (or the queries' windows start at their depths): each query's G
    // rows read the keys of its own path.
    std::vector<int64_t> map(static_cast<size_t>(kAttnChunk));
    for (int64_t t = r0 / G; t < (r1 + G - 1) / G; ++t) {
      const int64_t* path = &tree->path[size_t((b * T + t) * T)];
      for (int64_t j = 0; j < n[t * G]; ++j) map[size_t(j)] = c0 + j < base ? j : base + path[c0 + j - base] - c0;
      kr.map = vr.map = map.data();
      attend_chunk<K>(qp.data() + (bh * R + t * G) * D, G, lo + t * G, n + t * G, kr, vr, D, a.scale, s, cnt + t * G,
                      dst + t * G * P);
    }
  };
  auto out_row = [&](int64_t bh, int64_t r) { return ((bh / Hkv) * T + r / G) * a.Hq + (bh % Hkv) * G + r % G; };
  int64_t total = 0;
  for (int64_t bh = 0; bh < B * Hkv; ++bh)
    total += attn_chunks(a.cache_lens[bh / Hkv]) - first_chunk(bh / Hkv) + C - Cc;
  const bool serial = total * R * kAttnChunk * D < kAttnSerialWork;

  if (B * Hkv >= 2 * int64_t(threads) || serial) {
    // Enough (b, hkv) pairs to keep the threads busy: each pair's chunks in order on one
    // thread, folded as they come (no partial buffer). Same folds, same order as below.
    auto work = [&](int64_t begin, int64_t end) {
      std::vector<float> s(static_cast<size_t>(R * kAttnChunk)), part(static_cast<size_t>(R * P)),
          st(static_cast<size_t>(R * P));
      std::vector<int64_t> lo(static_cast<size_t>(R)), n(static_cast<size_t>(R)), cnt(static_cast<size_t>(R)), cs;
      std::unique_ptr<bool[]> any(new bool[size_t(R)]);
      for (int64_t bh = begin; bh < end; ++bh) {
        std::fill(any.get(), any.get() + R, false);
        cs.clear();
        chunks_of(bh, &cs);
        for (int64_t c : cs) {
          compute_chunk(bh, c, part.data(), s.data(), lo.data(), n.data(), cnt.data(), 0, R);
          for (int64_t r = 0; r < R; ++r)
            if (n[size_t(r)] > 0) fold_partial(st.data() + r * P, part.data() + r * P, D, &any[size_t(r)]);
        }
        for (int64_t r = 0; r < R; ++r) write_row(a, out_row(bh, r), st.data() + r * P, any[size_t(r)]);
      }
    };
    if (serial)
      work(0, B * Hkv);
    else
      parallel_for(B * Hkv, work);
    return;
  }

  // Few (b, hkv) pairs, long caches: chunks spread over the threads (flash-decoding), their
  // partials kept, then each row's merged left to right. Fewer chunks than twice the threads
  // (a verify pass over a short cache: one per pair) are cut further into slices of the
  // tokens, so that the threads get even shares (a row's bits never depend on the others').
  std::vector<int64_t> items;  // bh * C + c
  for (int64_t bh = 0; bh < B * Hkv; ++bh) {
    std::vector<int64_t> cs;
    chunks_of(bh, &cs);
    for (int64_t c : cs) items.push_back(bh * C + c);
  }
  const int64_t chunks = int64_t(items.size());
  const int64_t slices = std::clamp<int64_t>((2 * threads + chunks - 1) / chunks, 1, T);
  std::unique_ptr<float[]> part(new float[size_t(B * Hkv * C * R * P)]);
  parallel_for(chunks * slices, [&](int64_t begin, int64_t end) {
    std::vector<float> s(static_cast<size_t>(R * kAttnChunk));
    std::vector<int64_t> lo(static_cast<size_t>(R)), n(static_cast<size_t>(R)), cnt(static_cast<size_t>(R));
    for (int64_t w = begin; w < end; ++w) {
      const int64_t id = items[size_t(w / slices)], slice = w % slices;
      compute_chunk(id / C, id % C, part.get() + id * R * P, s.data(), lo.data(), n.data(), cnt.data(),
                    T * slice / slices * G, T * (slice + 1) / slices * G);
    }
  });
  parallel_for(B * Hkv * R, [&](int64_t begin, int64_t end) {
    std::vector<float> st(static_cast<size_t>(P));
    for (int64_t i = begin; i < end; ++i) {
      const int64_t bh = i / R, r = i % R, b = bh / Hkv, t = r / G;
      const float* pb = part.get() + (bh * C * R + r) * P;  // chunk c at + c*R*P
      bool any = false;
      const int64_t vis = visible(b, t);
      for (int64_t c = first_visible(a, vis) / kAttnChunk; c < attn_chunks(vis); ++c)
        fold_partial(st.data(), pb + c * R * P, D, &any);
      for (int64_t c = 0; c < attn_chunks(visible_local(a, t)); ++c)
        fold_partial(st.data(), pb + (Cc + c) * R * P, D, &any);
      write_row(a, out_row(bh, r), st.data(), any);
    }
  });
}

}  // namespace mtp

#include "mtp/generic/attention.h"
#if defined(MTP_X86)
#include "mtp/x86/attention.h"
#elif defined(MTP_ARM64)
#include "mtp/neon/attention.h"
#endif

namespace mtp {

// The kernels of every set without a vector path of its own, and of every head dim but 64, 128
// and 256.
template <class ParallelFor>
void attention(generic::Generic, const AttentionArgs& a, int threads, ParallelFor& pf) {
  switch (a.dtype) {
    case DType::F32: return attention_with<generic::Attention<DType::F32>>(a, threads, pf);
    case DType::BF16: return attention_with<generic::Attention<DType::BF16>>(a, threads, pf);
    default: return attention_with<generic::Attention<DType::F16>>(a, threads, pf);
  }
}

// One vector family V<dtype, D> over the three dtypes and D in {64, 128, 256} (256: Gemma 3).
template <template <DType, int> class V, DType T, class ParallelFor>
void attention_vector_dims(const AttentionArgs& a, int threads, ParallelFor& pf) {
  switch (a.D) {
    case 64: return attention_with<V<T, 64>>(a, threads, pf);
    case 128: return attention_with<V<T, 128>>(a, threads, pf);
    case 256: return attention_with<V<T, 256>>(a, threads, pf);
    default: return attention(generic::Generic{}, a, threads, pf);
  }
}
template <template <DType, int> class V, class ParallelFor>
void attention_vector(const AttentionArgs& a, int threads, ParallelFor& pf) {
  switch (a.dtype) {
    case DType::F32: return attention_vector_dims<V, DType::F32>(a, threads, pf);
    case DType::BF16: return attention_vector_dims<V, DType::BF16>(a, threads, pf);
    default: return attention_vector_dims<V, DType::F16>(a, threads, pf);
  }
}

// The sets' vector families (x86/attention.h, neon/attention.h; NeonFp16 runs Neon's).
#if defined(MTP_X86)
template <class ParallelFor>
void attention(x86::Avx512, const AttentionArgs& a, int threads, ParallelFor& pf) {
  attention_vector<x86::Avx512Attention>(a, threads, pf);
}
template <class ParallelFor>
void attention(x86::Avx2, const AttentionArgs& a, int threads, ParallelFor& pf) {
  attention_vector<x86::Avx2Attention>(a, threads, pf);
}
#elif defined(MTP_ARM64)
template <class ParallelFor>
void attention(neon::Neon, const AttentionArgs& a, int threads, ParallelFor& pf) {
  attention_vector<neon::NeonAttention>(a, threads, pf);
}
#endif

// Writes a.out. parallel_for(n, fn(begin, end)) may run the work items anywhere; `threads`
// (how many it uses) only shapes the work split, never the result.
template <class ParallelFor>
void attention(const AttentionArgs& a, int threads, Isa isa, ParallelFor&& pf) {
  dispatch(isa, [&](auto set) { attention(set, a, threads, pf); });
}

}  // namespace mtp
