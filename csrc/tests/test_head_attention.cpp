// Tests of head_attention and cache_append through the C API, against oracles written here in
// double precision (tolerance: a different summation order), of shape invariance (bitwise: a
// row's bits never depend on T, B, strides or threads), and their bad arguments.
// Called from test_core.cpp's main: mtp_core_tests attention [isa] | cache_append | ops_errors
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mtp/attention.h"
#include "mtp/common.h"
#include "mtp/mtp.h"
#include "mtp/parallel.h"
#include "test_arrays.h"
#include "test_util.h"

namespace {

// ---------------------------------------------------------------- head_attention
// Caches stored as [B, Lmax, Hkv, D] (the permuted layout) or [B, Hkv, Lmax, D] (contiguous).
// window > 0: mtp_head_attention_window (a sliding window), else mtp_head_attention.
struct AttnProblem {
  int64_t B, T, Hq, Hkv, D, L, S, window = 0;
  bool window_fn = false;  // mtp_head_attention_window even for window = 0
  mtp_dtype t;
  bool causal, permuted;
  float scale;
  Arr q, k, v, kl, vl;
  std::vector<int64_t> lens;
  int64_t qs[4], ks[4], ls[4];

  AttnProblem(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D, int64_t L, int64_t S, mtp_dtype t, bool causal,
              bool permuted, float scale)
      : B(B),
        T(T),
        Hq(Hq),
        Hkv(Hkv),
        D(D),
        L(L),
        S(S),
        t(t),
        causal(causal),
        permuted(permuted),
        scale(scale),
        q(t, size_t(B * T * Hq * D)),
        k(t, size_t(B * L * Hkv * D)),
        v(t, size_t(B * L * Hkv * D)),
        kl(t, size_t(B * Hkv * S * D)),
        vl(t, size_t(B * Hkv * S * D)),
        lens(size_t(B)) {
    q.randomize(-1, 1);
    k.randomize(-1, 1);
    v.randomize(-1, 1);
    kl.randomize(-1, 1);
    vl.randomize(-1, 1);
    for (int64_t b = 0; b < B; ++b) lens[size_t(b)] = uniform(causal ? T : 0, L);
    const int64_t q0[4] = {T * Hq * D, Hq * D, D, 1};
    std::copy(q0, q0 + 4, qs);
    if (permuted) {
      ks[0] = L * Hkv * D;
      ks[1] = D;
      ks[2] = Hkv * D;
      ks[3] = 1;
    } else {
      ks[0] = Hkv * L * D;
      ks[1] = L * D;
      ks[2] = D;
      ks[3] = 1;
    }
    const int64_t l0[4] = {Hkv * S * D, S * D, D, 1};
    std::copy(l0, l0 + 4, ls);
  }

  // out [B', T', Hq, D] for requests [b0, b0 + nb) and queries [t0, t0 + nt), with the cache
  // lengths `lens_of` and local lengths s_len (a one-query call reproduces row t of the full
  // call: its own visible cache and local entries).
  mtp_status run(int64_t b0, int64_t nb, int64_t t0, int64_t nt, const std::vector<int64_t>& call_lens, int64_t s_len,
                 bool use_causal, Arr* out, int threads) {
    const int64_t qsz[4] = {nb, nt, Hq, D}, csz[4] = {nb, Hkv, L, D}, lsz[4] = {nb, Hkv, s_len, D};
    mtp_tensor qv = view4(q, qsz, qs, b0 * qs[0] + t0 * qs[1]);
    mtp_tensor kv = view4(k, csz, ks, b0 * ks[0]), vv = view4(v, csz, ks, b0 * ks[0]);
    mtp_tensor klv = view4(kl, lsz, ls, b0 * ls[0]), vlv = view4(vl, lsz, ls, b0 * ls[0]);
    std::vector<int32_t> l32(call_lens.begin(), call_lens.end());  // int32 lengths, stride 1
    mtp_tensor lv = mtp_contiguous(l32.data(), MTP_INT32, 1, &nb);
    // out padded: row stride D + 3, so a write outside the view shows on a canary.
    const int64_t osz[4] = {nb, nt, Hq, D}, ost[4] = {nt * Hq * (D + 3), Hq * (D + 3), D + 3, 1};
    mtp_tensor ov = view4(*out, osz, ost);
    if (window || window_fn)
      return mtp_head_attention_window(&qv, &kv, &vv, &lv, S ? &klv : nullptr, S ? &vlv : nullptr, &scale, use_causal,
                                       window, &ov, threads);
    return mtp_head_attention(&qv, &kv, &vv, &lv, S ? &klv : nullptr, S ? &vlv : nullptr, &scale, use_causal, &ov,
                              threads);
  }
  size_t out_size(int64_t nb, int64_t nt) const { return size_t(nb * nt * Hq * (D + 3)); }
  size_t out_at(int64_t b, int64_t t, int64_t h, int64_t d, int64_t nt) const {
    return size_t(((b * nt + t) * Hq + h) * (D + 3) + d);
  }

