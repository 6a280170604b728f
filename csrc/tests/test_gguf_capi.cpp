// GGUF block-type weights (MTP_Q4_0 .. MTP_Q6_K) through the C API: mtp_linear gives the
// core's canonical product (mtp::generic::gguf_linear) bit for bit on every instruction set,
// for every format, x dtype, bias, y dtype, strided views and rows padded apart;
// mtp_decoder_layers(_tree) runs with block-type matrices (any mix, float ones too) and gives
// the core's pass, a token the same bits in a T = 3 pass as in three T = 1 passes; the head
// drafts with a Q8_0 embedding / lm_head (and block-type matrices of its own) what it drafts
// with that embedding given as its fp32 dequantized rows. The x8 layout (MTP_Q4_0_X8 ..,
// made by mtp_gguf_repack_x8, which writes mtp::repack_x8's bytes): mtp_linear, the decoder
// passes and the head (its embedding rows, the draft vocabulary's lm_head rows or all of them)
// give the file layout's bits. mtp_embedding gives every type's rows dequantize_row's values,
// rounded once, in both layouts. Bad input: a status and message, nothing written
// (gguf_capi_errors).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "mtp/decoder_layers.h"
#include "mtp/gguf.h"
#include "mtp/linear.h"
#include "mtp/mtp.h"
#include "mtp/parallel.h"
#include "test_util.h"

namespace {

using mtp::DType;

using mtp::kBlockTypes;

const char* tname(DType t) {
  if (mtp::is_block_type(t)) return mtp::block_type_name(t);
  return t == DType::F32 ? "f32" : t == DType::BF16 ? "bf16" : "f16";
}

mtp_dtype capi(DType t) { return mtp_dtype(int(t)); }

// A normal fp16 in [2^e, 2^(e+1)), negative when asked.
uint16_t f16_in(int e, bool negative) {
  return uint16_t((negative ? 0x8000 : 0) | ((e + 15) << 10) | int(uniform(0, 1023)));
}

// N rows of K elements of random blocks, rows `stride` bytes apart (the padding 0xAB): random
// quant bytes, fp16 scales chosen so that a weight is about 0.05 (a realistic matrix).
std::vector<uint8_t> random_blocks(DType t, int64_t N, int64_t K, int64_t stride = -1) {
  const int64_t rb = mtp::block_row_bytes(t, K), bb = mtp::block_bytes(t);
  if (stride < 0) stride = rb;
  std::vector<uint8_t> w(size_t(std::max<int64_t>(N * stride, 1)), 0xAB);
  auto put = [](uint8_t* p, uint16_t h) { std::memcpy(p, &h, 2); };
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < rb / bb; ++b) {
      uint8_t* blk = w.data() + n * stride + b * bb;
      for (int64_t i = 0; i < bb; ++i) blk[i] = uint8_t(uniform(0, 255));
      switch (t) {
        case DType::Q4_0: put(blk, f16_in(-7, uniform(0, 1))); break;
        case DType::Q4_1:
          put(blk, f16_in(-7, uniform(0, 1)));
          put(blk + 2, f16_in(-4, true));
          break;
        case DType::Q5_0: put(blk, f16_in(-8, uniform(0, 1))); break;
        case DType::Q8_0: put(blk, f16_in(-10, uniform(0, 1))); break;
        case DType::Q4_K:
          put(blk, f16_in(-11, uniform(0, 1)));
          put(blk + 2, f16_in(-11, false));
          break;
        default: put(blk + 208, f16_in(-14, uniform(0, 1))); break;  // Q6_K
      }
    }
  return w;
}

// Bytes holding n random values of a float type, of scale s around offset.
std::vector<char> values(DType t, int64_t n, float s, float offset = 0.f) {
  std::vector<char> out(size_t(std::max<int64_t>(n, 1) * mtp::dtype_size(t)));
  for (int64_t i = 0; i < n; ++i)
    mtp::store_f32(out.data(), t, i, offset + s * std::ldexp(float(int64_t(rng() >> 44) - (1 << 19)), -19));
  return out;
}

mtp_tensor view(const void* p, DType t, std::initializer_list<int64_t> sizes) {
  return mtp_contiguous(p, capi(t), int32_t(sizes.size()), sizes.begin());
}

// The x8 layout of N rows of file type t (rows `stride` bytes apart) through mtp_gguf_repack_x8
// (the rows packed first: it takes the file's packed rows), checked against mtp::repack_x8 and
// row by row against the file rows' dequantized values.
std::vector<uint8_t> repacked_x8(DType t, const std::vector<uint8_t>& w, int64_t N, int64_t K, int64_t stride) {
  const int64_t rb = mtp::block_row_bytes(t, K);
  std::vector<uint8_t> packed(size_t(std::max<int64_t>(N * rb, 1))), x8(packed.size(), 0xCD), want(packed.size(), 0xCD);
  for (int64_t n = 0; n < N; ++n) std::memcpy(packed.data() + n * rb, w.data() + n * stride, size_t(rb));
  EXPECT(mtp_gguf_repack_x8(capi(t), packed.data(), N, K, x8.data()) == MTP_OK,
         "mtp_gguf_repack_x8 %s [%lld, %lld]: %s", tname(t), (long long)N, (long long)K, mtp_last_error());
  mtp::repack_x8(t, w.data(), stride, N, K, want.data());
  EXPECT(x8 == want, "mtp_gguf_repack_x8 %s [%lld, %lld] != mtp::repack_x8", tname(t), (long long)N, (long long)K);
  std::vector<float> a(static_cast<size_t>(K)), b(static_cast<size_t>(K));
  for (int64_t n = 0; n < N && K > 0; ++n) {  // K = 0: no values (and NULL data())
    mtp::dequantize_row(t, w.data(), stride, n, K, a.data());
    mtp::dequantize_row(mtp::x8_of(t), x8.data(), rb, n, K, b.data());
    EXPECT(std::memcmp(a.data(), b.data(), size_t(K) * sizeof(float)) == 0,
           "%s [%lld, %lld]: x8 row %lld != the file's", tname(t), (long long)N, (long long)K, (long long)n);
  }
  return x8;
}

// ---------------------------------------------------------------- mtp_linear

// y = mtp_linear(x, w, bias) against the core's generic product, bitwise.
void check_linear(DType wt, DType xt, int64_t M, int64_t N, int64_t K, bool with_bias, bool y_f32, int64_t pad,
                  bool strided_x, int threads) {
  const int64_t rb = mtp::block_row_bytes(wt, K), stride = rb + pad;
  const std::vector<uint8_t> w = random_blocks(wt, N, K, stride);
  const int64_t xcols = strided_x ? 2 * K : K;  // strided: x's elements 2 apart
  const std::vector<char> x = values(xt, M * xcols, 2.f);
  const DType bt = xt;
  const std::vector<char> bias = values(bt, N, 1.f);
  const DType yt = y_f32 ? DType::F32 : xt;
  const int64_t ycols = N + 3;  // y's rows padded
  std::vector<char> y(size_t(std::max<int64_t>(M * ycols, 1) * mtp::dtype_size(yt)), char(0x5A));

  mtp_tensor xv = view(x.data(), xt, {M, K});
  if (strided_x) xv.strides[0] = xcols, xv.strides[1] = 2;
  mtp_tensor wv = mtp_gguf_matrix(w.data(), capi(wt), N, K);
  wv.strides[0] = stride;
  const mtp_tensor bv = view(bias.data(), bt, {N});
  mtp_tensor yv = view(y.data(), yt, {M, N});
  yv.strides[0] = ycols;
  const mtp_status st = mtp_linear(&xv, &wv, with_bias ? &bv : nullptr, &yv, threads);
  char what[160];
  std::snprintf(what, sizeof what,
                "mtp_linear %s x %s M=%lld N=%lld K=%lld bias=%d y=%s pad=%lld strided=%d threads=%d", tname(wt),
                tname(xt), (long long)M, (long long)N, (long long)K, int(with_bias), tname(yt), (long long)pad,
                int(strided_x), threads);
  EXPECT(st == MTP_OK, "%s: %s", what, mtp_last_error());

  // The reference: x packed to contiguous rows of its dtype, the generic canonical product.
  std::vector<char> xc(size_t(std::max<int64_t>(M * K, 1) * mtp::dtype_size(xt)));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k)
      mtp::store_f32(xc.data(), xt, m * K + k, mtp::load_f32(x.data(), xt, m * xcols + k * (strided_x ? 2 : 1)));
  std::vector<float> b(static_cast<size_t>(N)), want(static_cast<size_t>(M * N));
  for (int64_t n = 0; n < N; ++n) b[size_t(n)] = mtp::load_f32(bias.data(), bt, n);
  mtp::LinearArgs a;
  a.M = M;
  a.N = N;
  a.K = K;
  a.x = xc.data();
  a.x_dtype = xt;
  a.x_stride = K;
  a.w = w.data();
  a.w_dtype = wt;
  a.w_stride = stride;
  a.bias = with_bias ? b.data() : nullptr;
  a.y = want.data();
  a.y_stride = N;
  mtp::QuantRows xq;
  mtp::quantize_rows(a.x, xt, K, M, K, xq);
  mtp::generic::gguf_linear(a, xq, 0, N);

  int bad = 0;
  const int64_t es = mtp::dtype_size(yt);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      std::vector<char> expect(static_cast<size_t>(es));
      mtp::store_f32(expect.data(), yt, 0, want[size_t(m * N + n)]);
      if (std::memcmp(expect.data(), y.data() + (m * ycols + n) * es, size_t(es)) && bad++ < 3)
        EXPECT(false, "%s: y[%lld, %lld] = %g, the core's product %g", what, (long long)m, (long long)n,
               double(mtp::load_f32(y.data(), yt, m * ycols + n)), double(want[size_t(m * N + n)]));
    }
    for (int64_t n = N; n < ycols; ++n)
      EXPECT(std::all_of(y.data() + (m * ycols + n) * es, y.data() + (m * ycols + n + 1) * es,
                         [](char c) { return c == char(0x5A); }),
             "%s: wrote y's padding", what);
  }

  // The x8 layout of the same weight (whole groups of 8 rows): y's bytes, padding included.
  if (mtp::x8_of(wt) == wt || N % mtp::kX8Rows != 0) return;
  const std::vector<uint8_t> w8 = repacked_x8(wt, w, N, K, stride);
  std::vector<char> y8(y.size(), char(0x5A));
  const mtp_tensor wv8 = mtp_gguf_matrix(w8.data(), capi(mtp::x8_of(wt)), N, K);
  mtp_tensor yv8 = yv;
  yv8.data = y8.data();
  EXPECT(mtp_linear(&xv, &wv8, with_bias ? &bv : nullptr, &yv8, threads) == MTP_OK, "%s x8: %s", what,
         mtp_last_error());
  EXPECT(y8 == y, "%s: the %s weight's y != the file layout's", what, tname(mtp::x8_of(wt)));
}

