// Fuzz target for the C API's argument checks: every mtp_* function is called with tensor views
// and scalars decoded from the input bytes, and must either return a status with a message or run
// without reading or writing outside the views it was given (AddressSanitizer sees every buffer at
// its exact size) and without undefined behaviour (UBSan: overflow in size arithmetic).
//
// Tensors are always real buffers (at most 1 MiB): a view whose extent is larger is skipped, since
// a caller passing it must own that memory. Sizes come mostly from four shared dimensions, so that
// shapes often agree and the calls reach the kernels; scalars (num_heads, eps, pad_id, k,
// num_threads ...) take any value, including the huge ones that once wrapped the shape checks.
//
// clang: -fsanitize=fuzzer,address,undefined -DMTP_LIBFUZZER (libFuzzer drives it, `make fuzz`).
// gcc (no libFuzzer): a built-in driver runs seeded random inputs for a time budget, and replays
// files given as arguments: `fuzz_capi [--seconds S] [--seed N] [files...]`.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "mtp/mtp.h"

namespace {

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  // Past the end: a fixed pseudo-random stream (zeros would pick the first, often wrong, choice
  // of every decision).
  uint8_t u8() {
    if (pos_ < size_) return data_[pos_++];
    tail_ = tail_ * 6364136223846793005ull + 1442695040888963407ull;
    return uint8_t(tail_ >> 56);
  }
  bool empty() const { return pos_ >= size_; }
  int64_t i64() {
    static const int64_t kPicks[] = {0,
                                     1,
                                     2,
                                     3,
                                     4,
                                     -1,
                                     7,
                                     32,
                                     64,
                                     256,
                                     int64_t(1) << 31,
                                     (int64_t(1) << 31) - 1,
                                     int64_t(1) << 62,
                                     std::numeric_limits<int64_t>::max(),
                                     std::numeric_limits<int64_t>::min()};
    const uint8_t b = u8();
    if (b < 200) return kPicks[b % (sizeof kPicks / sizeof kPicks[0])];
    int64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | u8();
    return v;
  }
  float f32() {
    static const float kPicks[] = {0.f, 1.f, -1.f, 1e-5f, 0.125f, NAN, INFINITY, -INFINITY, 3e38f, 1e-40f};
    return kPicks[u8() % (sizeof kPicks / sizeof kPicks[0])];
  }
  int32_t threads() {
    static const int32_t kPicks[] = {1, 1, 2, 0, 3, -1, std::numeric_limits<int32_t>::max(), 100000};
    return kPicks[u8() % (sizeof kPicks / sizeof kPicks[0])];
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  uint64_t tail_ = 0x853c49e6748fea9bull;
};

size_t elem_bytes(int32_t dtype) {
  switch (dtype) {
    case MTP_FLOAT32:
    case MTP_INT32: return 4;
    case MTP_BFLOAT16:
    case MTP_FLOAT16: return 2;
    case MTP_INT64: return 8;
    default: return 1;  // int8, block dtypes (strides[0] in bytes) and bad dtypes
  }
}

enum class Fill { kFloat, kIndex, kRaw };

// One view in about 40 gets one thing wrong: a call of 17 views then still runs often.
constexpr uint8_t kBad = 7;

// The views of one call and the buffers behind them (owned here, freed after the call).
class Call {
 public:
  explicit Call(Input& in) : in_(in) {}

  // A small dimension (1..5, or 8 / 32 / 64 now and then: vector widths and GGUF blocks).
  int64_t dim() {
    const uint8_t b = in_.u8();
    return b < 200 ? 1 + b % 5 : b < 230 ? 8 : b < 250 ? 32 : 64;
  }

