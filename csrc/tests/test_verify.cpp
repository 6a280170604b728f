// Tests of argmax, verify, verify_ragged and accept_prefix (the torch-free core and the C API)
// against a naive oracle written here (its own fp16/bf16 decoding, its own argmax loop), and
// their bad arguments. Called from test_core.cpp's main:
//   mtp_core_tests argmax|verify|verify_ragged|accept_prefix [isa] | errors | verify_ragged_errors
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "mtp/argmax.h"
#include "mtp/mtp.h"
#include "mtp/parallel.h"
#include "test_util.h"

namespace {

// ---------------------------------------------------------------- logits as raw bits
struct Specials {
  uint32_t pos_inf, neg_inf, nan, neg_nan, neg_zero;
};
Specials specials(mtp_dtype t) {
  if (t == MTP_FLOAT32) return {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x80000000u};
  if (t == MTP_BFLOAT16) return {0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x8000};
  return {0x7c00, 0xfc00, 0x7e00, 0xfe01, 0x8000};
}

// The oracle's decoding, independent of common.h: fp16 by its definition, bf16/fp32 by bits.
double decode(mtp_dtype t, uint32_t bits) {
  if (t == MTP_FLOAT16) {
    int sign = bits >> 15 ? -1 : 1, exp = (bits >> 10) & 31, man = bits & 1023;
    if (exp == 31) return man ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
    return sign * (exp ? std::ldexp(1024 + man, exp - 25) : std::ldexp(man, -24));
  }
  uint32_t u = t == MTP_BFLOAT16 ? bits << 16 : bits;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint32_t random_finite(mtp_dtype t) {
  for (;;) {
    uint32_t b = uint32_t(rng()) & (t == MTP_FLOAT32 ? 0xffffffffu : 0xffffu);
    if (!std::isnan(decode(t, b)) && !std::isinf(decode(t, b))) return b;
  }
}

// A row of n values in one of several regimes that hit the argmax rules.
enum Mode { kRandom, kTies, kNan, kAllNegInf, kZeros, kPosInf, kLateMax, kNumModes };

std::vector<uint32_t> make_row(mtp_dtype t, int64_t n, int mode) {
  const Specials s = specials(t);
  std::vector<uint32_t> r(n);
  switch (mode) {
    case kTies: {  // few distinct values: the maximum occurs many times
      uint32_t pool[3] = {random_finite(t), random_finite(t), random_finite(t)};
      for (auto& v : r) v = pool[uniform(0, 2)];
      break;
    }
    case kAllNegInf:
      for (auto& v : r) v = s.neg_inf;
      break;
    case kZeros:  // max is zero: +0.0 and -0.0 are equal, the first one wins
      for (auto& v : r) v = uniform(0, 2) == 0 ? s.neg_zero : uniform(0, 1) ? 0u : (random_finite(t) | s.neg_zero);
      break;
    default:
      for (auto& v : r) v = random_finite(t);
  }
  if (mode == kNan && n > 0) {
    int k = int(uniform(1, 3));
    while (k--) r[uniform(0, n - 1)] = uniform(0, 1) ? s.nan : s.neg_nan;
  }
  if (mode == kPosInf && n > 0) r[uniform(0, n - 1)] = s.pos_inf;
  if (mode == kLateMax && n > 0) r[n - 1] = s.pos_inf;  // in the tail or the last block
  if (mode == kAllNegInf && n > 1 && uniform(0, 1)) r[uniform(1, n - 1)] = random_finite(t);
  return r;
}

// torch.argmax: first NaN, else first maximal value (-0.0 == +0.0), all -inf -> 0.
int64_t oracle_argmax(mtp_dtype t, const uint32_t* bits, int64_t n, int64_t stride = 1) {
  int64_t best = 0;
  for (int64_t i = 0; i < n; ++i) {
    double v = decode(t, bits[i * stride]);
    if (std::isnan(v)) return i;
    if (v > decode(t, bits[best * stride])) best = i;
  }
  return best;
}

// Bits stored as the dtype's element type.
struct Buffer {
  mtp_dtype t;
  std::vector<uint32_t> f32;
  std::vector<uint16_t> h;
  Buffer(mtp_dtype t, size_t n) : t(t) { (t == MTP_FLOAT32 ? f32.resize(n) : h.resize(n)); }
  void set(size_t i, uint32_t b) { t == MTP_FLOAT32 ? void(f32[i] = b) : void(h[i] = uint16_t(b)); }
  void* data() { return t == MTP_FLOAT32 ? static_cast<void*>(f32.data()) : static_cast<void*>(h.data()); }
};

mtp::DType kernel_dtype(mtp_dtype t) { return mtp::DType(int(t)); }

// ---------------------------------------------------------------- argmax kernel
}  // namespace

void test_argmax() {
  const int64_t lengths[] = {1, 2, 3, 7, 8, 15, 16, 31, 33, 64, 255, 256, 257, 511, 512, 513, 777, 1024, 1031, 2309};
  int64_t checked = 0;
  for (mtp_dtype t : kFloatTypes)
    for (int64_t n : lengths)
      for (int mode = 0; mode < kNumModes; ++mode)
        for (int64_t offset : {0, 1, 3}) {  // unaligned starts
          std::vector<uint32_t> row = make_row(t, n, mode);
          Buffer buf(t, size_t(offset + n));
          for (int64_t i = 0; i < n; ++i) buf.set(size_t(offset + i), row[i]);
          const int64_t want = oracle_argmax(t, row.data(), n);
          mtp::ArgmaxResult got =
              mtp::argmax_range(buf.data(), kernel_dtype(t), 1, offset, offset + n, mtp::current_isa());
          EXPECT(got.idx - offset == want, "%s n=%lld mode=%d offset=%lld: got %lld want %lld", name_of(t),
                 (long long)n, mode, (long long)offset, (long long)(got.idx - offset), (long long)want);
          EXPECT(got.nan == std::isnan(decode(t, row[want])), "%s n=%lld mode=%d: nan flag", name_of(t), (long long)n,
                 mode);
          // Split at a random point and merged: the same answer whatever the split.
          if (n > 1) {
            int64_t cut = offset + uniform(1, n - 1);
            mtp::ArgmaxResult m = mtp::argmax_merge(
                mtp::argmax_range(buf.data(), kernel_dtype(t), 1, offset, cut, mtp::current_isa()),
                mtp::argmax_range(buf.data(), kernel_dtype(t), 1, cut, offset + n, mtp::current_isa()));
            EXPECT(m.idx - offset == want, "%s n=%lld mode=%d split at %lld: got %lld want %lld", name_of(t),
                   (long long)n, mode, (long long)(cut - offset), (long long)(m.idx - offset), (long long)want);
          }
          // Strided (every third element) takes the scalar path on every isa.
          if (offset == 0 && n >= 3) {
            const int64_t m = n / 3;
            mtp::ArgmaxResult s = mtp::argmax_range(buf.data(), kernel_dtype(t), 3, 0, m, mtp::current_isa());
            EXPECT(s.idx == oracle_argmax(t, row.data(), m, 3), "%s n=%lld mode=%d stride 3", name_of(t), (long long)n,
                   mode);
          }
          ++checked;
        }
  std::printf("argmax: %lld rows checked on %s\n", (long long)checked, mtp_get_isa());
}

namespace {

// ---------------------------------------------------------------- ids
struct Ids {  // int32 or int64 values behind one interface
  mtp_dtype t;
  std::vector<int32_t> i32;
  std::vector<int64_t> i64;
  Ids(mtp_dtype t, size_t n, int64_t fill) : t(t) {
    t == MTP_INT32 ? i32.assign(n, int32_t(fill)) : i64.assign(n, fill);
  }
  int64_t get(size_t i) const { return t == MTP_INT32 ? i32[i] : i64[i]; }
  void set(size_t i, int64_t v) { t == MTP_INT32 ? void(i32[i] = int32_t(v)) : void(i64[i] = v); }
  void* data() { return t == MTP_INT32 ? static_cast<void*>(i32.data()) : static_cast<void*>(i64.data()); }
  size_t size() const { return t == MTP_INT32 ? i32.size() : i64.size(); }
};

mtp_tensor view(void* data, mtp_dtype t, std::initializer_list<int64_t> sizes, std::initializer_list<int64_t> strides) {
  mtp_tensor v{};
  v.data = data;
  v.dtype = t;
  v.ndim = int32_t(sizes.size());
  int d = 0;
  for (int64_t s : sizes) v.sizes[d++] = s;
  d = 0;
  for (int64_t s : strides) v.strides[d++] = s;
  return v;
}

constexpr int64_t kCanary = 0x5a5a5a5a;

// A strided [rows, cols] output (row stride 2*cols+1, column stride 2) inside a canary-filled
// buffer: a write outside the view shows up as a changed canary.
struct Out {
  Ids buf;
  int64_t rows, cols;
  Out(mtp_dtype t, int64_t rows, int64_t cols)
      : buf(t, size_t(rows * (2 * cols + 1) + 1), kCanary), rows(rows), cols(cols) {}
  int64_t at(int64_t r, int64_t c) const { return buf.get(size_t(r * (2 * cols + 1) + 2 * c)); }
  mtp_tensor view2() { return view(buf.data(), buf.t, {rows, cols}, {2 * cols + 1, 2}); }
  mtp_tensor view1() { return view(buf.data(), buf.t, {rows}, {2 * cols + 1}); }  // cols must be 1
  bool canaries_intact() const {
    for (size_t i = 0; i < buf.size(); ++i) {
      int64_t r = int64_t(i) / (2 * cols + 1), c = int64_t(i) % (2 * cols + 1);
      bool inside = r < rows && c % 2 == 0 && c / 2 < cols;
      if (!inside && buf.get(i) != kCanary) return false;
    }
    return true;
  }
};

// ---------------------------------------------------------------- verify through the C API
enum Layout { kContiguous, kPadded, kVocabStrided };

void run_verify_case(int64_t B, int64_t K, int64_t V, mtp_dtype lt, mtp_dtype it, Layout layout, int nd_kind,
                     int threads, int mode) {
  // Logits [B, K+1, V] in some layout of a bigger buffer.
  int64_t s0, s1, s2, total;
  if (layout == kContiguous) {
    s2 = 1;
    s1 = V;
    s0 = (K + 1) * V;
    total = B * s0;
  } else if (layout == kPadded) {
    s2 = 1;
    s1 = V + 7;
    s0 = (K + 1) * s1 + 3;
    total = B * s0 + 5;
  } else {
    s2 = B * (K + 1);
    s1 = 1;
    s0 = K + 1;
    total = V * s2;
  }  // [V, B, K+1] permuted
  Buffer logits(lt, size_t(std::max<int64_t>(total, 1)));
  std::vector<uint32_t> bits(size_t(std::max<int64_t>(total, 1)), specials(lt).nan);  // unviewed slots: NaN
  std::vector<int64_t> want_target(size_t(B * (K + 1)));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t <= K; ++t) {
      std::vector<uint32_t> row = make_row(lt, V, (mode + b + t) % kNumModes);
      for (int64_t v = 0; v < V; ++v) bits[size_t(b * s0 + t * s1 + v * s2)] = row[v];
      want_target[size_t(b * (K + 1) + t)] = oracle_argmax(lt, row.data(), V);
    }
  for (size_t i = 0; i < bits.size(); ++i) logits.set(i, bits[i]);