void check_linear_all() {
  for (DType wt : kBlockTypes) {
    const int64_t e = mtp::block_elems(wt);
    for (DType xt : {DType::F32, DType::BF16, DType::F16}) {
      check_linear(wt, xt, 3, 70, 2 * e, true, true, 0, false, 2);
      check_linear(wt, xt, 1, 5, e, false, false, 6, true, 1);
    }
    check_linear(wt, DType::F32, 7, 130, 3 * e, true, false, 2, false, 3);
    check_linear(wt, DType::BF16, 2, 1, 4 * e, false, true, 0, true, 0);
    check_linear(wt, DType::F32, 0, 4, e, true, true, 0, false, 1);  // M = 0
    check_linear(wt, DType::F32, 2, 0, e, true, true, 0, false, 1);  // N = 0
    check_linear(wt, DType::F32, 2, 3, 0, true, true, 0, false, 1);  // K = 0: the bias
  }
  // N a multiple of 8: the x8 layout too (check_linear compares it with the file layout).
  for (DType wt : {DType::Q4_0, DType::Q4_1, DType::Q8_0}) {
    for (DType xt : {DType::F32, DType::BF16, DType::F16}) {
      check_linear(wt, xt, 3, 72, 64, true, true, 0, false, 2);
      check_linear(wt, xt, 1, 8, 32, false, false, 6, true, 1);
    }
    check_linear(wt, DType::F32, 7, 136, 96, true, false, 2, false, 3);
    check_linear(wt, DType::F32, 10, 24, 128, true, true, 0, false, 0);
    check_linear(wt, DType::BF16, 2, 16, 128, false, true, 0, true, 4);
    check_linear(wt, DType::F32, 0, 8, 32, true, true, 0, false, 1);  // M = 0
    check_linear(wt, DType::F32, 2, 0, 32, true, true, 0, false, 1);  // N = 0
    check_linear(wt, DType::F32, 2, 8, 0, true, true, 0, false, 1);   // K = 0: the bias
  }
}

// ---------------------------------------------------------------- decoder passes

// A matrix [N, K]: a GGUF block type (rows `pad` bytes apart beyond their size), or float.
struct Mat {
  DType t;
  int64_t N, K, stride;
  std::vector<uint8_t> bytes;
  std::vector<char> floats;
  Mat(DType t_, int64_t N_, int64_t K_, int64_t pad = 0) : t(t_), N(N_), K(K_) {
    if (mtp::is_block_type(t)) {
      stride = mtp::block_row_bytes(t, K) + pad;
      bytes = random_blocks(t, N, K, stride);
    } else {
      stride = K;
      floats = values(t, N * K, 1.f / std::sqrt(float(K)));
    }
  }
  const void* data() const { return bytes.empty() ? static_cast<const void*>(floats.data()) : bytes.data(); }
  mtp_tensor view() const {
    mtp_tensor v = mtp_gguf_matrix(data(), capi(t), N, K);
    v.strides[0] = stride;
    return v;
  }
  mtp::DecoderMatrix core() const { return {data(), t, stride, nullptr, 0}; }
  // Rows `rows` of this matrix (file layout) as a new matrix [rows.size(), K].
  Mat gathered(const std::vector<int64_t>& rows) const {
    Mat m = *this;
    m.N = int64_t(rows.size());
    const size_t row = bytes.empty() ? size_t(K * mtp::dtype_size(t)) : size_t(stride);
    auto gather = [&](const auto& src, auto& dst) {
      dst.resize(rows.size() * row);
      for (size_t i = 0; i < rows.size(); ++i) std::memcpy(&dst[i * row], &src[size_t(rows[i]) * row], row);
    };
    if (bytes.empty())
      gather(floats, m.floats);
    else
      gather(bytes, m.bytes);
    return m;
  }
  // Into the x8 layout (mtp_gguf_repack_x8) where the type has one and N is whole groups of 8.
  bool to_x8() {
    if (mtp::x8_of(t) == t || N % mtp::kX8Rows != 0) return false;
    bytes = repacked_x8(t, bytes, N, K, stride);
    t = mtp::x8_of(t);
    stride = mtp::block_row_bytes(t, K);
    return true;
  }
};

struct Dims {
  int64_t H, Hq, Hkv, D, I, L, P;
};

// Decoder layers with the given matrix types (4 per layer: qkv, o_proj, gate_up, down_proj),
// the C API's weight views and the core's layers over the same bytes.
struct Model {
  Dims d;
  DType t;
  std::vector<std::vector<char>> norms;  // 2 per layer, then the final one
  std::vector<Mat> mats;
  std::vector<float> cos, sin;
  std::vector<mtp_tensor> w;
  std::vector<const mtp_tensor*> wp;
  std::vector<mtp::DecoderLayer> layers;
  Model(Dims d_, DType t_, const std::vector<DType>& types) : d(d_), t(t_) {
    const int64_t n = int64_t(types.size()) / 4;
    for (int64_t i = 0; i < n; ++i) {
      const DType* m = &types[size_t(4 * i)];
      mats.emplace_back(m[0], (d.Hq + 2 * d.Hkv) * d.D, d.H, 4 * i);  // some rows padded apart
      mats.emplace_back(m[1], d.H, d.Hq * d.D);
      mats.emplace_back(m[2], 2 * d.I, d.H, 2);
      mats.emplace_back(m[3], d.H, d.I);
    }
    for (int64_t i = 0; i < 2 * n + 1; ++i) norms.push_back(values(t, d.H, 0.25f, 1.f));
    build();
    for (int64_t p = 0; p < d.P; ++p)
      for (int64_t j = 0; j < d.D; ++j) {
        const double a = p * std::pow(10000.0, -double(2 * (j % (d.D / 2))) / double(d.D));
        cos.push_back(float(std::cos(a)));
        sin.push_back(float(std::sin(a)));
      }
  }
  // The C API's views and the core's layers of the norms and matrices.
  void build() {
    const int64_t n = int64_t(mats.size()) / 4;
    w.clear();
    wp.clear();
    layers.clear();
    for (int64_t i = 0; i < n; ++i) {
      w.push_back(view(norms[size_t(2 * i)].data(), t, {d.H}));
      for (int j = 0; j < 4; ++j) {
        if (j == 2) w.push_back(view(norms[size_t(2 * i + 1)].data(), t, {d.H}));
        w.push_back(mats[size_t(4 * i + j)].view());
      }
      layers.push_back({norms[size_t(2 * i)].data(), mats[size_t(4 * i)].core(), mats[size_t(4 * i + 1)].core(),
                        norms[size_t(2 * i + 1)].data(), mats[size_t(4 * i + 2)].core(),
                        mats[size_t(4 * i + 3)].core()});
    }
    w.push_back(view(norms.back().data(), t, {d.H}));
    for (auto& v : w) wp.push_back(&v);
  }
  // Every matrix that has an x8 layout (and whole groups of 8 rows) into it; false if none.
  bool to_x8() {
    bool any = false;
    for (Mat& m : mats) any |= m.to_x8();
    build();
    return any;
  }
  int64_t nlayers() const { return int64_t(layers.size()); }
};

