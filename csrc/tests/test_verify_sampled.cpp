// mtp_verify_sampled through the C API: results equal to the scalar kernel (sample_request,
// request by request) for every dtype, layout, thread count, with and without draft_probs;
// bad arguments rejected with a message naming the argument, outputs untouched.
// Also the accuracy of exp_fixed, the exp every backend evaluates the same way, and the rule
// itself (sample_request) called directly.
#include <cmath>
#include <vector>

#include "mtp/common.h"
#include "mtp/isa.h"
#include "mtp/verify_sampled.h"
#include "test_util.h"

namespace {

// Floats stored in a dtype's element type (bf16/fp16 rounded by the core's store).
struct Floats {
  mtp_dtype t;
  std::vector<char> bytes;
  Floats(mtp_dtype t, size_t n) : t(t), bytes(std::max<size_t>(n, 1) * (t == MTP_FLOAT32 ? 4 : 2), 0) {}
  void set(int64_t i, float v) { mtp::store_f32(bytes.data(), mtp::DType(int(t)), i, v); }
  void* data() { return bytes.data(); }
};

template <class I>
void run_case(int64_t B, int64_t K, int64_t V, mtp_dtype lt, mtp_dtype qt, bool with_q, int threads, int seed_base) {
  std::normal_distribution<float> normal(0.f, 3.f);
  // Logits [B, K+1, V] with padded rows; draft_probs [B, K, V] permuted (strides {1, B, B*K}).
  const int64_t s1 = V + 3, s0 = (K + 1) * s1 + 1;
  Floats logits(lt, size_t(B * s0)), q(qt, size_t(B * K * V));
  for (int64_t i = 0; i < B * s0; ++i) logits.set(i, normal(rng));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < K; ++t) {
      std::vector<float> row(static_cast<size_t>(V));
      float sum = 0;
      for (auto& v : row) sum += (v = std::exp(normal(rng) / 2));
      for (int64_t i = 0; i < V; ++i) q.set(b + t * B + i * B * K, row[size_t(i)] / sum);
    }
  std::vector<I> draft(size_t(std::max<int64_t>(B * K, 1)));
  for (auto& d : draft) d = I(uniform(-1, V));  // V and -1: outside the vocabulary
  std::vector<float> temp(size_t(std::max<int64_t>(B, 1)));
  std::vector<int64_t> seeds(temp.size()), offsets(temp.size()), nd(temp.size());
  for (int64_t b = 0; b < B; ++b) {
    temp[size_t(b)] = b % 3 == 0 ? 0.f : float(uniform(1, 200)) / 100.f;
    seeds[size_t(b)] = seed_base * 1000 + b - 500;
    offsets[size_t(b)] = uniform(0, 1 << 20);
    nd[size_t(b)] = uniform(0, K);
  }
  // Every other case with filters, each request its own (some off, some cutting most of V).
  const bool filtered = seed_base % 2 == 1;
  std::vector<int64_t> top_k(temp.size(), 0);
  std::vector<float> top_p(temp.size(), 1.f), min_p(temp.size(), 0.f);
  std::vector<mtp::Filters> filters(temp.size());
  for (int64_t b = 0; filtered && b < B; ++b) {
    top_k[size_t(b)] = uniform(0, 2) ? uniform(0, V + 1) : 0;
    top_p[size_t(b)] = uniform(0, 2) ? float(uniform(1, 100)) / 100.f : 1.f;
    min_p[size_t(b)] = uniform(0, 3) ? 0.f : float(uniform(0, 60)) / 100.f;
    filters[size_t(b)] = {top_k[size_t(b)], top_p[size_t(b)], min_p[size_t(b)]};
  }
  const mtp_dtype it = sizeof(I) == 4 ? MTP_INT32 : MTP_INT64;
  auto view = [](void* p, mtp_dtype t, std::initializer_list<int64_t> sizes, std::initializer_list<int64_t> strides) {
    mtp_tensor v{};
    v.data = p;
    v.dtype = t;
    v.ndim = int32_t(sizes.size());
    int d = 0;
    for (int64_t s : sizes) v.sizes[d++] = s;
    d = 0;
    for (int64_t s : strides) v.strides[d++] = s;
    return v;
  };
  mtp_tensor dv = view(draft.data(), it, {B, K}, {K, 1}), lv = view(logits.data(), lt, {B, K + 1, V}, {s0, s1, 1}),
             qv = view(q.data(), qt, {B, K, V}, {1, B, B * K}), tv = view(temp.data(), MTP_FLOAT32, {B}, {1}),
             sv = view(seeds.data(), MTP_INT64, {B}, {1}), ov = view(offsets.data(), MTP_INT64, {B}, {1}),
             nv = view(nd.data(), MTP_INT64, {B}, {1});
  std::vector<I> acc(size_t(std::max<int64_t>(B, 1)), I(-99)), out(size_t(std::max<int64_t>(B * (K + 1), 1)), I(-99));
  mtp_tensor av = view(acc.data(), it, {B}, {1}), outv = view(out.data(), it, {B, K + 1}, {K + 1, 1});
  mtp_tensor kv = view(top_k.data(), MTP_INT64, {B}, {1}), pv = view(top_p.data(), MTP_FLOAT32, {B}, {1}),
             mv = view(min_p.data(), MTP_FLOAT32, {B}, {1});
  mtp_status st =
      filtered ? mtp_verify_sampled_filtered(&dv, with_q ? &qv : nullptr, &lv, &tv, &kv, &pv, &mv, &sv, &ov, &nv, -7,
                                             &av, &outv, threads)
               : mtp_verify_sampled(&dv, with_q ? &qv : nullptr, &lv, &tv, &sv, &ov, &nv, -7, &av, &outv, threads);
  EXPECT(st == MTP_OK, "mtp_verify_sampled failed: %s", mtp_last_error());

