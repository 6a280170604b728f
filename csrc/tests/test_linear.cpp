// Tests of linear (float, Q8 and int8-dot weights) through the C API, against oracles written
// here in double precision (tolerance: a different summation order), of shape invariance
// (bitwise: a row's bits never depend on M, strides or threads), and its bad arguments.
// Called from test_core.cpp's main: mtp_core_tests linear|linear_q8|linear_q8dot [isa] | ops_errors
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mtp/common.h"
#include "mtp/linear.h"
#include "mtp/mtp.h"
#include "mtp/parallel.h"
#include "test_arrays.h"
#include "test_util.h"

// ---------------------------------------------------------------- linear
namespace {

// Shape invariance: each row of the activations xv [M, K] run alone (M = 1, one thread) by
// `call` gives the bits of row m of the full result y [M, N].
template <class Call>
void expect_rows_alone(const char* what, const mtp_tensor& xv, const float* y, int64_t M, int64_t N, Call&& call) {
  std::vector<float> y1(size_t(std::max<int64_t>(N, 1)));
  for (int64_t m = 0; m < M; ++m) {
    mtp_tensor x1 = xv;
    x1.data = static_cast<char*>(xv.data) + m * xv.strides[0] * (xv.dtype == MTP_FLOAT32 ? 4 : 2);
    x1.sizes[0] = 1;
    const int64_t s1[2] = {1, N};
    mtp_tensor y1v = mtp_contiguous(y1.data(), MTP_FLOAT32, 2, s1);
    EXPECT(call(&x1, &y1v) == MTP_OK, "%s: %s", what, mtp_last_error());
    EXPECT(std::memcmp(y1.data(), y + m * N, size_t(N) * 4) == 0, "%s: row %lld differs from the M = 1 call", what,
           (long long)m);
  }
}

void run_linear_case(int64_t M, int64_t N, int64_t K, mtp_dtype xt, mtp_dtype wt, bool bias, bool strided_x,
                     int threads) {
  // x [M, K]: contiguous, or column stride 2 (packed by the C API).
  const int64_t xc = strided_x ? 2 : 1;
  Arr x(xt, size_t(std::max<int64_t>(M * K * xc, 1))), w(wt, size_t(std::max<int64_t>(N * (K + 3), 1))),
      bv(MTP_BFLOAT16, size_t(std::max<int64_t>(N, 1)));
  x.randomize(-1, 1);
  w.randomize(-1, 1);
  bv.randomize(-2, 2);
  mtp_tensor xv{}, wv{}, bt{};
  xv.data = x.data();
  xv.dtype = xt;
  xv.ndim = 2;
  xv.sizes[0] = M;
  xv.sizes[1] = K;
  xv.strides[0] = K * xc;
  xv.strides[1] = xc;
  wv.data = w.data();
  wv.dtype = wt;
  wv.ndim = 2;
  wv.sizes[0] = N;
  wv.sizes[1] = K;
  wv.strides[0] = K + 3;
  wv.strides[1] = 1;
  bt = mtp_contiguous(bv.data(), MTP_BFLOAT16, 1, &N);
  std::vector<float> y(size_t(std::max<int64_t>(M * N, 1)), -7.f);
  const int64_t ysz[2] = {M, N};
  mtp_tensor yv = mtp_contiguous(y.data(), MTP_FLOAT32, 2, ysz);
  char what[160];
  std::snprintf(what, sizeof what, "x %s w %s M=%lld N=%lld K=%lld bias=%d strided=%d thr=%d", name_of(xt), name_of(wt),
                (long long)M, (long long)N, (long long)K, int(bias), int(strided_x), threads);
  EXPECT(mtp_linear(&xv, &wv, bias ? &bt : nullptr, &yv, threads) == MTP_OK, "%s: %s", what, mtp_last_error());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double want = bias ? bv.get(size_t(n)) : 0.0, l1 = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = x.get(size_t(m * K * xc + k * xc)) * w.get(size_t(n * (K + 3) + k));
        want += p;
        l1 += std::fabs(p);
      }
      // fp32 sums of K products in another order: a few ulp of the sum of magnitudes.
      const double got = y[size_t(m * N + n)];
      EXPECT(std::fabs(got - want) <= 1e-5 * l1 + 1e-6 * std::fabs(want) + 1e-30,
             "%s: y[%lld,%lld] = %.9g, oracle %.9g", what, (long long)m, (long long)n, got, want);
    }
  expect_rows_alone(what, xv, y.data(), M, N, [&](const mtp_tensor* x1, const mtp_tensor* y1) {
    return mtp_linear(x1, &wv, bias ? &bt : nullptr, y1, 1);
  });
  // y in x's dtype (strided): the fp32 result rounded to nearest even, as the torch op does.
  if (xt != MTP_FLOAT32 && M > 0 && N > 0) {
    Arr yl(xt, size_t(M * N * 2));
    mtp_tensor ylv{};
    ylv.data = yl.data();
    ylv.dtype = xt;
    ylv.ndim = 2;
    ylv.sizes[0] = M;
    ylv.sizes[1] = N;
    ylv.strides[0] = 1;
    ylv.strides[1] = 2 * M;
    EXPECT(mtp_linear(&xv, &wv, bias ? &bt : nullptr, &ylv, threads) == MTP_OK, "%s: %s", what, mtp_last_error());
    Arr r(xt, 1);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        r.set(0, y[size_t(m * N + n)]);
        EXPECT(yl.bits(size_t(m + n * 2 * M)) == r.bits(0), "%s: %s y[%lld,%lld] is not the rounded fp32 result", what,
               name_of(xt), (long long)m, (long long)n);
      }
  }
}