  // A view of `shape` and `dtype` (contiguous, or a column slice), then, now and then, one thing
  // made wrong: dtype, rank, a size, a stride, a NULL pointer or a NULL view. Index tensors hold
  // values in [0, bound] (mostly valid ids and lengths); float ones small values, or raw bytes.
  // `skip` is set when a view's extent is beyond the 1 MiB budget.
  const mtp_tensor* tensor(std::initializer_list<int64_t> shape, int32_t dtype, Fill fill = Fill::kFloat,
                           int64_t bound = 0) {
    auto t = std::make_unique<mtp_tensor>();
    std::memset(t.get(), 0, sizeof *t);
    t->dtype = dtype;
    t->ndim = int32_t(shape.size());
    int i = 0;
    for (int64_t s : shape) t->sizes[i++] = s;
    const uint8_t layout = in_.u8();
    int64_t stride = 1;
    for (int d = t->ndim - 1; d >= 0; --d) {
      t->strides[d] = stride;
      stride *= t->sizes[d] + (d == t->ndim - 1 && layout % 4 == 1 ? 2 : 0);  // padded rows
    }
    if (dtype >= MTP_Q4_0 && t->ndim == 2) t->strides[0] = row_bytes(dtype, t->sizes[1]);
    const uint8_t bad = in_.u8();
    if (bad < kBad) {
      static const int32_t kDtypes[] = {MTP_FLOAT32, MTP_BFLOAT16, MTP_FLOAT16, MTP_INT32, MTP_INT64,
                                        MTP_INT8,    MTP_Q4_0,     MTP_Q4_1,    MTP_Q5_0,  MTP_Q8_0,
                                        MTP_Q4_K,    MTP_Q6_K,     7,           -1};
      const int nd = t->ndim;
      switch (bad % 8) {
        case 0: t->dtype = kDtypes[in_.u8() % 13]; break;
        case 1: t->ndim = int32_t(in_.u8() % 9) - 1; break;
        case 2:
          if (nd) t->sizes[in_.u8() % nd] = in_.u8() < 128 ? in_.u8() % 9 : in_.i64();
          break;
        case 3:
          if (nd) t->strides[in_.u8() % nd] = in_.u8() < 128 ? in_.u8() % 4 : in_.i64();
          break;
        case 4: return nullptr;
        default: break;  // 5..7: the data pointer below
      }
    }
    const int nd = t->ndim < 0 ? 0 : t->ndim > MTP_MAX_DIMS ? MTP_MAX_DIMS : t->ndim;
    // Extent in bytes: the furthest element any in-bounds index reaches (strides taken as given;
    // a negative one by its magnitude, so that a kernel honouring it reads outside).
    unsigned __int128 extent = 1;
    for (int d = 0; d < nd; ++d) {
      if (t->sizes[d] <= 0) {
        extent = 0;
        break;
      }
      const int64_t st = t->strides[d];
      const unsigned __int128 mag = st < 0 ? (unsigned __int128)(-(__int128)st) : (unsigned __int128)st;
      extent += (unsigned __int128)(t->sizes[d] - 1) * mag;
    }
    const bool block = t->dtype >= MTP_Q4_0;
    unsigned __int128 bytes =
        block ? (extent ? extent - 1 + row_bytes(t->dtype, t->sizes[1]) : 0) : extent * elem_bytes(t->dtype);
    if (bytes > (1u << 20)) {
      skip_ = true;
      bytes = 0;
    }
    buffers_.emplace_back(new uint8_t[size_t(bytes) + 1]);  // +1: never a zero-byte allocation
    uint8_t* buf = buffers_.back().get();
    fill_buffer(buf, size_t(bytes), t->dtype, fill, bound);
    t->data = bad < kBad && bad % 8 >= 5 && bad % 8 < 6 ? nullptr : buf;
    views_.push_back(std::move(t));
    return views_.back().get();
  }
  bool skip() const { return skip_; }

  // Mostly-valid values for a [n] float32 view the call left sane (the fill's values are
  // often out of a filter's range): lo + (i % 8) * step, so most calls reach the kernels.
  static void set_f32(const mtp_tensor* t, int64_t n, float lo, float step) {
    if (!t || !t->data || t->dtype != MTP_FLOAT32 || t->ndim != 1 || t->sizes[0] != n || t->strides[0] < 0) return;
    for (int64_t i = 0; i < n; ++i) static_cast<float*>(t->data)[i * t->strides[0]] = lo + float(i % 8) * step;
  }

