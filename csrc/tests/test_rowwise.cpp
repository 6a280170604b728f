// The row-local layer ops (mtp/rowwise.h), called directly: the path of the selected
// instruction set gives the generic path's bits, each row alone gives its bits within a
// batch, the values are close to a double-precision oracle, and a hash of every output's bits
// over a fixed input set equals a constant, so every architecture (x86 here, aarch64 under
// qemu) is checked to compute the same values (NaN payloads aside: x86 and Arm make different
// default NaNs).
#include <cmath>
#include <cstdio>
#include <vector>

#include "mtp/rowwise.h"
#include "test_util.h"

namespace {

using mtp::DType;

// Exactly representable inputs from the (standardised) mt19937_64 bits, not from a library
// distribution: the same values on every platform. Magnitudes 2^-12 .. 2^6 times a row scale.
struct Inputs {
  std::vector<float> v;
  explicit Inputs(size_t n, int shift = 0) : v(n) {
    for (auto& x : v) {
      const int64_t m = int64_t(rng() >> 41) - (int64_t(1) << 22);  // 23-bit signed integer
      x = std::ldexp(float(m), -18 + shift);
    }
  }
};

// Element i of a buffer of type t.
struct Buffer {
  DType t;
  std::vector<char> bytes;
  Buffer(DType t_, const std::vector<float>& src) : t(t_), bytes(src.size() * size_t(mtp::dtype_size(t_))) {
    for (size_t i = 0; i < src.size(); ++i) mtp::store_f32(bytes.data(), t, int64_t(i), src[i]);
  }
  Buffer(DType t_, size_t n) : t(t_), bytes(n * size_t(mtp::dtype_size(t_))) {}
  float at(int64_t i) const { return mtp::load_f32(bytes.data(), t, i); }
  size_t size() const { return bytes.size() / size_t(mtp::dtype_size(t)); }
  bool same_bits(const Buffer& o, int64_t begin, int64_t end, int64_t o_begin) const {
    const int64_t es = mtp::dtype_size(t);
    return std::memcmp(bytes.data() + begin * es, o.bytes.data() + o_begin * es, size_t((end - begin) * es)) == 0;
  }
};

// FNV-1a over the values' bits, every NaN hashed as one value.
struct Hash {
  uint64_t h = 1469598103934665603ull;
  void add(const Buffer& b) {
    for (size_t i = 0; i < b.size(); ++i) {
      const float v = b.at(int64_t(i));
      uint32_t u = 0x7fc00000u;
      if (!std::isnan(v)) std::memcpy(&u, &v, 4);
      for (int k = 0; k < 4; ++k) h = (h ^ ((u >> (8 * k)) & 0xff)) * 1099511628211ull;
    }
  }
};

struct NormCase {
  int64_t M, H;
  DType t, wt;
  bool residual;
  Buffer x, r, w, sum, out;
  NormCase(int64_t M_, int64_t H_, DType t_, DType wt_, bool res)
      : M(M_),
        H(H_),
        t(t_),
        wt(wt_),
        residual(res),
        x(t_, Inputs(size_t(M_ * H_)).v),
        r(t_, Inputs(size_t(M_ * H_)).v),
        w(wt_, Inputs(size_t(H_), -4).v),
        sum(t_, size_t(M_ * H_)),
        out(t_, size_t(M_ * H_)) {
    // special rows: zeros, a NaN, an inf, huge values (squares overflow)
    if (M > 4) {
      for (int64_t k = 0; k < H; ++k) mtp::store_f32(x.bytes.data(), t, k, 0.f);
      mtp::store_f32(x.bytes.data(), t, H + H / 2, NAN);
      mtp::store_f32(x.bytes.data(), t, 2 * H, INFINITY);
      for (int64_t k = 0; k < H; ++k) mtp::store_f32(x.bytes.data(), t, 3 * H + k, t == DType::F16 ? 6e4f : 3e38f);
    }
  }
  mtp::RmsNormArgs args(int64_t m0, int64_t m1, Buffer& s, Buffer& o) {
    mtp::RmsNormArgs a;
    a.M = m1 - m0;
    a.H = H;
    a.dtype = t;
    const int64_t es = mtp::dtype_size(t);
    a.x = x.bytes.data() + m0 * H * es;
    a.x_stride = H;
    if (residual) {
      a.residual = r.bytes.data() + m0 * H * es;
      a.residual_stride = H;
      a.sum = s.bytes.data();
      a.sum_stride = H;
    }
    a.out = o.bytes.data();
    a.out_stride = H;
    a.weight = w.bytes.data();
    a.w_dtype = wt;
    a.eps = 1e-5f;
    return a;
  }
};

int test_norms(mtp::Isa isa, Hash& hash) {
  int cases = 0;
  for (DType t : {DType::F32, DType::BF16, DType::F16})
    for (DType wt : {DType::F32, DType::BF16})
      for (int64_t H : {576, 1, 15, 16, 17, 100})
        for (bool res : {false, true}) {
          NormCase c(9, H, t, wt, res);
          mtp::rms_norm(c.args(0, c.M, c.sum, c.out), isa);
          Buffer gs(t, c.sum.size()), go(t, c.out.size());
          mtp::rms_norm(c.args(0, c.M, gs, go), mtp::Isa::Generic);
          EXPECT(c.out.same_bits(go, 0, c.M * H, 0) && (!res || c.sum.same_bits(gs, 0, c.M * H, 0)),
                 "rms_norm %s/%s H=%lld residual=%d: not the generic path's bits", name_of(mtp_dtype(t)),
                 name_of(mtp_dtype(wt)), (long long)H, int(res));
          for (int64_t m = 0; m < c.M; ++m) {  // each row alone
            Buffer s1(t, size_t(H)), o1(t, size_t(H));
            mtp::rms_norm(c.args(m, m + 1, s1, o1), isa);
            EXPECT(o1.same_bits(c.out, 0, H, m * H) && (!res || s1.same_bits(c.sum, 0, H, m * H)),
                   "rms_norm row %lld alone differs (H=%lld)", (long long)m, (long long)H);
          }
          for (int64_t m = 4; m < c.M; ++m) {  // ordinary rows against a double oracle
            double ss = 0;
            std::vector<double> v(static_cast<size_t>(H));
            for (int64_t k = 0; k < H; ++k) {
              const float s = res ? c.sum.at(m * H + k) : c.x.at(m * H + k);
              v[size_t(k)] = s;
              ss += double(s) * s;
            }
            const double inv = 1 / std::sqrt(ss / double(H) + 1e-5);
            const double tol = t == DType::F32 ? 1e-6 : t == DType::BF16 ? 8e-3 : 1e-3;
            for (int64_t k = 0; k < H; ++k) {
              const double want = v[size_t(k)] * inv * c.w.at(k), got = c.out.at(m * H + k);
              EXPECT(std::fabs(got - want) <= tol * (std::fabs(want) + 1e-6), "rms_norm (%lld, %lld): %g, want %g",
                     (long long)m, (long long)k, got, want);
            }
          }
          if (c.M > 4) {  // the zero row normalises to zeros, the bad rows stay in their rows
            for (int64_t k = 0; k < H && !res; ++k) EXPECT(c.out.at(k) == 0.f, "zero row: %g", double(c.out.at(k)));
            for (int64_t k = 0; k < H && !res; ++k) EXPECT(std::isnan(c.out.at(H + k)), "NaN row not NaN");
          }
          hash.add(c.out);
          if (res) hash.add(c.sum);
          ++cases;
        }
  return cases;
}

int test_rope(mtp::Isa isa, Hash& hash) {
  int cases = 0;
  for (DType t : {DType::F32, DType::BF16, DType::F16})
    for (int64_t D : {64, 128, 2, 40, 34}) {
      const int64_t B = 2, T = 3, H = 4, n = B * T * H * D;
      const Buffer x0(t, Inputs(size_t(n)).v);
      const std::vector<float> cos = Inputs(size_t(B * T * D), 4).v, sin = Inputs(size_t(B * T * D), 4).v;
      auto run = [&](mtp::Isa which, int64_t b0, int64_t b1, int64_t t0, int64_t t1, int64_t xs3) {
        // x as a [B, T, H, D] view with element stride xs3 in a bigger buffer
        Buffer xb(t, size_t(n * xs3));
        for (int64_t i = 0; i < n; ++i) mtp::store_f32(xb.bytes.data(), t, i * xs3, x0.at(i));
        mtp::RopeArgs a;
        a.B = b1 - b0;
        a.T = t1 - t0;
        a.H = H;
        a.D = D;
        a.dtype = t;
        const int64_t xs[4] = {T * H * D * xs3, H * D * xs3, D * xs3, xs3};
        a.x = xb.bytes.data() + (b0 * xs[0] + t0 * xs[1]) * mtp::dtype_size(t);
        for (int d = 0; d < 4; ++d) a.x_stride[d] = xs[d];
        a.cos = cos.data() + (b0 * T + t0) * D;
        a.sin = sin.data() + (b0 * T + t0) * D;
        const int64_t cs[3] = {T * D, D, 1};
        for (int d = 0; d < 3; ++d) a.cos_stride[d] = a.sin_stride[d] = cs[d];
        mtp::rope(a, which);
        Buffer out(t, size_t(n));
        for (int64_t i = 0; i < n; ++i) mtp::store_f32(out.bytes.data(), t, i, xb.at(i * xs3));
        return out;
      };
      const Buffer got = run(isa, 0, B, 0, T, 1);
      EXPECT(got.same_bits(run(mtp::Isa::Generic, 0, B, 0, T, 1), 0, n, 0), "rope D=%lld: not the generic bits",
             (long long)D);
      EXPECT(got.same_bits(run(isa, 0, B, 0, T, 3), 0, n, 0), "rope D=%lld: strided x differs", (long long)D);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t tt = 0; tt < T; ++tt) {
          const Buffer one = run(isa, b, b + 1, tt, tt + 1, 1);
          const int64_t at = (b * T + tt) * H * D;
          EXPECT(one.same_bits(got, at, at + H * D, at), "rope (%lld, %lld) alone differs", (long long)b,
                 (long long)tt);
        }
      for (int64_t i = 0; i < n; ++i) {  // the formula, in fp32 products
        const int64_t d = i % D, half = D / 2, row = i - d, bt = i / (H * D);
        const float* c = cos.data() + bt * D;
        const float* s = sin.data() + bt * D;
        const float lo = x0.at(row + d % half), hi = x0.at(row + half + d % half);
        const float want = d < half ? lo * c[d] - hi * s[d] : hi * c[d] + lo * s[d];
        Buffer w(t, std::vector<float>{want});
        EXPECT(w.same_bits(got, 0, 1, i), "rope element %lld: %g, want %g", (long long)i, double(got.at(i)),
               double(w.at(0)));
      }
      hash.add(got);
      ++cases;
    }
  return cases;
}

