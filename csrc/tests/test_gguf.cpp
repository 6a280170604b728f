// GGUF block-type weights (gguf.h): the current instruction set's product gives the generic
// kernel's bits (the canonical order) for every format, shape and row count; a row's bits do
// not depend on M, the thread split or a row map; the product is the dequantized weights'
// within the int8 activations' error; dequantize_row is d * q + m.
#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

#include "mtp/linear.h"
#include "test_util.h"

namespace {

using mtp::kBlockTypes;

uint16_t random_f16_scale(bool negative_ok) {  // a normal fp16 in about [2^-10, 2^-4)
  const uint16_t exp = uint16_t(uniform(5, 10)), man = uint16_t(uniform(0, 1023));
  const uint16_t sign = negative_ok && uniform(0, 3) == 0 ? 0x8000 : 0;
  return uint16_t(sign | (exp << 10) | man);
}

// N rows of random blocks: random quant bytes, fp16 scales in a realistic range.
std::vector<uint8_t> random_rows(mtp::DType t, int64_t N, int64_t K) {
  const int64_t rb = mtp::block_row_bytes(t, K), bb = mtp::block_bytes(t);
  std::vector<uint8_t> w(size_t(N * rb));
  for (auto& v : w) v = uint8_t(uniform(0, 255));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < rb / bb; ++b) {
      uint8_t* blk = w.data() + n * rb + b * bb;
      auto put = [](uint8_t* p, uint16_t h) { std::memcpy(p, &h, 2); };
      if (t == mtp::DType::Q6_K)
        put(blk + 208, random_f16_scale(true));
      else
        put(blk, random_f16_scale(true));
      if (t == mtp::DType::Q4_1 || t == mtp::DType::Q4_K) put(blk + 2, random_f16_scale(true));
    }
  return w;
}

struct Case {
  mtp::DType t;
  int64_t M, N, K;
  std::vector<uint8_t> w;
  std::vector<float> x, bias;
  Case(mtp::DType t_, int64_t M_, int64_t N_, int64_t K_) : t(t_), M(M_), N(N_), K(K_), w(random_rows(t_, N_, K_)) {
    std::normal_distribution<float> nd(0.f, 1.f);
    x.resize(size_t(M * K));
    for (auto& v : x) v = nd(rng);
    bias.resize(size_t(N));
    for (auto& v : bias) v = nd(rng);
  }
  mtp::LinearArgs args(std::vector<float>& y, bool with_bias, int64_t m0 = 0, int64_t rows = -1) const {
    mtp::LinearArgs a;
    a.M = rows < 0 ? M : rows;
    a.N = N;
    a.K = K;
    a.x = x.data() + m0 * K;
    a.x_dtype = mtp::DType::F32;
    a.x_stride = K;
    a.w = w.data();
    a.w_dtype = t;
    a.w_stride = mtp::block_row_bytes(t, K);
    a.bias = with_bias ? bias.data() : nullptr;
    y.assign(size_t(a.M * N), -1.f);
    a.y = y.data();
    a.y_stride = N;
    return a;
  }
};

// The case's weights in the x8 layout (gguf.h; N a multiple of 8).
std::vector<uint8_t> x8_bytes(const Case& c) {
  std::vector<uint8_t> w8(c.w.size());
  mtp::repack_x8(c.t, c.w.data(), mtp::block_row_bytes(c.t, c.K), c.N, c.K, w8.data());
  return w8;
}

auto serial = [](int64_t n, auto&& fn) { fn(int64_t(0), n); };