  // The oracle for row (b, t, h), in double.
  void oracle(int64_t b, int64_t t, int64_t h, std::vector<double>* o) const {
    const int64_t G = Hq / Hkv, hk = h / G;
    const int64_t nc = causal ? lens[size_t(b)] - T + t + 1 : lens[size_t(b)];
    const int64_t ns = std::min<int64_t>(std::max<int64_t>(S - T + t + 1, 0), S);
    const int64_t first = window > 0 ? std::max<int64_t>(nc - window, 0) : 0;  // keys [first, nc)
    std::vector<double> s;
    std::vector<std::pair<const Arr*, int64_t>> rows;  // value row starts
    auto add = [&](const Arr& K, const Arr& Vv, int64_t base) {
      double acc = 0;
      for (int64_t d = 0; d < D; ++d)
        acc += q.get(size_t(b * qs[0] + t * qs[1] + h * qs[2] + d)) * K.get(size_t(base + d));
      s.push_back(acc * scale);
      rows.push_back({&Vv, base});
    };
    for (int64_t j = first; j < nc; ++j) add(k, v, b * ks[0] + hk * ks[1] + j * ks[2]);
    for (int64_t j = 0; j < ns; ++j) add(kl, vl, b * ls[0] + hk * ls[1] + j * ls[2]);
    o->assign(size_t(D), 0.0);
    if (s.empty()) return;
    double m = s[0], l = 0;
    for (double x : s) m = std::max(m, x);
    for (size_t j = 0; j < s.size(); ++j) {
      const double p = std::exp(s[j] - m);
      l += p;
      for (int64_t d = 0; d < D; ++d) (*o)[size_t(d)] += p * rows[j].first->get(size_t(rows[j].second + d));
    }
    for (double& x : *o) x /= l;
  }
};

const uint32_t kCanaryF = 0x7fc0dead;  // a NaN payload nobody writes

void run_attention_case(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D, int64_t L, int64_t S, mtp_dtype t,
                        bool causal, bool permuted, float scale, int threads, int64_t window = 0) {
  AttnProblem p(B, T, Hq, Hkv, D, L, S, t, causal, permuted, scale);
  p.window = window;
  Arr out(t, p.out_size(B, T));
  const float canary = t == MTP_FLOAT32 ? [] {
    float f;
    std::memcpy(&f, &kCanaryF, 4);
    return f;
  }()
                                        : 12345.f;
  for (size_t i = 0; i < out.size(); ++i) out.set(i, canary);
  const uint32_t canary_bits = Arr(t, 1, canary).bits(0);
  char what[240];
  std::snprintf(what, sizeof what,
                "%s B=%lld T=%lld Hq=%lld Hkv=%lld D=%lld L=%lld S=%lld causal=%d perm=%d thr=%d window=%lld",
                name_of(t), (long long)B, (long long)T, (long long)Hq, (long long)Hkv, (long long)D, (long long)L,
                (long long)S, int(causal), int(permuted), threads, (long long)window);
  mtp_status st = p.run(0, B, 0, T, p.lens, S, causal, &out, threads);
  EXPECT(st == MTP_OK, "%s: %s", what, mtp_last_error());
  std::vector<double> want;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t tt = 0; tt < T; ++tt)
      for (int64_t h = 0; h < Hq; ++h) {
        p.oracle(b, tt, h, &want);
        for (int64_t d = 0; d < D; ++d) {
          const double got = out.get(p.out_at(b, tt, h, d, T));
          EXPECT(close(got, want[size_t(d)], t, 1e-5), "%s: out[%lld,%lld,%lld,%lld] = %.9g, oracle %.9g", what,
                 (long long)b, (long long)tt, (long long)h, (long long)d, got, want[size_t(d)]);
        }
        for (int64_t d = D; d < D + 3; ++d)
          EXPECT(out.bits(p.out_at(b, tt, h, d, T)) == canary_bits, "%s: write outside out", what);
      }

  // Shape invariance: each (b, t) again as a one-request, one-query call (its own visible
  // cache length and local entries; a window counts back from its last key either way), on
  // another thread count: the same bits.
  Arr one(t, p.out_size(1, 1));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t tt = 0; tt < T; ++tt) {
      const int64_t nc = causal ? p.lens[size_t(b)] - T + tt + 1 : p.lens[size_t(b)];
      const int64_t ns = std::min<int64_t>(std::max<int64_t>(S - T + tt + 1, 0), S);
      AttnProblem& q = p;
      const int64_t keepS = q.S;
      q.S = ns;  // the view covers the first ns local entries only
      mtp_status s1 = q.run(b, 1, tt, 1, {nc}, ns, false, &one, 1 + int(tt % 3));
      q.S = keepS;
      EXPECT(s1 == MTP_OK, "%s one-query: %s", what, mtp_last_error());
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t d = 0; d < D; ++d)
          EXPECT(one.bits(p.out_at(0, 0, h, d, 1)) == out.bits(p.out_at(b, tt, h, d, T)),
                 "%s: row (%lld,%lld,%lld) d=%lld differs from the one-query call (0x%x vs 0x%x)", what, (long long)b,
                 (long long)tt, (long long)h, (long long)d, one.bits(p.out_at(0, 0, h, d, 1)),
                 out.bits(p.out_at(b, tt, h, d, T)));
    }
}

