// Chain rejection sampling (mtp.verify_sampled), torch-free: the counter-based RNG and the
// per-request sampling rule, written once so the Triton/CUDA ports can mirror it line by
// line. The exact formulas are documented in mtp_kernels/reference.py (verify_sampled).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "mtp/argmax.h"
#include "mtp/verify_args.h"

namespace mtp {

// splitmix64's finaliser (Steele et al.): a bijective 64-bit mix.
MTP_HOST_DEVICE inline uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// RNG streams: one uniform per (seed, position, stream), never a sequential state, so a
// token does not depend on the batch it was drawn in or on the thread that drew it.
enum : uint64_t { kStreamAccept = 0, kStreamSample = 1 };

// A uniform in [0, 1) on the 2^-24 grid (exact in fp32 and fp64).
MTP_HOST_DEVICE inline double sample_uniform(int64_t seed, int64_t position, uint64_t stream) {
  const uint64_t h = mix64(mix64(mix64(uint64_t(seed)) + uint64_t(position)) + stream);
  return double(h >> 40) * (1.0 / 16777216.0);
}

// exp(y) for y <= 0 from IEEE-exact steps only (+, -, *, floor, scaling by 2^k), in this
// order, so the Triton mirror gets the same bits: std::exp, numpy and libdevice differ in
// the last place, and one ulp can move a sampled token. Cody-Waite reduction y = k ln2 + r,
// |r| <= ln2/2, then Taylor to r^13 (relative error ~1e-16); 0 below -708 (< 1e-307).
inline constexpr double kLn2Hi = 6.93147180369123816490e-01;  // 21 trailing zero bits: k*hi exact
inline constexpr double kLn2Lo = 1.90821492927058770002e-10;
inline constexpr double kInvLn2 = 1.44269504088896338700e+00;
inline constexpr int kExpTerms = 13;

// a * b, never fused into a following add (GCC contracts across statements on aarch64;
// the mirror rounds every product).
MTP_HOST_DEVICE inline double mul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  double p = a * b;
#if defined(__GNUC__) && defined(__aarch64__)
  __asm__("" : "+w"(p));
#elif defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  __asm__("" : "+x"(p));
#endif
  return p;
#endif
}

MTP_HOST_DEVICE inline double exp_fixed(double y) {
  if (!(y >= -708.0)) return 0.0;
  const double k = std::floor(mul_rn(y, kInvLn2) + 0.5);
  const double r = (y - mul_rn(k, kLn2Hi)) - mul_rn(k, kLn2Lo);
  double f = 1.0;  // 1/n! for n = kExpTerms down to 0, each a correctly rounded division
  for (int n = 2; n <= kExpTerms; ++n) f = f * double(n);
  double p = 1.0 / f;
  for (int n = kExpTerms - 1; n >= 0; --n) {
    f = f / double(n + 1);
    p = mul_rn(p, r) + 1.0 / f;
  }
  return std::ldexp(p, int(k));  // exact: the result stays normal above -708
}

// The fixed summation order of verify_sampled (mirrored by the Triton kernel): the
// vocabulary in blocks of kSampleBlock, each block summed as a pairwise tree (leaves
// 2j, 2j+1 first), the block sums added left to right.
inline constexpr int kSampleBlock = 256;
// The tree's depth: log2(kSampleBlock) levels from a leaf up to the root.
inline constexpr int kSampleLevels = [] {
  int levels = 0;
  while ((1 << levels) < kSampleBlock) ++levels;
  return levels;
}();
static_assert((1 << kSampleLevels) == kSampleBlock, "kSampleBlock must be a power of two (a pairwise tree)");

// Fills tree[kSampleBlock + j] = weight(lo + j) (0 past V) and tree[n] = tree[2n] + tree[2n+1];
// returns the block's sum tree[1].
template <class Weight>
inline double block_tree(int64_t lo, int64_t V, Weight& weight, double* tree) {
  for (int j = 0; j < kSampleBlock; ++j) tree[kSampleBlock + j] = lo + j < V ? weight(lo + j) : 0.0;
  for (int n = kSampleBlock - 1; n >= 1; --n) tree[n] = tree[2 * n] + tree[2 * n + 1];
  return tree[1];
}

template <class Weight>
inline double ordered_sum(int64_t V, Weight weight) {
  double tree[2 * kSampleBlock], s = 0;
  for (int64_t lo = 0; lo < V; lo += kSampleBlock) s += block_tree(lo, V, weight, tree);
  return s;
}