struct Cache {
  std::vector<char> k, v;
  std::vector<int64_t> lens;
  Cache(const Model& m, std::vector<int64_t> l)
      : k(size_t(m.nlayers() * int64_t(l.size()) * m.d.Hkv * m.d.L * m.d.D * mtp::dtype_size(m.t))),
        v(k.size()),
        lens(std::move(l)) {}
  int64_t B() const { return int64_t(lens.size()); }
};

// mtp_decoder_layers (tree: mtp_decoder_layers_tree) of T tokens; the lengths are left as
// they were (the caller advances them).
mtp_status capi_pass(const Model& m, Cache& c, const std::vector<char>& x, int64_t T, std::vector<char>& out,
                     int threads, const int64_t* tree = nullptr) {
  const int64_t B = c.B();
  const mtp_tensor xv = view(x.data(), m.t, {B, T, m.d.H}), ov = view(out.data(), m.t, {B, T, m.d.H}),
                   kv = view(c.k.data(), m.t, {m.nlayers(), B, m.d.Hkv, m.d.L, m.d.D}),
                   vv = view(c.v.data(), m.t, {m.nlayers(), B, m.d.Hkv, m.d.L, m.d.D}),
                   cv = view(m.cos.data(), DType::F32, {m.d.P, m.d.D}),
                   sv = view(m.sin.data(), DType::F32, {m.d.P, m.d.D});
  mtp_tensor lv = view(c.lens.data(), DType::F32, {B}), tv = view(tree, DType::F32, {B, T});
  lv.dtype = MTP_INT64;
  tv.dtype = MTP_INT64;
  if (tree)
    return mtp_decoder_layers_tree(&xv, &kv, &vv, &lv, &cv, &sv, m.wp.data(), int32_t(m.wp.size()), nullptr, 0, m.d.Hq,
                                   1e-5f, 0, &tv, &ov, threads);
  return mtp_decoder_layers(&xv, &kv, &vv, &lv, &cv, &sv, m.wp.data(), int32_t(m.wp.size()), nullptr, 0, m.d.Hq, 1e-5f,
                            0, &ov, threads);
}

// The core's pass (mtp::decoder_layers) over the same bytes.
std::vector<char> core_pass(const Model& m, Cache& c, const std::vector<char>& x, int64_t T, int threads) {
  mtp::DecoderArgs a;
  a.B = c.B();
  a.T = T;
  a.H = m.d.H;
  a.Hq = m.d.Hq;
  a.Hkv = m.d.Hkv;
  a.D = m.d.D;
  a.I = m.d.I;
  a.layers = m.nlayers();
  a.L = m.d.L;
  a.P = m.d.P;
  a.dtype = m.t;
  a.x = x.data();
  a.rope_cos = m.cos.data();
  a.rope_sin = m.sin.data();
  a.k_cache = c.k.data();
  a.v_cache = c.v.data();
  const int64_t strides[5] = {c.B() * m.d.Hkv * m.d.L * m.d.D, m.d.Hkv * m.d.L * m.d.D, m.d.L * m.d.D, m.d.D, 1};
  std::copy_n(strides, 5, a.k_stride);
  std::copy_n(strides, 5, a.v_stride);
  a.cache_lens = c.lens.data();
  a.layer = m.layers.data();
  a.final_norm = m.norms.back().data();
  a.eps = 1e-5f;
  std::vector<char> out(x.size());
  a.out = out.data();
  mtp::decoder_layers(a, threads, mtp::current_isa(), mtp::ThreadParallelFor{threads});
  return out;
}

bool all_finite(const std::vector<char>& v, DType t) {
  for (int64_t i = 0; i < int64_t(v.size()) / mtp::dtype_size(t); ++i)
    if (!std::isfinite(mtp::load_f32(v.data(), t, i))) return false;
  return true;
}

void check_decoder(const char* what, Dims d, DType t, const std::vector<DType>& types) {
  Model m(d, t, types);
  const int64_t B = 2, P0 = 5, T = 3, es = mtp::dtype_size(t), row = d.H * es;
  // Prefill (ragged: request 0 keeps 2 of its 5 positions).
  Cache base(m, {0, 0});
  const std::vector<char> prompt = values(t, B * P0 * d.H, 1.f), next = values(t, B * T * d.H, 1.f);
  std::vector<char> pre(prompt.size());
  EXPECT(capi_pass(m, base, prompt, P0, pre, 2) == MTP_OK, "%s prefill: %s", what, mtp_last_error());
  EXPECT(all_finite(pre, t), "%s: the prefill's output is not finite", what);
  base.lens = {2, 5};

  // (a) one T = 3 pass: the core's bits.
  Cache batched = base, core = base;
  std::vector<char> out(next.size());
  EXPECT(capi_pass(m, batched, next, T, out, 2) == MTP_OK, "%s T=3: %s", what, mtp_last_error());
  EXPECT(all_finite(out, t), "%s: the output is not finite", what);
  EXPECT(core_pass(m, core, next, T, 1) == out && core.k == batched.k && core.v == batched.v,
         "%s: mtp_decoder_layers != the core's pass", what);

  // (b) three T = 1 passes, one thread: each token's bits, and the same cache.
  Cache steps = base;
  for (int64_t j = 0; j < T; ++j) {
    std::vector<char> x1(size_t(B * row)), o1(x1.size());
    for (int64_t b = 0; b < B; ++b) std::memcpy(x1.data() + b * row, next.data() + (b * T + j) * row, size_t(row));
    EXPECT(capi_pass(m, steps, x1, 1, o1, 1) == MTP_OK, "%s T=1: %s", what, mtp_last_error());
    for (int64_t b = 0; b < B; ++b)
      EXPECT(std::memcmp(o1.data() + b * row, out.data() + (b * T + j) * row, size_t(row)) == 0,
             "%s: request %lld token %lld: the T=3 pass != a T=1 pass", what, (long long)b, (long long)j);
    for (auto& n : steps.lens) ++n;
  }
  EXPECT(steps.k == batched.k && steps.v == batched.v, "%s: the caches of T=3 and 3 x T=1 differ", what);

  // mtp_decoder_layers_tree with a chain for a tree: the chain's bits.
  Cache tree = base;
  const int64_t chain[B * T] = {-1, 0, 1, -1, 0, 1};
  std::vector<char> tout(next.size());
  EXPECT(capi_pass(m, tree, next, T, tout, 2, chain) == MTP_OK, "%s tree: %s", what, mtp_last_error());
  EXPECT(tout == out && tree.k == batched.k, "%s: mtp_decoder_layers_tree of a chain != the chain", what);

  // The x8 layout of the matrices that have one: the same prefill, pass, caches and tree.
  if (!m.to_x8()) return;
  Cache base8(m, {0, 0});
  std::vector<char> pre8(prompt.size());
  EXPECT(capi_pass(m, base8, prompt, P0, pre8, 2) == MTP_OK, "%s x8 prefill: %s", what, mtp_last_error());
  EXPECT(pre8 == pre && base8.k == base.k && base8.v == base.v, "%s: the x8 prefill != the file layout's", what);
  base8.lens = base.lens;
  Cache batched8 = base8, tree8 = base8;
  std::vector<char> out8(next.size()), tout8(next.size());
  EXPECT(capi_pass(m, batched8, next, T, out8, 3) == MTP_OK, "%s x8 T=3: %s", what, mtp_last_error());
  EXPECT(out8 == out && batched8.k == batched.k && batched8.v == batched.v, "%s: the x8 pass != the file layout's",
         what);
  EXPECT(capi_pass(m, tree8, next, T, tout8, 1, chain) == MTP_OK, "%s x8 tree: %s", what, mtp_last_error());
  EXPECT(tout8 == out && tree8.k == batched.k, "%s: the x8 tree pass != the file layout's", what);
}

// ---------------------------------------------------------------- the head