  // Drafts [B, K] column-major (strides {1, B}); mostly the target, else a miss or an out-of-range id.
  Ids draft(it, size_t(std::max<int64_t>(B * K, 1)), 0);
  const int64_t bad_ids[] = {-1, V, V + 100, std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min()};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < K; ++t) {
      int64_t tgt = want_target[size_t(b * (K + 1) + t)], d = tgt;
      int64_t r = uniform(0, 9);
      if (r == 0)
        d = bad_ids[uniform(0, 4)];
      else if (r <= 2 && V > 1)
        d = (tgt + uniform(1, V - 1)) % V;
      draft.set(size_t(b + t * B), d);
    }
  // num_drafts: absent, or ragged in [0, K] with stride 2.
  Ids nd(nd_kind == 2 ? MTP_INT64 : MTP_INT32, size_t(std::max<int64_t>(2 * B, 1)), -7);
  for (int64_t b = 0; b < B; ++b) nd.set(size_t(2 * b), uniform(0, K));
  const int64_t pad = mode % 2 ? -1 : 7;

  mtp_tensor dv = view(draft.data(), it, {B, K}, {1, B});
  mtp_tensor lv = view(logits.data(), lt, {B, K + 1, V}, {s0, s1, s2});
  mtp_tensor nv = view(nd.data(), nd.t, {B}, {2});
  Out acc(it, B, 1), out(it, B, K + 1);
  mtp_tensor av = acc.view1(), ov = out.view2();
  mtp_status st = mtp_verify(&dv, &lv, nd_kind ? &nv : nullptr, pad, &av, &ov, threads);
  EXPECT(st == MTP_OK, "mtp_verify failed: %s", mtp_last_error());
  EXPECT(std::strcmp(mtp_last_error(), "") == 0, "last error after success: %s", mtp_last_error());