void run(const mtp::LinearArgs& a, mtp::Isa isa, int threads = 1) {
  if (threads == 1) return mtp::linear(a, isa, serial);
  mtp::linear(a, isa, [&](int64_t n, auto&& fn) {  // items split over real threads
    std::vector<std::thread> ts;
    for (int i = 0; i < threads; ++i) ts.emplace_back([&, i] { fn(n * i / threads, n * (i + 1) / threads); });
    for (auto& th : ts) th.join();
  });
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// ---- each SIMD variant called directly (not only the one the CPU's dispatch picks) against
// generic::gguf_linear on the same QuantRows: the same bits for every format, row grouping,
// column tail and split, row map, and the largest integer lanes.
using GgufKernel = void (*)(const mtp::LinearArgs&, const mtp::QuantRows&, int64_t, int64_t);

bool kernel_matches(const Case& c, GgufKernel f, bool bias, const int64_t* w_rows = nullptr, int64_t N = -1) {
  mtp::QuantRows xq;
  mtp::quantize_rows(c.x.data(), mtp::DType::F32, c.K, c.M, c.K, xq);
  std::vector<float> want, got;
  mtp::LinearArgs a = c.args(want, bias), b = c.args(got, bias);
  if (w_rows) {
    for (auto* p : {&a, &b}) p->N = N, p->w_rows = w_rows, p->y_stride = N;
    want.assign(size_t(c.M * N), -1.f), got.assign(size_t(c.M * N), -2.f);
    a.y = want.data(), b.y = got.data();
  }
  mtp::generic::gguf_linear(a, xq, 0, a.N);
  const int64_t cut = std::min<int64_t>(13, b.N);  // a split inside a tile of columns
  f(b, xq, 0, cut);
  f(b, xq, cut, b.N);
  return same_bits(want, got);
}

int expect_kernel_variant(const char* name, GgufKernel f) {
  int checked = 0;
  for (mtp::DType t : kBlockTypes) {
    const int64_t e = mtp::block_elems(t);
    for (int64_t K : {e, 3 * e})
      for (int64_t N : {37, 200})  // 200: several column chunks of NEON's row groups (gguf_chunks)
        for (int64_t M : {1, 2, 3, 4, 5, 7}) {
          Case c(t, M, N, K);
          EXPECT(kernel_matches(c, f, M % 2 == 0), "%s %s M=%lld N=%lld K=%lld differs from generic", name,
                 mtp::block_type_name(t), (long long)M, (long long)N, (long long)K);
          ++checked;
        }
    Case c(t, 3, 40, 2 * e);
    const int64_t rows[] = {39, 0, 7, 7, 20, 33};
    EXPECT(kernel_matches(c, f, true, rows, 6), "%s %s w_rows differs from generic", name, mtp::block_type_name(t));
    ++checked;
  }
  // the largest lanes: Q8_0 -128 x -127 (adjacent int16 pairs 32512 on the plain NEON path),
  // Q6_K -32 x -127 times the multiplier -128, Q5_0 -16 x -127 (every 5th bit clear)
  for (mtp::DType t : {mtp::DType::Q8_0, mtp::DType::Q6_K, mtp::DType::Q5_0}) {
    Case c(t, 2, 9, 256);
    for (int64_t i = 0; i < int64_t(c.x.size()); ++i) c.x[size_t(i)] = i < 256 ? -1.5f : 2.f;
    const int64_t bb = mtp::block_bytes(t);
    for (size_t o = 0; o < c.w.size(); o += size_t(bb)) {
      if (t == mtp::DType::Q8_0)
        std::memset(&c.w[o + 2], 0x80, 32);
      else if (t == mtp::DType::Q5_0)
        std::memset(&c.w[o + 2], 0, 20);
      else
        std::memset(&c.w[o], 0, 192), std::memset(&c.w[o + 192], 0x80, 16);
    }
    EXPECT(kernel_matches(c, f, false), "%s %s extreme lanes differ from generic", name, mtp::block_type_name(t));
    ++checked;
  }
  // the x8 layout: the file layout's generic bits, whole groups split between calls
  for (mtp::DType t8 : mtp::kX8Types) {
    const mtp::DType t = mtp::file_type(t8);
    const int64_t e = mtp::block_elems(t);
    for (int64_t K : {e, 3 * e})
      for (int64_t N : {40, 136})  // 136: several column chunks of NEON's row groups (gguf_chunks)
        // 9 rows: one group (AVX-512 VNNI); from 16: 16 columns a tile (AVX-512 VNNI)
        for (int64_t M : {1, 2, 3, 4, 5, 8, 9, 10, 16, 17, 31}) {
          Case c(t, M, N, K);
          if (t == mtp::DType::Q8_0 && M == 9)  // the largest lanes: -128 x -127
            for (size_t o = 0; o < c.w.size(); o += 34) std::memset(&c.w[o + 2], 0x80, 32);
          if (t == mtp::DType::Q6_K && M == 9) {  // -32 x -127 times the multiplier -128
            for (int64_t i = 0; i < int64_t(c.x.size()); ++i) c.x[size_t(i)] = i % K < K / 2 ? -1.5f : 2.f;
            for (size_t o = 0; o < c.w.size(); o += 210)
              std::memset(&c.w[o], 0, 192), std::memset(&c.w[o + 192], 0x80, 16);
          }
          mtp::QuantRows xq;
          mtp::quantize_rows(c.x.data(), mtp::DType::F32, c.K, c.M, c.K, xq);
          std::vector<float> want, got;
          mtp::LinearArgs a = c.args(want, M % 2 == 0), b = c.args(got, M % 2 == 0);
          const std::vector<uint8_t> w8 = x8_bytes(c);
          b.w = w8.data(), b.w_dtype = t8;
          mtp::generic::gguf_linear(a, xq, 0, a.N);
          f(b, xq, 0, 16);
          f(b, xq, 16, b.N);
          EXPECT(same_bits(want, got), "%s %s M=%lld N=%lld K=%lld differs from the file layout's generic", name,
                 mtp::block_type_name(t8), (long long)M, (long long)N, (long long)K);
          ++checked;
        }
    // a row map (gathered groups, a partial last group) gives the file layout's bits
    Case c(t, 3, 40, 3 * e);
    const std::vector<uint8_t> w8 = x8_bytes(c);
    const int64_t rows[] = {39, 0, 7, 7, 20, 33, 8, 15, 16, 1, 2};
    mtp::QuantRows xq;
    mtp::quantize_rows(c.x.data(), mtp::DType::F32, c.K, c.M, c.K, xq);
    std::vector<float> want, got;
    mtp::LinearArgs a = c.args(want, true), b = c.args(got, true);
    for (auto* p : {&a, &b}) p->N = 11, p->w_rows = rows, p->y_stride = 11;
    want.assign(33, -1.f), got.assign(33, -2.f);
    a.y = want.data(), b.y = got.data(), b.w = w8.data(), b.w_dtype = t8;
    mtp::generic::gguf_linear(a, xq, 0, 11);
    f(b, xq, 0, 3);
    f(b, xq, 3, 11);
    EXPECT(same_bits(want, got), "%s %s w_rows differs from the file layout's generic", name, mtp::block_type_name(t8));
    ++checked;
  }
  std::printf("gguf: %s == generic bitwise on %d cases\n", name, checked);
  return checked;
}

void expect_kernel_variants() {
#if defined(MTP_X86)
  if (mtp::has_avx512_vnni()) {  // both thresholds of the two-group tile, whichever this CPU takes
    expect_kernel_variant("avx512_vnni", mtp::x86::gguf_linear_avx512_vnni);
    expect_kernel_variant("avx512_vnni_wide", mtp::x86::gguf_linear_avx512_vnni_wide);
  }
  if (mtp::isa_supported(mtp::Isa::Avx512)) expect_kernel_variant("avx512_madd", mtp::x86::gguf_linear_avx512_madd);
  if (mtp::has_avx_vnni()) expect_kernel_variant("avx2_vnni", mtp::x86::gguf_linear_avx2_vnni);
  if (mtp::isa_supported(mtp::Isa::Avx2)) expect_kernel_variant("avx2_madd", mtp::x86::gguf_linear_avx2_madd);
#elif defined(MTP_ARM64)
  expect_kernel_variant("neon_plain", mtp::neon::gguf_linear_neon_plain);
#if defined(MTP_NEON_DOTPROD)
  if (mtp::has_neon_dotprod()) expect_kernel_variant("neon_sdot", mtp::neon::gguf_linear_neon_sdot);
#endif
#endif
}

// ---- the activation rows: each vector quantize_rows (quantize_rows(set, ...)) against the
// portable one, every field bitwise, on random bits (NaN, infinities, subnormals, zeros of
// either sign among them), normal values, exact ties, blocks of zeros, huge and tiny blocks,
// for fp32 / bf16 / fp16 rows with a stride past K.
bool same_rows(const mtp::QuantRows& a, const mtp::QuantRows& b) {
  auto same = [](const auto& u, const auto& v) {
    return u.size() == v.size() && std::memcmp(u.data(), v.data(), u.size() * sizeof(u[0])) == 0;
  };
  return a.M == b.M && a.K == b.K && a.nb == b.nb && same(a.q, b.q) && same(a.dx, b.dx) && same(a.s, b.s) &&
         same(a.sum, b.sum) && same(a.sum4, b.sum4);
}

template <class Set>
int expect_quantize_rows(const char* name, Set set) {
  const int64_t M = 5, K = 12 * 32, stride = K + 40;
  std::normal_distribution<float> nd(0.f, 1.f);
  int checked = 0;
  for (mtp::DType dt : {mtp::DType::F32, mtp::DType::BF16, mtp::DType::F16}) {
    const size_t size = size_t(mtp::dtype_size(dt));
    std::vector<uint8_t> x(size_t(M * stride) * size);
    auto put = [&](int64_t i, float v) {  // element i as dt (bf16: the top half, fp16: rounded)
      uint32_t u;
      std::memcpy(&u, &v, 4);
      const uint16_t h = dt == mtp::DType::BF16 ? uint16_t(u >> 16) : mtp::f32_to_f16(v);
      if (dt == mtp::DType::F32)
        std::memcpy(&x[size_t(i) * 4], &v, 4);
      else
        std::memcpy(&x[size_t(i) * 2], &h, 2);
    };
    for (auto& v : x) v = uint8_t(uniform(0, 255));  // row 0 and the padding: random bits
    for (int64_t m = 1; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) {
        const int64_t b = k / 32, i = m * stride + k;
        const float scale = std::ldexp(1.f, int(uniform(-20, 20)));
        switch ((b + m) % 8) {
          case 0: put(i, 0.f); break;
          case 1: put(i, k % 32 == 0 ? 127.f : float(k % 32 - 16) + 0.5f); break;  // scale 1: ties
          case 2: put(i, (k % 3 ? 1.f : -1.f) * 3.0e38f * nd(rng)); break;         // huge (f16: inf)
          case 3: put(i, 1e-39f * nd(rng)); break;                                 // subnormal
          case 4: put(i, k % 2 ? -0.f : 1e-3f); break;
          default: put(i, scale * nd(rng)); break;
        }
      }
    mtp::QuantRows want, got;
    mtp::quantize_rows(x.data(), dt, stride, M, K, want);
    quantize_rows(set, x.data(), dt, stride, M, K, got);
    EXPECT(same_rows(want, got), "quantize_rows %s dtype %d differs from the portable one", name, int(dt));
    ++checked;
  }
  std::printf("gguf: quantize_rows %s == portable bitwise on %d dtypes\n", name, checked);
  return checked;
}

void expect_quantize_rows_variants() {
#if defined(MTP_X86)
  if (mtp::isa_supported(mtp::Isa::Avx512)) expect_quantize_rows("avx512", mtp::x86::Avx512{});
  if (mtp::isa_supported(mtp::Isa::Avx2)) expect_quantize_rows("avx2", mtp::x86::Avx2{});
#endif
  expect_quantize_rows("generic", mtp::generic::Generic{});
}

}  // namespace