// bf16 x bf16 on avx512 (two FMAs per pair, the activations split once per call) follows
// VDPBF16PS's order (avx512_bf16): with no subnormal in sight the two give the same fp32 bits,
// for one row, a row group of 5 (4 x 4 tiles) and two groups (4 + 5 rows), and a K tail.
void expect_pairs_match_vdpbf16ps() {
  if (!mtp_isa_supported("avx512_bf16")) return;
  const std::string before = mtp_get_isa();
  for (int64_t M : {1, 2, 5, 9, 17}) {
    const int64_t N = 53, K = 576 + 19;
    Arr x(MTP_BFLOAT16, size_t(M * K)), w(MTP_BFLOAT16, size_t(N * K));
    x.randomize(-1, 1);
    w.randomize(-1, 1);
    const int64_t xs[2] = {M, K}, ws[2] = {N, K}, ys[2] = {M, N};
    mtp_tensor xv = mtp_contiguous(x.data(), MTP_BFLOAT16, 2, xs), wv = mtp_contiguous(w.data(), MTP_BFLOAT16, 2, ws);
    std::vector<float> y[2];
    const char* isas[2] = {"avx512", "avx512_bf16"};
    for (int i = 0; i < 2; ++i) {
      y[i].assign(size_t(M * N), -7.f);
      mtp_tensor yv = mtp_contiguous(y[i].data(), MTP_FLOAT32, 2, ys);
      EXPECT(mtp_set_isa(isas[i]) == MTP_OK && mtp_linear(&xv, &wv, nullptr, &yv, 2) == MTP_OK, "%s", mtp_last_error());
    }
    EXPECT(std::memcmp(y[0].data(), y[1].data(), y[0].size() * 4) == 0,
           "M=%lld: avx512's bf16 pairs differ from VDPBF16PS", (long long)M);
  }
  mtp_set_isa(before.c_str());
}

// w_rows (rows read in place through an index, the MTP head's draft vocabulary) gives the
// bits of the same rows copied out, for float and Q8 weights, with and without quantize_x,
// on the current ISA; repeated and out-of-order rows included.
void expect_gathered_rows_match_copies() {
  const int64_t V = 70, N = 37, K = 576 + 19, nb = mtp::q8_blocks(K);
  std::vector<int64_t> ids(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) ids[size_t(n)] = (n * 29 + 11) % V;
  ids[5] = ids[6];
  for (mtp_dtype wt : {MTP_FLOAT32, MTP_BFLOAT16, MTP_INT8})
    for (bool quantize_x : {false, true}) {
      if (quantize_x && wt != MTP_INT8) continue;
      const bool q8 = wt == MTP_INT8;
      const size_t es = q8 ? 1 : wt == MTP_FLOAT32 ? 4 : 2;
      Arr w(q8 ? MTP_FLOAT32 : wt, size_t(V * K));
      w.randomize(-1, 1);
      std::vector<int8_t> q(size_t(V * K));
      std::vector<float> sc(size_t(V * nb));
      for (auto& v : q) v = int8_t(uniform(-128, 127));
      for (auto& v : sc) v = float(std::uniform_real_distribution<double>(-0.02, 0.02)(rng));
      const char* all = q8 ? reinterpret_cast<const char*>(q.data()) : static_cast<const char*>(w.data());
      std::vector<char> copy(size_t(N) * K * es);
      std::vector<float> copy_sc(size_t(N * nb));
      for (int64_t n = 0; n < N; ++n) {
        std::memcpy(copy.data() + n * K * es, all + ids[size_t(n)] * K * es, K * es);
        std::copy_n(sc.data() + ids[size_t(n)] * nb, nb, copy_sc.data() + n * nb);
      }
      for (int64_t M : {1, 5, 9}) {
        Arr x(MTP_BFLOAT16, size_t(M * K));
        x.randomize(-1, 1);
        std::vector<float> y[2];
        for (int gathered = 0; gathered < 2; ++gathered) {
          mtp::LinearArgs a;
          a.M = M;
          a.N = N;
          a.K = K;
          a.x = x.data();
          a.x_dtype = mtp::DType::BF16;
          a.x_stride = K;
          a.w = gathered ? all : copy.data();
          a.w_rows = gathered ? ids.data() : nullptr;
          a.w_dtype = q8 ? mtp::DType::I8 : mtp::DType(int(wt));
          a.w_stride = K;
          if (q8) {
            a.w_scale = gathered ? sc.data() : copy_sc.data();
            a.w_scale_stride = nb;
          }
          a.quantize_x = quantize_x;
          y[gathered].assign(size_t(M * N), -7.f);
          a.y = y[gathered].data();
          a.y_stride = N;
          mtp::linear(a, mtp::current_isa(), mtp::ThreadParallelFor{2});
        }
        EXPECT(std::memcmp(y[0].data(), y[1].data(), y[0].size() * 4) == 0,
               "w %s%s M=%lld: rows read through w_rows differ from the same rows copied", name_of(wt),
               quantize_x ? " quantize_x" : "", (long long)M);
      }
    }
}

}  // namespace