  // The scalar kernel, one request at a time.
  mtp::VerifyArgs a;
  a.B = B;
  a.K = K;
  a.V = V;
  a.logits = logits.data();
  a.logits_dtype = mtp::DType(int(lt));
  a.logits_stride[0] = s0;
  a.logits_stride[1] = s1;
  a.logits_stride[2] = 1;
  const int64_t qs[2] = {B, B * K};
  for (int64_t b = 0; b < B; ++b) {
    std::vector<I> want(size_t(K + 1));
    const void* qrow = with_q ? static_cast<const char*>(q.data()) + b * (qt == MTP_FLOAT32 ? 4 : 2) : nullptr;
    const int64_t n = mtp::sample_request<I>(a, b, draft.data() + b * K, 1, qrow, mtp::DType(int(qt)), qs,
                                             temp[size_t(b)], filters[size_t(b)], seeds[size_t(b)], offsets[size_t(b)],
                                             nd[size_t(b)], -7, want.data(), 1, mtp::current_isa());
    EXPECT(int64_t(acc[size_t(b)]) == n, "%s B=%lld K=%lld V=%lld q=%d b=%lld: accepted %lld want %lld", name_of(lt),
           (long long)B, (long long)K, (long long)V, int(with_q), (long long)b, (long long)acc[size_t(b)],
           (long long)n);
    for (int64_t t = 0; t <= K; ++t)
      EXPECT(out[size_t(b * (K + 1) + t)] == want[size_t(t)], "%s V=%lld b=%lld t=%lld: %lld want %lld", name_of(lt),
             (long long)V, (long long)b, (long long)t, (long long)out[size_t(b * (K + 1) + t)],
             (long long)want[size_t(t)]);
  }
}