  for (int64_t b = 0; b < B; ++b) {
    const int64_t nmax = nd_kind ? nd.get(size_t(2 * b)) : K;
    int64_t n = 0;
    while (n < nmax && draft.get(size_t(b + n * B)) == want_target[size_t(b * (K + 1) + n)]) ++n;
    EXPECT(acc.at(b, 0) == n, "%s ids=%d B=%lld K=%lld V=%lld layout=%d b=%lld: accepted %lld want %lld", name_of(lt),
           int(it), (long long)B, (long long)K, (long long)V, int(layout), (long long)b, (long long)acc.at(b, 0),
           (long long)n);
    for (int64_t t = 0; t <= K; ++t) {
      int64_t w = t < n ? draft.get(size_t(b + t * B)) : t == n ? want_target[size_t(b * (K + 1) + t)] : pad;
      EXPECT(out.at(b, t) == w, "%s B=%lld K=%lld V=%lld layout=%d out[%lld,%lld] = %lld want %lld", name_of(lt),
             (long long)B, (long long)K, (long long)V, int(layout), (long long)b, (long long)t, (long long)out.at(b, t),
             (long long)w);
    }
  }
  EXPECT(acc.canaries_intact() && out.canaries_intact(), "write outside the output views");
}

}  // namespace

void test_verify() {
  int cases = 0;
  for (mtp_dtype lt : kFloatTypes)
    for (mtp_dtype it : {MTP_INT32, MTP_INT64})
      for (Layout layout : {kContiguous, kPadded, kVocabStrided})
        for (int64_t B : {0, 1, 3})
          for (int64_t K : {0, 1, 4})
            for (int64_t V : {1, 5, 300, 1100}) {
              run_verify_case(B, K, V, lt, it, layout, cases % 3, 1 + cases % 3, cases);
              ++cases;
            }
  // Long rows split over threads (chunks of >= 8192) and many requests on many threads.
  for (mtp_dtype lt : kFloatTypes) {
    run_verify_case(1, 0, 20011, lt, MTP_INT64, kContiguous, 0, 4, cases++);
    run_verify_case(2, 3, 17000, lt, MTP_INT32, kPadded, 1, 3, cases++);
    run_verify_case(7, 5, 2000, lt, MTP_INT32, kContiguous, 2, 0, cases++);
  }
  std::printf("verify: %d cases on %s\n", cases, mtp_get_isa());
}