// Extreme values (the contract of reference.head_attention): a row that sees no key is 0; a
// row that sees a non-finite score (fp32, -inf included) or value is all NaN; the others are
// finite. Two query heads over one kv head, q = 0 in row 1 (every score 0) and values that do
// not depend on the key, so a finite row is exactly v[0] on every path; row 0 is poisoned.
void run_attention_extreme(int64_t D, mtp_dtype t, int threads) {
  const int64_t L = 1100;  // five chunks of 256 keys (D = 128, 4 threads: spread over them)
  enum Case {
    kNegInfScores,
    kOverflowNeg,
    kOneOverflowNeg,
    kOverflowPos,
    kQNan,
    kKNan,
    kVInf,
    kKNanUnseen,
    kNoKey,
    kCount
  };
  for (int c = 0; c < kCount; ++c) {
    if (t == MTP_FLOAT16 && (c == kOverflowNeg || c == kOneOverflowNeg || c == kOverflowPos)) continue;  // fp32 range
    Arr q(t, size_t(2 * D)), k(t, size_t(L * D)), v(t, size_t(L * D)), out(t, size_t(2 * D), 7.f);
    k.randomize(-1, 1);
    for (int64_t j = 0; j < L; ++j)
      for (int64_t d = 0; d < D; ++d) v.set(size_t(j * D + d), float(d % 9 - 4));
    int64_t len = L;
    bool nan0 = true, nan1 = false;  // the rows that must be NaN
    switch (c) {
      case kNegInfScores:  // every score of row 0 is -inf
        q.set(0, -INFINITY);
        for (int64_t j = 0; j < L; ++j) k.set(size_t(j * D), 1.f);
        break;
      case kOverflowNeg:  // the same by fp32 overflow of the products; row 1 gets 0 * -1e30 = 0
        q.set(0, 1e30f);
        for (int64_t j = 0; j < L; ++j) k.set(size_t(j * D), -1e30f);
        break;
      case kOneOverflowNeg:  // one -inf score among finite ones: NaN too, not a zero weight
        q.set(0, 1e30f), k.set(size_t(600 * D), -1e30f);
        break;
      case kOverflowPos:  // one key's dot overflows to +inf for row 0 only
        for (int64_t d = 0; d < D; ++d) q.set(size_t(d), 1e20f), k.set(size_t(1070 * D + d), 1e20f);
        break;
      case kQNan: q.set(size_t(D - 1), NAN); break;
      case kKNan: k.set(size_t(600 * D + 7), NAN), nan1 = true; break;        // 0 * NaN for row 1
      case kVInf: v.set(size_t(1090 * D + 3), INFINITY), nan1 = true; break;  // both rows see key 1090
      case kKNanUnseen:
        len = 800, nan0 = false, k.set(size_t(850 * D + 5), NAN), v.set(size_t(801 * D), INFINITY);
        break;
      case kNoKey: len = 0, nan0 = false, q.set(0, INFINITY); break;
    }
    const int64_t qsz[4] = {1, 1, 2, D}, qst[4] = {2 * D, 2 * D, D, 1}, csz[4] = {1, 1, L, D},
                  cst[4] = {L * D, L * D, D, 1};
    mtp_tensor qv = view4(q, qsz, qst), kv = view4(k, csz, cst), vv = view4(v, csz, cst), ov = view4(out, qsz, qst);
    int64_t one = 1;
    mtp_tensor lv = mtp_contiguous(&len, MTP_INT64, 1, &one);
    const mtp_status st = mtp_head_attention(&qv, &kv, &vv, &lv, nullptr, nullptr, nullptr, false, &ov, threads);
    EXPECT(st == MTP_OK, "extreme case %d: %s", c, mtp_last_error());
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t d = 0; d < D; ++d) {
        const double got = out.get(size_t(r * D + d)), want = len == 0 ? 0.0 : double(d % 9 - 4);
        EXPECT((r == 0 ? nan0 : nan1) ? std::isnan(got) : got == want,
               "extreme case %d %s D=%lld threads=%d: out[%lld][%lld] = %g", c, name_of(t), (long long)D, threads,
               (long long)r, (long long)d, got);
      }
  }
}