// A valid call (B=2, K=3, V=5) that each check below breaks in one way.
struct SampledCall {
  std::vector<int64_t> draft = {1, 2, 3, 4, 0, 1}, seeds = {1, 2}, offsets = {0, 0}, acc = {-99, -99},
                       out = std::vector<int64_t>(8, -99);
  std::vector<float> logits = std::vector<float>(2 * 4 * 5, 0.f), q = std::vector<float>(2 * 3 * 5, 0.2f),
                     temp = {1.f, 0.f};
  std::vector<int64_t> top_k = {0, 3};
  std::vector<float> top_p = {1.f, 0.5f}, min_p = {0.f, 0.25f};
  mtp_tensor d, l, qv, tv, sv, ov, a, o, kv, pv, mv;
  mtp_tensor *qp = &qv, *op = &ov, *tp = &tv, *sp = &sv;
  int32_t threads = 1;
  SampledCall() {
    int64_t ds[2] = {2, 3}, ls[3] = {2, 4, 5}, qs[3] = {2, 3, 5}, bs[1] = {2}, os[2] = {2, 4};
    d = mtp_contiguous(draft.data(), MTP_INT64, 2, ds);
    l = mtp_contiguous(logits.data(), MTP_FLOAT32, 3, ls);
    qv = mtp_contiguous(q.data(), MTP_FLOAT32, 3, qs);
    tv = mtp_contiguous(temp.data(), MTP_FLOAT32, 1, bs);
    sv = mtp_contiguous(seeds.data(), MTP_INT64, 1, bs);
    ov = mtp_contiguous(offsets.data(), MTP_INT64, 1, bs);
    a = mtp_contiguous(acc.data(), MTP_INT64, 1, bs);
    o = mtp_contiguous(out.data(), MTP_INT64, 2, os);
    kv = mtp_contiguous(top_k.data(), MTP_INT64, 1, bs);
    pv = mtp_contiguous(top_p.data(), MTP_FLOAT32, 1, bs);
    mv = mtp_contiguous(min_p.data(), MTP_FLOAT32, 1, bs);
  }
  bool filtered = false;  // through mtp_verify_sampled_filtered, with top_k / top_p / min_p
  mtp_status run() {
    if (filtered)
      return mtp_verify_sampled_filtered(&d, qp, &l, tp, &kv, &pv, &mv, sp, op, nullptr, -1, &a, &o, threads);
    return mtp_verify_sampled(&d, qp, &l, tp, sp, op, nullptr, -1, &a, &o, threads);
  }
  bool untouched() const {
    for (int64_t v : acc)
      if (v != -99) return false;
    for (int64_t v : out)
      if (v != -99) return false;
    return true;
  }
};

#define BAD_SAMPLED(mutation, status, needle) BAD_CALL(SampledCall, mutation, status, needle)

}  // namespace

void test_sampling_capi() {
  int cases = 0;
  for (mtp_dtype lt : kFloatTypes)
    for (bool with_q : {false, true})
      for (int64_t K : {0, 1, 4})
        for (int64_t V : {1, 7, 300, 1100}) {
          const mtp_dtype qt = kFloatTypes[cases % 3];
          if (cases % 2)
            run_case<int32_t>(5, K, V, lt, qt, with_q, 1 + cases % 3, cases);
          else
            run_case<int64_t>(4, K, V, lt, qt, with_q, cases % 3, cases);
          ++cases;
        }
  run_case<int64_t>(0, 2, 5, MTP_FLOAT32, MTP_FLOAT32, true, 1, cases++);
  run_case<int32_t>(9, 3, 20011, MTP_BFLOAT16, MTP_FLOAT16, true, 3, cases++);
  std::printf("sampling_capi: %d cases\n", cases);
}