// The inverse CDF at u of the weights (total: ordered_sum of the same weights). The first
// block whose running sum passes u * total, then down its tree: left unless the left
// subtree's sum is passed (or the right one is empty). Never picks a zero weight.
template <class Weight>
inline int64_t inverse_cdf(int64_t V, double total, double u, Weight weight) {
  const double target = u * total;
  double tree[2 * kSampleBlock], acc = 0;
  for (int64_t lo = 0; lo < V; lo += kSampleBlock) {
    const double s = block_tree(lo, V, weight, tree);
    if (!(s > 0 && acc + s > target)) {
      acc += s;
      continue;
    }
    int n = 1;
    while (n < kSampleBlock) {
      const double left = tree[2 * n], right = tree[2 * n + 1];
      if (right == 0 || acc + left > target) {
        n = 2 * n;
      } else {
        acc += left;
        n = 2 * n + 1;
      }
    }
    return lo + (n - kSampleBlock);
  }
  return 0;  // unreachable: target < total, the same sum
}

// Per-request sampling filters, applied after the temperature in vLLM's order: min_p, then
// top_k, then top_p (off: 0, 0, 1; values checked by filter_error before they get here).
struct Filters {
  int64_t top_k = 0;
  double top_p = 1.0, min_p = 0.0;
  bool active() const { return top_k > 0 || top_p < 1.0 || min_p > 0.0; }
};

// Order-preserving key of an fp32 value: key(a) < key(b) iff a < b, -0 just below +0. The
// filters' cuts compare keys, integers, so every backend draws the same line.
inline uint32_t order_key(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return (u >> 31) ? ~u : (u | 0x80000000u);
}

// A token a filter keeps so far: its index, weight and key (lists stay in index order).
struct Kept {
  int64_t i;
  double w;
  uint32_t key;
};

// ordered_sum of the weights of the tokens in `kept` whose key is > `above` (every other
// weight 0). The same bits as the dense sum, since x + 0 == x: each block's tree is built
// from its nonzero leaves only, O(|kept| log kSampleBlock).
inline double sparse_ordered_sum(const std::vector<Kept>& kept, uint32_t above) {
  struct Node {
    int64_t n;  // the node's number in block_tree's numbering
    double v;
  };
  Node nodes[kSampleBlock];
  double s = 0;
  for (size_t j = 0; j < kept.size();) {
    const int64_t block = kept[j].i / kSampleBlock;
    int len = 0;
    for (; j < kept.size() && kept[j].i / kSampleBlock == block; ++j)
      if (kept[j].key > above) nodes[len++] = {kSampleBlock + kept[j].i % kSampleBlock, kept[j].w};
    if (len == 0) continue;
    for (int level = 0; level < kSampleLevels; ++level) {  // up to the root
      int out = 0;
      for (int k = 0; k < len; ++k) {
        if (k + 1 < len && nodes[k].n / 2 == nodes[k + 1].n / 2) {
          nodes[out++] = {nodes[k].n / 2, nodes[k].v + nodes[k + 1].v};  // left + right, as block_tree
          ++k;
        } else {
          nodes[out++] = {nodes[k].n / 2, nodes[k].v};
        }
      }
      len = out;
    }
    s += nodes[0].v;
  }
  return s;
}

// above(K) of top_p: the fixed-order sum of the kept weights whose key is > K. Sparse over
// the kept list when it is short, else dense over copies indexed by token (the same bits).
class AboveSum {
 public:
  AboveSum(const std::vector<Kept>& kept, int64_t V) : kept_(kept), V_(V), dense_(int64_t(kept.size()) * 16 > V) {
    if (!dense_) return;
    w_.assign(size_t(V), 0.0);
    key_.assign(size_t(V), 0);
    for (const Kept& k : kept) w_[size_t(k.i)] = k.w, key_[size_t(k.i)] = k.key;
  }
  double operator()(uint32_t K) const {
    if (!dense_) return sparse_ordered_sum(kept_, K);
    return ordered_sum(V_, [&](int64_t i) { return key_[size_t(i)] > K ? w_[size_t(i)] : 0.0; });
  }

 private:
  const std::vector<Kept>& kept_;
  int64_t V_;
  bool dense_;
  std::vector<double> w_;
  std::vector<uint32_t> key_;
};