struct Head {
  Dims d;
  DType t;
  int64_t B = 2, V = 50, Vd = 24, K = 3;
  Mat embedding, proj;
  Model block;  // one block: its 4 matrices and 2 norms (its final norm: the head's out_norm)
  std::vector<char> embed_norm, hidden_norm, hidden, kc, vc;
  std::vector<float> dequantized;  // the embedding's rows in fp32
  std::vector<int64_t> token = {7, 31}, lens = {3, 6}, vocab;
  std::vector<mtp_tensor> w;
  std::vector<const mtp_tensor*> wp;
  bool all_vocab = false;        // run with draft_vocab NULL (every row of lm_head)
  const Mat* lm_rows = nullptr;  // lm_head as the draft vocabulary's rows [Vd, H] (else the embedding)
  Head(Dims d_, DType t_, DType emb, DType proj_t, const std::vector<DType>& types, int64_t V_ = 50)
      : d(d_),
        t(t_),
        V(V_),
        embedding(emb, V, d.H),
        proj(proj_t, d.H, 2 * d.H),
        block(d, t, types),
        embed_norm(values(t, d.H, 0.25f, 1.f)),
        hidden_norm(values(t, d.H, 0.25f, 1.f)),
        hidden(values(t, B * d.H, 1.f)),
        kc(values(t, B * d.Hkv * d.L * d.D, 1.f)),
        vc(values(t, B * d.Hkv * d.L * d.D, 1.f)) {
    dequantized.resize(size_t(V * d.H));
    for (int64_t v = 0; v < V; ++v)
      if (mtp::is_block_type(emb))
        mtp::dequantize_row(emb, embedding.bytes.data(), embedding.stride, v, d.H, dequantized.data() + v * d.H);
      else
        for (int64_t k = 0; k < d.H; ++k)
          dequantized[size_t(v * d.H + k)] = mtp::load_f32(embedding.data(), emb, v * d.H + k);
    for (int64_t i = 0; i < Vd; ++i) vocab.push_back((i * 7 + 3) % V);
    build();
  }
  void build() {
    w = {view(embed_norm.data(), t, {d.H}), view(hidden_norm.data(), t, {d.H}), proj.view()};
    w.insert(w.end(), block.w.begin(), block.w.end());  // 6 tensors, then the final norm: out_norm
    wp.clear();
    for (auto& v : w) wp.push_back(&v);
  }
  // The embedding (= lm_head), proj and the block's matrices that have an x8 layout into it.
  bool to_x8() {
    bool any = embedding.to_x8();
    any |= proj.to_x8();
    any |= block.to_x8();
    build();
    return any;
  }
  // The drafts [B, K + alternatives] (int64) of the embedding `emb` (lm_head: the embedding).
  mtp_status run(const mtp_tensor& emb, int64_t alternatives, std::vector<int64_t>* drafts) const {
    const mtp_tensor hv = view(hidden.data(), t, {B, d.H}), kv = view(kc.data(), t, {B, d.Hkv, d.L, d.D}),
                     vv = view(vc.data(), t, {B, d.Hkv, d.L, d.D}), cv = view(block.cos.data(), DType::F32, {d.P, d.D}),
                     sv = view(block.sin.data(), DType::F32, {d.P, d.D}),
                     lm = lm_rows ? lm_rows->view() : embedding.view();
    mtp_tensor tv = view(token.data(), DType::F32, {B}), lv = view(lens.data(), DType::F32, {B}),
               vocv = view(vocab.data(), DType::F32, {Vd}),
               dv = view(drafts->data(), DType::F32, {B, K + alternatives});
    tv.dtype = lv.dtype = vocv.dtype = dv.dtype = MTP_INT64;
    const mtp_tensor* voc = all_vocab ? nullptr : &vocv;
    if (alternatives)
      return mtp_head_draft_alternatives(&hv, &tv, &kv, &vv, &lv, &cv, &sv, &emb, nullptr, wp.data(),
                                         int32_t(wp.size()), &lm, nullptr, voc, K, d.Hq, 1e-5f, alternatives, &dv, 2);
    return mtp_head_draft(&hv, &tv, &kv, &vv, &lv, &cv, &sv, &emb, nullptr, wp.data(), int32_t(wp.size()), &lm, nullptr,
                          voc, K, d.Hq, 1e-5f, &dv, 2);
  }
};

void check_head(const char* what, Dims d, DType t, DType emb, DType proj, const std::vector<DType>& types,
                int64_t V = 50) {
  Head h(d, t, emb, proj, types, V);
  std::vector<int64_t> drafts(size_t(h.B * h.K), -1), floats(drafts.size(), -2);
  EXPECT(h.run(h.embedding.view(), 0, &drafts) == MTP_OK, "%s: %s", what, mtp_last_error());
  for (int64_t v : drafts)
    EXPECT(std::find(h.vocab.begin(), h.vocab.end(), v) != h.vocab.end(), "%s: draft %lld not in the draft vocabulary",
           what, (long long)v);
  // The embedding as its fp32 dequantized rows: the same drafts (a row is rounded once either way).
  const mtp_tensor f32 = view(h.dequantized.data(), DType::F32, {h.V, d.H});
  EXPECT(h.run(f32, 0, &floats) == MTP_OK, "%s fp32 embedding: %s", what, mtp_last_error());
  EXPECT(drafts == floats, "%s: drafts with the %s embedding != with its dequantized fp32 rows", what, tname(emb));
  std::vector<int64_t> alt(size_t(h.B * (h.K + 2)), -1);
  EXPECT(h.run(h.embedding.view(), 2, &alt) == MTP_OK, "%s alternatives: %s", what, mtp_last_error());
  for (int64_t b = 0; b < h.B; ++b)
    EXPECT(std::equal(drafts.begin() + b * h.K, drafts.begin() + (b + 1) * h.K, alt.begin() + b * (h.K + 2)),
           "%s: request %lld: the chain changed with alternatives", what, (long long)b);
  // Every row of lm_head (no draft vocabulary).
  std::vector<int64_t> full(drafts.size(), -3);
  h.all_vocab = true;
  EXPECT(h.run(h.embedding.view(), 0, &full) == MTP_OK, "%s full vocabulary: %s", what, mtp_last_error());
  h.all_vocab = false;
  // lm_head given as the draft vocabulary's rows, gathered once by the caller: the same drafts
  // (in the x8 layout too, below: Vd is whole groups of 8).
  Mat rows = h.embedding.gathered(h.vocab);
  auto check_rows = [&](const char* layout) {
    std::vector<int64_t> got(drafts.size(), -4), got_alt(alt.size(), -4);
    h.lm_rows = &rows;
    EXPECT(h.run(h.embedding.view(), 0, &got) == MTP_OK && h.run(h.embedding.view(), 2, &got_alt) == MTP_OK,
           "%s %s lm_head rows: %s", what, layout, mtp_last_error());
    h.lm_rows = nullptr;
    EXPECT(got == drafts && got_alt == alt, "%s: drafts with the %s draft vocabulary's rows != through draft_vocab",
           what, layout);
  };
  check_rows("file layout");

  // The x8 layout of the matrices that have one (the embedding's rows gathered by token, the
  // draft vocabulary's lm_head rows, all of them): the same drafts.
  if (!h.to_x8()) return;
  std::vector<int64_t> drafts8(drafts.size(), -1), alt8(alt.size(), -1), full8(full.size(), -1);
  EXPECT(h.run(h.embedding.view(), 0, &drafts8) == MTP_OK, "%s x8: %s", what, mtp_last_error());
  EXPECT(h.run(h.embedding.view(), 2, &alt8) == MTP_OK, "%s x8 alternatives: %s", what, mtp_last_error());
  h.all_vocab = true;
  EXPECT(h.run(h.embedding.view(), 0, &full8) == MTP_OK, "%s x8 full vocabulary: %s", what, mtp_last_error());
  EXPECT(drafts8 == drafts && alt8 == alt && full8 == full, "%s: the x8 layout's drafts != the file layout's", what);
  h.all_vocab = false;
  if (rows.to_x8()) check_rows("x8");
}

// ---------------------------------------------------------------- mtp_embedding

// mtp_embedding of a table of file type t [V, H] (rows `pad` bytes apart beyond their size):
// each row dequantize_row's fp32 values rounded once to out's dtype, for fp32 and bf16 out,
// int32 and int64 ids, contiguous and strided views (ids 2 apart, out's rows padded and their
// elements 2 apart); its x8 layout (V whole groups of 8) the same bytes.
void check_embedding(DType t, int64_t V, int64_t H, int64_t pad) {
  const Mat file(t, V, H, pad);
  Mat x8 = file;
  const bool has_x8 = x8.to_x8();
  const std::vector<int64_t> ids = {3 % V, 0, V - 1, 3 % V, V / 2};
  const int64_t n = int64_t(ids.size());
  std::vector<float> row(static_cast<size_t>(H));
  for (DType ot : {DType::F32, DType::BF16})
    for (mtp_dtype it : {MTP_INT32, MTP_INT64})
      for (int64_t step : {1, 2}) {
        char what[128];
        std::snprintf(what, sizeof what, "mtp_embedding %s [%lld, %lld] pad %lld out %s ids %s step %lld", tname(t),
                      (long long)V, (long long)H, (long long)pad, tname(ot), it == MTP_INT32 ? "int32" : "int64",
                      (long long)step);
        const int64_t es = mtp::dtype_size(ot), stride = H * step + 5;
        std::vector<char> want(size_t(n * stride * es), char(0x5A)), out = want, out8 = want;
        std::vector<int64_t> ids64(size_t(n * step), -1);
        std::vector<int32_t> ids32(ids64.size(), -1);
        for (int64_t i = 0; i < n; ++i) {
          const int64_t id = ids[size_t(i)];
          ids64[size_t(i * step)] = id, ids32[size_t(i * step)] = int32_t(id);
          mtp::dequantize_row(t, file.bytes.data(), file.stride, id, H, row.data());
          for (int64_t k = 0; k < H; ++k) mtp::store_f32(want.data(), ot, i * stride + k * step, row[size_t(k)]);
        }
        mtp_tensor tv = mtp_contiguous(it == MTP_INT32 ? static_cast<void*>(ids32.data()) : ids64.data(), it, 1, &n),
                   ov = view(out.data(), ot, {n, H});
        tv.strides[0] = step;
        ov.strides[0] = stride, ov.strides[1] = step;
        const mtp_tensor wv = file.view();
        EXPECT(mtp_embedding(&tv, &wv, nullptr, &ov) == MTP_OK, "%s: %s", what, mtp_last_error());
        EXPECT(out == want, "%s: rows != dequantize_row's rounded once", what);
        if (!has_x8) continue;
        const mtp_tensor wv8 = x8.view();
        ov.data = out8.data();
        EXPECT(mtp_embedding(&tv, &wv8, nullptr, &ov) == MTP_OK, "%s %s: %s", what, tname(x8.t), mtp_last_error());
        EXPECT(out8 == want, "%s: the %s table's rows != the file layout's", what, tname(x8.t));
      }
}

}  // namespace