// The sliding window's identities, bitwise: window >= every cache length and
// mtp_head_attention_window(window = 0) are mtp_head_attention; keys older than every row's
// window are never read (NaN there changes no bit).
void run_window_identities(int64_t D, mtp_dtype t, int threads) {
  const int64_t B = 3, T = 4, L = 1100, W = 300;
  AttnProblem p(B, T, 4, 1, D, L, 0, t, true, true, 1.f / std::sqrt(float(D)));
  p.lens = {L, T, 700};
  auto call = [&](int64_t window, bool fn) {
    Arr out(t, p.out_size(B, T));
    p.window = window;
    p.window_fn = fn;
    const mtp_status st = p.run(0, B, 0, T, p.lens, 0, true, &out, threads);
    EXPECT(st == MTP_OK, "window %lld: %s", (long long)window, mtp_last_error());
    return out;
  };
  auto same = [&](const Arr& a, const Arr& b, const char* what) {
    bool eq = true;
    for (int64_t b_ = 0; b_ < B; ++b_)
      for (int64_t tt = 0; tt < T; ++tt)
        for (int64_t h = 0; h < p.Hq; ++h)
          for (int64_t d = 0; d < D; ++d) eq &= a.bits(p.out_at(b_, tt, h, d, T)) == b.bits(p.out_at(b_, tt, h, d, T));
    EXPECT(eq, "%s %s D=%lld threads=%d: bits differ", what, name_of(t), (long long)D, threads);
  };
  const Arr plain = call(0, false);
  same(call(0, true), plain, "window 0 vs mtp_head_attention");
  same(call(L, true), plain, "window L vs none");
  same(call(p.lens[0], true), plain, "window = the longest cache vs none");
  const Arr windowed = call(W, true);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t oldest = std::max<int64_t>(p.lens[size_t(b)] - T + 1 - W, 0);  // query 0's first key
    for (int64_t j = 0; j < oldest; ++j)
      for (int64_t d = 0; d < D; ++d) {
        const size_t at = size_t(b * p.ks[0] + j * p.ks[2] + d);
        p.k.set(at, NAN);
        p.v.set(at, NAN);
      }
  }
  same(call(W, true), windowed, "NaN before the windows");
  int64_t wrong = 0;
  for (size_t i = 0; i < windowed.size(); ++i) wrong += std::isnan(windowed.get(i)) ? 1 : 0;
  EXPECT(wrong == 0, "windowed output has NaN");
}

// The kernels' tree mode (AttentionArgs::parents, decoder_layers' tree passes) with a window:
// each query sits at its chain position (cache_lens - T + depth), its window spans the
// committed keys and its path alike, and its rows have the bits of a one-query call over the
// chain gathered into a contiguous cache. No C API takes a window with a tree yet: the
// kernel is called directly (fp32, the isa under test, one thread and three).
void run_tree_window(int64_t D, int64_t window, int threads) {
  const int64_t B = 2, T = 6, Hq = 4, L = 700;
  const int64_t parents[B * T] = {-1, 0, 1, 2, 0, 0, -1, 0, 0, 2, 1, 4};
  std::vector<int64_t> lens = {700, 300};  // the T new keys included
  std::vector<float> q(size_t(B * T * Hq * D)), k(size_t(B * L * D)), v(k.size()), out(q.size());
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto* x : {&q, &k, &v})
    for (float& e : *x) e = u(gen);
  auto serial = [](int64_t n, auto&& fn) { fn(0, n); };
  auto threaded = mtp::ThreadParallelFor{threads};
  auto args = [&](const float* qp, int64_t nb, int64_t nt, const float* kp, const float* vp, int64_t len,
                  const int64_t* lp, float* op) {
    mtp::AttentionArgs a;
    a.B = nb, a.T = nt, a.Hq = Hq, a.Hkv = 1, a.D = D;
    const int64_t qs[4] = {nt * Hq * D, Hq * D, D, 1}, cs[4] = {len * D, len * D, D, 1};
    std::copy(qs, qs + 4, a.q_stride);
    std::copy(cs, cs + 4, a.k_stride);
    std::copy(cs, cs + 4, a.v_stride);
    a.q = qp, a.k = kp, a.v = vp, a.cache_lens = lp, a.out = op;
    a.scale = 1.f / std::sqrt(float(D));
    a.causal = true;
    a.window = window;
    return a;
  };
  mtp::AttentionArgs tree = args(q.data(), B, T, k.data(), v.data(), L, lens.data(), out.data());
  tree.parents = parents;
  if (threads == 1)
    mtp::attention(tree, 1, mtp::current_isa(), serial);
  else
    mtp::attention(tree, threads, mtp::current_isa(), threaded);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int64_t> path;
      for (int64_t x = t; x >= 0; x = parents[b * T + x]) path.insert(path.begin(), x);
      const int64_t base = lens[size_t(b)] - T, n = base + int64_t(path.size());
      std::vector<float> kc(size_t(n * D)), vc(kc.size()), one(size_t(Hq * D));
      for (int64_t j = 0; j < n; ++j) {
        const int64_t src = j < base ? j : base + path[size_t(j - base)];
        std::copy_n(&k[size_t((b * L + src) * D)], D, &kc[size_t(j * D)]);
        std::copy_n(&v[size_t((b * L + src) * D)], D, &vc[size_t(j * D)]);
      }
      mtp::AttentionArgs chain = args(&q[size_t((b * T + t) * Hq * D)], 1, 1, kc.data(), vc.data(), n, &n, one.data());
      mtp::attention(chain, 1, mtp::current_isa(), serial);
      EXPECT(std::memcmp(one.data(), &out[size_t((b * T + t) * Hq * D)], one.size() * 4) == 0,
             "tree window=%lld D=%lld threads=%d: row (%lld, %lld) differs from its chain", (long long)window,
             (long long)D, threads, (long long)b, (long long)t);
    }
}

}  // namespace