// top_p's cut: the smallest key K with above(K) < bound (bound = top_p * the kept mass).
// above falls as K grows, so K is found bit by bit from the top (the Triton kernel runs
// this search densely); a token stays iff its key is >= K: the nucleus, ties at its edge all
// kept. Tokens at or below the search's lower end never count again and are dropped.
inline uint32_t top_p_key_bitwise(std::vector<Kept> kept, double bound) {
  if (sparse_ordered_sum(kept, 0) < bound) return 0;  // key 0 is a NaN's: every kept key is above
  uint32_t lo = 0;  // invariant: above(lo) >= bound (so lo < the top key, whose above is 0)
  for (int bit = 31; bit >= 0; --bit) {
    const uint32_t cand = lo | (uint32_t(1) << bit);
    if (sparse_ordered_sum(kept, cand) < bound) continue;
    lo = cand;
    kept.erase(std::remove_if(kept.begin(), kept.end(), [&](const Kept& k) { return k.key <= lo; }), kept.end());
  }
  return lo + 1;
}

// The same cut, fast: above changes only at kept keys, so the cut is the smallest kept key c
// with above(c) < bound (keeping keys >= c keeps what keys >= lo + 1 keep). Approximate
// sums (any order) over 4096 key buckets, then over the sorted keys of the bucket that holds
// the crossing, name a candidate c; two exact sums confirm it (above(c) < bound, and not for
// the next smaller kept key). If rounding misplaced the candidate, the bitwise search decides.
// *kept_mass: the exact fixed-order sum of the kept keys >= the cut (the renormalizer).
inline uint32_t top_p_key(const std::vector<Kept>& kept, const AboveSum& above, double bound, double* kept_mass) {
  constexpr int kBucketBits = 12;
  constexpr int kBuckets = 1 << kBucketBits;
  std::vector<double> mass(kBuckets, 0.0);
  std::vector<uint32_t> top(kBuckets, 0);
  std::vector<char> used(kBuckets, 0);
  for (const Kept& k : kept) {
    const uint32_t b = k.key >> (32 - kBucketBits);
    mass[b] += k.w;
    top[b] = std::max(top[b], k.key);
    used[b] = 1;
  }
  double acc = 0;  // approximate mass above bucket b
  int b = kBuckets - 1;
  for (; b >= 0; --b) {
    if (!used[size_t(b)]) continue;
    if (acc + mass[size_t(b)] >= bound) break;
    acc += mass[size_t(b)];
  }
  if (b >= 0) {
    std::vector<std::pair<uint32_t, double>> in;  // the bucket's (key, w), largest key first
    for (const Kept& k : kept)
      if (int(k.key >> (32 - kBucketBits)) == b) in.emplace_back(k.key, k.w);
    std::sort(in.begin(), in.end(), [](const auto& l, const auto& r) { return l.first > r.first; });
    uint32_t c = in[0].first;
    bool has_next = false;
    uint32_t next = 0;  // the largest kept key below c
    for (size_t j = 0; j < in.size();) {
      size_t e = j;
      double tie = 0;
      for (; e < in.size() && in[e].first == in[j].first; ++e) tie += in[e].second;
      if (acc + tie >= bound) {  // keys below in[j] would count in[j]'s mass too: c = in[j]
        c = in[j].first;
        if (e < in.size()) has_next = true, next = in[e].first;
        break;
      }
      acc += tie;
      c = in[j].first;
      j = e;
    }
    if (!has_next) {
      int lower = b - 1;
      while (lower >= 0 && !used[size_t(lower)]) --lower;
      if (lower >= 0) has_next = true, next = top[size_t(lower)];
    }
    if (above(c) < bound) {
      *kept_mass = has_next ? above(next) : above(0);  // keys > next: keys >= c
      if (!(*kept_mass < bound) || !has_next) return c;
    }
  }
  const uint32_t cut = top_p_key_bitwise(kept, bound);
  *kept_mass = above(cut > 0 ? cut - 1 : 0);
  return cut;
}

// The k-th largest of n keys (1 <= k <= n; key(j) for j < n): top_k's cut.
template <class Key>
inline uint32_t kth_largest_key(int64_t n, int64_t k, Key key) {
  std::vector<uint32_t> keys(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) keys[size_t(j)] = key(j);
  std::nth_element(keys.begin(), keys.begin() + (k - 1), keys.end(), std::greater<uint32_t>());
  return keys[size_t(k - 1)];
}