namespace {

// ---------------------------------------------------------------- verify_ragged through the C API
// The flattened layout: drafts [N] (stride 2), cu [B] (stride 3), logits [N + B, V] in some
// layout of a bigger buffer; out [B, W] with W >= the widest request + 1. Against the oracle,
// request by request.
void run_ragged_case(const std::vector<int64_t>& counts, int64_t V, mtp_dtype lt, mtp_dtype it, mtp_dtype ct,
                     Layout layout, int64_t extra_width, int threads, int mode) {
  const int64_t B = int64_t(counts.size());
  std::vector<int64_t> cu(static_cast<size_t>(B));
  int64_t N = 0, widest = 0;
  for (int64_t b = 0; b < B; ++b) {
    N += counts[size_t(b)];
    cu[size_t(b)] = N;
    widest = std::max(widest, counts[size_t(b)]);
  }
  const int64_t R = N + B, W = widest + 1 + extra_width;
  int64_t s0, s1, total;  // row stride, vocabulary stride
  if (layout == kContiguous) {
    s0 = V;
    s1 = 1;
    total = R * V;
  } else if (layout == kPadded) {
    s0 = V + 7;
    s1 = 1;
    total = R * s0 + 3;
  } else {
    s0 = 1;
    s1 = R + 2;
    total = V * s1;
  }  // [V, R] buffer seen as [R, V]
  Buffer logits(lt, size_t(std::max<int64_t>(total, 1)));
  std::vector<uint32_t> bits(size_t(std::max<int64_t>(total, 1)), specials(lt).nan);  // unviewed slots: NaN
  std::vector<int64_t> row_target(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    std::vector<uint32_t> row = make_row(lt, V, (mode + r) % kNumModes);
    for (int64_t v = 0; v < V; ++v) bits[size_t(r * s0 + v * s1)] = row[v];
    row_target[size_t(r)] = oracle_argmax(lt, row.data(), V);
  }
  for (size_t i = 0; i < bits.size(); ++i) logits.set(i, bits[i]);

  // Request b's draft j is drafts[cu[b-1] + j], verified against row cu[b-1] + b + j.
  Ids draft(it, size_t(std::max<int64_t>(2 * N, 1)), -5);
  const int64_t bad_ids[] = {-1, V, V + 100, std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min()};
  for (int64_t b = 0, start = 0; b < B; start = cu[size_t(b)], ++b)
    for (int64_t j = 0; j < counts[size_t(b)]; ++j) {
      int64_t d = row_target[size_t(start + b + j)];
      const int64_t r = uniform(0, 9);
      if (r == 0)
        d = bad_ids[uniform(0, 4)];
      else if (r <= 2 && V > 1)
        d = (d + uniform(1, V - 1)) % V;
      draft.set(size_t(2 * (start + j)), d);
    }
  Ids cuv(ct, size_t(std::max<int64_t>(3 * B, 1)), -9);
  for (int64_t b = 0; b < B; ++b) cuv.set(size_t(3 * b), cu[size_t(b)]);
  const int64_t pad = mode % 2 ? -1 : 7;

  mtp_tensor dv = view(draft.data(), it, {N}, {2});
  mtp_tensor cv = view(cuv.data(), ct, {B}, {3});
  mtp_tensor lv = view(logits.data(), lt, {R, V}, {s0, s1});
  Out acc(it, B, 1), out(it, B, W);
  mtp_tensor av = acc.view1(), ov = out.view2();
  const mtp_status st = mtp_verify_ragged(&dv, &cv, &lv, pad, &av, &ov, threads);
  EXPECT(st == MTP_OK, "mtp_verify_ragged failed: %s", mtp_last_error());
  for (int64_t b = 0, start = 0; b < B; start = cu[size_t(b)], ++b) {
    const int64_t k = counts[size_t(b)];
    int64_t n = 0;
    while (n < k && draft.get(size_t(2 * (start + n))) == row_target[size_t(start + b + n)]) ++n;
    EXPECT(acc.at(b, 0) == n, "%s B=%lld V=%lld layout=%d b=%lld: accepted %lld want %lld", name_of(lt), (long long)B,
           (long long)V, int(layout), (long long)b, (long long)acc.at(b, 0), (long long)n);
    for (int64_t t = 0; t < W; ++t) {
      const int64_t w = t < n ? draft.get(size_t(2 * (start + t))) : t == n ? row_target[size_t(start + b + t)] : pad;
      EXPECT(out.at(b, t) == w, "%s B=%lld V=%lld layout=%d out[%lld,%lld] = %lld want %lld", name_of(lt), (long long)B,
             (long long)V, int(layout), (long long)b, (long long)t, (long long)out.at(b, t), (long long)w);
    }
  }
  EXPECT(acc.canaries_intact() && out.canaries_intact(), "write outside the output views");
}

}  // namespace

void test_verify_ragged() {
  int cases = 0;
  const std::vector<std::vector<int64_t>> shapes = {
      {}, {0}, {3}, {0, 0, 0}, {2, 0, 5, 1}, {0, 4, 0}, {1, 1, 1, 1, 1, 1, 1}, {8, 0, 3, 0, 0, 6, 2, 7}};
  for (mtp_dtype lt : kFloatTypes)
    for (mtp_dtype it : {MTP_INT32, MTP_INT64})
      for (Layout layout : {kContiguous, kPadded, kVocabStrided})
        for (const auto& counts : shapes)
          for (int64_t V : {1, 5, 300, 1100}) {
            run_ragged_case(counts, V, lt, it, cases % 2 ? MTP_INT64 : MTP_INT32, layout, cases % 3, 1 + cases % 3,
                            cases);
            ++cases;
          }
  // Long rows split over threads; random counts over many requests on many threads.
  for (mtp_dtype lt : kFloatTypes) {
    run_ragged_case({0}, 20011, lt, MTP_INT64, MTP_INT64, kContiguous, 0, 4, cases++);
    run_ragged_case({3, 0, 1}, 17000, lt, MTP_INT32, MTP_INT32, kPadded, 1, 3, cases++);
    std::vector<int64_t> counts(33);
    for (auto& k : counts) k = uniform(0, 8);
    run_ragged_case(counts, 2000, lt, MTP_INT32, MTP_INT64, kContiguous, 0, 0, cases++);
  }
  std::printf("verify_ragged: %d cases on %s\n", cases, mtp_get_isa());
}