void test_attention() {
  int cases = 0;
  for (mtp_dtype t : kFloatTypes)
    for (int64_t D : {64, 128, 40}) {  // 40: the generic path on every isa
      run_attention_case(2, 1, 4, 2, D, 37, 0, t, false, cases % 2, 0.125f, 1), ++cases;
      run_attention_case(3, 3, 6, 2, D, 70, 0, t, true, cases % 2, 1.f / std::sqrt(float(D)), 2), ++cases;
      run_attention_case(2, 2, 3, 3, D, 20, 3, t, false, cases % 2, 0.3f, 1), ++cases;  // local segment
      run_attention_case(1, 1, 2, 1, D, 10, 4, t, false, cases % 2, 0.5f, 1), ++cases;  // one query, all S
      run_attention_case(2, 4, 8, 2, D, 600, 0, t, true, true, 1.f, 3), ++cases;        // 3 chunks, big scores
      run_attention_case(1, 2, 8, 1, D, 1100, 2, t, true, false, 0.2f, 4), ++cases;     // flash-decoding split
    }
  // Sliding windows (Gemma 3: window 512, Hq = 4 over one kv head, D = 256) and D = 256 alone.
  for (mtp_dtype t : kFloatTypes)
    for (int64_t D : {64, 128, 40, 256}) {
      const float sc = 1.f / std::sqrt(float(D));
      run_attention_case(3, 4, 4, 1, D, 1100, 0, t, true, cases % 2, sc, 3, 512), ++cases;  // flash-decoding split
      run_attention_case(3, 4, 4, 1, D, 1100, 0, t, true, cases % 2, sc, 1, 300), ++cases;  // serial, mid-chunk starts
      run_attention_case(2, 3, 6, 2, D, 600, 0, t, false, cases % 2, sc, 2, 260), ++cases;  // non-causal: the last keys
      run_attention_case(2, 5, 4, 2, D, 300, 0, t, true, cases % 2, sc, 1, 1), ++cases;     // window 1: itself only
      run_attention_case(2, 3, 4, 1, D, 600, 0, t, true, cases % 2, sc, 2, 2000), ++cases;  // window > L: none
      run_window_identities(D, t, 1 + int(cases % 3)), ++cases;
    }
  for (int64_t D : {64, 40})
    for (int64_t window : {0, 300, 3})
      for (int threads : {1, 3}) run_tree_window(D, window, threads), ++cases;
  for (mtp_dtype t : kFloatTypes) {
    run_attention_case(2, 3, 4, 1, 256, 600, 0, t, true, true, 0.0625f, 2), ++cases;  // D = 256, Hkv = 1
    run_attention_case(2, 1, 4, 1, 256, 300, 3, t, false, false, 0.0625f, 1), ++cases;
  }
  run_attention_case(0, 2, 4, 2, 64, 8, 0, MTP_FLOAT32, false, false, 1.f, 1), ++cases;  // B = 0
  run_attention_case(2, 2, 4, 2, 64, 8, 0, MTP_FLOAT32, false, true, 1.f, 1), ++cases;   // some cache_lens may be 0
  for (mtp_dtype t : kFloatTypes)
    for (int64_t D : {64, 128, 40})
      for (int threads : {1, 4}) run_attention_extreme(D, t, threads), ++cases;
  std::printf("attention: %d cases on %s\n", cases, mtp_get_isa());
}