// The target distribution of one logits row: p_i = w_i / S with w_i = exp_fixed((x_i - m) / T)
// in fp64, m = max x, S = ordered_sum(w). Temperature 0, or a row whose softmax is
// undefined (a NaN, +inf, or all -inf), is the point mass on torch.argmax's choice (filters
// never remove it). Filters zero the weights they remove (then S sums the rest):
//   min_p: w_i < min_p (p_i < min_p * max p);
//   top_k: keys below the top_k-th largest key min_p kept (ties at the cut all stay);
//   top_p: keys below top_p_key of what min_p and top_k kept (bound top_p * their sum).
struct RowDist {
  const void* x;
  DType dt;
  int64_t stride, V;
  double T, m = 0, S = 1;
  int64_t point = -1;    // >= 0: the point mass's index
  uint32_t key_min = 0;  // top_k / top_p: tokens with a smaller key are out
  double w_min = 0;      // min_p: weights below it are out

  RowDist(const void* row, DType dt_, int64_t stride_, int64_t V_, double T_, Isa isa, const Filters& f = {})
      : x(row), dt(dt_), stride(stride_), V(V_), T(T_) {
    ArgmaxResult best = argmax_range(x, dt, stride, 0, V, isa);
    m = best.val;
    if (T == 0 || best.nan || !std::isfinite(m)) {
      point = best.idx;
      return;
    }
    if (!f.active()) {
      S = ordered_sum(V, [&](int64_t i) { return w(i); });
      return;
    }
    w_min = f.min_p;
    // Without min_p, top_k's cut comes from the keys alone: no exp below it.
    const bool k_first = f.min_p == 0 && f.top_k > 0 && f.top_k < V;
    if (k_first)
      key_min = kth_largest_key(V, f.top_k, [&](int64_t i) { return order_key(load_f32(x, dt, i * stride)); });
    std::vector<Kept> kept;
    for (int64_t i = 0; i < V; ++i) {
      const float xi = load_f32(x, dt, i * stride);
      const uint32_t key = order_key(xi);
      if (key < key_min) continue;
      const double e = exp_fixed((double(xi) - m) / T);
      if (e >= w_min) kept.push_back({i, e, key});
    }
    if (!k_first && f.top_k > 0 && f.top_k < int64_t(kept.size())) {
      key_min = kth_largest_key(int64_t(kept.size()), f.top_k, [&](int64_t j) { return kept[size_t(j)].key; });
      kept.erase(std::remove_if(kept.begin(), kept.end(), [&](const Kept& k) { return k.key < key_min; }), kept.end());
    }
    // The smallest kept key as a cut too: the same tokens, and w() skips the exp below it.
    uint32_t lowest = UINT32_MAX;  // kept is never empty: the max logit stays (w = 1)
    for (const Kept& k : kept) lowest = std::min(lowest, k.key);
    key_min = std::max(key_min, lowest);
    const AboveSum above(kept, V);  // == ordered_sum(V, w) over the same leaves (key 0 is NaN's)
    S = above(0);
    if (f.top_p < 1.0) key_min = std::max(key_min, top_p_key(kept, above, f.top_p * S, &S));
  }
  double w(int64_t i) const {
    if (point >= 0) return i == point ? 1.0 : 0.0;
    const float xi = load_f32(x, dt, i * stride);
    if (order_key(xi) < key_min) return 0.0;
    const double e = exp_fixed((double(xi) - m) / T);
    return e >= w_min ? e : 0.0;
  }
};

