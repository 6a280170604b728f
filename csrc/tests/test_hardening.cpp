// Hostile input to the C API: sizes whose products or sums overflow int64, outputs
// that alias inputs or each other (or are expanded, stride 0), non-finite float arguments,
// thread counts past MTP_MAX_THREADS, and fork(). Each call fails with a status and a message
// naming the argument, writes nothing, and is clean under ASan + UBSan; a forked child's
// threaded call finishes; the pool never holds more than MTP_MAX_THREADS - 1 workers.
// Its own executable (mtp_hardening_tests <case>): the fork case must not share a process
// with other tests' threads.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <string>
#include <vector>

#include "mtp/lenient.h"
#include "mtp/mtp.h"
#include "test_util.h"

namespace {

mtp_tensor view(const void* p, mtp_dtype t, std::initializer_list<int64_t> sizes) {
  return mtp_contiguous(p, t, int32_t(sizes.size()), sizes.begin());
}

// ---------------------------------------------------------------- a small decoder call

// One layer of float32 weights with the given head counts; every matrix's sizes as the caller
// sets them (so a hostile num_heads can come with the matrices its wrapped widths would match).
struct Decoder {
  int64_t H = 8, Hkv = 1, D = 4, I = 4, L = 4, P = 4;
  int64_t heads = 2;
  float eps = 1e-5f;
  std::vector<float> x, k, v, cos, sin, norm, qkv, o, gu, down, out;
  std::vector<int64_t> lens{0};
  mtp_tensor tx, tk, tv, tlens, tcos, tsin, w[7], tout;
  const mtp_tensor* wp[7];