// ---------------------------------------------------------------- cache_append (exact)
void test_cache_append() {
  int cases = 0;
  for (mtp_dtype t : kFloatTypes)
    for (bool permuted : {false, true})
      for (int64_t T : {0, 1, 3}) {
        const int64_t B = 3, Hkv = 2, D = 5, L = 9;
        Arr k(t, size_t(B * L * Hkv * D)), v(t, size_t(B * L * Hkv * D));
        k.randomize(-1, 1);
        v.randomize(-1, 1);
        const Arr k0 = k, v0 = v;
        int64_t cs[4];
        if (permuted) {
          cs[0] = L * Hkv * D;
          cs[1] = D;
          cs[2] = Hkv * D;
          cs[3] = 1;
        } else {
          cs[0] = Hkv * L * D;
          cs[1] = L * D;
          cs[2] = D;
          cs[3] = 1;
        }
        // k_new / v_new [B, T, Hkv, D] with element stride 2 (every other slot).
        Arr kn(t, size_t(std::max<int64_t>(2 * B * T * Hkv * D, 1))), vn(t, kn.size());
        kn.randomize(-1, 1);
        vn.randomize(-1, 1);
        const int64_t ns[4] = {2 * T * Hkv * D, 2 * Hkv * D, 2 * D, 2};
        std::vector<int64_t> lens = {uniform(0, L - T), uniform(0, L - T), L - T};
        const int64_t csz[4] = {B, Hkv, L, D}, nsz[4] = {B, T, Hkv, D};
        mtp_tensor kv = view4(k, csz, cs), vv = view4(v, csz, cs), knv = view4(kn, nsz, ns), vnv = view4(vn, nsz, ns);
        mtp_tensor lv = mtp_contiguous(lens.data(), MTP_INT64, 1, &B);
        EXPECT(mtp_cache_append(&kv, &vv, &knv, &vnv, &lv, 1 + cases % 3) == MTP_OK, "%s", mtp_last_error());
        for (int64_t b = 0; b < B; ++b)
          for (int64_t h = 0; h < Hkv; ++h)
            for (int64_t j = 0; j < L; ++j)
              for (int64_t d = 0; d < D; ++d) {
                const int64_t ci[4] = {b, h, j, d};
                const size_t at = size_t(dot_offset(ci, cs, 4));
                const int64_t tt = j - lens[size_t(b)];
                const bool fresh = tt >= 0 && tt < T;
                const int64_t ni[4] = {b, tt, h, d};
                const size_t src = fresh ? size_t(dot_offset(ni, ns, 4)) : 0;
                EXPECT(k.bits(at) == (fresh ? kn.bits(src) : k0.bits(at)) &&
                           v.bits(at) == (fresh ? vn.bits(src) : v0.bits(at)),
                       "%s perm=%d T=%lld: cache[%lld,%lld,%lld,%lld]", name_of(t), int(permuted), (long long)T,
                       (long long)b, (long long)h, (long long)j, (long long)d);
              }
        // One more append passes the capacity for request 2 (when T > 0): nothing is written.
        const Arr k1 = k, v1 = v;
        lens[2] = L - T + 1;
        mtp_status st = mtp_cache_append(&kv, &vv, &knv, &vnv, &lv, 2);
        if (T > 0) {
          EXPECT(st == MTP_ERROR_INVALID_ARGUMENT &&
                     std::strstr(mtp_last_error(), "request 2 would pass the cache capacity"),
                 "overflow: %s", mtp_last_error());
        } else {
          EXPECT(st == MTP_ERROR_INVALID_ARGUMENT, "cache_lens[2] = L + 1 accepted");  // outside [0, L]
        }
        bool same = true;
        for (size_t i = 0; i < k.size(); ++i) same &= k.bits(i) == k1.bits(i) && v.bits(i) == v1.bits(i);
        EXPECT(same, "%s T=%lld: cache written by a failed append", name_of(t), (long long)T);
        ++cases;
      }
  std::printf("cache_append: %d cases\n", cases);
}