// Request b of verify_sampled. draft [K] (stride ds); q: draft_probs rows [K, V] with
// element strides qs (nullptr: one-hot drafts). Rows t = 0..nd are read only up to the
// first rejection. Writes out[0..K] (stride os) and returns the accepted count.
//
// One-hot drafts (and T == 0): y_t = inverse_cdf(p_t, u(seed, offset+t, kStreamSample));
// the draft is accepted iff y_t == draft. That accepts with probability p_t(x) = min(1,
// p/q) and, on rejection, emits y ~ p restricted to y != x = normalize(max(0, p - q)):
// exactly the rejection-sampling law, and the same token plain sampling draws at that
// position with the same seed (so speculative == plain, token for token).
// With q: accept x iff u(.., kStreamAccept) * q(x) < p(x) (x in [0, V)); on rejection
// y = inverse_cdf(max(0, p - q), u(.., kStreamSample)) (p itself if that is all zero).
template <class I>
inline int64_t sample_request(const VerifyArgs& a, int64_t b, const I* draft, int64_t ds, const void* q, DType qdt,
                              const int64_t* qs, double T, const Filters& f, int64_t seed, int64_t offset, int64_t nd,
                              int64_t pad, I* out, int64_t os, Isa isa) {
  const int64_t esize = dtype_size(a.logits_dtype);
  for (int64_t t = 0; t <= nd; ++t) {
    const char* row = static_cast<const char*>(a.logits) + logits_row(a, b, t) * esize;
    RowDist p(row, a.logits_dtype, a.logits_stride[2], a.V, T, isa, f);
    // offsets are the caller's: the position wraps modulo 2^64 (as the hash's uint64 does), no UB
    const int64_t position = int64_t(uint64_t(offset) + uint64_t(t));
    const double us = sample_uniform(seed, position, kStreamSample);
    const auto pw = [&](int64_t i) { return p.w(i); };
    int64_t y;
    if (t == nd || q == nullptr || T == 0) {
      y = inverse_cdf(a.V, p.S, us, pw);
      if (t < nd && int64_t(draft[t * ds]) == y) {
        out[t * os] = draft[t * ds];
        continue;
      }
    } else {
      const int64_t x = int64_t(draft[t * ds]);
      const void* qrow = static_cast<const char*>(q) + t * qs[0] * dtype_size(qdt);
      const auto qv = [&](int64_t i) { return double(load_f32(qrow, qdt, i * qs[1])); };
      if (x >= 0 && x < a.V && sample_uniform(seed, position, kStreamAccept) * qv(x) < p.w(x) / p.S) {
        out[t * os] = draft[t * ds];
        continue;
      }
      const auto r = [&](int64_t i) { return std::fmax(0.0, p.w(i) / p.S - qv(i)); };
      const double R = ordered_sum(a.V, r);
      y = R > 0 ? inverse_cdf(a.V, R, us, r) : inverse_cdf(a.V, p.S, us, pw);
    }
    out[t * os] = I(y);
    for (int64_t j = t + 1; j <= a.K; ++j) out[j * os] = I(pad);
    return t;
  }
  return nd;  // not reached: t == nd always emits
}

// The inputs of verify_sampled beyond verify's: per-request values already read and checked
// (temperature finite >= 0, num_drafts in [0, K]), draft_probs as a strided [B, K, V] view.
struct SampledArgs {
  VerifyArgs v;             // v.num_drafts must be set
  const void* q = nullptr;  // draft_probs, nullptr: one-hot drafts
  DType q_dtype = DType::F32;
  int64_t q_stride[3] = {0, 0, 0};
  const double* temperature = nullptr;
  const Filters* filters = nullptr;  // [B]; nullptr: none
  const int64_t* seed = nullptr;
  const int64_t* offset = nullptr;
  int64_t pad = -1;
  // The flattened ragged layout (verify_sampled_ragged: q [N, V] seen with q_stride[0] = 0):
  // request b's q row t at b*q_stride[0] + (q_first[b] + t)*q_stride[1]; nullptr: all 0.
  const int64_t* q_first = nullptr;
};

// Every request, parallel over b (both front doors run this: the torch binding, the C API).
template <class I, class ParallelFor>
void verify_sampled(const SampledArgs& a, IdView<const I> draft, I* accepted, int64_t acc_stride, IdView<I> out,
                    Isa isa, ParallelFor&& parallel_for) {
  const int64_t qb = a.q_stride[0] * dtype_size(a.q_dtype);
  parallel_for(a.v.B, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t qoff = b * qb + (a.q_first ? a.q_first[b] * a.q_stride[1] * dtype_size(a.q_dtype) : 0);
      const void* qrow = a.q ? static_cast<const char*>(a.q) + qoff : nullptr;
      accepted[b * acc_stride] =
          I(sample_request<I>(a.v, b, draft.row(b), draft.stride[1], qrow, a.q_dtype, a.q_stride + 1, a.temperature[b],
                              a.filters ? a.filters[b] : Filters{}, a.seed[b], a.offset[b], a.v.num_drafts[b], a.pad,
                              out.row(b), out.stride[1], isa));
    }
  });
}

}  // namespace mtp