void test_sampling_errors() {
  {
    SampledCall c;
    EXPECT(c.run() == MTP_OK, "baseline: %s", mtp_last_error());
    SampledCall f;
    f.filtered = true;
    EXPECT(f.run() == MTP_OK, "filtered: %s", mtp_last_error());
    SampledCall n;
    n.qp = nullptr;
    n.op = nullptr;
    EXPECT(n.run() == MTP_OK, "no draft_probs, no offsets: %s", mtp_last_error());
  }
  BAD_SAMPLED(c.tp = nullptr, MTP_ERROR_NULL_POINTER, "mtp_verify_sampled: temperature is NULL");
  BAD_SAMPLED(c.sp = nullptr, MTP_ERROR_NULL_POINTER, "mtp_verify_sampled: seeds is NULL");
  BAD_SAMPLED(c.temp[1] = -0.5f, MTP_ERROR_INVALID_ARGUMENT,
              "mtp_verify_sampled: temperature must be finite and >= 0, got temperature[1] = -0.5");
  BAD_SAMPLED(c.temp[0] = NAN, MTP_ERROR_INVALID_ARGUMENT, "got temperature[0] = nan");
  BAD_SAMPLED(c.temp[0] = INFINITY, MTP_ERROR_INVALID_ARGUMENT, "temperature must be finite");
  BAD_SAMPLED(c.tv.dtype = MTP_FLOAT16, MTP_ERROR_UNSUPPORTED_DTYPE, "temperature must be float32, got float16");
  BAD_SAMPLED(c.sv.dtype = MTP_INT32, MTP_ERROR_UNSUPPORTED_DTYPE, "seeds must be int64, got int32");
  BAD_SAMPLED(c.ov.sizes[0] = 3, MTP_ERROR_INVALID_ARGUMENT, "offsets.sizes[0] must equal B");
  BAD_SAMPLED(c.tv.ndim = 2, MTP_ERROR_INVALID_ARGUMENT, "temperature must be 1-D");
  BAD_SAMPLED(c.q[7] = -0.1f, MTP_ERROR_INVALID_ARGUMENT,
              "draft_probs must be probabilities (finite, >= 0), got draft_probs[0, 1, 2] = -0.1");
  BAD_SAMPLED(c.q[29] = NAN, MTP_ERROR_INVALID_ARGUMENT, "got draft_probs[1, 2, 4] = nan");
  BAD_SAMPLED(c.q[0] = INFINITY, MTP_ERROR_INVALID_ARGUMENT, "got draft_probs[0, 0, 0] = inf");
  BAD_SAMPLED(c.qv.sizes[2] = 4, MTP_ERROR_INVALID_ARGUMENT, "draft_probs.sizes[2] must equal V");
  BAD_SAMPLED(c.qv.dtype = MTP_INT64, MTP_ERROR_UNSUPPORTED_DTYPE, "draft_probs must be float32 or bfloat16");
  BAD_SAMPLED(c.l.sizes[1] = 3, MTP_ERROR_INVALID_ARGUMENT, "target_logits.sizes[1] must equal K+1");
  BAD_SAMPLED(c.o.dtype = MTP_INT32, MTP_ERROR_UNSUPPORTED_DTYPE, "out_tokens must be int64, got int32");
  BAD_SAMPLED(c.threads = -1, MTP_ERROR_INVALID_ARGUMENT, "num_threads");
  BAD_SAMPLED((c.filtered = true, c.top_k[1] = -1), MTP_ERROR_INVALID_ARGUMENT,
              "mtp_verify_sampled_filtered: top_k must be >= 0 (0: off), got top_k[1] = -1");
  BAD_SAMPLED((c.filtered = true, c.top_p[0] = 0.f), MTP_ERROR_INVALID_ARGUMENT,
              "top_p must lie in (0, 1] (1: off), got top_p[0] = 0");
  BAD_SAMPLED((c.filtered = true, c.top_p[1] = 1.5f), MTP_ERROR_INVALID_ARGUMENT, "got top_p[1] = 1.5");
  BAD_SAMPLED((c.filtered = true, c.top_p[1] = NAN), MTP_ERROR_INVALID_ARGUMENT, "got top_p[1] = nan");
  BAD_SAMPLED((c.filtered = true, c.min_p[0] = 1.f), MTP_ERROR_INVALID_ARGUMENT,
              "min_p must lie in [0, 1) (0: off), got min_p[0] = 1");
  BAD_SAMPLED((c.filtered = true, c.min_p[1] = -0.5f), MTP_ERROR_INVALID_ARGUMENT, "got min_p[1] = -0.5");
  BAD_SAMPLED((c.filtered = true, c.kv.dtype = MTP_FLOAT32), MTP_ERROR_UNSUPPORTED_DTYPE,
              "top_k must be int32 or int64, got float32");
  BAD_SAMPLED((c.filtered = true, c.pv.sizes[0] = 3), MTP_ERROR_INVALID_ARGUMENT, "top_p.sizes[0] must equal B");
}