// ---------------------------------------------------------------- bad arguments
namespace {

// Runs a Call (a valid call of one function) broken by `mutation`: it fails with `status` and a
// message containing `needle`, and its outputs stay untouched.

// A valid head_attention call (B=2, T=2, Hq=4, Hkv=2, D=8, L=6, S=3) each check below breaks
// in one way; the output must stay untouched.
struct AttnCall {
  std::vector<float> q = std::vector<float>(2 * 2 * 4 * 8, 0.5f), k = std::vector<float>(2 * 2 * 6 * 8, 0.25f), v = k,
                     kl = std::vector<float>(2 * 2 * 3 * 8, 1.f), vl = kl, out = std::vector<float>(q.size(), -99.f);
  std::vector<int32_t> lens = {4, 6};
  mtp_tensor qv, kv, vv, lv, klv, vlv, ov;
  float scale = 0.5f;
  const float* scale_p = &scale;
  int32_t causal = 1, threads = 1;
  int64_t window = 0;  // != 0: mtp_head_attention_window
  bool no_k = false, no_v = false, no_local_k = false, no_local_v = false, no_q = false, no_out = false,
       no_lens = false;
  AttnCall() {
    int64_t qs[4] = {2, 2, 4, 8}, cs[4] = {2, 2, 6, 8}, ls[4] = {2, 2, 3, 8}, ns[1] = {2};
    qv = mtp_contiguous(q.data(), MTP_FLOAT32, 4, qs);
    kv = mtp_contiguous(k.data(), MTP_FLOAT32, 4, cs);
    vv = mtp_contiguous(v.data(), MTP_FLOAT32, 4, cs);
    klv = mtp_contiguous(kl.data(), MTP_FLOAT32, 4, ls);
    vlv = mtp_contiguous(vl.data(), MTP_FLOAT32, 4, ls);
    lv = mtp_contiguous(lens.data(), MTP_INT32, 1, ns);
    ov = mtp_contiguous(out.data(), MTP_FLOAT32, 4, qs);
  }
  mtp_status run() {
    if (window)
      return mtp_head_attention_window(&qv, &kv, &vv, &lv, no_local_k ? nullptr : &klv, no_local_v ? nullptr : &vlv,
                                       scale_p, causal, window, &ov, threads);
    return mtp_head_attention(no_q ? nullptr : &qv, no_k ? nullptr : &kv, no_v ? nullptr : &vv, no_lens ? nullptr : &lv,
                              no_local_k ? nullptr : &klv, no_local_v ? nullptr : &vlv, scale_p, causal,
                              no_out ? nullptr : &ov, threads);
  }
  bool untouched() const {
    for (float x : out)
      if (x != -99.f) return false;
    return true;
  }
};

#define BAD_ATTN(mutation, status, needle) BAD_CALL(AttnCall, mutation, status, needle)

// A valid cache_append (B=2, T=2, Hkv=2, D=4, L=5); the caches must stay untouched.
struct AppendCall {
  std::vector<uint16_t> k = std::vector<uint16_t>(2 * 2 * 5 * 4, 0x1234), v = k,
                        kn = std::vector<uint16_t>(2 * 2 * 2 * 4, 0x3c00), vn = kn;
  std::vector<int64_t> lens = {0, 3};
  mtp_tensor kv, vv, knv, vnv, lv;
  int32_t threads = 1;
  bool no_k = false, no_vn = false, no_lens = false;
  AppendCall() {
    int64_t cs[4] = {2, 2, 5, 4}, ns[4] = {2, 2, 2, 4}, ls[1] = {2};
    kv = mtp_contiguous(k.data(), MTP_FLOAT16, 4, cs);
    vv = mtp_contiguous(v.data(), MTP_FLOAT16, 4, cs);
    knv = mtp_contiguous(kn.data(), MTP_FLOAT16, 4, ns);
    vnv = mtp_contiguous(vn.data(), MTP_FLOAT16, 4, ns);
    lv = mtp_contiguous(lens.data(), MTP_INT64, 1, ls);
  }
  mtp_status run() {
    return mtp_cache_append(no_k ? nullptr : &kv, &vv, &knv, no_vn ? nullptr : &vnv, no_lens ? nullptr : &lv, threads);
  }
  bool untouched() const {
    for (uint16_t x : k)
      if (x != 0x1234) return false;
    for (uint16_t x : v)
      if (x != 0x1234) return false;
    return true;
  }
};

#define BAD_APPEND(mutation, status, needle) BAD_CALL(AppendCall, mutation, status, needle)

}  // namespace