void test_gguf() {
  expect_kernel_variants();
  expect_quantize_rows_variants();
  const mtp::Isa isa = mtp::current_isa();
  int checked = 0;
  for (mtp::DType t : kBlockTypes) {
    const int64_t e = mtp::block_elems(t);
    for (int64_t K : {e, 2 * e, 576 / e * e == 576 ? int64_t(576) : 3 * e}) {
      for (int64_t M : {1, 2, 3, 4, 5, 9}) {
        Case c(t, M, 37, K);
        const bool bias = M % 2 == 1;
        std::vector<float> want, got;
        run(c.args(want, bias), mtp::Isa::Generic);
        run(c.args(got, bias), isa, 1 + M % 3);
        EXPECT(same_bits(want, got), "%s M=%lld K=%lld: %s differs from generic", mtp::block_type_name(t), (long long)M,
               (long long)K, mtp::isa_name(isa));
        for (int64_t m = 0; m < M; ++m) {  // shape invariance: row m alone
          std::vector<float> one;
          run(c.args(one, bias, m, 1), isa);
          EXPECT(std::memcmp(one.data(), got.data() + m * c.N, size_t(c.N) * 4) == 0, "%s row %lld alone differs",
                 mtp::block_type_name(t), (long long)m);
        }
        // against the dequantized weights in fp64: within the int8 activations' error
        std::vector<float> wd(size_t(c.N * K));
        for (int64_t n = 0; n < c.N; ++n)
          mtp::dequantize_row(t, c.w.data(), mtp::block_row_bytes(t, K), n, K, wd.data() + n * K);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < c.N; ++n) {
            double exact = bias ? c.bias[size_t(n)] : 0.0, mag = 0.0, xmax = 0.0;
            for (int64_t k = 0; k < K; ++k) {
              exact += double(c.x[size_t(m * K + k)]) * wd[size_t(n * K + k)];
              mag += std::fabs(double(wd[size_t(n * K + k)]));
              xmax = std::max(xmax, double(std::fabs(c.x[size_t(m * K + k)])));
            }
            const double err = std::fabs(double(got[size_t(m * c.N + n)]) - exact);
            EXPECT(err <= mag * xmax / 127.0 * 0.5 + 1e-4 * (std::fabs(exact) + 1), "%s (%lld, %lld): %g vs %g",
                   mtp::block_type_name(t), (long long)m, (long long)n, double(got[size_t(m * c.N + n)]), exact);
          }
        ++checked;
      }
    }
    // a row map (the draft vocabulary's rows read in place) gives those rows' bits
    Case c(t, 2, 40, 2 * e);
    std::vector<float> full, sub;
    run(c.args(full, false), isa);
    std::vector<int64_t> rows = {39, 0, 7, 7, 20};
    mtp::LinearArgs a = c.args(sub, false);
    a.N = int64_t(rows.size());
    a.w_rows = rows.data();
    sub.assign(size_t(2 * a.N), 0.f);
    a.y = sub.data();
    a.y_stride = a.N;
    run(a, isa);
    for (int64_t m = 0; m < 2; ++m)
      for (size_t i = 0; i < rows.size(); ++i)
        EXPECT(std::memcmp(&sub[m * a.N + i], &full[size_t(m * c.N + rows[i])], 4) == 0, "%s w_rows",
               mtp::block_type_name(t));
  }
  // the x8 layout through the dispatch: the file layout's bits, any thread split and row map;
  // its rows dequantize to the file rows' values
  for (mtp::DType t8 : mtp::kX8Types) {
    const mtp::DType t = mtp::file_type(t8);
    const int64_t K = mtp::block_elems(t) == 256 ? 768 : 576;
    // any thread split, below kParallelRows rows and from it (a prefill's: the rows are
    // quantized over the threads too)
    auto on_threads = [&](const Case& cs) {
      const std::vector<uint8_t> cs8 = x8_bytes(cs);
      std::vector<float> cs_want, cs_got;
      run(cs.args(cs_want, true), mtp::Isa::Generic);
      mtp::LinearArgs b = cs.args(cs_got, true);
      b.w = cs8.data(), b.w_dtype = t8;
      for (int threads : {1, 2, 3}) {
        run(b, isa, threads);
        EXPECT(same_bits(cs_want, cs_got), "%s: %s, %lld rows, %d threads differs from the file layout",
               mtp::block_type_name(t8), mtp::isa_name(isa), static_cast<long long>(b.M), threads);
      }
    };
    Case c(t, 5, 48, K);
    on_threads(c);
    on_threads(Case(t, mtp::kParallelRows + 3, 48, K));
    const std::vector<uint8_t> w8 = x8_bytes(c);
    std::vector<float> want, got;
    mtp::LinearArgs a = c.args(got, true);
    a.w = w8.data(), a.w_dtype = t8;
    std::vector<int64_t> rows = {47, 0, 9, 9, 20};
    std::vector<float> sub(2 * rows.size());
    run(c.args(want, false), mtp::Isa::Generic);
    mtp::LinearArgs r = a;
    r.M = 2, r.N = int64_t(rows.size()), r.w_rows = rows.data(), r.bias = nullptr, r.y = sub.data(), r.y_stride = r.N;
    run(r, isa);
    for (int64_t m = 0; m < 2; ++m)
      for (size_t i = 0; i < rows.size(); ++i)
        EXPECT(std::memcmp(&sub[m * r.N + i], &want[size_t(m * c.N + rows[i])], 4) == 0, "%s w_rows",
               mtp::block_type_name(t8));
    std::vector<float> d8(static_cast<size_t>(K)), d(static_cast<size_t>(K));
    for (int64_t n : {0, 7, 8, 47}) {
      mtp::dequantize_row(t, c.w.data(), mtp::block_row_bytes(t, K), n, K, d.data());
      mtp::dequantize_row(t8, w8.data(), mtp::block_row_bytes(t, K), n, K, d8.data());
      EXPECT(same_bits(d, d8), "%s row %lld dequantizes differently", mtp::block_type_name(t8), (long long)n);
    }
    ++checked;
  }
  // bf16 activations are widened exactly: the same bits as their fp32 values
  {
    Case c(mtp::DType::Q4_1, 3, 33, 64);
    std::vector<uint16_t> xb(c.x.size());
    for (size_t i = 0; i < xb.size(); ++i) xb[i] = mtp::f32_to_bf16(c.x[i]), c.x[i] = mtp::bf16_to_f32(xb[i]);
    std::vector<float> y32, y16;
    run(c.args(y32, true), isa);
    mtp::LinearArgs a = c.args(y16, true);
    a.x = xb.data();
    a.x_dtype = mtp::DType::BF16;
    run(a, isa);
    EXPECT(same_bits(y32, y16), "bf16 activations differ from their fp32 values");
  }
  // a NaN in a row makes that row's outputs NaN, and only that row's
  {
    Case c(mtp::DType::Q8_0, 2, 5, 32);
    c.x[3] = NAN;
    std::vector<float> y;
    run(c.args(y, false), isa);
    for (int n = 0; n < 5; ++n) EXPECT(std::isnan(y[size_t(n)]) && !std::isnan(y[size_t(5 + n)]), "NaN row %d", n);
  }
  std::printf("gguf: %s == generic bitwise on %d shapes\n", mtp::isa_name(isa), checked);
}