void test_gguf_capi() {
  check_linear_all();
  for (DType t : kBlockTypes) {
    const int64_t e = mtp::block_elems(t);
    check_embedding(t, 16, 2 * e, 0);  // the x8 layout too
    check_embedding(t, 5, e, 6);       // rows padded apart
    check_embedding(t, 1, 3 * e, 0);
  }
  using D = DType;
  const Dims small{64, 4, 2, 16, 96, 16, 16}, wide{256, 4, 2, 64, 256, 16, 16};
  for (DType t : {DType::F32, DType::BF16}) {
    check_decoder(t == D::F32 ? "decoder Q4_1 f32" : "decoder Q4_1 bf16", small, t,
                  {D::Q4_1, D::Q4_1, D::Q4_1, D::Q4_1, D::Q4_1, D::Q4_1, D::Q4_1, D::Q4_1});
    check_decoder(t == D::F32 ? "decoder mixed f32" : "decoder mixed bf16", wide, t,
                  {D::Q4_K, D::Q6_K, D::Q4_1, D::Q8_0, D::Q4_0, t, D::Q6_K, D::Q4_K});
    // per layer qkv, o, gate_up, down: Q5_0 beside the K-quants, as in Gemma 3's Q4_K_M file
    check_decoder(t == D::F32 ? "decoder Q5_0 mix f32" : "decoder Q5_0 mix bf16", wide, t,
                  {D::Q5_0, D::Q4_K, D::Q5_0, D::Q6_K, D::Q5_0, D::Q8_0, D::Q5_0, D::Q4_K});
    check_head(t == D::F32 ? "head Q8_0 f32" : "head Q8_0 bf16", small, t, D::Q8_0, t,
               {D::Q4_1, D::Q8_0, D::Q4_0, D::Q4_1});
    check_head(t == D::F32 ? "head K-quants f32" : "head K-quants bf16", wide, t, D::Q8_0, D::Q4_K,
               {D::Q4_K, D::Q6_K, D::Q4_K, D::Q6_K});
    check_head(t == D::F32 ? "head Q6_K embedding f32" : "head Q6_K embedding bf16", wide, t, D::Q6_K, t,
               {D::Q4_0, D::Q4_1, D::Q8_0, D::Q4_K});
    // V = 64: the embedding / lm_head in the x8 layout too.
    check_head(t == D::F32 ? "head Q4_0 x8 f32" : "head Q4_0 x8 bf16", small, t, D::Q4_0, D::Q8_0,
               {D::Q4_1, D::Q8_0, D::Q4_0, D::Q4_1}, 64);
    check_head(t == D::F32 ? "head Q8_0 x8 f32" : "head Q8_0 x8 bf16", wide, t, D::Q8_0, D::Q4_1,
               {D::Q4_K, D::Q4_0, D::Q8_0, D::Q6_K}, 64);
  }
}

// ---------------------------------------------------------------- bad input

namespace {

// mtp_embedding(tokens [3] int32, weight Q8_0 [16, 64], out [3, 64] f32), valid until mutated
// (x8: the weight in Q8_0_X8).
struct EmbeddingCall {
  std::vector<uint8_t> ws = random_blocks(DType::Q8_0, 16, 64);
  std::vector<int32_t> ids = {2, 15, 0};
  std::vector<float> os = std::vector<float>(3 * 64, -3.f), scale = std::vector<float>(16 * 2, 1.f);
  mtp_tensor tokens = view(ids.data(), DType::F32, {3}), w = mtp_gguf_matrix(ws.data(), MTP_Q8_0, 16, 64),
             out = view(os.data(), DType::F32, {3, 64}), sc = view(scale.data(), DType::F32, {16, 2});
  const mtp_tensor* weight_scale = nullptr;
  bool x8 = false;
  EmbeddingCall() { tokens.dtype = MTP_INT32; }
  EmbeddingCall(const EmbeddingCall&) = delete;  // the views point into this object
  mtp_status run() {
    std::vector<uint8_t> w8(ws.size());
    mtp_tensor wv = w;
    if (x8) {
      mtp_gguf_repack_x8(MTP_Q8_0, ws.data(), 16, 64, w8.data());
      wv.data = w8.data(), wv.dtype = MTP_Q8_0_X8;
    }
    return mtp_embedding(&tokens, &wv, weight_scale, &out);
  }
  bool untouched() const {
    return std::all_of(os.begin(), os.end(), [](float v) { return v == -3.f; });
  }
};

// mtp_linear(x [2, 64] f32, weight Q4_0 [4, 64], y [2, 4] f32), valid until mutated.
struct LinearCall {
  std::vector<float> xs = std::vector<float>(2 * 64, 0.5f), ys = std::vector<float>(8, -3.f),
                     bs = std::vector<float>(4, 1.f);
  std::vector<uint8_t> ws = random_blocks(DType::Q4_0, 4, 64);
  mtp_tensor x = view(xs.data(), DType::F32, {2, 64}), w = mtp_gguf_matrix(ws.data(), MTP_Q4_0, 4, 64),
             y = view(ys.data(), DType::F32, {2, 4}), b = view(bs.data(), DType::F32, {4});
  const mtp_tensor* bias = nullptr;
  int q8 = 0;  // 1: mtp_linear_q8, 2: mtp_linear_q8dot
  mtp_status run() const {
    if (q8 == 1) return mtp_linear_q8(&x, &w, nullptr, bias, &y, 1);
    if (q8 == 2) return mtp_linear_q8dot(&x, &w, nullptr, bias, &y, 1);
    return mtp_linear(&x, &w, bias, &y, 1);
  }
  bool untouched() const {
    return std::all_of(ys.begin(), ys.end(), [](float v) { return v == -3.f; });
  }
};

// LinearCall with a Q4_0_X8 weight [8, 64] (mtp_gguf_repack_x8 of Q4_0 rows) and y [2, 8].
struct LinearX8Call : LinearCall {
  LinearX8Call() {
    ys.assign(16, -3.f);
    bs.assign(8, 1.f);
    const std::vector<uint8_t> file = random_blocks(DType::Q4_0, 8, 64);
    ws.assign(file.size(), 0);
    mtp_gguf_repack_x8(MTP_Q4_0, file.data(), 8, 64, ws.data());
    w = mtp_gguf_matrix(ws.data(), MTP_Q4_0_X8, 8, 64);
    y = view(ys.data(), DType::F32, {2, 8});
    b = view(bs.data(), DType::F32, {8});
  }
};

// mtp_gguf_repack_x8(Q4_0, src [8, 64] (288 bytes), dst), valid until mutated.
struct RepackCall {
  std::vector<uint8_t> s = random_blocks(DType::Q4_0, 8, 64), d = std::vector<uint8_t>(288, 0x77), s0 = s;
  int32_t dtype = MTP_Q4_0;
  int64_t rows = 8, cols = 64;
  const void* src = s.data();
  void* dst = d.data();
  mtp_status run() const { return mtp_gguf_repack_x8(dtype, src, rows, cols, dst); }
  bool untouched() const {
    return s == s0 && std::all_of(d.begin(), d.end(), [](uint8_t v) { return v == 0x77; });
  }
};

// mtp_decoder_layers(_tree) of one Q4_1 layer (H 64, Hq D 64, I 96), B = 1, T = 1.
struct DecoderCall {
  Model m{Dims{64, 4, 2, 16, 96, 8, 8}, DType::F32, {DType::Q4_1, DType::Q4_1, DType::Q4_1, DType::Q4_1}};
  std::vector<mtp_tensor> w = m.w;
  std::vector<const mtp_tensor*> wp, sp;
  std::vector<char> xs = values(DType::F32, 64, 1.f), os = std::vector<char>(64 * 4, char(0x11));
  std::vector<char> kc = std::vector<char>(size_t(2 * 8 * 16 * 4), char(0x22)), vc = kc;
  std::vector<int64_t> lens = {2}, parents = {-1};
  std::vector<float> scale = std::vector<float>(64 * 2, 1.f);
  mtp_tensor x = view(xs.data(), DType::F32, {1, 1, 64}), out = view(os.data(), DType::F32, {1, 1, 64}),
             k = view(kc.data(), DType::F32, {1, 1, 2, 8, 16}), v = view(vc.data(), DType::F32, {1, 1, 2, 8, 16}),
             cos = view(m.cos.data(), DType::F32, {8, 16}), sin = view(m.sin.data(), DType::F32, {8, 16}),
             lv = view(lens.data(), DType::F32, {1}), tree = view(parents.data(), DType::F32, {1, 1}),
             sc = view(scale.data(), DType::F32, {64, 2});
  bool with_tree = false;
  int32_t quantize_x = 0;
  DecoderCall() {
    lv.dtype = tree.dtype = MTP_INT64;
    for (auto& t : w) wp.push_back(&t);
  }
  mtp_status run() const {
    if (with_tree)
      return mtp_decoder_layers_tree(&x, &k, &v, &lv, &cos, &sin, wp.data(), int32_t(wp.size()), sp.data(),
                                     int32_t(sp.size()), 4, 1e-5f, quantize_x, &tree, &out, 1);
    return mtp_decoder_layers(&x, &k, &v, &lv, &cos, &sin, wp.data(), int32_t(wp.size()), sp.data(), int32_t(sp.size()),
                              4, 1e-5f, quantize_x, &out, 1);
  }
  bool untouched() const {
    return std::all_of(os.begin(), os.end(), [](char c) { return c == char(0x11); }) &&
           std::all_of(kc.begin(), kc.end(), [](char c) { return c == char(0x22); }) && vc == kc;
  }
};

// mtp_head_draft with a Q8_0 embedding / lm_head and Q4_1 matrices (H 64).
struct HeadCall {
  Head h{Dims{64, 4, 2, 16, 96, 16, 16},
         DType::F32,
         DType::Q8_0,
         DType::Q4_1,
         {DType::Q4_1, DType::Q4_1, DType::Q4_1, DType::Q4_1}};
  std::vector<mtp_tensor> w = h.w;
  std::vector<const mtp_tensor*> wp;
  std::vector<int64_t> drafts = std::vector<int64_t>(size_t(2 * 3), -7);
  std::vector<float> scale = std::vector<float>(50 * 2, 1.f);
  mtp_tensor emb = h.embedding.view(), lm = h.embedding.view(), sc = view(scale.data(), DType::F32, {50, 2});
  const mtp_tensor *emb_scale = nullptr, *lm_scale = nullptr, *voc = nullptr;
  mtp_tensor vocab = view(h.vocab.data(), DType::F32, {h.Vd});
  HeadCall() {
    for (auto& t : w) wp.push_back(&t);
    vocab.dtype = MTP_INT64;
  }
  mtp_status run() const {
    const Dims& d = h.d;
    const mtp_tensor hv = view(h.hidden.data(), h.t, {h.B, d.H}), kv = view(h.kc.data(), h.t, {h.B, d.Hkv, d.L, d.D}),
                     vv = view(h.vc.data(), h.t, {h.B, d.Hkv, d.L, d.D}),
                     cv = view(h.block.cos.data(), DType::F32, {d.P, d.D}),
                     sv = view(h.block.sin.data(), DType::F32, {d.P, d.D});
    mtp_tensor tv = view(h.token.data(), DType::F32, {h.B}), lv = view(h.lens.data(), DType::F32, {h.B}),
               dv = view(drafts.data(), DType::F32, {h.B, h.K});
    tv.dtype = lv.dtype = dv.dtype = MTP_INT64;
    return mtp_head_draft(&hv, &tv, &kv, &vv, &lv, &cv, &sv, &emb, emb_scale, wp.data(), int32_t(wp.size()), &lm,
                          lm_scale, voc, h.K, d.Hq, 1e-5f, &dv, 1);
  }
  bool untouched() const {
    return std::all_of(drafts.begin(), drafts.end(), [](int64_t v) { return v == -7; });
  }
};

}  // namespace