// ---------------------------------------------------------------- accept_prefix through the C API
void test_accept_prefix() {
  int cases = 0;
  for (mtp_dtype dt : {MTP_INT32, MTP_INT64})
    for (mtp_dtype tt : {MTP_INT32, MTP_INT64})
      for (int64_t B : {0, 1, 4})
        for (int64_t K : {0, 1, 3, 6})
          for (int64_t extra : {0, 1}) {  // target width K or K+1
            const int64_t W = K + extra;
            Ids draft(dt, size_t(std::max<int64_t>(B * K, 1)), 0),
                target(tt, size_t(std::max<int64_t>(3 * B * W, 1)), 0);
            for (int64_t b = 0; b < B; ++b)
              for (int64_t t = 0; t < W; ++t) target.set(size_t(3 * (b * W + t)), uniform(0, 9));  // stride 3
            for (int64_t b = 0; b < B; ++b)
              for (int64_t t = 0; t < K; ++t)
                draft.set(size_t(b * K + t), uniform(0, 3) ? target.get(size_t(3 * (b * W + t))) : uniform(-2, 12));
            Ids nd(MTP_INT64, size_t(std::max<int64_t>(B, 1)), 0);
            for (int64_t b = 0; b < B; ++b) nd.set(size_t(b), uniform(0, K));
            mtp_tensor dv = view(draft.data(), dt, {B, K}, {K, 1});
            mtp_tensor tv = view(target.data(), tt, {B, W}, {3 * W, 3});
            mtp_tensor nv = view(nd.data(), MTP_INT64, {B}, {1});
            const bool with_nd = cases % 2;
            Out acc(dt, B, 1);
            mtp_tensor av = acc.view1();
            EXPECT(mtp_accept_prefix(&dv, &tv, with_nd ? &nv : nullptr, &av) == MTP_OK, "%s", mtp_last_error());
            for (int64_t b = 0; b < B; ++b) {
              int64_t nmax = with_nd ? nd.get(size_t(b)) : K, n = 0;
              while (n < nmax && draft.get(size_t(b * K + n)) == target.get(size_t(3 * (b * W + n)))) ++n;
              EXPECT(acc.at(b, 0) == n, "B=%lld K=%lld b=%lld: accepted %lld want %lld", (long long)B, (long long)K,
                     (long long)b, (long long)acc.at(b, 0), (long long)n);
            }
            EXPECT(acc.canaries_intact(), "write outside accepted");
            ++cases;
          }
  std::printf("accept_prefix: %d cases\n", cases);
}