void test_linear() {
  int cases = 0;
  const mtp_dtype types[] = {MTP_FLOAT32, MTP_BFLOAT16, MTP_FLOAT16};
  for (mtp_dtype xt : types)
    for (mtp_dtype wt : types)
      for (int64_t K : {1, 7, 64, 100, 515}) {
        run_linear_case(7, 37, K, xt, wt, cases % 2, cases % 3 == 0, 1 + cases % 3);
        ++cases;
      }
  run_linear_case(5, 300, 576, MTP_FLOAT32, MTP_BFLOAT16, true, false, 4), ++cases;  // many column blocks
  run_linear_case(3, 4, 0, MTP_FLOAT32, MTP_FLOAT32, true, false, 1), ++cases;       // K = 0: y = bias
  run_linear_case(0, 4, 8, MTP_BFLOAT16, MTP_FLOAT32, false, false, 1), ++cases;     // M = 0
  expect_pairs_match_vdpbf16ps();
  expect_gathered_rows_match_copies();
  std::printf("linear: %d cases on %s\n", cases, mtp_get_isa());
}

// ---------------------------------------------------------------- linear with int8 (Q8) weights
namespace {

// The sum of an ISA's W accumulator lanes in its kernel's order: NEON's pairwise tree, or
// halving (lane l + lane l + h) on x86.
float lane_tree_sum(float* acc, int W, bool neon_tree) {
  if (neon_tree) return (acc[0] + acc[1]) + (acc[2] + acc[3]);
  for (int h = W / 2; h >= 1; h /= 2)
    for (int l = 0; l < h; ++l) acc[l] = acc[l] + acc[l + h];
  return acc[0];
}

// The documented order of one output element, in scalar code: lanes of W (16 avx512, 8 avx2,
// 4 neon; 0: the generic path) take each whole block of 32 as t = x*q, then fma over the next
// W elements, then acc = fma(t, scale, acc); the lanes are summed by the ISA's tree; a partial
// last block is summed in order and added as sum + scale * t; then the bias. The generic path
// sums every block in order and adds scale * t.
float q8_emulate(int W, bool neon_tree, const std::vector<float>& x, const int8_t* q, const float* s, int64_t K,
                 const float* bias) {
  const int64_t kv = W ? K / 32 * 32 : 0;
  float sum = 0.f;
  if (W) {
    float acc[16] = {};
    for (int64_t k0 = 0; k0 < kv; k0 += 32)
      for (int l = 0; l < W; ++l) {
        float t = x[size_t(k0 + l)] * float(q[k0 + l]);
        for (int i = 1; i < 32 / W; ++i) t = std::fma(x[size_t(k0 + i * W + l)], float(q[k0 + i * W + l]), t);
        acc[l] = std::fma(t, s[k0 / 32], acc[l]);
      }
    sum = lane_tree_sum(acc, W, neon_tree);
  }
  for (int64_t k0 = kv; k0 < K; k0 += 32) {
    float t = 0.f;
    for (int64_t k = k0; k < std::min<int64_t>(K, k0 + 32); ++k) t += x[size_t(k)] * float(q[k]);
    sum = sum + s[k0 / 32] * t;
  }
  return bias ? sum + *bias : sum;
}

int lanes_of(const char* isa, bool* neon_tree) {
  *neon_tree = std::strncmp(isa, "neon", 4) == 0;
  if (*neon_tree) return 4;
  if (std::strncmp(isa, "avx512", 6) == 0) return 16;
  if (std::strcmp(isa, "avx2") == 0) return 8;
  return 0;
}

// A random Q8 problem for the C API: x [M, K] (every other element when strided_x), int8
// weights and their scales in padded rows, a bias, y [M, N] (-7 everywhere), and their views.
struct Q8ApiCase {
  int64_t M, N, K, xc, nb, ws, ss;
  Arr x, bv;
  std::vector<int8_t> w;
  std::vector<float> sc, y;
  int64_t ysz[2];
  mtp_tensor xv{}, wv{}, sv{}, bt{}, yv{};
  Q8ApiCase(int64_t M, int64_t N, int64_t K, mtp_dtype xt, bool strided_x)
      : M(M),
        N(N),
        K(K),
        xc(strided_x ? 2 : 1),
        nb((K + 31) / 32),
        ws(K + 5),
        ss(nb + 2),
        x(xt, size_t(std::max<int64_t>(M * K * xc, 1))),
        bv(MTP_FLOAT32, size_t(std::max<int64_t>(N, 1))),
        w(size_t(std::max<int64_t>(N * ws, 1))),
        sc(size_t(std::max<int64_t>(N * ss, 1))),
        y(size_t(std::max<int64_t>(M * N, 1)), -7.f),
        ysz{M, N} {
    x.randomize(-1, 1);
    bv.randomize(-2, 2);
    for (auto& q : w) q = int8_t(uniform(-128, 127));
    for (auto& v : sc) v = float(std::uniform_real_distribution<double>(-0.02, 0.02)(rng));
    xv.data = x.data();
    xv.dtype = xt;
    xv.ndim = 2;
    xv.sizes[0] = M;
    xv.sizes[1] = K;
    xv.strides[0] = K * xc;
    xv.strides[1] = xc;
    wv.data = w.data();
    wv.dtype = MTP_INT8;
    wv.ndim = 2;
    wv.sizes[0] = N;
    wv.sizes[1] = K;
    wv.strides[0] = ws;
    wv.strides[1] = 1;
    sv.data = sc.data();
    sv.dtype = MTP_FLOAT32;
    sv.ndim = 2;
    sv.sizes[0] = N;
    sv.sizes[1] = nb;
    sv.strides[0] = ss;
    sv.strides[1] = 1;
    bt = mtp_contiguous(bv.data(), MTP_FLOAT32, 1, &this->N);
    yv = mtp_contiguous(y.data(), MTP_FLOAT32, 2, ysz);
  }
};

void run_linear_q8_case(int64_t M, int64_t N, int64_t K, mtp_dtype xt, bool bias, bool strided_x, int threads) {
  Q8ApiCase c(M, N, K, xt, strided_x);
  if (N > 1 && c.nb > 0) c.sc[size_t(c.ss)] = 0.f;  // a zero block
  char what[160];
  std::snprintf(what, sizeof what, "q8 x %s M=%lld N=%lld K=%lld bias=%d strided=%d thr=%d", name_of(xt), (long long)M,
                (long long)N, (long long)K, int(bias), int(strided_x), threads);
  EXPECT(mtp_linear_q8(&c.xv, &c.wv, &c.sv, bias ? &c.bt : nullptr, &c.yv, threads) == MTP_OK, "%s: %s", what,
         mtp_last_error());
  bool neon_tree;
  const int W = lanes_of(mtp_get_isa(), &neon_tree);
  std::vector<float> xr(static_cast<size_t>(K));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K; ++k) xr[size_t(k)] = float(c.x.get(size_t(m * K * c.xc + k * c.xc)));
    for (int64_t n = 0; n < N; ++n) {
      const int8_t* q = c.w.data() + n * c.ws;
      const float* s = c.sc.data() + n * c.ss;
      double want = bias ? c.bv.get(size_t(n)) : 0.0, l1 = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(xr[size_t(k)]) * q[k] * s[k / 32];
        want += p;
        l1 += std::fabs(p);
      }
      const float got = c.y[size_t(m * N + n)];
      EXPECT(std::fabs(got - want) <= 1e-5 * l1 + 1e-6 * std::fabs(want) + 1e-30,
             "%s: y[%lld,%lld] = %.9g, oracle %.9g", what, (long long)m, (long long)n, double(got), want);
      const float b = bias ? c.bv.f[size_t(n)] : 0.f;
      const float emu = q8_emulate(W, neon_tree, xr, q, s, K, bias ? &b : nullptr);
      EXPECT(std::memcmp(&got, &emu, 4) == 0, "%s: y[%lld,%lld] = %.9g, the documented order on %s gives %.9g", what,
             (long long)m, (long long)n, double(got), mtp_get_isa(), double(emu));
    }
  }
  expect_rows_alone(what, c.xv, c.y.data(), M, N, [&](const mtp_tensor* x1, const mtp_tensor* y1) {
    return mtp_linear_q8(x1, &c.wv, &c.sv, bias ? &c.bt : nullptr, y1, 1);
  });
  // y in x's dtype: the fp32 result rounded to nearest even.
  if (xt != MTP_FLOAT32 && M > 0 && N > 0) {
    Arr yl(xt, size_t(M * N));
    mtp_tensor ylv = mtp_contiguous(yl.data(), xt, 2, c.ysz);
    EXPECT(mtp_linear_q8(&c.xv, &c.wv, &c.sv, bias ? &c.bt : nullptr, &ylv, threads) == MTP_OK, "%s: %s", what,
           mtp_last_error());
    Arr r(xt, 1);
    for (int64_t i = 0; i < M * N; ++i) {
      r.set(0, c.y[size_t(i)]);
      EXPECT(yl.bits(size_t(i)) == r.bits(0), "%s: %s y[%lld] is not the rounded fp32 result", what, name_of(xt),
             (long long)i);
    }
  }
}

}  // namespace