// ---------------------------------------------------------------- the flattened ragged layout
// mtp_verify_sampled_ragged: request b equals the scalar kernel on its own drafts, rows and q
// rows (sample_request with no ragged offsets), every dtype, filters, 1-3 threads.
template <class I>
void run_ragged_case(const std::vector<int64_t>& counts, int64_t V, mtp_dtype lt, mtp_dtype qt, bool with_q,
                     bool filtered, int threads, int64_t W) {
  std::normal_distribution<float> normal(0.f, 3.f);
  const int64_t B = int64_t(counts.size());
  int64_t N = 0;
  std::vector<int64_t> cu(size_t(std::max<int64_t>(B, 1)), 0), start(cu.size(), 0);
  for (int64_t b = 0; b < B; ++b) start[size_t(b)] = N, N += counts[size_t(b)], cu[size_t(b)] = N;
  // Logits [N + B, V] with padded rows (stride V + 2); draft_probs [N, V] transposed (strides {1, N}).
  const int64_t ls = V + 2;
  Floats logits(lt, size_t((N + B) * ls)), q(qt, size_t(N * V));
  for (int64_t i = 0; i < (N + B) * ls; ++i) logits.set(i, normal(rng));
  for (int64_t j = 0; j < N; ++j) {
    std::vector<float> row(static_cast<size_t>(V));
    float sum = 0;
    for (auto& v : row) sum += (v = std::exp(normal(rng) / 2));
    for (int64_t i = 0; i < V; ++i) q.set(j + i * N, row[size_t(i)] / sum);
  }
  std::vector<I> draft(size_t(std::max<int64_t>(N, 1)));
  for (auto& d : draft) d = I(uniform(-1, V));
  std::vector<float> temp(cu.size()), top_p(cu.size(), 1.f), min_p(cu.size(), 0.f);
  std::vector<int64_t> seeds(cu.size()), offsets(cu.size()), top_k(cu.size(), 0);
  std::vector<mtp::Filters> filters(cu.size());
  for (int64_t b = 0; b < B; ++b) {
    const size_t i = size_t(b);
    temp[i] = b % 3 == 0 ? 0.f : float(uniform(1, 200)) / 100.f;
    seeds[i] = uniform(-1000, 1000);
    offsets[i] = uniform(0, 1 << 20);
    if (filtered) {
      top_k[i] = uniform(0, 2) ? uniform(0, V + 1) : 0;
      top_p[i] = uniform(0, 2) ? float(uniform(1, 100)) / 100.f : 1.f;
      min_p[i] = uniform(0, 3) ? 0.f : float(uniform(0, 60)) / 100.f;
      filters[i] = {top_k[i], top_p[i], min_p[i]};
    }
  }
  const mtp_dtype it = sizeof(I) == 4 ? MTP_INT32 : MTP_INT64;
  auto view = [](void* p, mtp_dtype t, std::initializer_list<int64_t> sizes, std::initializer_list<int64_t> strides) {
    mtp_tensor v{};
    v.data = p;
    v.dtype = t;
    v.ndim = int32_t(sizes.size());
    int d = 0;
    for (int64_t s : sizes) v.sizes[d++] = s;
    d = 0;
    for (int64_t s : strides) v.strides[d++] = s;
    return v;
  };
  std::vector<I> acc(cu.size(), I(-99)), out(size_t(std::max<int64_t>(B * W, 1)), I(-99));
  mtp_tensor dv = view(draft.data(), it, {N}, {1}), cv = view(cu.data(), MTP_INT64, {B}, {1}),
             lv = view(logits.data(), lt, {N + B, V}, {ls, 1}), qv = view(q.data(), qt, {N, V}, {1, N}),
             tv = view(temp.data(), MTP_FLOAT32, {B}, {1}), sv = view(seeds.data(), MTP_INT64, {B}, {1}),
             ov = view(offsets.data(), MTP_INT64, {B}, {1}), kv = view(top_k.data(), MTP_INT64, {B}, {1}),
             pv = view(top_p.data(), MTP_FLOAT32, {B}, {1}), mv = view(min_p.data(), MTP_FLOAT32, {B}, {1}),
             av = view(acc.data(), it, {B}, {1}), outv = view(out.data(), it, {B, W}, {W, 1});
  const mtp_status st =
      mtp_verify_sampled_ragged(&dv, with_q ? &qv : nullptr, &cv, &lv, &tv, filtered ? &kv : nullptr,
                                filtered ? &pv : nullptr, filtered ? &mv : nullptr, &sv, &ov, -7, &av, &outv, threads);
  EXPECT(st == MTP_OK, "mtp_verify_sampled_ragged failed: %s", mtp_last_error());
  const size_t qsize = qt == MTP_FLOAT32 ? 4 : 2;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t k = counts[size_t(b)], s = start[size_t(b)];
    // Request b alone, as verify_sampled's [1, k, V] view: no ragged offsets.
    mtp::VerifyArgs a;
    a.B = 1;
    a.K = k;
    a.V = V;
    a.logits_dtype = mtp::DType(int(lt));
    a.logits = static_cast<const char*>(logits.data()) + (s + b) * ls * (lt == MTP_FLOAT32 ? 4 : 2);
    a.logits_stride[0] = 0;
    a.logits_stride[1] = ls;
    a.logits_stride[2] = 1;
    const int64_t qs[2] = {1, N};
    const void* qrow = with_q ? static_cast<const char*>(q.data()) + s * qsize : nullptr;
    std::vector<I> want(size_t(k + 1));
    const int64_t n = mtp::sample_request<I>(a, 0, draft.data() + s, 1, qrow, mtp::DType(int(qt)), qs, temp[size_t(b)],
                                             filters[size_t(b)], seeds[size_t(b)], offsets[size_t(b)], k, -7,
                                             want.data(), 1, mtp::current_isa());
    EXPECT(int64_t(acc[size_t(b)]) == n, "%s V=%lld q=%d b=%lld: accepted %lld want %lld", name_of(lt), (long long)V,
           int(with_q), (long long)b, (long long)acc[size_t(b)], (long long)n);
    for (int64_t t = 0; t < W; ++t) {
      const int64_t w = t <= k ? int64_t(want[size_t(t)]) : -7;
      EXPECT(int64_t(out[size_t(b * W + t)]) == w, "%s V=%lld b=%lld t=%lld: %lld want %lld", name_of(lt), (long long)V,
             (long long)b, (long long)t, (long long)out[size_t(b * W + t)], (long long)w);
    }
  }
}