namespace {

// ---------------------------------------------------------------- bad arguments
// A valid verify call (B=2, K=3, V=5) that each check below breaks in one way.
struct VerifyCall {
  std::vector<int32_t> draft = {1, 2, 3, 4, 0, 1};
  std::vector<float> logits = std::vector<float>(2 * 4 * 5, 0.f);
  std::vector<int32_t> nd = {3, 1};
  std::vector<int32_t> acc = std::vector<int32_t>(2, -99), out = std::vector<int32_t>(8, -99);
  mtp_tensor d, l, n, a, o;
  int32_t threads = 1;
  VerifyCall() {
    int64_t ds[2] = {2, 3}, ls[3] = {2, 4, 5}, ns[1] = {2}, as[1] = {2}, os[2] = {2, 4};
    d = mtp_contiguous(draft.data(), MTP_INT32, 2, ds);
    l = mtp_contiguous(logits.data(), MTP_FLOAT32, 3, ls);
    n = mtp_contiguous(nd.data(), MTP_INT32, 1, ns);
    a = mtp_contiguous(acc.data(), MTP_INT32, 1, as);
    o = mtp_contiguous(out.data(), MTP_INT32, 2, os);
  }
  mtp_status run(bool null_d = false, bool null_l = false, bool null_a = false, bool null_o = false) {
    return mtp_verify(null_d ? nullptr : &d, null_l ? nullptr : &l, &n, -1, null_a ? nullptr : &a,
                      null_o ? nullptr : &o, threads);
  }
  bool untouched() const {
    for (int32_t v : acc)
      if (v != -99) return false;
    for (int32_t v : out)
      if (v != -99) return false;
    return true;
  }
};

#define BAD_VERIFY(mutation, status, needle, ...)                       \
  do {                                                                  \
    VerifyCall c;                                                       \
    mutation;                                                           \
    expect_error(c.run(__VA_ARGS__), status, needle, #mutation);        \
    EXPECT(c.untouched(), "%s: outputs written on failure", #mutation); \
  } while (0)

// A valid verify_ragged call (N = 4, B = 3, counts {2, 0, 2}, V = 5, W = 3) that each check
// below breaks in one way.
struct RaggedCall {
  std::vector<int32_t> draft = {1, 2, 3, 4};
  std::vector<int32_t> cu = {2, 2, 4};
  std::vector<float> logits = std::vector<float>(7 * 5, 0.f);
  std::vector<int32_t> acc = std::vector<int32_t>(3, -99), out = std::vector<int32_t>(9, -99);
  mtp_tensor d, c, l, a, o;
  int64_t pad = -1;
  int32_t threads = 1;
  RaggedCall() {
    int64_t ds[1] = {4}, cs[1] = {3}, ls[2] = {7, 5}, as[1] = {3}, os[2] = {3, 3};
    d = mtp_contiguous(draft.data(), MTP_INT32, 1, ds);
    c = mtp_contiguous(cu.data(), MTP_INT32, 1, cs);
    l = mtp_contiguous(logits.data(), MTP_FLOAT32, 2, ls);
    a = mtp_contiguous(acc.data(), MTP_INT32, 1, as);
    o = mtp_contiguous(out.data(), MTP_INT32, 2, os);
  }
  mtp_status run(bool null_d = false, bool null_c = false, bool null_l = false, bool null_a = false,
                 bool null_o = false) {
    return mtp_verify_ragged(null_d ? nullptr : &d, null_c ? nullptr : &c, null_l ? nullptr : &l, pad,
                             null_a ? nullptr : &a, null_o ? nullptr : &o, threads);
  }
  bool untouched() const {
    for (int32_t v : acc)
      if (v != -99) return false;
    for (int32_t v : out)
      if (v != -99) return false;
    return true;
  }
};

#define BAD_RAGGED(mutation, status, needle, ...)                       \
  do {                                                                  \
    RaggedCall c;                                                       \
    mutation;                                                           \
    expect_error(c.run(__VA_ARGS__), status, needle, #mutation);        \
    EXPECT(c.untouched(), "%s: outputs written on failure", #mutation); \
  } while (0)

}  // namespace

void test_verify_ragged_errors() {
  {
    RaggedCall c;  // the baseline is valid: every row's argmax is 0
    EXPECT(c.run() == MTP_OK && c.acc[0] == 0 && c.out[0] == 0 && c.out[1] == -1 && c.acc[1] == 0 && c.out[3] == 0 &&
               c.out[4] == -1,
           "baseline: %s", mtp_last_error());
  }
  BAD_RAGGED((void)0, MTP_ERROR_NULL_POINTER, "mtp_verify_ragged: draft_token_ids is NULL", true);
  BAD_RAGGED((void)0, MTP_ERROR_NULL_POINTER, "cu_num_draft_tokens is NULL", false, true);
  BAD_RAGGED((void)0, MTP_ERROR_NULL_POINTER, "target_logits is NULL", false, false, true);
  BAD_RAGGED((void)0, MTP_ERROR_NULL_POINTER, "accepted is NULL", false, false, false, true);
  BAD_RAGGED((void)0, MTP_ERROR_NULL_POINTER, "out_tokens is NULL", false, false, false, false, true);
  BAD_RAGGED(c.c.data = nullptr, MTP_ERROR_NULL_POINTER, "cu_num_draft_tokens.data is NULL");
  BAD_RAGGED(c.d.dtype = MTP_FLOAT32, MTP_ERROR_UNSUPPORTED_DTYPE,
             "draft_token_ids must be int32 or int64, got float32");
  BAD_RAGGED(c.c.dtype = MTP_FLOAT16, MTP_ERROR_UNSUPPORTED_DTYPE, "cu_num_draft_tokens must be int32 or int64");
  BAD_RAGGED(c.l.dtype = MTP_INT64, MTP_ERROR_UNSUPPORTED_DTYPE,
             "target_logits must be float32 or bfloat16 or float16");
  BAD_RAGGED(c.a.dtype = MTP_INT64, MTP_ERROR_UNSUPPORTED_DTYPE, "accepted must be int32, got int64");
  BAD_RAGGED(c.o.dtype = MTP_INT64, MTP_ERROR_UNSUPPORTED_DTYPE, "out_tokens must be int32, got int64");
  BAD_RAGGED(c.d.ndim = 2, MTP_ERROR_INVALID_ARGUMENT, "draft_token_ids must be 1-D [N]");
  BAD_RAGGED(c.c.ndim = 2, MTP_ERROR_INVALID_ARGUMENT, "cu_num_draft_tokens must be 1-D [B]");
  BAD_RAGGED(c.l.ndim = 3, MTP_ERROR_INVALID_ARGUMENT, "target_logits must be 2-D [N + B, V]");
  BAD_RAGGED(c.l.sizes[0] = 6, MTP_ERROR_INVALID_ARGUMENT,
             "target_logits.sizes[0] must equal N + B (N = 4 drafts plus one bonus row per request, B = 3) = 7, got 6");
  BAD_RAGGED(c.l.sizes[1] = 0, MTP_ERROR_INVALID_ARGUMENT, "V >= 1 entries, got V = 0");
  BAD_RAGGED(c.cu[1] = 1, MTP_ERROR_INVALID_ARGUMENT,
             "cu_num_draft_tokens must hold non-decreasing inclusive cumulative counts, got cu_num_draft_tokens[1] = 1 "
             "< cu_num_draft_tokens[0] = 2: request 1 would have -1 drafts");
  BAD_RAGGED(c.cu[0] = -1, MTP_ERROR_INVALID_ARGUMENT, "got cu_num_draft_tokens[0] = -1 < 0: request 0 would have -1");
  BAD_RAGGED(c.cu[2] = 3, MTP_ERROR_INVALID_ARGUMENT,
             "cu_num_draft_tokens must end at N (draft_token_ids.sizes[0]) = 4, got cu_num_draft_tokens[2] = 3");
  BAD_RAGGED(c.cu[0] = 5, MTP_ERROR_INVALID_ARGUMENT, "got cu_num_draft_tokens[0] = 5 > N (request 0)");
  BAD_RAGGED(c.o.sizes[1] = 2, MTP_ERROR_INVALID_ARGUMENT,
             "out_tokens.sizes[1] - 1 = 1 is smaller than request 0's 2 drafts (cu_num_draft_tokens[0] - 0)");
  BAD_RAGGED((c.cu = {1, 1, 4}, c.o.sizes[1] = 3), MTP_ERROR_INVALID_ARGUMENT,
             "request 2's 3 drafts (cu_num_draft_tokens[2] - cu_num_draft_tokens[1])");
  BAD_RAGGED(c.o.sizes[1] = 0, MTP_ERROR_INVALID_ARGUMENT, "out_tokens.sizes[1] = W must be >= 1");
  BAD_RAGGED(c.pad = int64_t(1) << 40, MTP_ERROR_INVALID_ARGUMENT,
             "pad_id must fit draft_token_ids' dtype int32, [-2147483648, 2147483647], got 1099511627776");
  BAD_RAGGED(c.a.sizes[0] = 2, MTP_ERROR_INVALID_ARGUMENT, "accepted.sizes[0] must equal B");
  BAD_RAGGED(c.o.sizes[0] = 2, MTP_ERROR_INVALID_ARGUMENT, "out_tokens.sizes[0] must equal B");
  BAD_RAGGED(c.threads = -1, MTP_ERROR_INVALID_ARGUMENT, "num_threads must be >= 0");
  // Hostile: sizes whose sum overflows, extents beyond int64, outputs that alias.
  BAD_RAGGED((c.d.sizes[0] = INT64_MAX, c.d.strides[0] = 0), MTP_ERROR_INVALID_ARGUMENT,
             "N + B (draft_token_ids' N = 9223372036854775807 drafts plus B = 3 requests) overflows int64");
  BAD_RAGGED(c.cu[2] = std::numeric_limits<int32_t>::max(), MTP_ERROR_INVALID_ARGUMENT, "> N (request 2)");
  BAD_RAGGED(c.l.strides[0] = int64_t(1) << 61, MTP_ERROR_INVALID_ARGUMENT, "extent beyond int64");
  BAD_RAGGED(c.o.strides[0] = 0, MTP_ERROR_INVALID_ARGUMENT, "out_tokens must not have overlapping elements");
  BAD_RAGGED(c.o.data = c.draft.data(), MTP_ERROR_INVALID_ARGUMENT, "out_tokens and draft_token_ids overlap");
  BAD_RAGGED(c.a.data = c.cu.data(), MTP_ERROR_INVALID_ARGUMENT, "accepted and cu_num_draft_tokens overlap");
  {  // int64 ids take any pad_id
    RaggedCall c;
    std::vector<int64_t> d64 = {1, 2, 3, 4}, a64(3, -99), o64(9, -99);
    c.d.data = d64.data();
    c.d.dtype = MTP_INT64;
    c.a.data = a64.data();
    c.a.dtype = MTP_INT64;
    c.o.data = o64.data();
    c.o.dtype = MTP_INT64;
    c.pad = int64_t(1) << 40;
    EXPECT(c.run() == MTP_OK && o64[2] == int64_t(1) << 40, "int64 pad: %s", mtp_last_error());
  }
  {  // B = 0 and N = 0 with NULL data; N = 0 with B = 2 (every request only a bonus row)
    RaggedCall c;
    c.d.sizes[0] = c.c.sizes[0] = c.l.sizes[0] = c.a.sizes[0] = c.o.sizes[0] = 0;
    c.d.data = c.c.data = c.l.data = c.a.data = c.o.data = nullptr;
    EXPECT(c.run() == MTP_OK, "B = 0 with NULL data: %s", mtp_last_error());
    RaggedCall z;
    z.d.sizes[0] = 0;
    z.d.data = nullptr;
    z.c.sizes[0] = 2;
    z.cu = {0, 0};
    z.c.data = z.cu.data();
    z.l.sizes[0] = 2;
    z.a.sizes[0] = z.o.sizes[0] = 2;
    z.logits[1] = 1.f;      // row 0: token 1
    z.logits[5 + 4] = 2.f;  // row 1: token 4
    EXPECT(z.run() == MTP_OK && z.acc[0] == 0 && z.acc[1] == 0 && z.out[0] == 1 && z.out[1] == -1 && z.out[3] == 4 &&
               z.out[6] == -99,
           "N = 0: %s", mtp_last_error());
  }
  std::printf("verify_ragged_errors: ok\n");
}

void test_errors() {
  {
    VerifyCall c;  // the baseline is valid
    EXPECT(c.run() == MTP_OK, "baseline: %s", mtp_last_error());
  }
  BAD_VERIFY((void)0, MTP_ERROR_NULL_POINTER, "mtp_verify: draft_tokens is NULL", true);
  BAD_VERIFY((void)0, MTP_ERROR_NULL_POINTER, "target_logits is NULL", false, true);
  BAD_VERIFY((void)0, MTP_ERROR_NULL_POINTER, "accepted is NULL", false, false, true);
  BAD_VERIFY((void)0, MTP_ERROR_NULL_POINTER, "out_tokens is NULL", false, false, false, true);
  BAD_VERIFY(c.d.data = nullptr, MTP_ERROR_NULL_POINTER, "draft_tokens.data is NULL");
  BAD_VERIFY(c.l.data = nullptr, MTP_ERROR_NULL_POINTER, "target_logits.data is NULL");
  BAD_VERIFY(c.o.data = nullptr, MTP_ERROR_NULL_POINTER, "out_tokens.data is NULL");
  BAD_VERIFY(c.d.dtype = MTP_FLOAT32, MTP_ERROR_UNSUPPORTED_DTYPE, "draft_tokens must be int32 or int64, got float32");
  BAD_VERIFY(c.d.dtype = 42, MTP_ERROR_UNSUPPORTED_DTYPE, "got unknown (dtype value 42)");
  BAD_VERIFY(c.l.dtype = -1, MTP_ERROR_UNSUPPORTED_DTYPE, "target_logits must be float32 or bfloat16 or float16");
  BAD_VERIFY(c.l.dtype = MTP_INT64, MTP_ERROR_UNSUPPORTED_DTYPE, "got int64");
  BAD_VERIFY(c.n.dtype = MTP_FLOAT16, MTP_ERROR_UNSUPPORTED_DTYPE, "num_drafts must be int32 or int64");
  BAD_VERIFY(c.a.dtype = MTP_INT64, MTP_ERROR_UNSUPPORTED_DTYPE, "accepted must be int32, got int64");
  BAD_VERIFY(c.o.dtype = MTP_INT64, MTP_ERROR_UNSUPPORTED_DTYPE, "out_tokens must be int32, got int64");
  BAD_VERIFY(c.d.ndim = 3, MTP_ERROR_INVALID_ARGUMENT, "draft_tokens must be 2-D [B, K], got ndim = 3");
  BAD_VERIFY(c.l.ndim = 2, MTP_ERROR_INVALID_ARGUMENT, "target_logits must be 3-D [B, K+1, V]");
  BAD_VERIFY(c.d.sizes[0] = -2, MTP_ERROR_INVALID_ARGUMENT, "draft_tokens.sizes[0] must be >= 0, got -2");
  BAD_VERIFY(c.l.strides[2] = -1, MTP_ERROR_INVALID_ARGUMENT, "target_logits.strides[2] must be >= 0, got -1");
  BAD_VERIFY(c.l.sizes[0] = 3, MTP_ERROR_INVALID_ARGUMENT, "target_logits.sizes[0] must equal B");
  BAD_VERIFY(c.l.sizes[1] = 3, MTP_ERROR_INVALID_ARGUMENT, "must equal K+1 (draft_tokens.sizes[1] + 1) = 4, got 3");
  BAD_VERIFY(c.l.sizes[2] = 0, MTP_ERROR_INVALID_ARGUMENT, "V >= 1 entries, got V = 0");
  BAD_VERIFY(c.nd[1] = 4, MTP_ERROR_INVALID_ARGUMENT, "num_drafts[1] = 4 is outside [0, K] = [0, 3]");
  BAD_VERIFY(c.nd[0] = -1, MTP_ERROR_INVALID_ARGUMENT, "num_drafts[0] = -1 is outside");
  BAD_VERIFY(c.n.sizes[0] = 1, MTP_ERROR_INVALID_ARGUMENT, "num_drafts.sizes[0] must equal B");
  BAD_VERIFY(c.a.sizes[0] = 3, MTP_ERROR_INVALID_ARGUMENT, "accepted.sizes[0] must equal B");
  BAD_VERIFY(c.o.sizes[1] = 3, MTP_ERROR_INVALID_ARGUMENT, "out_tokens.sizes[1] must equal K+1");
  BAD_VERIFY(c.threads = -1, MTP_ERROR_INVALID_ARGUMENT, "num_threads must be >= 0");
  BAD_VERIFY(c.l.strides[1] = int64_t(1) << 61, MTP_ERROR_INVALID_ARGUMENT, "extent beyond int64");

  {  // Empty views may have NULL data: B = 0, and K = 0 with drafts NULL.
    VerifyCall c;
    c.d.sizes[0] = c.l.sizes[0] = c.n.sizes[0] = c.a.sizes[0] = c.o.sizes[0] = 0;
    c.d.data = c.l.data = c.n.data = c.a.data = c.o.data = nullptr;
    EXPECT(c.run() == MTP_OK, "B = 0 with NULL data: %s", mtp_last_error());
    VerifyCall k;
    k.d.sizes[1] = 0;
    k.d.data = nullptr;
    k.l.sizes[1] = 1;
    k.o.sizes[1] = 1;
    k.nd[0] = k.nd[1] = 0;
    // out_tokens keeps the [2, 4] buffer's strides: row b starts at 4 * b.
    EXPECT(k.run() == MTP_OK && k.acc[0] == 0 && k.acc[1] == 0 && k.out[0] == 0 && k.out[4] == 0 && k.out[1] == -99,
           "K = 0: %s", mtp_last_error());
  }

  {  // accept_prefix
    int32_t d[2] = {1, 2}, t[3] = {1, 2, 3}, a[1] = {-99};
    int64_t ds[2] = {1, 2}, ts[2] = {1, 3}, as[1] = {1};
    mtp_tensor dv = mtp_contiguous(d, MTP_INT32, 2, ds), tv = mtp_contiguous(t, MTP_INT32, 2, ts),
               av = mtp_contiguous(a, MTP_INT32, 1, as);
    EXPECT(mtp_accept_prefix(&dv, &tv, nullptr, &av) == MTP_OK && a[0] == 2, "accept_prefix baseline: %s",
           mtp_last_error());
    a[0] = -99;
    tv.sizes[1] = 4;
    expect_error(mtp_accept_prefix(&dv, &tv, nullptr, &av), MTP_ERROR_INVALID_ARGUMENT,
                 "mtp_accept_prefix: target_tokens.sizes[1] must be K+1 = 3 or K = 2, got 4", "target width");
    tv.sizes[1] = 3;
    tv.dtype = MTP_BFLOAT16;
    expect_error(mtp_accept_prefix(&dv, &tv, nullptr, &av), MTP_ERROR_UNSUPPORTED_DTYPE,
                 "target_tokens must be int32 or int64", "target dtype");
    tv.dtype = MTP_INT32;
    expect_error(mtp_accept_prefix(&dv, &tv, nullptr, nullptr), MTP_ERROR_NULL_POINTER, "accepted is NULL", "accepted");
    expect_error(mtp_accept_prefix(nullptr, &tv, nullptr, &av), MTP_ERROR_NULL_POINTER, "draft_tokens is NULL",
                 "draft");
    int64_t bad_nd[1] = {3}, ns[1] = {1};
    mtp_tensor nv = mtp_contiguous(bad_nd, MTP_INT64, 1, ns);
    expect_error(mtp_accept_prefix(&dv, &tv, &nv, &av), MTP_ERROR_INVALID_ARGUMENT,
                 "num_drafts[0] = 3 is outside [0, K] = [0, 2]", "num_drafts");
    EXPECT(a[0] == -99, "accept_prefix wrote on failure");
  }

  {  // ISA selection
    expect_error(mtp_set_isa("sse9"), MTP_ERROR_INVALID_ARGUMENT, "unknown instruction set 'sse9'", "isa name");
    expect_error(mtp_set_isa(nullptr), MTP_ERROR_NULL_POINTER, "name is NULL", "isa NULL");
    const char* foreign = mtp_isa_supported("neon") ? "avx2" : "neon";  // another architecture's set
    expect_error(mtp_set_isa(foreign), MTP_ERROR_UNSUPPORTED, "does not support", "foreign isa");
    EXPECT(mtp_isa_supported("generic") == 1 && mtp_isa_supported("bogus") == 0 && mtp_isa_supported(nullptr) == 0,
           "mtp_isa_supported");
  }

  {  // The error message is per thread.
    VerifyCall c;
    c.threads = -5;
    c.run();
    std::string other = "unset";
    std::thread([&] { other = mtp_last_error(); }).join();
    EXPECT(other.empty(), "another thread sees '%s'", other.c_str());
    EXPECT(std::strstr(mtp_last_error(), "-5") != nullptr, "this thread lost its message: '%s'", mtp_last_error());
  }
  EXPECT(std::strcmp(mtp_status_name(MTP_ERROR_UNSUPPORTED_DTYPE), "MTP_ERROR_UNSUPPORTED_DTYPE") == 0 &&
             std::strcmp(mtp_status_name(mtp_status(99)), "unknown status") == 0,
         "mtp_status_name");
  std::printf("errors: checked\n");
}