void test_linear_q8() {
  int cases = 0;
  for (mtp_dtype xt : {MTP_FLOAT32, MTP_BFLOAT16, MTP_FLOAT16})
    for (int64_t K : {1, 7, 31, 32, 33, 64, 100, 515}) {
      run_linear_q8_case(7, 37, K, xt, cases % 2, cases % 3 == 0, 1 + cases % 3);
      ++cases;
    }
  for (int64_t M : {1, 2, 5, 9, 17, 20})  // every row grouping (9 = 5 + 4, 17 > the row block)
    run_linear_q8_case(M, 45, 96 + 13, MTP_FLOAT32, true, false, 2), ++cases;
  run_linear_q8_case(5, 300, 576, MTP_BFLOAT16, true, false, 4), ++cases;  // many column blocks
  run_linear_q8_case(4, 1, 70, MTP_FLOAT32, false, false, 1), ++cases;     // N = 1
  run_linear_q8_case(3, 4, 0, MTP_FLOAT32, true, false, 1), ++cases;       // K = 0: y = bias
  run_linear_q8_case(0, 4, 8, MTP_BFLOAT16, false, false, 1), ++cases;     // M = 0
  std::printf("linear_q8: %d cases on %s\n", cases, mtp_get_isa());
}

namespace {

// reference.quantize_rows_q8's rule, written again: per block of 32, s = amax / 127 and
// q = clamp(round_half_even(x / s)) in fp32 (s == 0: q = 0).
void quantize_block(const float* x, int64_t n, int8_t* q, float* s) {
  float amax = 0.f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  *s = amax / 127.f;
  for (int64_t i = 0; i < n; ++i)
    q[i] = *s > 0.f ? int8_t(std::min(127.f, std::max(-127.f, std::nearbyint(x[i] / *s)))) : int8_t(0);
}

// The documented order of quantize_x on an instruction set (the int32 block sums are exact,
// so only the fp32 steps matter). W = 0 (generic): per block, acc = acc + float(isum) *
// (sx * sw), blocks in order. W = 4, 8, 16 (neon, avx2, avx512): lanes of min(W, 8) per
// block, lane j of a block summing the products of the elements i with (i / 4) % min(W, 8)
// == j (neon: 4j..4j+3 and 16+4j..16+4j+3); each lane acc = fma(float(lane), sx * sw, acc)
// over its blocks (avx512: lanes 8-15 take the odd blocks); then the W lanes by the
// instruction set's tree (neon_tree: (l0 + l1) + (l2 + l3); else halving), then the bias.
float q8dot_emulate(int W, bool neon_tree, const int8_t* xq, const float* xs, const int8_t* q, const float* s,
                    int64_t K, const float* bias) {
  const int64_t nb = (K + 31) / 32;
  float sum = 0.f;
  if (W == 0) {
    for (int64_t b = 0; b < nb; ++b) {
      int32_t t = 0;
      for (int64_t k = 32 * b; k < std::min(K, 32 * b + 32); ++k) t += int32_t(xq[k]) * int32_t(q[k]);
      sum = sum + float(t) * (xs[b] * s[b]);
    }
  } else {
    const int lpb = std::min(W, 8), bpc = W / lpb;  // lanes per block, blocks per chunk
    float acc[16] = {};
    for (int64_t b = 0; b < nb; ++b) {
      int32_t lane[8] = {};
      for (int64_t k = 32 * b; k < std::min(K, 32 * b + 32); ++k)
        lane[(k % 32) / 4 % lpb] += int32_t(xq[k]) * int32_t(q[k]);
      const float f = xs[b] * s[b];
      for (int j = 0; j < lpb; ++j) {
        float& a = acc[(b % bpc) * lpb + j];
        a = std::fma(float(lane[j]), f, a);
      }
    }
    sum = lane_tree_sum(acc, W, neon_tree);
  }
  return bias ? sum + *bias : sum;
}

// nan_rows: rows 1, 4, 7, ... get one NaN (or an infinity, every other such row): all their
// outputs are NaN, the other rows are untouched (checked against the oracle and alone).
void run_linear_q8dot_case(int64_t M, int64_t N, int64_t K, mtp_dtype xt, bool bias, bool strided_x, int threads,
                           bool nan_rows = false) {
  Q8ApiCase c(M, N, K, xt, strided_x);
  auto poisoned = [&](int64_t m) { return nan_rows && K > 0 && m % 3 == 1; };
  for (int64_t m = 0; m < M; ++m)
    if (poisoned(m)) c.x.set(size_t(m * K * c.xc + (m * 7 % K) * c.xc), m % 2 ? NAN : -INFINITY);
  char what[160];
  std::snprintf(what, sizeof what, "q8dot x %s M=%lld N=%lld K=%lld bias=%d strided=%d thr=%d nan=%d", name_of(xt),
                (long long)M, (long long)N, (long long)K, int(bias), int(strided_x), threads, int(nan_rows));
  EXPECT(mtp_linear_q8dot(&c.xv, &c.wv, &c.sv, bias ? &c.bt : nullptr, &c.yv, threads) == MTP_OK, "%s: %s", what,
         mtp_last_error());
  bool neon_tree;
  const int W = lanes_of(mtp_get_isa(), &neon_tree);
  std::vector<float> xr(static_cast<size_t>(K)), xs(static_cast<size_t>(c.nb));
  std::vector<int8_t> xq(static_cast<size_t>(K));
  for (int64_t m = 0; m < M; ++m) {
    if (poisoned(m)) {
      for (int64_t n = 0; n < N; ++n)
        EXPECT(std::isnan(c.y[size_t(m * N + n)]), "%s: y[%lld,%lld] = %.9g, not NaN (x row has a NaN/inf)", what,
               (long long)m, (long long)n, double(c.y[size_t(m * N + n)]));
      continue;
    }
    for (int64_t k = 0; k < K; ++k) xr[size_t(k)] = float(c.x.get(size_t(m * K * c.xc + k * c.xc)));
    for (int64_t b = 0; b < c.nb; ++b)
      quantize_block(xr.data() + 32 * b, std::min<int64_t>(32, K - 32 * b), xq.data() + 32 * b, &xs[size_t(b)]);
    for (int64_t n = 0; n < N; ++n) {
      const int8_t* q = c.w.data() + n * c.ws;
      const float* s = c.sc.data() + n * c.ss;
      double want = 0, l1 = 0;
      for (int64_t b = 0; b < c.nb; ++b) {
        int64_t isum = 0, iabs = 0;
        for (int64_t k = 32 * b; k < std::min(K, 32 * b + 32); ++k) {
          isum += int64_t(xq[size_t(k)]) * q[k];
          iabs += std::abs(int64_t(xq[size_t(k)]) * q[k]);
        }
        const double f = double(xs[size_t(b)]) * double(s[b]);
        want += double(isum) * f;
        l1 += double(iabs) * std::fabs(f);
      }
      if (bias) want += c.bv.get(size_t(n));
      const float got = c.y[size_t(m * N + n)];
      // reference.linear's documented bound
      EXPECT(std::fabs(got - want) <= (c.nb + 8) * std::ldexp(l1, -24) + std::ldexp(std::fabs(want), -23) + 1e-30,
             "%s: y[%lld,%lld] = %.9g, oracle %.9g", what, (long long)m, (long long)n, double(got), want);
      const float b = bias ? c.bv.f[size_t(n)] : 0.f;
      const float emu = q8dot_emulate(W, neon_tree, xq.data(), xs.data(), q, s, K, bias ? &b : nullptr);
      EXPECT(std::memcmp(&got, &emu, 4) == 0, "%s: y[%lld,%lld] = %.9g, the documented order on %s gives %.9g", what,
             (long long)m, (long long)n, double(got), mtp_get_isa(), double(emu));
    }
  }
  expect_rows_alone(what, c.xv, c.y.data(), M, N, [&](const mtp_tensor* x1, const mtp_tensor* y1) {
    return mtp_linear_q8dot(x1, &c.wv, &c.sv, bias ? &c.bt : nullptr, y1, 1);
  });
}

// quantize_x's kernel arguments for random rows x [M, K] (quantized into `rows`) and weights.
struct Q8dotProblem {
  int64_t M, N, K;
  std::vector<float> rows, sc;
  std::vector<int8_t> w;
  mtp::LinearArgs a;
  Q8dotProblem(int64_t M, int64_t N, int64_t K) : M(M), N(N), K(K) {
    std::vector<float> x(size_t(M * K));
    for (auto& v : x) v = float(std::uniform_real_distribution<double>(-3, 3)(rng));
    w.resize(size_t(std::max<int64_t>(N * K, 1)));
    for (auto& q : w) q = int8_t(uniform(-128, 127));
    sc.assign(size_t(std::max<int64_t>(N * ((K + 31) / 32), 1)), 0.01f);
    const int64_t rb = mtp::xq_row_bytes(K);
    rows.resize(size_t(std::max<int64_t>(M * rb / 4, 1)));
    for (int64_t m = 0; m < M; ++m)
      mtp::quantize_row_q8(x.data() + m * K, mtp::DType::F32, K, reinterpret_cast<char*>(rows.data()) + m * rb);
    a.M = M;
    a.N = N;
    a.K = K;
    a.x = rows.data();
    a.x_dtype = mtp::DType::I8;
    a.x_stride = rb;
    a.w = w.data();
    a.w_dtype = mtp::DType::I8;
    a.w_stride = K;
    a.w_scale = sc.data();
    a.w_scale_stride = (K + 31) / 32;
  }
  void run(std::vector<float>& y, void (*f)(const mtp::LinearArgs&, int64_t, int64_t)) {
    y.assign(size_t(std::max<int64_t>(M * N, 1)), -7.f);
    a.y = y.data();
    a.y_stride = N;
    f(a, 0, N);
  }
};

#if defined(MTP_X86)
// The VNNI and the VPMADDUBSW variants of one instruction set give the same bits.
void expect_vnni_variants_agree() {
  Q8dotProblem p(5, 70, 576 + 45);
  std::vector<float> y1, y2;
  if (mtp::has_avx512_vnni()) {
    p.run(y1, mtp::x86::linear_q8dot_avx512_vnni);
    p.run(y2, mtp::x86::linear_q8dot_avx512_madd);
    EXPECT(std::memcmp(y1.data(), y2.data(), y1.size() * 4) == 0, "avx512: VNNI and VPMADDUBSW results differ");
  }
  if (mtp::has_avx_vnni()) {
    p.run(y1, mtp::x86::linear_q8dot_avx2_vnni);
    p.run(y2, mtp::x86::linear_q8dot_avx2_madd);
    EXPECT(std::memcmp(y1.data(), y2.data(), y1.size() * 4) == 0, "avx2: AVX_VNNI and VPMADDUBSW results differ");
  }
}
#endif

#if defined(MTP_ARM64)
// The SDOT and the SMULL variants give the same bits (K below, at and past whole blocks and
// groups; every row grouping). Only where the CPU has dotprod (qemu -cpu max); elsewhere the
// SMULL variant alone runs, checked by the cases against the same documented order.
void expect_sdot_variants_agree() {
#if defined(MTP_NEON_DOTPROD)
  if (!mtp::has_neon_dotprod()) return;
  int checked = 0;
  for (int64_t K : {1, 7, 31, 32, 33, 64, 100, 576 + 45})
    for (int64_t M : {1, 5, 9, 17}) {
      Q8dotProblem p(M, 37, K);
      std::vector<float> y1, y2;
      p.run(y1, mtp::neon::linear_q8dot_neon_sdot);
      p.run(y2, mtp::neon::linear_q8dot_neon_smull);
      EXPECT(std::memcmp(y1.data(), y2.data(), y1.size() * 4) == 0, "neon M=%lld K=%lld: SDOT and SMULL results differ",
             (long long)M, (long long)K);
      ++checked;
    }
  std::printf("linear_q8dot: SDOT == SMULL bitwise on %d shapes\n", checked);
#endif
}
#endif

}  // namespace