void test_sampling_ragged_capi() {
  const std::vector<std::vector<int64_t>> layouts = {{}, {0}, {3}, {2, 0, 5, 1}, {0, 4, 0}, {1, 1, 1, 1, 1}};
  int cases = 0;
  for (mtp_dtype lt : kFloatTypes)
    for (bool with_q : {false, true})
      for (int64_t V : {1, 7, 300, 1100})
        for (const auto& counts : layouts) {
          int64_t W = 1;
          for (int64_t k : counts) W = std::max(W, k + 1);
          const mtp_dtype qt = kFloatTypes[cases % 3];
          if (cases % 2)
            run_ragged_case<int32_t>(counts, V, lt, qt, with_q, cases % 4 == 1, 1 + cases % 3, W);
          else
            run_ragged_case<int64_t>(counts, V, lt, qt, with_q, cases % 4 == 2, cases % 3, W + cases % 3);
          ++cases;
        }
  std::printf("sampling_ragged_capi: %d cases on %s\n", cases, mtp_get_isa());
}

namespace {
// A valid call (N = 4, B = 3, counts {2, 0, 2}, V = 5, W = 3) that each check below breaks.
struct SampledRaggedCall {
  std::vector<int64_t> draft = {1, 2, 3, 4}, cu = {2, 2, 4}, seeds = {1, 2, 3}, offsets = {0, 0, 0},
                       acc = {-99, -99, -99}, out = std::vector<int64_t>(9, -99), top_k = {0, 3, 1};
  std::vector<float> logits = std::vector<float>(7 * 5, 0.f), q = std::vector<float>(4 * 5, 0.2f),
                     temp = {1.f, 0.f, 0.5f}, top_p = {1.f, 0.5f, 0.9f}, min_p = {0.f, 0.25f, 0.f};
  mtp_tensor d, c, l, qv, tv, sv, ov, a, o, kv, pv, mv;
  mtp_tensor *qp = &qv, *op = &ov, *tp = &tv;
  int32_t threads = 1;
  SampledRaggedCall() {
    int64_t ns[1] = {4}, bs[1] = {3}, ls[2] = {7, 5}, qs[2] = {4, 5}, os[2] = {3, 3};
    d = mtp_contiguous(draft.data(), MTP_INT64, 1, ns);
    c = mtp_contiguous(cu.data(), MTP_INT64, 1, bs);
    l = mtp_contiguous(logits.data(), MTP_FLOAT32, 2, ls);
    qv = mtp_contiguous(q.data(), MTP_FLOAT32, 2, qs);
    tv = mtp_contiguous(temp.data(), MTP_FLOAT32, 1, bs);
    sv = mtp_contiguous(seeds.data(), MTP_INT64, 1, bs);
    ov = mtp_contiguous(offsets.data(), MTP_INT64, 1, bs);
    a = mtp_contiguous(acc.data(), MTP_INT64, 1, bs);
    o = mtp_contiguous(out.data(), MTP_INT64, 2, os);
    kv = mtp_contiguous(top_k.data(), MTP_INT64, 1, bs);
    pv = mtp_contiguous(top_p.data(), MTP_FLOAT32, 1, bs);
    mv = mtp_contiguous(min_p.data(), MTP_FLOAT32, 1, bs);
  }
  mtp_status run() {
    return mtp_verify_sampled_ragged(&d, qp, &c, &l, tp, &kv, &pv, &mv, &sv, op, -1, &a, &o, threads);
  }
  bool untouched() const {
    for (int64_t v : acc)
      if (v != -99) return false;
    for (int64_t v : out)
      if (v != -99) return false;
    return true;
  }
};
#define BAD_SAMPLED_RAGGED(mutation, status, needle) BAD_CALL(SampledRaggedCall, mutation, status, needle)
}  // namespace