  // qkv [qkv_rows, H], o_proj [H, o_cols]
  void build(int64_t qkv_rows, int64_t o_cols) {
    x.assign(size_t(H), 0.5f);
    k.assign(size_t(Hkv * L * std::max<int64_t>(D, 1)), 0.f);
    v = k;
    cos.assign(size_t(P * std::max<int64_t>(D, 1)), 1.f);
    sin.assign(cos.size(), 0.f);
    norm.assign(size_t(H), 1.f);
    qkv.assign(size_t(std::max<int64_t>(qkv_rows * H, 1)), 0.01f);
    o.assign(size_t(std::max<int64_t>(H * o_cols, 1)), 0.01f);
    gu.assign(size_t(2 * I * H), 0.01f);
    down.assign(size_t(H * I), 0.01f);
    out.assign(size_t(H), 7.f);
    tx = view(x.data(), MTP_FLOAT32, {1, 1, H});
    tk = view(k.data(), MTP_FLOAT32, {1, 1, Hkv, L, D});
    tv = view(v.data(), MTP_FLOAT32, {1, 1, Hkv, L, D});
    tlens = view(lens.data(), MTP_INT64, {1});
    tcos = view(cos.data(), MTP_FLOAT32, {P, D});
    tsin = view(sin.data(), MTP_FLOAT32, {P, D});
    w[0] = w[3] = w[6] = view(norm.data(), MTP_FLOAT32, {H});
    w[1] = view(qkv.data(), MTP_FLOAT32, {qkv_rows, H});
    w[2] = view(o.data(), MTP_FLOAT32, {H, o_cols});
    w[4] = view(gu.data(), MTP_FLOAT32, {2 * I, H});
    w[5] = view(down.data(), MTP_FLOAT32, {H, I});
    for (int i = 0; i < 7; ++i) wp[i] = &w[i];
    tout = view(out.data(), MTP_FLOAT32, {1, 1, H});
  }
  void build() { build((heads + 2 * Hkv) * D, heads * D); }
  mtp_status run(int32_t threads = 1) {
    return mtp_decoder_layers(&tx, &tk, &tv, &tlens, &tcos, &tsin, wp, 7, nullptr, 0, heads, eps, 0, &tout, threads);
  }
  bool untouched() const {
    for (float f : out)
      if (f != 7.f) return false;
    for (float f : k)
      if (f != 0.f) return false;
    return true;
  }
};

void test_sizes() {
  {  // the case: (Hq + 2 Hkv) D wraps to 8 and Hq D to 0 with num_heads = 2^62
    Decoder d;
    d.heads = int64_t(1) << 62;
    d.build(8, 0);
    expect_error(d.run(), MTP_ERROR_INVALID_ARGUMENT, "num_heads = 4611686018427387904 is too large", "num_heads 2^62");
    EXPECT(d.untouched(), "num_heads 2^62: written on failure");
  }
  {  // a valid call first: the builder is right
    Decoder d;
    d.build();
    EXPECT(d.run() == MTP_OK, "valid decoder call: %s", mtp_last_error());
  }
  {  // D = 0: heads of no width run (no memcpy from an empty buffer's NULL: UBSan)
    Decoder d;
    d.D = 0;
    d.build();
    EXPECT(d.run(2) == MTP_OK, "D = 0: %s", mtp_last_error());
  }
  {  // a stride-0 view whose sizes' product passes int64
    std::vector<float> x(4), w(4), y(4, 3.f);
    mtp_tensor tx = view(x.data(), MTP_FLOAT32, {1, 4}), tw = view(w.data(), MTP_FLOAT32, {1, 4}),
               ty = view(y.data(), MTP_FLOAT32, {1, 1});
    tx.sizes[0] = int64_t(1) << 62;  // set by hand: mtp_contiguous would multiply the sizes
    tx.strides[0] = 0;
    expect_error(mtp_linear(&tx, &tw, nullptr, &ty, 1), MTP_ERROR_INVALID_ARGUMENT,
                 "x of sizes [4611686018427387904, 4] has more elements than int64 counts", "numel overflow");
  }
  {  // K + 1 of a [1, INT64_MAX] expanded draft_tokens
    int64_t draft = 0, acc = 5, out = 5;
    float logits = 0.f;
    mtp_tensor td = view(&draft, MTP_INT64, {1, 1}), tl = view(&logits, MTP_FLOAT32, {1, 1, 1}),
               ta = view(&acc, MTP_INT64, {1}), to = view(&out, MTP_INT64, {1, 1});
    td.sizes[1] = INT64_MAX;
    td.strides[1] = 0;
    expect_error(mtp_verify(&td, &tl, nullptr, -1, &ta, &to, 1), MTP_ERROR_INVALID_ARGUMENT,
                 "draft_tokens.sizes[1] = K = 9223372036854775807 is too large", "K + 1");
    expect_error(mtp_accept_prefix(&td, &to, nullptr, &ta), MTP_ERROR_INVALID_ARGUMENT,
                 "draft_tokens.sizes[1] = K = 9223372036854775807 is too large", "accept_prefix K + 1");
    EXPECT(acc == 5 && out == 5, "K + 1: written on failure");
  }
  {  // head_draft: cache_lens[b] + k near 2^63 must not wrap past the RoPE check
    std::vector<float> hidden(8), k(16), cos(16), sin(16);
    int64_t token = 0, lens = 1, drafts = 5;
    mtp_tensor th = view(hidden.data(), MTP_FLOAT32, {1, 8}), ttok = view(&token, MTP_INT64, {1}),
               tk = view(k.data(), MTP_FLOAT32, {1, 1, 4, 4}), tlens = view(&lens, MTP_INT64, {1}),
               tcos = view(cos.data(), MTP_FLOAT32, {4, 4}), tsin = view(sin.data(), MTP_FLOAT32, {4, 4}),
               tdr = view(&drafts, MTP_INT64, {1, 1});
    expect_error(mtp_head_draft(&th, &ttok, &tk, &tk, &tlens, &tcos, &tsin, nullptr, nullptr, nullptr, 0, nullptr,
                                nullptr, nullptr, INT64_MAX, 2, 1e-5f, &tdr, 1),
                 MTP_ERROR_INVALID_ARGUMENT, "request 0's drafts would pass the RoPE tables", "cache_lens + k");
    EXPECT(drafts == 5, "cache_lens + k: written on failure");
  }
  {  // mtp_embedding: an expanded out of 2^62 rows, a weight's extent past int64 bytes, ids at
     // int64's ends: refused before any row is read
    std::vector<float> w(32, 1.f), out(8, 3.f);
    int64_t ids[2] = {0, 1};
    mtp_tensor tt = view(ids, MTP_INT64, {2}), tw = view(w.data(), MTP_FLOAT32, {4, 8}),
               to = view(out.data(), MTP_FLOAT32, {1, 8});
    tt.sizes[0] = to.sizes[0] = int64_t(1) << 62;
    tt.strides[0] = to.strides[0] = 0;
    expect_error(mtp_embedding(&tt, &tw, nullptr, &to), MTP_ERROR_INVALID_ARGUMENT,
                 "mtp_embedding: out of sizes [4611686018427387904, 8] has more elements than int64 counts",
                 "embedding 2^62 rows");
    tt = view(ids, MTP_INT64, {2});
    to = view(out.data(), MTP_FLOAT32, {1, 8});
    to.sizes[0] = 2;
    to.strides[0] = 0;
    to.sizes[1] = 4;  // 2 rows of 4 over the same 4 floats
    tw.sizes[1] = 4;
    expect_error(mtp_embedding(&tt, &tw, nullptr, &to), MTP_ERROR_INVALID_ARGUMENT,
                 "out must not have overlapping elements (it is an output), got strides [0, 1]",
                 "embedding out expanded");
    to = view(out.data(), MTP_FLOAT32, {2, 4});
    tw.strides[0] = INT64_MAX / 2;
    expect_error(mtp_embedding(&tt, &tw, nullptr, &to), MTP_ERROR_INVALID_ARGUMENT,
                 "weight of sizes [4, 4] has an extent beyond int64 bytes", "embedding weight extent");
    tw = view(w.data(), MTP_FLOAT32, {4, 4});
    for (int64_t id : {INT64_MAX, INT64_MIN, int64_t(4)}) {
      ids[1] = id;
      expect_error(
          mtp_embedding(&tt, &tw, nullptr, &to), MTP_ERROR_INVALID_ARGUMENT,
          ("tokens must hold token ids in [0, V (weight.sizes[0])) = [0, 4), got tokens[1] = " + std::to_string(id))
              .c_str(),
          "embedding id");
    }
    EXPECT(std::all_of(out.begin(), out.end(), [](float f) { return f == 3.f; }),
           "embedding sizes: written on failure");
  }
  {  // verify_sampled with offsets near 2^63: positions wrap (no UB), tokens valid
    const int64_t B = 1, K = 2, V = 5;
    std::vector<int64_t> draft{1, 2}, seeds{7}, offsets{INT64_MAX}, acc{-9}, out(3, -9);
    std::vector<float> logits(size_t(B * (K + 1) * V), 0.f), temp { 1.f };
    mtp_tensor td = view(draft.data(), MTP_INT64, {B, K}), tl = view(logits.data(), MTP_FLOAT32, {B, K + 1, V}),
               tt = view(temp.data(), MTP_FLOAT32, {B}), ts = view(seeds.data(), MTP_INT64, {B}),
               toff = view(offsets.data(), MTP_INT64, {B}), ta = view(acc.data(), MTP_INT64, {B}),
               to = view(out.data(), MTP_INT64, {B, K + 1});
    EXPECT(mtp_verify_sampled(&td, nullptr, &tl, &tt, &ts, &toff, nullptr, -1, &ta, &to, 1) == MTP_OK,
           "offsets INT64_MAX: %s", mtp_last_error());
    EXPECT(acc[0] >= 0 && acc[0] <= K && out[size_t(acc[0])] >= 0 && out[size_t(acc[0])] < V,
           "offsets INT64_MAX: accepted %lld, token %lld", (long long)acc[0], (long long)out[size_t(acc[0])]);
  }
}

// ---------------------------------------------------------------- aliasing

// cache_append over [1, 1, 4, 2] caches and [1, 2, 1, 2] new entries.
struct Append {
  std::vector<float> k = std::vector<float>(8, 0.f), v = std::vector<float>(8, 0.f), kn{1, 2, 3, 4}, vn{5, 6, 7, 8};
  int64_t len = 0;
  mtp_tensor tk = view(k.data(), MTP_FLOAT32, {1, 1, 4, 2}), tv = view(v.data(), MTP_FLOAT32, {1, 1, 4, 2}),
             tkn = view(kn.data(), MTP_FLOAT32, {1, 2, 1, 2}), tvn = view(vn.data(), MTP_FLOAT32, {1, 2, 1, 2}),
             tlen = view(&len, MTP_INT64, {1});
  mtp_status run() { return mtp_cache_append(&tk, &tv, &tkn, &tvn, &tlen, 1); }
  bool untouched() const {
    for (float f : k)
      if (f != 0.f) return false;
    for (float f : v)
      if (f != 0.f) return false;
    return true;
  }
};

void test_aliasing() {
  {
    Append a;
    EXPECT(a.run() == MTP_OK && a.k[0] == 1.f && a.v[3] == 8.f, "valid append: %s", mtp_last_error());
  }
  BAD_CALL(Append, c.tv = c.tk, MTP_ERROR_INVALID_ARGUMENT, "k_cache and v_cache overlap in memory");
  // k_new a view of k_cache's own rows
  BAD_CALL(Append, (c.tkn.data = c.k.data() + 4, c.tkn.strides[1] = 2), MTP_ERROR_INVALID_ARGUMENT,
           "k_cache and k_new overlap in memory");
  // an expanded cache: every position the same memory
  BAD_CALL(Append, c.tk.strides[2] = 0, MTP_ERROR_INVALID_ARGUMENT,
           "k_cache must not have overlapping elements (it is an output), got strides [8, 8, 0, 1]");

  {  // mtp_linear: y aliasing x (in place) would read overwritten inputs
    std::vector<float> x(6, 1.f), w(9, 0.5f);
    const std::vector<float> x0 = x;
    mtp_tensor tx = view(x.data(), MTP_FLOAT32, {2, 3}), tw = view(w.data(), MTP_FLOAT32, {3, 3}), ty = tx;
    expect_error(mtp_linear(&tx, &tw, nullptr, &ty, 1), MTP_ERROR_INVALID_ARGUMENT, "y and x overlap in memory",
                 "linear y = x");
    EXPECT(x == x0, "linear y = x: written on failure");
    std::vector<float> y(3);  // y expanded over the rows
    mtp_tensor ty2 = view(y.data(), MTP_FLOAT32, {2, 3});
    ty2.strides[0] = 0;
    expect_error(mtp_linear(&tx, &tw, nullptr, &ty2, 1), MTP_ERROR_INVALID_ARGUMENT,
                 "y must not have overlapping elements", "linear y stride 0");
    mtp_tensor tw2 = tw;  // y aliasing the weight
    tw2.data = y.data();
    tw2.sizes[0] = 1;
    mtp_tensor ty3 = view(y.data(), MTP_FLOAT32, {2, 1});
    expect_error(mtp_linear(&tx, &tw2, nullptr, &ty3, 1), MTP_ERROR_INVALID_ARGUMENT, "y and weight overlap in memory",
                 "linear y = weight");
  }
  {  // mtp_embedding: out over the table, its scales or the ids
    std::vector<int8_t> q(64, 1);
    std::vector<float> scale(4, 0.5f), out(64, 3.f);
    int64_t ids[2] = {0, 1};
    const mtp_tensor tt = view(ids, MTP_INT64, {2}), tq = view(q.data(), MTP_INT8, {2, 32}),
                     ts = view(scale.data(), MTP_FLOAT32, {2, 1}), to = view(out.data(), MTP_FLOAT32, {2, 32});
    EXPECT(mtp_embedding(&tt, &tq, &ts, &to) == MTP_OK && out[0] == 0.5f, "valid embedding: %s", mtp_last_error());
    std::fill(out.begin(), out.end(), 3.f);
    mtp_tensor over = view(q.data(), MTP_FLOAT32, {2, 8});  // the int8 table's 64 bytes
    const mtp_tensor tq8 = view(q.data(), MTP_INT8, {2, 8}), ts8 = view(scale.data(), MTP_FLOAT32, {2, 1});
    expect_error(mtp_embedding(&tt, &tq8, &ts8, &over), MTP_ERROR_INVALID_ARGUMENT, "out and weight overlap in memory",
                 "embedding out = weight");
    over.data = scale.data(), over.sizes[0] = 1, over.sizes[1] = 4;  // [1, 4] over the scales; one id
    mtp_tensor t1 = tt;
    t1.sizes[0] = 1;
    const mtp_tensor tq4 = view(q.data(), MTP_INT8, {2, 4});
    expect_error(mtp_embedding(&t1, &tq4, &ts8, &over), MTP_ERROR_INVALID_ARGUMENT,
                 "out and weight_scale overlap in memory", "embedding out = weight_scale");
    const mtp_tensor tf = view(out.data(), MTP_FLOAT32, {2, 32});
    mtp_tensor oi = view(ids, MTP_FLOAT32, {2, 2});  // out over the ids' 16 bytes
    mtp_tensor tf2 = tf;
    tf2.sizes[1] = 2;
    expect_error(mtp_embedding(&tt, &tf2, nullptr, &oi), MTP_ERROR_INVALID_ARGUMENT, "out and tokens overlap in memory",
                 "embedding out = tokens");
    EXPECT(ids[0] == 0 && ids[1] == 1 && q[0] == 1 && scale[0] == 0.5f, "embedding aliasing: written on failure");
  }
  {  // head_attention: out over q
    std::vector<float> q(8, 1.f), k(8, 1.f);
    int64_t len = 2;
    mtp_tensor tq = view(q.data(), MTP_FLOAT32, {1, 1, 2, 4}), tk = view(k.data(), MTP_FLOAT32, {1, 1, 2, 4}),
               tl = view(&len, MTP_INT64, {1});
    expect_error(mtp_head_attention(&tq, &tk, &tk, &tl, nullptr, nullptr, nullptr, 0, &tq, 1),
                 MTP_ERROR_INVALID_ARGUMENT, "out and q overlap in memory", "attention out = q");
  }
  {  // verify: out_tokens over draft_tokens, accepted over out_tokens
    std::vector<int64_t> buf(8, 0);
    std::vector<float> logits(3 * 4, 0.f);
    int64_t acc = -1;
    mtp_tensor td = view(buf.data(), MTP_INT64, {1, 2}), tl = view(logits.data(), MTP_FLOAT32, {1, 3, 4}),
               ta = view(&acc, MTP_INT64, {1}), to = view(buf.data(), MTP_INT64, {1, 3});
    expect_error(mtp_verify(&td, &tl, nullptr, -1, &ta, &to, 1), MTP_ERROR_INVALID_ARGUMENT,
                 "out_tokens and draft_tokens overlap in memory", "verify out = draft");
    mtp_tensor to2 = view(buf.data() + 4, MTP_INT64, {1, 3}), ta2 = view(buf.data() + 5, MTP_INT64, {1});
    expect_error(mtp_verify(&td, &tl, nullptr, -1, &ta2, &to2, 1), MTP_ERROR_INVALID_ARGUMENT,
                 "accepted and out_tokens overlap in memory", "verify accepted in out");
    EXPECT(acc == -1, "verify aliasing: written on failure");
  }
  {  // decoder: the caches the same memory, out over x
    Decoder d;
    d.build();
    d.tv = d.tk;
    expect_error(d.run(), MTP_ERROR_INVALID_ARGUMENT, "k_cache and v_cache overlap in memory", "decoder k = v");
    Decoder e;
    e.build();
    e.tout = e.tx;
    expect_error(e.run(), MTP_ERROR_INVALID_ARGUMENT, "out and x overlap in memory", "decoder out = x");
    Decoder f;  // a weight inside the cache
    f.build();
    f.w[0].data = f.k.data();
    expect_error(f.run(), MTP_ERROR_INVALID_ARGUMENT, "k_cache and weights[0] (layer 0's input_norm) overlap",
                 "decoder weight in cache");
    EXPECT(f.untouched(), "decoder aliasing: written on failure");
  }
}

// ---------------------------------------------------------------- scalars

void test_scalars() {
  std::vector<float> q(8, 1.f), k(8, 1.f), out(8, 3.f);
  int64_t len = 2;
  mtp_tensor tq = view(q.data(), MTP_FLOAT32, {1, 1, 2, 4}), tk = view(k.data(), MTP_FLOAT32, {1, 1, 2, 4}),
             tl = view(&len, MTP_INT64, {1}), to = view(out.data(), MTP_FLOAT32, {1, 1, 2, 4});
  for (float s : {NAN, INFINITY, -INFINITY})
    expect_error(mtp_head_attention(&tq, &tk, &tk, &tl, nullptr, nullptr, &s, 0, &to, 1), MTP_ERROR_INVALID_ARGUMENT,
                 "*scale must be finite, got", "scale");
  EXPECT(out[0] == 3.f, "scale: written on failure");
  for (float e : {NAN, INFINITY, -1.f}) {
    Decoder d;
    d.eps = e;
    d.build();
    expect_error(d.run(), MTP_ERROR_INVALID_ARGUMENT, "eps must be a finite number >= 0, got", "eps");
  }
  // verify_lenient's min_ratio in the fewest digits that read back (was std::to_string's %f)
  for (auto [v, shown] : {std::pair<double, const char*>{1e300, "1e+300"},
                          {-1e-300, "-1e-300"},
                          {1 + 1e-12, "1.000000000001"},
                          {1.5, "1.5"},
                          {-0.1, "-0.1"},
                          {NAN, "nan"}}) {
    const std::string got = mtp::lenient_error(2, v), want = std::string("min_ratio must lie in [0, 1], got ") + shown;
    EXPECT(got == want, "lenient_error(2, %.17g) = '%s', want '%s'", v, got.c_str(), want.c_str());
  }
  EXPECT(mtp::lenient_error(2, 1.0).empty() && mtp::lenient_error(2, 0.0).empty(), "lenient_error refused [0, 1]");
}

// ---------------------------------------------------------------- threads

// A verify call whose argmax rows split over `threads` (the pool's regions).
mtp_status verify_call(int32_t threads) {
  const int64_t B = 8, K = 3, V = 4096;
  static std::vector<float> logits;
  logits.assign(size_t(B * (K + 1) * V), 0.f);
  for (int64_t r = 0; r < B * (K + 1); ++r) logits[size_t(r * V + (r * 37) % V)] = 1.f;
  std::vector<int64_t> draft(size_t(B * K), 0), acc(static_cast<size_t>(B)), out(static_cast<size_t>(B * (K + 1)));
  mtp_tensor td = view(draft.data(), MTP_INT64, {B, K}), tl = view(logits.data(), MTP_FLOAT32, {B, K + 1, V}),
             ta = view(acc.data(), MTP_INT64, {B}), to = view(out.data(), MTP_INT64, {B, K + 1});
  const mtp_status st = mtp_verify(&td, &tl, nullptr, -1, &ta, &to, threads);
  for (int64_t b = 0; st == MTP_OK && b < B; ++b)
    if (out[size_t(b * (K + 1) + acc[size_t(b)])] != (b * (K + 1) + acc[size_t(b)]) * 37 % V) return MTP_ERROR_INTERNAL;
  return st;
}

int thread_count() {
  int n = 0;
#if defined(__linux__)
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
#endif
  return n;
}

void test_threads() {
  EXPECT(MTP_MAX_THREADS == 256, "MTP_MAX_THREADS = %d", MTP_MAX_THREADS);
  for (int32_t n : {MTP_MAX_THREADS + 1, 100000, INT32_MAX})
    expect_error(verify_call(n), MTP_ERROR_INVALID_ARGUMENT, "num_threads must be <= MTP_MAX_THREADS = 256",
                 "threads past the cap");
  std::vector<float> q(8, 1.f), k(8, 1.f), out(8, 3.f);  // attention's 2 * threads with INT32_MAX
  int64_t len = 2;
  mtp_tensor tq = view(q.data(), MTP_FLOAT32, {1, 1, 2, 4}), tk = view(k.data(), MTP_FLOAT32, {1, 1, 2, 4}),
             tl = view(&len, MTP_INT64, {1}), to = view(out.data(), MTP_FLOAT32, {1, 1, 2, 4});
  expect_error(mtp_head_attention(&tq, &tk, &tk, &tl, nullptr, nullptr, nullptr, 0, &to, INT32_MAX),
               MTP_ERROR_INVALID_ARGUMENT, "num_threads must be <= MTP_MAX_THREADS", "attention INT32_MAX threads");
  const int before = thread_count();
  EXPECT(verify_call(MTP_MAX_THREADS) == MTP_OK, "threads = cap: %s", mtp_last_error());
  EXPECT(verify_call(0) == MTP_OK, "threads = 0: %s", mtp_last_error());
  const int after = thread_count();
#if defined(__linux__)
  EXPECT(after - before <= MTP_MAX_THREADS - 1, "the pool grew by %d threads (cap %d)", after - before,
         MTP_MAX_THREADS);
#endif
  std::printf("threads: %d before, %d after the cap's calls\n", before, after);
}

// fork() after the pool started: the child's threaded call finishes (the parent waits at most
// 30 s, then kills it and fails).
void test_fork() {
  EXPECT(verify_call(2) == MTP_OK, "parent, before fork: %s", mtp_last_error());
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(30);  // the child never outlives a hang by much, even if the parent dies
    const bool ok = verify_call(2) == MTP_OK && verify_call(4) == MTP_OK;
    _exit(ok ? 0 : 3);
  }
  EXPECT(pid > 0, "fork failed");
  if (pid <= 0) return;
  int status = 0;
  bool done = false;
  for (int i = 0; i < 3000 && !done; ++i) {  // 30 s in steps of 10 ms
    done = waitpid(pid, &status, WNOHANG) == pid;
    if (!done) usleep(10000);
  }
  if (!done) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  EXPECT(done, "the forked child's call with num_threads = 2 hung (killed after 30 s)");
  EXPECT(done && WIFEXITED(status) && WEXITSTATUS(status) == 0, "the forked child failed (status %d)", status);
  EXPECT(verify_call(2) == MTP_OK, "parent, after fork: %s", mtp_last_error());
}

}  // namespace

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "";
  if (which == "sizes")
    test_sizes();
  else if (which == "aliasing")
    test_aliasing();
  else if (which == "scalars")
    test_scalars();
  else if (which == "threads")
    test_threads();
  else if (which == "fork")
    test_fork();
  else {
    std::fprintf(stderr, "usage: %s sizes|aliasing|scalars|threads|fork\n", argv[0]);
    return 2;
  }
  if (g_failures)
    std::fprintf(stderr, "%d failure(s)\n", g_failures);
  else
    std::printf("%s: checked\n", which.c_str());
  return g_failures ? 1 : 0;
}