void test_linear_q8dot() {
  int cases = 0;
  for (mtp_dtype xt : {MTP_FLOAT32, MTP_BFLOAT16, MTP_FLOAT16})
    for (int64_t K : {1, 7, 31, 32, 33, 63, 64, 65, 100, 515}) {
      run_linear_q8dot_case(7, 37, K, xt, cases % 2, cases % 3 == 0, 1 + cases % 3);
      ++cases;
    }
  for (int64_t M = 1; M <= 33; ++M)  // every row grouping and row block: each row == the row alone
    run_linear_q8dot_case(M, 45, 96 + 13, MTP_FLOAT32, M % 2, false, 1 + M % 3), ++cases;
  run_linear_q8dot_case(5, 300, 576, MTP_BFLOAT16, true, false, 4), ++cases;
  for (int64_t K : {5, 32, 77})  // NaN / infinite rows among finite ones
    run_linear_q8dot_case(11, 37, K, MTP_FLOAT32, true, false, 2, true), ++cases;
  run_linear_q8dot_case(3, 4, 0, MTP_FLOAT32, true, false, 1), ++cases;  // K = 0: y = bias
  run_linear_q8dot_case(0, 4, 8, MTP_BFLOAT16, false, false, 1), ++cases;
#if defined(MTP_X86)
  if (std::string(mtp_get_isa()) == "avx512") expect_vnni_variants_agree();
#elif defined(MTP_ARM64)
  if (std::string(mtp_get_isa()) == "neon") expect_sdot_variants_agree();
#endif
  std::printf("linear_q8dot: %d cases on %s\n", cases, mtp_get_isa());
}