void test_sampling_ragged_errors() {
  {
    SampledRaggedCall c;
    EXPECT(c.run() == MTP_OK, "baseline: %s", mtp_last_error());
  }
  BAD_SAMPLED_RAGGED(c.cu[1] = 1, MTP_ERROR_INVALID_ARGUMENT,
                     "mtp_verify_sampled_ragged: cu_num_draft_tokens must hold non-decreasing inclusive cumulative "
                     "counts, got cu_num_draft_tokens[1] = 1 < cu_num_draft_tokens[0] = 2");
  BAD_SAMPLED_RAGGED(c.cu[2] = 3, MTP_ERROR_INVALID_ARGUMENT, "cu_num_draft_tokens must end at N");
  BAD_SAMPLED_RAGGED(c.l.sizes[0] = 6, MTP_ERROR_INVALID_ARGUMENT, "target_logits.sizes[0] must equal N + B");
  BAD_SAMPLED_RAGGED(c.o.sizes[1] = 2, MTP_ERROR_INVALID_ARGUMENT, "out_tokens.sizes[1] - 1 = 1 is smaller than");
  BAD_SAMPLED_RAGGED(c.qv.sizes[0] = 3, MTP_ERROR_INVALID_ARGUMENT, "draft_probs.sizes[0] must equal N");
  BAD_SAMPLED_RAGGED(c.q[7] = -0.1f, MTP_ERROR_INVALID_ARGUMENT,
                     "draft_probs must be probabilities (finite, >= 0), got draft_probs[1, 2] = -0.1");
  BAD_SAMPLED_RAGGED(c.temp[2] = -0.5f, MTP_ERROR_INVALID_ARGUMENT,
                     "temperature must be finite and >= 0, got temperature[2] = -0.5");
  BAD_SAMPLED_RAGGED(c.tv.sizes[0] = 2, MTP_ERROR_INVALID_ARGUMENT,
                     "temperature.sizes[0] must equal B (cu_num_draft_tokens.sizes[0])");
  BAD_SAMPLED_RAGGED(c.tp = nullptr, MTP_ERROR_NULL_POINTER, "mtp_verify_sampled_ragged: temperature is NULL");
  BAD_SAMPLED_RAGGED(c.top_p[0] = 0.f, MTP_ERROR_INVALID_ARGUMENT,
                     "top_p must lie in (0, 1] (1: off), got top_p[0] = 0");
  BAD_SAMPLED_RAGGED(c.top_k[1] = -1, MTP_ERROR_INVALID_ARGUMENT, "top_k must be >= 0 (0: off), got top_k[1] = -1");
  BAD_SAMPLED_RAGGED(c.a.data = c.q.data(), MTP_ERROR_INVALID_ARGUMENT, "accepted");
  std::printf("sampling_ragged_errors: ok\n");
}

// top_p's fast cut keeps exactly the tokens the bitwise search keeps: flat and peaked
// weights, tied keys, small and large kept lists (sparse and dense sums), any top_p.
void test_top_p_key() {
  std::uniform_real_distribution<double> unit(0, 1);
  for (int round = 0; round < 300; ++round) {
    const int64_t V = uniform(1, 5000);
    const double spread = round % 3 == 0 ? 0.5 : 20.0;
    std::vector<mtp::Kept> kept;
    for (int64_t i = 0; i < V; ++i)
      if (uniform(0, 4) > 0) {
        const float x = float(-spread * unit(rng));
        const float xt = round % 2 ? std::round(x * 4) / 4 : x;  // every other round: many ties
        kept.push_back({i, std::exp(double(xt)), mtp::order_key(xt)});
      }
    if (kept.empty()) continue;
    const double top_p = double(float(unit(rng)));
    const double bound = top_p * mtp::sparse_ordered_sum(kept, 0);
    const mtp::AboveSum above(kept, V);
    double mass = 0;
    const uint32_t fast = mtp::top_p_key(kept, above, bound, &mass), slow = mtp::top_p_key_bitwise(kept, bound);
    int64_t differ = 0;
    for (const auto& k : kept) differ += (k.key >= fast) != (k.key >= slow);
    EXPECT(differ == 0 && fast > 0, "V=%lld top_p=%.9g: %lld tokens differ (fast %u, bitwise %u)", (long long)V, top_p,
           (long long)differ, fast, slow);
    EXPECT(fast == 0 || mass == mtp::sparse_ordered_sum(kept, fast - 1), "V=%lld: kept mass %.17g", (long long)V, mass);
  }
}