  // A ragged call's cu [B] (int32 or int64) := the inclusive sums of counts, where the draw
  // left it a plain vector: most ragged calls then reach the kernels.
  static void set_cumulative(const mtp_tensor* cu, const std::vector<int64_t>& counts) {
    const int64_t B = int64_t(counts.size());
    if (!cu || !cu->data || cu->ndim != 1 || cu->sizes[0] != B || cu->strides[0] < 0 ||
        (cu->dtype != MTP_INT32 && cu->dtype != MTP_INT64))
      return;
    int64_t sum = 0;
    for (int64_t b = 0; b < B; ++b) {
      sum += counts[size_t(b)];
      if (cu->dtype == MTP_INT32)
        static_cast<int32_t*>(cu->data)[b * cu->strides[0]] = int32_t(sum);
      else
        static_cast<int64_t*>(cu->data)[b * cu->strides[0]] = sum;
    }
  }

  // A buffer of `bytes` (at most 1 MiB; else 64) owned by the call, raw bytes from the input.
  uint8_t* bytes(int64_t n) {
    const size_t size = n > 0 && n <= (1 << 20) ? size_t(n) : 64;
    buffers_.emplace_back(new uint8_t[size]);
    for (size_t i = 0; i < size; ++i) buffers_.back()[i] = uint8_t(i * 131 + 7);
    return buffers_.back().get();
  }

 private:
  static int64_t row_bytes(int32_t dtype, int64_t cols) {
    if (dtype >= MTP_Q4_0_X8) dtype -= 100;  // an x8 layout: its file type's rows
    const int64_t elems = dtype == MTP_Q4_K || dtype == MTP_Q6_K ? 256 : 32;
    const int64_t block = dtype == MTP_Q4_0   ? 18
                          : dtype == MTP_Q4_1 ? 20
                          : dtype == MTP_Q5_0 ? 22
                          : dtype == MTP_Q8_0 ? 34
                          : dtype == MTP_Q4_K ? 144
                                              : 210;
    return cols > 0 && cols < (int64_t(1) << 30) ? (cols + elems - 1) / elems * block : 1;
  }

  void fill_buffer(uint8_t* buf, size_t bytes, int32_t dtype, Fill fill, int64_t bound) {
    const size_t eb = elem_bytes(dtype);
    const bool raw = fill == Fill::kRaw || in_.u8() < 16;
    uint32_t seed = uint32_t(in_.u8()) << 8 | in_.u8();  // the values: a generator the input seeds
    for (size_t i = 0; i + eb <= bytes; i += eb) {
      seed = seed * 1664525u + 1013904223u;
      const uint8_t r = uint8_t(seed >> 24);
      if (raw || dtype >= MTP_Q4_0) {
        for (size_t j = 0; j < eb; ++j) buf[i + j] = uint8_t(r + j * 77);
        continue;
      }
      if (dtype == MTP_INT32 || dtype == MTP_INT64 || dtype == MTP_INT8) {
        const int64_t v = fill == Fill::kIndex ? int64_t(r) % (bound + 1) : int64_t(int8_t(r));
        if (dtype == MTP_INT32) {
          const int32_t w = int32_t(v);
          std::memcpy(buf + i, &w, 4);
        } else if (dtype == MTP_INT64)
          std::memcpy(buf + i, &v, 8);
        else
          buf[i] = uint8_t(v);
        continue;
      }
      const float f = float(r % 32) / 8.f - (fill == Fill::kIndex ? 0.f : 2.f);  // >= 0 for probabilities
      uint32_t u;
      std::memcpy(&u, &f, 4);
      if (dtype == MTP_FLOAT32)
        std::memcpy(buf + i, &u, 4);
      else if (dtype == MTP_BFLOAT16) {
        const uint16_t h = uint16_t(u >> 16);
        std::memcpy(buf + i, &h, 2);
      } else {
        const uint16_t h = f16_bits(f);
        std::memcpy(buf + i, &h, 2);
      }
    }
  }