// act(gate) * up: silu_mul and gelu_tanh_mul (one kernel, the activation a template argument).
int test_gated_mul(mtp::GatedAct act, mtp::Isa isa, Hash& hash) {
  const bool gelu = act == mtp::GatedAct::GeluTanh;
  const char* op = gelu ? "gelu_tanh_mul" : "silu_mul";
  int cases = 0;
  for (DType t : {DType::F32, DType::BF16, DType::F16})
    for (int64_t I : {1536, 1, 7, 16, 33}) {
      const int64_t M = 5;
      std::vector<float> v = Inputs(size_t(M * 2 * I), 3).v;
      const float special[] = {-INFINITY, -100.f, -87.4f, -87.2f, -20.f, -0.f, 0.f, 20.f, 88.5f, INFINITY, NAN};
      for (size_t i = 0; i < sizeof special / sizeof *special && int64_t(i) < I; ++i) v[i] = special[i];
      const Buffer x(t, v);
      auto run = [&](mtp::Isa which, int64_t m0, int64_t m1) {
        Buffer out(t, size_t((m1 - m0) * I));
        mtp::GatedMulArgs a;
        a.act = act;
        a.M = m1 - m0;
        a.I = I;
        a.dtype = t;
        a.x = x.bytes.data() + m0 * 2 * I * mtp::dtype_size(t);
        a.x_stride = 2 * I;
        a.out = out.bytes.data();
        a.out_stride = I;
        mtp::gated_mul(a, which);
        return out;
      };
      const Buffer got = run(isa, 0, M);
      EXPECT(got.same_bits(run(mtp::Isa::Generic, 0, M), 0, M * I, 0), "%s I=%lld: not the generic bits", op,
             (long long)I);
      for (int64_t m = 0; m < M; ++m)
        EXPECT(run(isa, m, m + 1).same_bits(got, 0, I, m * I), "%s row %lld alone differs", op, (long long)m);
      // relative: a few fp32 ulp, or the rounding to bf16 / fp16; absolute: fp16's subnormal step.
      // gelu in fp32: 4 (1 + |a|) ulp, a = 2 sqrt(2/pi) (g + 0.044715 g^3) computed in fp32 with
      // a few ulp of error, which e^-|a| turns into |a| times that relative (measured <= 2.9).
      const double tol = t == DType::F32 ? 1e-6 : t == DType::BF16 ? 8e-3 : 1e-3;
      const double atol = t == DType::F16 ? std::ldexp(1.0, -24) : 1e-30;
      for (int64_t m = 0; m < M; ++m)
        for (int64_t i = 0; i < I; ++i) {
          const double g = x.at(m * 2 * I + i), u = x.at(m * 2 * I + I + i);
          const double a = gelu ? 1.5957691216057308 * (g + 0.044715 * g * g * g) : g;
          // edges: the Python tests compare them with torch; below a = -87.3 e^a is 0 here
          if (!std::isfinite(g) || a < -87.3) continue;
          const double want = g / (1 + std::exp(-a)) * u, got_v = got.at(m * I + i);
          const double rel = gelu && t == DType::F32 ? 4 * (1 + std::fabs(a)) * std::ldexp(1.0, -23) : tol;
          EXPECT(std::fabs(got_v - want) <= rel * std::fabs(want) + atol, "%s(%g) * %g = %g, want %g (%s)", op, g, u,
                 got_v, want, name_of(mtp_dtype(t)));
        }
      hash.add(got);
      ++cases;
    }
  return cases;
}