// The sparse sum of the filters gives the dense sum's bits (x + 0 == x), whatever is kept.
void test_sparse_ordered_sum() {
  std::uniform_real_distribution<double> unit(0, 1);
  for (int round = 0; round < 200; ++round) {
    const int64_t V = uniform(1, 3000);
    std::vector<double> w(size_t(V), 0.0);
    std::vector<mtp::Kept> kept;
    const int density = uniform(1, 100);
    for (int64_t i = 0; i < V; ++i)
      if (uniform(0, 100) < density) {
        w[size_t(i)] = std::exp(-30 * unit(rng));
        kept.push_back({i, w[size_t(i)], uint32_t(uniform(1, 1000))});
      }
    const uint32_t above = uint32_t(uniform(0, 1000));
    const double dense = mtp::ordered_sum(V, [&](int64_t i) {
      for (const auto& k : kept)
        if (k.i == i) return k.key > above ? k.w : 0.0;
      return 0.0;
    });
    EXPECT(mtp::sparse_ordered_sum(kept, above) == dense, "V=%lld: sparse %.17g dense %.17g", (long long)V,
           mtp::sparse_ordered_sum(kept, above), dense);
  }
}

// exp_fixed against std::exp: relative error below 4e-16 on [-708, 0], 0 below, exact at 0.
void test_exp_fixed() {
  EXPECT(mtp::exp_fixed(0.0) == 1.0, "exp_fixed(0) = %.17g", mtp::exp_fixed(0.0));
  EXPECT(mtp::exp_fixed(-709.0) == 0.0 && mtp::exp_fixed(-INFINITY) == 0.0, "exp_fixed below -708 is not 0");
  double worst = 0;
  for (int i = 0; i <= 200000; ++i) {
    const double y = -708.0 * i / 200000.0;
    worst = std::max(worst, std::fabs(mtp::exp_fixed(y) / std::exp(y) - 1));
  }
  EXPECT(worst < 4e-16, "exp_fixed relative error %.3g", worst);
}

// verify_sampled's torch-free rule: the RNG formula (values fixed as in reference.py's
// test), the inverse CDF on a uniform row, temperature 0 = argmax, one-hot accept/reject.
void test_sampling() {
  EXPECT(mtp::mix64(0) == 0xE220A8397B1DCDAFull, "mix64(0) = %llx", (unsigned long long)mtp::mix64(0));
  const int64_t V = 4096, K = 2;
  std::vector<float> logits((K + 1) * V, 0.0f);
  mtp::VerifyArgs a;
  a.B = 1;
  a.K = K;
  a.V = V;
  a.logits = logits.data();
  a.logits_stride[0] = (K + 1) * V;
  a.logits_stride[1] = V;
  a.logits_stride[2] = 1;
  const mtp::Isa isa = mtp::current_isa();
  for (int64_t seed : {int64_t(0), int64_t(-1), int64_t(12345)}) {
    // Uniform rows: the drawn token is floor(u * V) at each position.
    int64_t want[K + 1];
    for (int64_t t = 0; t <= K; ++t)
      want[t] = int64_t(mtp::sample_uniform(seed, 40 + t, mtp::kStreamSample) * double(V));
    int64_t draft[K] = {want[0], V};  // the first matches the draw, the second lies outside V
    int64_t out[K + 1];
    int64_t n = mtp::sample_request<int64_t>(a, 0, draft, 1, nullptr, mtp::DType::F32, nullptr, 1.0, mtp::Filters{},
                                             seed, 40, K, -7, out, 1, isa);
    EXPECT(n == 1 && out[0] == want[0] && out[1] == want[1] && out[2] == -7, "seed %lld: n %lld out %lld %lld %lld",
           (long long)seed, (long long)n, (long long)out[0], (long long)out[1], (long long)out[2]);
  }
  // Temperature 0: the argmax (first of a tie), whatever the seed.
  logits[5] = logits[9] = 3.0f;
  int64_t draft[K] = {5, 1}, out[K + 1];
  int64_t n = mtp::sample_request<int64_t>(a, 0, draft, 1, nullptr, mtp::DType::F32, nullptr, 0.0, mtp::Filters{}, 77,
                                           0, K, -1, out, 1, isa);
  EXPECT(n == 1 && out[0] == 5 && out[1] == 0 && out[2] == -1, "greedy: n %lld out %lld %lld", (long long)n,
         (long long)out[0], (long long)out[1]);
}