// ---------------------------------------------------------------- bad arguments
namespace {

// A valid linear (M=3, N=4, K=5, bias); y must stay untouched.
struct LinearCall {
  std::vector<float> x = std::vector<float>(15, 1.f), w = std::vector<float>(20, 2.f), b = std::vector<float>(4, 0.5f),
                     y = std::vector<float>(12, -99.f);
  mtp_tensor xv, wv, bv, yv;
  int32_t threads = 1;
  bool no_x = false, no_w = false, no_y = false;
  LinearCall() {
    int64_t xs[2] = {3, 5}, ws[2] = {4, 5}, bs[1] = {4}, ys[2] = {3, 4};
    xv = mtp_contiguous(x.data(), MTP_FLOAT32, 2, xs);
    wv = mtp_contiguous(w.data(), MTP_FLOAT32, 2, ws);
    bv = mtp_contiguous(b.data(), MTP_FLOAT32, 1, bs);
    yv = mtp_contiguous(y.data(), MTP_FLOAT32, 2, ys);
  }
  mtp_status run() {
    return mtp_linear(no_x ? nullptr : &xv, no_w ? nullptr : &wv, &bv, no_y ? nullptr : &yv, threads);
  }
  bool untouched() const {
    for (float v : y)
      if (v != -99.f) return false;
    return true;
  }
};

#define BAD_LINEAR(mutation, status, needle) BAD_CALL(LinearCall, mutation, status, needle)

// A valid linear_q8 (M=3, N=4, K=40: a whole block and a partial one, bias); y must stay untouched.
struct LinearQ8Call {
  std::vector<float> x = std::vector<float>(120, 1.f), s = std::vector<float>(8, 0.5f), b = std::vector<float>(4, 0.5f),
                     y = std::vector<float>(12, -99.f);
  std::vector<int8_t> w = std::vector<int8_t>(160, 2);
  mtp_tensor xv, wv, sv, bv, yv;
  int32_t threads = 1;
  bool no_scale = false;
  LinearQ8Call() {
    int64_t xs[2] = {3, 40}, ws[2] = {4, 40}, ss[2] = {4, 2}, bs[1] = {4}, ys[2] = {3, 4};
    xv = mtp_contiguous(x.data(), MTP_FLOAT32, 2, xs);
    wv = mtp_contiguous(w.data(), MTP_INT8, 2, ws);
    sv = mtp_contiguous(s.data(), MTP_FLOAT32, 2, ss);
    bv = mtp_contiguous(b.data(), MTP_FLOAT32, 1, bs);
    yv = mtp_contiguous(y.data(), MTP_FLOAT32, 2, ys);
  }
  mtp_status run() { return mtp_linear_q8(&xv, &wv, no_scale ? nullptr : &sv, &bv, &yv, threads); }
  bool untouched() const {
    for (float v : y)
      if (v != -99.f) return false;
    return true;
  }
};

#define BAD_Q8(mutation, status, needle) BAD_CALL(LinearQ8Call, mutation, status, needle)

}  // namespace