void test_head_attention_errors() {
  {  // the baselines are valid
    AttnCall a;
    EXPECT(a.run() == MTP_OK && !a.untouched(), "attention baseline: %s", mtp_last_error());
    AppendCall p;
    EXPECT(p.run() == MTP_OK && !p.untouched(), "append baseline: %s", mtp_last_error());
  }
  const mtp_status NUL = MTP_ERROR_NULL_POINTER, ARG = MTP_ERROR_INVALID_ARGUMENT, DT = MTP_ERROR_UNSUPPORTED_DTYPE;
  BAD_ATTN(c.no_q = true, NUL, "mtp_head_attention: q is NULL");
  BAD_ATTN(c.no_k = true, NUL, "k_cache is NULL");
  BAD_ATTN(c.no_v = true, NUL, "v_cache is NULL");
  BAD_ATTN(c.no_lens = true, NUL, "cache_lens is NULL");
  BAD_ATTN(c.no_out = true, NUL, "out is NULL");
  BAD_ATTN(c.kv.data = nullptr, NUL, "k_cache.data is NULL");
  BAD_ATTN(c.qv.dtype = MTP_INT32, DT, "q must be float32 or bfloat16 or float16, got int32");
  BAD_ATTN(c.kv.dtype = MTP_BFLOAT16, DT, "k_cache must be float32, got bfloat16");
  BAD_ATTN(c.ov.dtype = MTP_FLOAT16, DT, "out must be float32, got float16");
  BAD_ATTN(c.vlv.dtype = MTP_FLOAT16, DT, "v_local must be float32");
  BAD_ATTN(c.qv.ndim = 3, ARG, "q must be 4-D [B, T, Hq, D], got ndim = 3");
  BAD_ATTN(c.kv.sizes[0] = 1, ARG, "k_cache.sizes[0] must equal B (q.sizes[0]) = 2, got 1");
  BAD_ATTN(c.kv.sizes[3] = 4, ARG, "k_cache.sizes[3] must equal the head dim D (q.sizes[3]) = 8, got 4");
  BAD_ATTN(c.vv.sizes[2] = 5, ARG, "v_cache must have k_cache's sizes [2, 2, 6, 8], got [2, 2, 5, 8]");
  BAD_ATTN((c.kv.sizes[1] = 3, c.vv.sizes[1] = 3), ARG, "Hq = 4 must be a multiple of k_cache's head count Hkv = 3");
  BAD_ATTN((c.kv.sizes[1] = 0, c.vv.sizes[1] = 0), ARG, "Hkv = 0");
  BAD_ATTN(c.lens[1] = 7, ARG, "cache_lens[1] = 7 is outside [0, L (k_cache.sizes[2])] = [0, 6]");
  BAD_ATTN(c.lens[0] = -1, ARG, "cache_lens[0] = -1 is outside");
  BAD_ATTN(c.lv.dtype = MTP_FLOAT32, DT, "cache_lens must be int32 or int64");
  BAD_ATTN(c.lv.sizes[0] = 3, ARG, "cache_lens.sizes[0] must equal B");
  BAD_ATTN(c.lens[0] = 1, ARG,
           "causal=True needs cache_lens[b] >= T = 2 (the T queries are the last T cached positions), got "
           "min(cache_lens) = 1");
  BAD_ATTN(c.no_local_v = true, ARG, "k_local and v_local must be given together, got only k_local");
  BAD_ATTN(c.no_local_k = true, ARG, "got only v_local");
  BAD_ATTN(c.klv.sizes[1] = 1, ARG, "k_local.sizes[1] must equal Hkv (k_cache.sizes[1]) = 2, got 1");
  BAD_ATTN(c.vlv.sizes[2] = 2, ARG, "v_local must have k_local's sizes [2, 2, 3, 8]");
  BAD_ATTN(c.ov.sizes[1] = 1, ARG, "out must have q's sizes [2, 2, 4, 8], got [2, 1, 4, 8]");
  BAD_ATTN(c.ov.strides[0] = -1, ARG, "out.strides[0] must be >= 0, got -1");
  BAD_ATTN(c.scale = NAN, ARG, "*scale must be finite");
  BAD_ATTN(c.threads = -2, ARG, "num_threads must be >= 0");
  BAD_ATTN((c.window = -1, c.no_local_k = c.no_local_v = true), ARG,
           "mtp_head_attention_window: window must be >= 0 (0: no window; else how many of the latest keys a query "
           "sees), got window = -1");
  BAD_ATTN(c.window = 3, ARG,
           "mtp_head_attention_window: window = 3 does not combine with a local segment (k_local / v_local)");
  {  // a window without a local segment is fine
    AttnCall a;
    a.no_local_k = a.no_local_v = true;
    a.window = 2;
    EXPECT(a.run() == MTP_OK && !a.untouched(), "window 2: %s", mtp_last_error());
  }
  {  // scale NULL = 1/sqrt(D): the same bits as passing it
    AttnCall a, b;
    a.scale_p = nullptr;
    b.scale = 1.f / std::sqrt(8.f);
    a.q[3] = b.q[3] = 2.f;
    a.k[17] = b.k[17] = -1.f;
    EXPECT(a.run() == MTP_OK && b.run() == MTP_OK && a.out == b.out, "default scale: %s", mtp_last_error());
  }

  BAD_APPEND(c.no_k = true, NUL, "mtp_cache_append: k_cache is NULL");
  BAD_APPEND(c.no_vn = true, NUL, "v_new is NULL");
  BAD_APPEND(c.no_lens = true, NUL, "cache_lens is NULL");
  BAD_APPEND(c.knv.dtype = MTP_INT64, DT, "k_new must be float32 or bfloat16 or float16, got int64");
  BAD_APPEND(c.vv.dtype = MTP_BFLOAT16, DT, "v_cache must be float16, got bfloat16");
  BAD_APPEND(c.vnv.sizes[1] = 1, ARG, "v_new must have k_new's sizes [2, 2, 2, 4], got [2, 1, 2, 4]");
  BAD_APPEND(c.kv.sizes[1] = 1, ARG, "k_cache.sizes[1] must equal Hkv (k_new.sizes[2]) = 2, got 1");
  BAD_APPEND(c.vv.sizes[2] = 4, ARG, "v_cache must have k_cache's sizes");
  BAD_APPEND(c.lens[0] = 6, ARG, "cache_lens[0] = 6 is outside [0, L (k_cache.sizes[2])] = [0, 5]");
  BAD_APPEND(c.lens[1] = 4, ARG,
             "request 1 would pass the cache capacity: cache_lens[1] + T = 4 + 2 > L = 5 (the caches' length); nothing "
             "was written");
  BAD_APPEND(c.kv.strides[2] = int64_t(1) << 62, ARG, "k_cache of sizes [2, 2, 5, 4] has an extent beyond int64");
  BAD_APPEND(c.threads = -1, ARG, "num_threads must be >= 0");
  std::printf("head_attention_errors: checked\n");
}