// The hash of every output above, computed on x86-64 (every path gives it): any architecture
// or instruction set that computes another value for any element fails here.
constexpr uint64_t kRowwiseHash = 0x7acf80bde2704f2ull;
// The same for gelu_tanh_mul's outputs (kept apart: kRowwiseHash, unchanged, shows that
// silu_mul's bits did not change when the two became one kernel).
constexpr uint64_t kGeluTanhHash = 0x8c02afc5547ff3feull;

}  // namespace

void test_rowwise() {
  const mtp::Isa isa = mtp::current_isa();
  Hash hash;
  const int cases = test_norms(isa, hash) + test_rope(isa, hash) + test_gated_mul(mtp::GatedAct::Silu, isa, hash);
  EXPECT(hash.h == kRowwiseHash, "outputs hash to %#llx, want %#llx: other values than on x86-64",
         (unsigned long long)hash.h, (unsigned long long)kRowwiseHash);
  Hash gelu_hash;
  const int gelu_cases = test_gated_mul(mtp::GatedAct::GeluTanh, isa, gelu_hash);
  EXPECT(gelu_hash.h == kGeluTanhHash, "gelu_tanh_mul outputs hash to %#llx, want %#llx: other values than on x86-64",
         (unsigned long long)gelu_hash.h, (unsigned long long)kGeluTanhHash);
  std::printf("rowwise: %d cases on %s, hash %#llx; gelu_tanh_mul: %d cases, hash %#llx\n", cases, mtp::isa_name(isa),
              (unsigned long long)hash.h, gelu_cases, (unsigned long long)gelu_hash.h);
}