  // Exact for the values above (multiples of 1/8 below 4 in magnitude).
  static uint16_t f16_bits(float f) {
    if (f == 0.f) return 0;
    const uint16_t sign = f < 0 ? 0x8000 : 0;
    int e;
    const float m = std::frexp(std::fabs(f), &e);  // f = m * 2^e, m in [0.5, 1)
    return uint16_t(sign | ((e - 1 + 15) << 10) | uint16_t((m * 2.f - 1.f) * 1024.f));
  }

  Input& in_;
  bool skip_ = false;
  std::vector<std::unique_ptr<uint8_t[]>> buffers_;
  std::vector<std::unique_ptr<mtp_tensor>> views_;
};

// Calls per function that ran (MTP_OK) and that were refused: the driver prints them, so that a
// harness change that stops reaching the kernels shows.
constexpr int kFunctions = 15;
uint64_t g_calls[kFunctions][2];

void check_status(mtp_status s) {
  // A failure must carry a message; success leaves "" (mtp.h).
  const char* msg = mtp_last_error();
  if (s != MTP_OK && (msg == nullptr || msg[0] == '\0')) {
    std::fprintf(stderr, "status %s without a message\n", mtp_status_name(s));
    std::abort();
  }
}

void one_call(Input& in) {
  Call c(in);
  const uint8_t fn = in.u8() % kFunctions;
  const int32_t threads = in.threads();
  const int32_t fdt = in.u8() % 3 == 0 ? MTP_BFLOAT16 : in.u8() % 2 ? MTP_FLOAT32 : MTP_FLOAT16;  // float dtype
  const int32_t idt = in.u8() & 1 ? MTP_INT64 : MTP_INT32;                                        // index dtype
  const Fill I = Fill::kIndex;
  const int64_t B = c.dim(), T = c.dim(), K = c.dim() - 1, V = c.dim() + 1, D = 2 * c.dim(), Hkv = c.dim(), G = c.dim(),
                L = c.dim() + 8, H = c.dim() * 8;
  mtp_status s = MTP_OK;
  switch (fn) {
    case 0: {
      auto *dr = c.tensor({B, K}, idt, I, V - 1), *lg = c.tensor({B, K + 1, V}, fdt),
           *nd = in.u8() & 1 ? c.tensor({B}, idt, I, K) : nullptr, *acc = c.tensor({B}, idt),
           *out = c.tensor({B, K + 1}, idt);
      if (c.skip()) return;
      s = mtp_verify(dr, lg, nd, in.u8() < 200 ? -1 : in.i64(), acc, out, threads);
      break;
    }
    case 1: {
      auto *dr = c.tensor({B, K}, idt, I, V - 1), *pr = in.u8() & 1 ? c.tensor({B, K, V}, fdt, I) : nullptr,
           *lg = c.tensor({B, K + 1, V}, fdt), *te = c.tensor({B}, MTP_FLOAT32, I),
           *se = c.tensor({B}, MTP_INT64, Fill::kRaw), *of = in.u8() & 1 ? c.tensor({B}, MTP_INT64, I, 9) : nullptr,
           *nd = in.u8() & 1 ? c.tensor({B}, idt, I, K) : nullptr, *acc = c.tensor({B}, idt),
           *out = c.tensor({B, K + 1}, idt);
      if (c.skip()) return;
      s = mtp_verify_sampled(dr, pr, lg, te, se, of, nd, -1, acc, out, threads);
      break;
    }
    case 2: {
      auto *dr = c.tensor({B, K}, idt, I, 3), *tg = c.tensor({B, K + 1}, idt, I, 3),
           *nd = in.u8() & 1 ? c.tensor({B}, idt, I, K) : nullptr, *acc = c.tensor({B}, idt);
      if (c.skip()) return;
      s = mtp_accept_prefix(dr, tg, nd, acc);
      break;
    }
    case 3: {
      const bool local = in.u8() & 1;
      const int64_t S = T + in.u8() % 3;
      auto *q = c.tensor({B, T, Hkv * G, D}, fdt), *k = c.tensor({B, Hkv, L, D}, fdt),
           *v = c.tensor({B, Hkv, L, D}, fdt), *lens = c.tensor({B}, idt, I, L),
           *kl = local ? c.tensor({B, Hkv, S, D}, fdt) : nullptr, *vl = local ? c.tensor({B, Hkv, S, D}, fdt) : nullptr,
           *out = c.tensor({B, T, Hkv * G, D}, fdt);
      const float scale = in.u8() < 200 ? 0.5f : in.f32();
      const bool has_scale = in.u8() & 1;
      const int64_t window = in.u8() % 4 == 0 ? int64_t(in.u8()) - 8 : 0;  // a sliding window, negatives too
      if (c.skip()) return;
      if (window)
        s = mtp_head_attention_window(q, k, v, lens, kl, vl, has_scale ? &scale : nullptr, int32_t(in.u8() % 3 == 0),
                                      window, out, threads);
      else
        s = mtp_head_attention(q, k, v, lens, kl, vl, has_scale ? &scale : nullptr, int32_t(in.u8() % 3 == 0), out,
                               threads);
      break;
    }
    case 4: {
      auto *kc = c.tensor({B, Hkv, L, D}, fdt), *vc = c.tensor({B, Hkv, L, D}, fdt),
           *kn = c.tensor({B, T, Hkv, D}, fdt), *vn = c.tensor({B, T, Hkv, D}, fdt),
           *lens = c.tensor({B}, idt, I, L - T);
      if (c.skip()) return;
      s = mtp_cache_append(kc, vc, kn, vn, lens, threads);
      break;
    }
    case 5:
    case 6:
    case 7: {  // linear: float, GGUF block, Q8 (and Q8 with int8 activations)
      static const int32_t kBlocks[] = {MTP_Q4_0,    MTP_Q4_1,    MTP_Q5_0,    MTP_Q8_0,    MTP_Q4_K,   MTP_Q6_K,
                                        MTP_Q4_0_X8, MTP_Q4_1_X8, MTP_Q8_0_X8, MTP_Q4_K_X8, MTP_Q6_K_X8};
      const int32_t wdt = fn == 5 ? (in.u8() & 1 ? fdt : kBlocks[in.u8() % 11]) : MTP_INT8;
      const bool k_quant = wdt == MTP_Q4_K || wdt == MTP_Q6_K || wdt == MTP_Q4_K_X8 || wdt == MTP_Q6_K_X8;
      const int64_t M = c.dim(), N = c.dim(), Kx = k_quant ? 256 : 32 * c.dim();
      const int32_t xdt = fdt == MTP_FLOAT16 && wdt >= MTP_Q4_0 ? MTP_FLOAT32 : fdt;
      auto *x = c.tensor({M, Kx}, xdt), *w = c.tensor({N, Kx}, wdt),
           *sc = c.tensor({N, (Kx + 31) / 32}, MTP_FLOAT32, I), *b = in.u8() & 1 ? c.tensor({N}, xdt) : nullptr,
           *y = c.tensor({M, N}, xdt);
      if (c.skip()) return;
      s = fn == 5   ? mtp_linear(x, w, b, y, threads)
          : fn == 6 ? mtp_linear_q8(x, w, sc, b, y, threads)
                    : mtp_linear_q8dot(x, w, sc, b, y, threads);
      break;
    }
    case 8:
    case 9: {  // decoder_layers(_tree): one layer's 6 views + the final norm
      const int32_t xdt = fdt == MTP_FLOAT16 ? MTP_FLOAT32 : fdt;
      const int64_t Hq = Hkv * G, I2 = 2 * c.dim(), P = L + 2;
      auto *x = c.tensor({B, T, H}, xdt), *kc = c.tensor({1, B, Hkv, L, D}, xdt),
           *vc = c.tensor({1, B, Hkv, L, D}, xdt), *lens = c.tensor({B}, idt, I, L - T),
           *cs = c.tensor({P, D}, MTP_FLOAT32), *sn = c.tensor({P, D}, MTP_FLOAT32),
           *tree = fn == 9 ? c.tensor({B, T}, idt, I, 0) : nullptr, *out = c.tensor({B, T, H}, xdt);
      const mtp_tensor* w[7] = {c.tensor({H}, xdt),         c.tensor({(Hq + 2 * Hkv) * D, H}, xdt),
                                c.tensor({H, Hq * D}, xdt), c.tensor({H}, xdt),
                                c.tensor({2 * I2, H}, xdt), c.tensor({H, I2}, xdt),
                                c.tensor({H}, xdt)};
      const int32_t nw = in.u8() < 240 ? 7 : int32_t(in.u8() % 9);
      const int64_t heads = in.u8() < 220 ? Hq : in.i64();
      const float eps = in.u8() < 220 ? 1e-5f : in.f32();
      if (c.skip()) return;
      s = fn == 8
              ? mtp_decoder_layers(x, kc, vc, lens, cs, sn, w, nw, nullptr, 0, heads, eps, 0, out, threads)
              : mtp_decoder_layers_tree(x, kc, vc, lens, cs, sn, w, nw, nullptr, 0, heads, eps, 0, tree, out, threads);
      break;
    }
    case 10: {  // head_draft(_alternatives, _probs): 4 + 6 views (one block)
      const int32_t xdt = fdt == MTP_FLOAT16 ? MTP_FLOAT32 : fdt;
      const int64_t Hq = Hkv * G, I2 = 2 * c.dim(), k = in.u8() % 4, Vd = c.dim(), P = L + 8;
      auto *h = c.tensor({B, H}, xdt), *tok = c.tensor({B}, idt, I, V - 1), *kc = c.tensor({B, Hkv, L, D}, xdt),
           *vc = c.tensor({B, Hkv, L, D}, xdt), *lens = c.tensor({B}, idt, I, L), *cs = c.tensor({P, D}, MTP_FLOAT32),
           *sn = c.tensor({P, D}, MTP_FLOAT32), *emb = c.tensor({V, H}, xdt), *lm = c.tensor({V, H}, xdt),
           *dv = in.u8() & 1 ? c.tensor({Vd}, idt, I, V - 1) : nullptr;
      const int64_t alts = in.u8() < 200 ? in.u8() % 3 : in.i64();
      auto* dr = c.tensor({B, k + (alts > 0 && alts < 8 ? alts : 0)}, idt);
      const mtp_tensor* w[10] = {c.tensor({H}, xdt),
                                 c.tensor({H}, xdt),
                                 c.tensor({H, 2 * H}, xdt),
                                 c.tensor({H}, xdt),
                                 c.tensor({(Hq + 2 * Hkv) * D, H}, xdt),
                                 c.tensor({H, Hq * D}, xdt),
                                 c.tensor({H}, xdt),
                                 c.tensor({2 * I2, H}, xdt),
                                 c.tensor({H, I2}, xdt),
                                 c.tensor({H}, xdt)};
      const int64_t heads = in.u8() < 220 ? Hq : in.i64();
      const float eps = in.u8() < 220 ? 1e-5f : in.f32();
      const bool with_probs = in.u8() < 64;  // mtp_head_draft_probs: probs [B, k] float32, mostly
      auto* pr = with_probs ? c.tensor({B, in.u8() < 230 ? k : k + 1}, MTP_FLOAT32) : nullptr;
      if (c.skip()) return;
      s = with_probs ? mtp_head_draft_probs(h, tok, kc, vc, lens, cs, sn, emb, nullptr, w, 10, lm, nullptr, dv, k,
                                            heads, eps, dr, pr, threads)
                     : mtp_head_draft_alternatives(h, tok, kc, vc, lens, cs, sn, emb, nullptr, w, 10, lm, nullptr, dv,
                                                   k, heads, eps, alts, dr, threads);
      break;
    }
    case 11: {  // mtp_verify_ragged: counts 0..3 per request, cu mostly their cumulative sums
      std::vector<int64_t> counts(static_cast<size_t>(B));
      int64_t N = 0;
      for (int64_t& k : counts) N += (k = in.u8() % 4);
      const bool consistent = in.u8() < 200;
      auto *dr = c.tensor({N}, idt, I, V - 1), *cu = c.tensor({B}, idt, I, N), *lg = c.tensor({N + B, V}, fdt),
           *acc = c.tensor({B}, idt), *out = c.tensor({B, 3 + in.u8() % 3}, idt);
      if (c.skip()) return;
      if (consistent) Call::set_cumulative(cu, counts);
      s = mtp_verify_ragged(dr, cu, lg, in.u8() < 200 ? -1 : in.i64(), acc, out, threads);
      break;
    }
    case 12: {  // mtp_gguf_repack_x8: file rows -> x8; hostile sizes only where their bytes overflow
      static const int32_t kTypes[] = {MTP_Q4_0, MTP_Q4_1,    MTP_Q8_0,    MTP_Q4_K, MTP_Q6_K,
                                       MTP_Q5_0, MTP_Q4_0_X8, MTP_FLOAT32, -1};
      const int32_t dtype = in.u8() < 200 ? kTypes[in.u8() % 5] : kTypes[in.u8() % 9];
      const int64_t elems = dtype == MTP_Q4_K || dtype == MTP_Q6_K ? 256 : 32;
      static const int64_t kRows[] = {-8, 7, int64_t(1) << 62, std::numeric_limits<int64_t>::max() - 7};
      static const int64_t kCols[] = {31, -32, int64_t(1) << 62, std::numeric_limits<int64_t>::max() - 31};
      const bool odd_rows = in.u8() < 20, odd_cols = in.u8() < 20;
      const int64_t rows = odd_rows ? kRows[in.u8() % 4] : 8 * (in.u8() % 9),
                    cols = odd_cols ? kCols[in.u8() % 4] : elems * (in.u8() % 9);
      const int64_t block = dtype == MTP_Q4_0   ? 18
                            : dtype == MTP_Q4_1 ? 20
                            : dtype == MTP_Q4_K ? 144
                            : dtype == MTP_Q6_K ? 210
                                                : 34;
      // the caller owns rows * row bytes when both are ordinary; else a small buffer (the call
      // must refuse, or touch nothing: 0 bytes)
      const int64_t n = odd_rows || odd_cols ? 64 : rows * (cols / elems) * block;
      uint8_t* src = c.bytes(n);
      const uint8_t mode = in.u8();
      uint8_t* dst = mode < 200 ? c.bytes(n) : mode < 215 ? src : mode < 230 ? src + (n > 1 ? 1 : 0) : nullptr;
      const void* from = mode >= 245 ? nullptr : src;
      s = mtp_gguf_repack_x8(dtype, from, rows, cols, dst);
      break;
    }
    case 13: {  // mtp_verify_sampled_ragged (its filters: mtp_verify_sampled_filtered's checks)
      std::vector<int64_t> counts(static_cast<size_t>(B));
      int64_t N = 0;
      for (int64_t& k : counts) N += (k = in.u8() % 4);
      const bool consistent = in.u8() < 200;
      auto *dr = c.tensor({N}, idt, I, V - 1), *pr = in.u8() & 1 ? c.tensor({N, V}, fdt, I) : nullptr,
           *cu = c.tensor({B}, idt, I, N), *lg = c.tensor({N + B, V}, fdt), *te = c.tensor({B}, MTP_FLOAT32, I),
           *tk = in.u8() & 1 ? c.tensor({B}, idt, I, V + 1) : nullptr,
           *tp = in.u8() & 1 ? c.tensor({B}, MTP_FLOAT32, I) : nullptr,
           *mp = in.u8() & 1 ? c.tensor({B}, MTP_FLOAT32, I) : nullptr, *se = c.tensor({B}, MTP_INT64, Fill::kRaw),
           *of = in.u8() & 1 ? c.tensor({B}, MTP_INT64, I, 9) : nullptr, *acc = c.tensor({B}, idt),
           *out = c.tensor({B, 3 + in.u8() % 3}, idt);
      if (c.skip()) return;
      if (consistent) {
        Call::set_f32(tp, B, 0.125f, 0.125f);  // (0, 1]
        Call::set_f32(mp, B, 0.f, 0.1f);       // [0, 1)
      }
      if (consistent) Call::set_cumulative(cu, counts);
      s = mtp_verify_sampled_ragged(dr, pr, cu, lg, te, tk, tp, mp, se, of, in.u8() < 200 ? -1 : in.i64(), acc, out,
                                    threads);
      break;
    }
    case 14: {  // mtp_embedding: a float, Q8 or GGUF table (file or x8 layout), ids mostly in [0, V)
      static const int32_t kTables[] = {MTP_FLOAT32, MTP_BFLOAT16, MTP_INT8,    MTP_Q4_0,   MTP_Q4_1,
                                        MTP_Q5_0,    MTP_Q8_0,     MTP_Q4_K,    MTP_Q6_K,   MTP_Q4_0_X8,
                                        MTP_Q4_1_X8, MTP_Q8_0_X8,  MTP_Q4_K_X8, MTP_Q6_K_X8};
      const int32_t wdt = kTables[in.u8() % 14];
      const bool k_quant = wdt == MTP_Q4_K || wdt == MTP_Q6_K || wdt == MTP_Q4_K_X8 || wdt == MTP_Q6_K_X8;
      const int64_t n = c.dim() - 1, blocks = c.dim();
      const int64_t trim = wdt < MTP_Q4_0 ? in.u8() % 32 : 0;  // float and Q8 rows: any H
      const int64_t Hw = k_quant ? 256 : 32 * blocks - trim, Vw = wdt >= MTP_Q4_0_X8 ? 8 * c.dim() : V;
      const int32_t odt = fdt == MTP_FLOAT16 ? MTP_FLOAT32 : fdt;
      auto *tok = c.tensor({n}, idt, I, in.u8() < 230 ? Vw - 1 : Vw), *w = c.tensor({Vw, Hw}, wdt),
           *sc = wdt == MTP_INT8 || in.u8() < 8 ? c.tensor({Vw, (Hw + 31) / 32}, MTP_FLOAT32, I) : nullptr,
           *out = c.tensor({n, Hw}, odt);
      if (c.skip()) return;
      s = mtp_embedding(tok, w, sc, out);
      break;
    }
  }
  check_status(s);
  ++g_calls[fn][s == MTP_OK ? 0 : 1];
  if (s != MTP_OK && std::getenv("FUZZ_VERBOSE")) std::fprintf(stderr, "%d: %s\n", fn, mtp_last_error());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  one_call(in);
  return 0;
}

#ifndef MTP_LIBFUZZER
// The gcc driver: replay the files given, else seeded random inputs for --seconds (default 5).
int main(int argc, char** argv) {
  double seconds = 5;
  uint64_t seed = 1;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc)
      seconds = std::atof(argv[++i]);
    else if (a == "--seed" && i + 1 < argc)
      seed = std::strtoull(argv[++i], nullptr, 10);
    else
      files.push_back(a);
  }
  if (!files.empty()) {
    for (const std::string& f : files) {
      std::FILE* fp = std::fopen(f.c_str(), "rb");
      if (!fp) {
        std::fprintf(stderr, "fuzz_capi: cannot open %s\n", f.c_str());
        return 2;
      }
      std::vector<uint8_t> bytes;
      for (int ch; (ch = std::fgetc(fp)) != EOF;) bytes.push_back(uint8_t(ch));
      std::fclose(fp);
      LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
    }
    std::printf("fuzz_capi: replayed %zu files\n", files.size());
    return 0;
  }
  uint64_t x = seed, runs = 0;
  auto next = [&x] {  // splitmix64
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  const auto start = std::chrono::steady_clock::now();
  std::vector<uint8_t> bytes;
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds) {
    bytes.resize(next() % 400);
    for (uint8_t& b : bytes) b = uint8_t(next());
    LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
    ++runs;
  }
  for (int f = 0; f < kFunctions; ++f)
    std::printf("  function %2d: %llu ran, %llu refused\n", f, (unsigned long long)g_calls[f][0],
                (unsigned long long)g_calls[f][1]);
  std::printf("fuzz_capi: %llu random inputs in %.0f s (seed %llu), no finding\n", (unsigned long long)runs, seconds,
              (unsigned long long)seed);
  return 0;
}
#endif