void test_linear_errors() {
  {
    LinearCall l;
    EXPECT(l.run() == MTP_OK && l.y[0] == 10.5f, "linear baseline: %s", mtp_last_error());
  }
  const mtp_status NUL = MTP_ERROR_NULL_POINTER, ARG = MTP_ERROR_INVALID_ARGUMENT, DT = MTP_ERROR_UNSUPPORTED_DTYPE;
  BAD_LINEAR(c.no_x = true, NUL, "mtp_linear: x is NULL");
  BAD_LINEAR(c.no_w = true, NUL, "weight is NULL");
  BAD_LINEAR(c.no_y = true, NUL, "y is NULL");
  BAD_LINEAR(c.xv.dtype = MTP_INT32, DT, "x must be float32 or bfloat16 or float16, got int32");
  BAD_LINEAR(c.bv.dtype = 9, DT, "bias must be float32 or bfloat16 or float16, got unknown");
  BAD_LINEAR(c.yv.dtype = MTP_BFLOAT16, DT, "y must be float32, got bfloat16");  // x is fp32
  BAD_LINEAR(c.wv.ndim = 1, ARG, "weight must be 2-D [N, K], got ndim = 1");
  BAD_LINEAR(c.wv.sizes[1] = 4, ARG, "weight.sizes[1] must equal K (x.sizes[1]) = 5, got 4");
  BAD_LINEAR((c.wv.strides[0] = 1, c.wv.strides[1] = 4), ARG,
             "weight rows must be contiguous (stride 1 along K), got strides [1, 4]");
  BAD_LINEAR(c.bv.sizes[0] = 3, ARG, "bias.sizes[0] must equal N (weight.sizes[0]) = 4, got 3");
  BAD_LINEAR(c.yv.sizes[0] = 2, ARG, "y.sizes[0] must equal M (x.sizes[0]) = 3, got 2");
  BAD_LINEAR(c.yv.sizes[1] = 5, ARG, "y.sizes[1] must equal N (weight.sizes[0]) = 4, got 5");
  BAD_LINEAR(c.threads = -3, ARG, "num_threads must be >= 0");
  BAD_LINEAR(c.wv.dtype = MTP_INT8, DT, "mtp_linear: weight is int8: call mtp_linear_q8 with its weight_scale");

  {
    LinearQ8Call q;
    EXPECT(q.run() == MTP_OK && q.y[0] == 40.5f && q.y[11] == 40.5f, "linear_q8 baseline: %s (y[0] = %g)",
           mtp_last_error(), double(q.y[0]));
  }
  BAD_Q8(c.no_scale = true, NUL, "mtp_linear_q8: weight_scale is NULL");
  BAD_Q8(c.wv.dtype = MTP_FLOAT32, DT, "weight must be int8, got float32");
  BAD_Q8(c.sv.dtype = MTP_BFLOAT16, DT, "weight_scale must be float32, got bfloat16");
  BAD_Q8(c.sv.ndim = 1, ARG, "weight_scale must be 2-D [N, ceil(K/32)], got ndim = 1");
  BAD_Q8(c.sv.sizes[0] = 3, ARG, "weight_scale.sizes[0] must equal N (weight.sizes[0]) = 4, got 3");
  BAD_Q8(c.sv.sizes[1] = 1, ARG, "weight_scale.sizes[1] must equal ceil(K/32) (blocks of 32 along K) = 2, got 1");
  BAD_Q8((c.sv.strides[0] = 1, c.sv.strides[1] = 4), ARG,
         "weight_scale rows must be contiguous (stride 1 along the blocks), got strides [1, 4]");
  BAD_Q8(c.sv.data = nullptr, NUL, "weight_scale.data is NULL");
  BAD_Q8((c.wv.strides[0] = 1, c.wv.strides[1] = 4), ARG,
         "weight rows must be contiguous (stride 1 along K), got strides [1, 4]");
  BAD_Q8(c.wv.sizes[1] = 41, ARG, "weight.sizes[1] must equal K (x.sizes[1]) = 40, got 41");
  BAD_Q8(c.xv.dtype = MTP_INT8, DT, "x must be float32 or bfloat16 or float16, got int8");
  BAD_Q8(c.yv.sizes[1] = 3, ARG, "y.sizes[1] must equal N (weight.sizes[0]) = 4, got 3");
  BAD_Q8(c.bv.sizes[0] = 5, ARG, "bias.sizes[0] must equal N (weight.sizes[0]) = 4, got 5");
  BAD_Q8(c.threads = -1, ARG, "num_threads must be >= 0");
  std::printf("linear_errors: checked\n");
}