void test_gguf_capi_errors() {
  constexpr auto INVALID = MTP_ERROR_INVALID_ARGUMENT;
  constexpr auto DTYPE = MTP_ERROR_UNSUPPORTED_DTYPE;
  // The valid calls run (else every error case below would prove nothing).
  {
    LinearCall c;
    EXPECT(c.run() == MTP_OK && !c.untouched(), "valid mtp_linear call: %s", mtp_last_error());
    DecoderCall d;
    EXPECT(d.run() == MTP_OK && !d.untouched(), "valid mtp_decoder_layers call: %s", mtp_last_error());
    d.with_tree = true;
    EXPECT(d.run() == MTP_OK, "valid mtp_decoder_layers_tree call: %s", mtp_last_error());
    HeadCall h;
    EXPECT(h.run() == MTP_OK && !h.untouched(), "valid mtp_head_draft call: %s", mtp_last_error());
    LinearX8Call x8;
    EXPECT(x8.run() == MTP_OK && !x8.untouched(), "valid mtp_linear call (Q4_0_X8): %s", mtp_last_error());
    RepackCall r;
    EXPECT(r.run() == MTP_OK && !r.untouched(), "valid mtp_gguf_repack_x8 call: %s", mtp_last_error());
    EmbeddingCall e, e8;
    std::copy(e.ws.begin(), e.ws.end(), e8.ws.begin());
    e8.x8 = true;
    EXPECT(e.run() == MTP_OK && !e.untouched() && e8.run() == MTP_OK && e8.os == e.os,
           "valid mtp_embedding calls (Q8_0, Q8_0_X8): %s", mtp_last_error());
    // Nothing to repack: fine, NULL pointers included.
    EXPECT(mtp_gguf_repack_x8(MTP_Q8_0, nullptr, 0, 64, nullptr) == MTP_OK &&
               mtp_gguf_repack_x8(MTP_Q4_1, nullptr, 8, 0, nullptr) == MTP_OK,
           "mtp_gguf_repack_x8 of an empty matrix: %s", mtp_last_error());
  }
  // mtp_gguf_matrix: packed rows.
  {
    const mtp_tensor q4k = mtp_gguf_matrix(nullptr, MTP_Q4_K, 3, 512), bad = mtp_gguf_matrix(nullptr, MTP_Q6_K, 3, 100),
                     f = mtp_gguf_matrix(nullptr, MTP_BFLOAT16, 3, 100);
    EXPECT(q4k.ndim == 2 && q4k.sizes[0] == 3 && q4k.sizes[1] == 512 && q4k.strides[0] == 288 && q4k.strides[1] == 1,
           "mtp_gguf_matrix Q4_K [3, 512]: strides [%lld, %lld]", (long long)q4k.strides[0], (long long)q4k.strides[1]);
    EXPECT(bad.strides[0] == 0 && f.strides[0] == 100 && f.strides[1] == 1, "mtp_gguf_matrix: other strides");
    // The x8 layouts: their file type's row bytes.
    const mtp_tensor a = mtp_gguf_matrix(nullptr, MTP_Q4_0_X8, 8, 64),
                     b = mtp_gguf_matrix(nullptr, MTP_Q4_1_X8, 16, 96),
                     q8 = mtp_gguf_matrix(nullptr, MTP_Q8_0_X8, 8, 64),
                     odd = mtp_gguf_matrix(nullptr, MTP_Q8_0_X8, 8, 48);
    EXPECT(a.strides[0] == 36 && b.strides[0] == 60 && q8.strides[0] == 68 && odd.strides[0] == 0 &&
               a.strides[1] == 1 && a.sizes[0] == 8 && b.sizes[1] == 96 && a.dtype == MTP_Q4_0_X8,
           "mtp_gguf_matrix x8: strides %lld %lld %lld %lld", (long long)a.strides[0], (long long)b.strides[0],
           (long long)q8.strides[0], (long long)odd.strides[0]);
  }

  // mtp_gguf_repack_x8
  BAD_CALL(RepackCall, c.dtype = MTP_Q5_0, DTYPE,
           "mtp_gguf_repack_x8: dtype must be the file's type of a matrix with an x8 layout: Q4_0 or Q4_1 or Q8_0 or "
           "Q4_K or Q6_K, got Q5_0 (dtype value 106): no x8 layout");
  BAD_CALL(RepackCall, c.dtype = MTP_Q6_K_X8, DTYPE, "got Q6_K_X8 (dtype value 214): already the x8 layout");
  BAD_CALL(RepackCall, c.dtype = MTP_Q4_0_X8, DTYPE,
           "Q4_K or Q6_K, got Q4_0_X8 (dtype value 202): already the x8 layout");
  BAD_CALL(RepackCall, c.dtype = MTP_FLOAT32, DTYPE, "Q4_K or Q6_K, got float32 (dtype value 0)");
  BAD_CALL(RepackCall, c.dtype = 104, DTYPE, "Q4_K or Q6_K, got unknown (dtype value 104)");
  BAD_CALL(RepackCall, (c.dtype = MTP_Q4_K, c.cols = 64), INVALID,
           "cols must be >= 0 and a multiple of Q4_K's blocks of 256 elements, got 64");
  BAD_CALL(RepackCall, c.dtype = -1, DTYPE, "got unknown (dtype value -1)");
  BAD_CALL(RepackCall, c.rows = 12, INVALID,
           "mtp_gguf_repack_x8: rows must be >= 0 and a multiple of 8 (the x8 layout interleaves groups of 8 rows), "
           "got 12");
  BAD_CALL(RepackCall, c.rows = 4, INVALID, "rows must be >= 0 and a multiple of 8");
  BAD_CALL(RepackCall, c.rows = -8, INVALID,
           "rows must be >= 0 and a multiple of 8 (the x8 layout interleaves groups "
           "of 8 rows), got -8");
  BAD_CALL(RepackCall, c.cols = 48, INVALID,
           "mtp_gguf_repack_x8: cols must be >= 0 and a multiple of Q4_0's blocks of 32 elements, got 48");
  BAD_CALL(RepackCall, (c.dtype = MTP_Q8_0, c.cols = 16), INVALID,
           "a multiple of Q8_0's blocks of 32 elements, got 16");
  BAD_CALL(RepackCall, c.cols = -32, INVALID,
           "cols must be >= 0 and a multiple of Q4_0's blocks of 32 elements, got -32");
  BAD_CALL(RepackCall, c.src = nullptr, MTP_ERROR_NULL_POINTER, "mtp_gguf_repack_x8: src is NULL for a [8, 64] matrix");
  BAD_CALL(RepackCall, c.dst = nullptr, MTP_ERROR_NULL_POINTER, "mtp_gguf_repack_x8: dst is NULL for a [8, 64] matrix");
  BAD_CALL(RepackCall, c.dst = c.s.data(), INVALID,
           "mtp_gguf_repack_x8: dst and src overlap in memory (each is rows x 36 = 288 bytes): the repack is not in "
           "place, dst must be another buffer");
  BAD_CALL(RepackCall, c.dst = c.s.data() + 287, INVALID, "dst and src overlap in memory");
  BAD_CALL(RepackCall, c.src = c.d.data() + 100, INVALID, "dst and src overlap in memory");
  BAD_CALL(
      RepackCall, c.rows = INT64_MAX - 7, INVALID,
      "mtp_gguf_repack_x8: a [rows, cols] = [9223372036854775800, 64] Q4_0 matrix has more bytes than int64 counts");
  BAD_CALL(RepackCall, c.cols = INT64_MAX / 32 * 32, INVALID,
           "a [rows, cols] = [8, 9223372036854775776] Q4_0 matrix has more bytes than int64 counts");
  BAD_CALL(RepackCall, (c.rows = 8, c.cols = INT64_MAX / 64 * 32), INVALID,  // row bytes fit, rows x them do not
           "Q4_0 matrix has more bytes than int64 counts");
  BAD_CALL(RepackCall, c.src = reinterpret_cast<const void*>(UINTPTR_MAX - 100), INVALID,
           "mtp_gguf_repack_x8: src or dst: 288 bytes from there run past the end of the address space");

  // mtp_linear
  BAD_CALL(LinearCall, c.w.sizes[1] = c.x.sizes[1] = 48, INVALID,
           "mtp_linear: weight: K = 48 is not a multiple of Q4_0's blocks of 32 elements");
  BAD_CALL(LinearCall, c.w.dtype = MTP_Q4_K, INVALID,
           "weight: K = 64 is not a multiple of Q4_K's blocks of 256 elements");
  BAD_CALL(LinearCall, c.w.dtype = MTP_Q6_K, INVALID, "K = 64 is not a multiple of Q6_K's blocks of 256 elements");
  BAD_CALL(LinearCall, c.w.strides[1] = 2, INVALID,
           "weight: weight bytes must be contiguous along a row (stride 1), got strides [36, 2]");
  BAD_CALL(LinearCall, c.w.strides[0] = 18, INVALID,
           "weight: a Q4_0 row of K = 64 elements is 36 bytes, so strides[0] (bytes between rows, for a block dtype) "
           "must be >= 36, got 18");
  BAD_CALL(LinearCall, (c.w.dtype = MTP_Q8_0, c.w.strides[0] = 64), INVALID,  // element strides where bytes are due
           "a Q8_0 row of K = 64 elements is 68 bytes, so strides[0] (bytes between rows, for a block dtype) must be "
           ">= 68, got 64");
  BAD_CALL(LinearCall, c.w.strides[0] = INT64_MAX / 2, INVALID,
           "weight of sizes [4, 64] has an extent beyond int64 bytes");
  BAD_CALL(LinearCall, c.w.data = nullptr, MTP_ERROR_NULL_POINTER, "mtp_linear: weight.data is NULL");
  BAD_CALL(LinearCall, c.w.dtype = 107, DTYPE,
           "weight must be float32 or bfloat16 or float16 or Q4_0 or Q4_1 or Q5_0 or Q8_0 or Q4_K or Q6_K or Q4_0_X8 "
           "or Q4_1_X8 or Q8_0_X8 or Q4_K_X8 or Q6_K_X8, got unknown (dtype value 107)");
  BAD_CALL(LinearCall, c.w.dtype = 204, DTYPE, "Q6_K_X8, got unknown (dtype value 204)");
  BAD_CALL(LinearCall, c.w.dtype = 104, DTYPE, "got unknown (dtype value 104)");
  BAD_CALL(LinearCall, c.w.sizes[1] = 32, INVALID, "weight.sizes[1] must equal K (x.sizes[1]) = 64");
  BAD_CALL(LinearCall, c.w.ndim = 3, INVALID, "weight must be 2-D [N, K]");
  BAD_CALL(LinearCall, c.q8 = 1, DTYPE,
           "mtp_linear_q8: weight is Q4_0, a GGUF block type with its own scales: call mtp_linear (no weight_scale)");
  BAD_CALL(LinearCall, c.q8 = 2, DTYPE, "mtp_linear_q8dot: weight is Q4_0, a GGUF block type");
  BAD_CALL(LinearCall, c.x.dtype = MTP_Q8_0, DTYPE, "x must be float32 or bfloat16 or float16, got Q8_0");
  BAD_CALL(LinearCall, c.y.dtype = MTP_Q4_0, DTYPE, "y must be float32, got Q4_0");
  BAD_CALL(LinearCall, (c.b.dtype = MTP_Q4_1, c.bias = &c.b), DTYPE,
           "bias must be float32 or bfloat16 or float16, got Q4_1");
  // x8 weights: whole groups of 8 contiguous rows.
  BAD_CALL(LinearCall, c.w.dtype = MTP_Q4_0_X8, INVALID,
           "mtp_linear: weight: a Q4_0_X8 matrix interleaves groups of 8 rows: N must be a multiple of 8, got 4");
  BAD_CALL(LinearX8Call, (c.w.sizes[0] = 12, c.y.sizes[1] = 12), INVALID,
           "weight: a Q4_0_X8 matrix interleaves groups of 8 rows: N must be a multiple of 8, got 12");
  BAD_CALL(LinearX8Call, c.w.strides[0] = 40, INVALID,
           "mtp_linear: weight: a Q4_0_X8 matrix must be contiguous (rows 36 bytes apart), got strides [40, 1]");
  BAD_CALL(LinearX8Call, c.w.strides[0] = 18, INVALID,
           "weight: a Q4_0_X8 matrix must be contiguous (rows 36 bytes apart), got strides [18, 1]");
  BAD_CALL(LinearX8Call, c.w.strides[1] = 2, INVALID,
           "weight: weight bytes must be contiguous along a row (stride 1), got strides [36, 2]");
  BAD_CALL(LinearX8Call, (c.w.sizes[1] = c.x.sizes[1] = 48), INVALID,
           "weight: K = 48 is not a multiple of Q4_0_X8's blocks of 32 elements");
  BAD_CALL(
      LinearX8Call, c.q8 = 1, DTYPE,
      "mtp_linear_q8: weight is Q4_0_X8, a GGUF block type with its own scales: call mtp_linear (no weight_scale)");
  BAD_CALL(LinearX8Call, c.x.dtype = MTP_Q8_0_X8, DTYPE, "x must be float32 or bfloat16 or float16, got Q8_0_X8");
  BAD_CALL(LinearX8Call, c.y.data = c.ws.data(), INVALID, "mtp_linear: y and weight overlap in memory");

  // mtp_decoder_layers / _tree
  for (bool tree : {false, true}) {
    const char* op = tree ? "mtp_decoder_layers_tree: " : "mtp_decoder_layers: ";
    auto needle = [&](const char* rest) {
      static std::string s;
      s = std::string(op) + rest;
      return s.c_str();
    };
    BAD_CALL(DecoderCall, (c.with_tree = tree, c.w[1].dtype = MTP_Q4_K), INVALID,
             needle("weights[1] (layer 0's qkv): K = 64 is not a multiple of Q4_K's blocks of 256 elements"));
    BAD_CALL(DecoderCall, (c.with_tree = tree, c.w[5].strides[0] = 59), INVALID,
             needle("weights[5] (layer 0's down_proj): a Q4_1 row of K = 96 elements is 60 bytes, so strides[0]"));
    BAD_CALL(DecoderCall, (c.with_tree = tree, c.w[4].strides[1] = 3), INVALID,
             needle("weights[4] (layer 0's gate_up): weight bytes must be contiguous along a row (stride 1)"));
    BAD_CALL(DecoderCall, (c.with_tree = tree, c.w[2].data = nullptr), MTP_ERROR_NULL_POINTER,
             needle("weights[2] (layer 0's o_proj).data is NULL"));
    BAD_CALL(DecoderCall, (c.with_tree = tree, c.w[0].dtype = MTP_Q4_1), DTYPE,
             needle("weights[0] (layer 0's input_norm) must be float32, got Q4_1"));
    BAD_CALL(DecoderCall, (c.with_tree = tree, c.w[1].dtype = 109), DTYPE,
             needle("weights[1] (layer 0's qkv) must be float32 or bfloat16 or int8 or Q4_0 or Q4_1 or Q5_0 or Q8_0 "
                    "or Q4_K or Q6_K or Q4_0_X8 or Q4_1_X8 or Q8_0_X8 or Q4_K_X8 or Q6_K_X8, got unknown (dtype value "
                    "109)"));
    BAD_CALL(DecoderCall, (c.with_tree = tree, c.w[5].dtype = MTP_Q4_1_X8, c.w[5].strides[0] = 64), INVALID,
             needle("weights[5] (layer 0's down_proj): a Q4_1_X8 matrix must be contiguous (rows 60 bytes apart), "
                    "got strides [64, 1]"));
    BAD_CALL(
        DecoderCall, (c.with_tree = tree, c.w[2].dtype = MTP_Q8_0_X8), INVALID,
        needle("weights[2] (layer 0's o_proj): a Q8_0_X8 matrix must be contiguous (rows 68 bytes apart), got strides "
               "[40, 1]"));
    BAD_CALL(DecoderCall, (c.with_tree = tree, c.w[1].dtype = MTP_Q4_1_X8, c.sp.assign(4, &c.sc)), DTYPE,
             needle("weights[1] (layer 0's qkv) is Q4_1_X8 but weight_scales is not empty"));
    BAD_CALL(DecoderCall, (c.with_tree = tree, c.sp.assign(4, &c.sc)), DTYPE,
             needle("weights[1] (layer 0's qkv) is Q4_1 but weight_scales is not empty: with scales the matrix is "
                    "int8 (Q8) (a GGUF block type carries its own scales: give it without)"));
    BAD_CALL(DecoderCall, (c.with_tree = tree, c.quantize_x = 1), INVALID, needle("quantize_x = 1 needs int8 weights"));
    BAD_CALL(DecoderCall, (c.with_tree = tree, c.x.dtype = MTP_Q4_0), DTYPE,
             needle("x must be float32 or bfloat16, got Q4_0"));
  }

  // mtp_embedding
  BAD_CALL(EmbeddingCall, c.w.dtype = MTP_Q4_K, INVALID,
           "mtp_embedding: weight: K = 64 is not a multiple of Q4_K's blocks of 256 elements");
  BAD_CALL(EmbeddingCall, (c.w.sizes[1] = c.out.sizes[1] = 48), INVALID,
           "mtp_embedding: weight: K = 48 is not a multiple of Q8_0's blocks of 32 elements");
  BAD_CALL(EmbeddingCall, c.w.strides[0] = 64, INVALID,  // element strides where bytes are due
           "mtp_embedding: weight: a Q8_0 row of K = 64 elements is 68 bytes, so strides[0] (bytes between rows, for "
           "a block dtype) must be >= 68, got 64");
  BAD_CALL(EmbeddingCall, c.w.strides[1] = 2, INVALID,
           "weight: weight bytes must be contiguous along a row (stride 1), got strides [68, 2]");
  BAD_CALL(EmbeddingCall, c.w.sizes[1] = 32, INVALID, "weight.sizes[1] must equal H (out.sizes[1]) = 64, got 32");
  BAD_CALL(EmbeddingCall, c.w.data = nullptr, MTP_ERROR_NULL_POINTER, "mtp_embedding: weight.data is NULL");
  BAD_CALL(EmbeddingCall, c.w.dtype = 104, DTYPE, "Q6_K_X8, got unknown (dtype value 104)");
  BAD_CALL(EmbeddingCall, c.weight_scale = &c.sc, DTYPE,
           "mtp_embedding: weight is Q8_0 but weight_scale is not empty: with scales the matrix is int8 (Q8) (a GGUF "
           "block type carries its own scales: give it without)");
  BAD_CALL(EmbeddingCall, c.ids[1] = 16, INVALID,
           "mtp_embedding: tokens must hold token ids in [0, V (weight.sizes[0])) = [0, 16), got tokens[1] = 16");
  BAD_CALL(EmbeddingCall, c.out.data = c.ws.data() + 100, INVALID, "mtp_embedding: out and weight overlap in memory");
  // x8: whole groups of 8 contiguous rows
  BAD_CALL(EmbeddingCall, (c.x8 = true, c.w.sizes[0] = 12), INVALID,
           "mtp_embedding: weight: a Q8_0_X8 matrix interleaves groups of 8 rows: N must be a multiple of 8, got 12");
  BAD_CALL(EmbeddingCall, (c.x8 = true, c.w.strides[0] = 72), INVALID,
           "weight: a Q8_0_X8 matrix must be contiguous (rows 68 bytes apart), got strides [72, 1]");
  BAD_CALL(EmbeddingCall, (c.x8 = true, c.weight_scale = &c.sc), DTYPE,
           "weight is Q8_0_X8 but weight_scale is not empty");
  BAD_CALL(EmbeddingCall, (c.x8 = true, c.ids[2] = -1), INVALID, "got tokens[2] = -1");

  // mtp_head_draft
  BAD_CALL(HeadCall, c.emb_scale = &c.sc, DTYPE,
           "mtp_head_draft: embedding is Q8_0 but embedding_scale is not empty: with scales the matrix is int8 (Q8)");
  BAD_CALL(HeadCall, c.lm_scale = &c.sc, DTYPE, "lm_head is Q8_0 but lm_head_scale is not empty");
  // lm_head's rows: V, or with a draft vocabulary V or Vd (its rows gathered)
  BAD_CALL(HeadCall, c.lm.sizes[0] = 24, INVALID,
           "mtp_head_draft: lm_head.sizes[0] must equal V (embedding.sizes[0]) = 50, got 24");
  BAD_CALL(HeadCall, (c.voc = &c.vocab, c.lm.sizes[0] = 23), INVALID,
           "lm_head.sizes[0] must equal V (embedding.sizes[0]) or Vd (draft_vocab.sizes[0]) = 50, got 23");
  BAD_CALL(HeadCall, (c.voc = &c.vocab, c.lm.ndim = 1), INVALID, "lm_head must be 2-D [V, H] or [Vd, H]");
  BAD_CALL(HeadCall, c.emb.dtype = MTP_Q4_K, INVALID,
           "mtp_head_draft: embedding: K = 64 is not a multiple of Q4_K's blocks of 256 elements");
  BAD_CALL(HeadCall, c.lm.strides[0] = 1, INVALID,
           "lm_head: a Q8_0 row of K = 64 elements is 68 bytes, so strides[0] (bytes between rows, for a block dtype) "
           "must be >= 68, got 1");
  BAD_CALL(HeadCall, c.emb.data = nullptr, MTP_ERROR_NULL_POINTER, "embedding.data is NULL");
  BAD_CALL(HeadCall, c.w[2].dtype = MTP_Q4_K, INVALID,
           "weights[2] (proj): K = 128 is not a multiple of Q4_K's blocks of 256 elements");
  BAD_CALL(HeadCall, c.w[4].strides[0] = 3, INVALID,
           "weights[4] (block 0's qkv): a Q4_1 row of K = 64 elements is 40 bytes");
  BAD_CALL(HeadCall, c.emb.dtype = 110, DTYPE, "embedding must be float32 or bfloat16 or int8 or Q4_0");
  BAD_CALL(
      HeadCall, c.emb.dtype = MTP_Q8_0_X8, INVALID,
      "mtp_head_draft: embedding: a Q8_0_X8 matrix interleaves groups of 8 rows: N must be a multiple of 8, got 50");
  BAD_CALL(HeadCall, c.lm.dtype = MTP_Q8_0_X8, INVALID,
           "mtp_head_draft: lm_head: a Q8_0_X8 matrix interleaves groups of 8 rows: N must be a multiple of 8, got 50");
  BAD_CALL(
      HeadCall, (c.w[4].dtype = MTP_Q4_1_X8, c.w[4].strides[0] = 80), INVALID,
      "weights[4] (block 0's qkv): a Q4_1_X8 matrix must be contiguous (rows 40 bytes apart), got strides [80, 1]");
}
