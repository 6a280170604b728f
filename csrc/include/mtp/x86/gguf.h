// x86 products of GGUF block-type weights (gguf.h) with int8 activation rows: 256-bit
// vectors, one block of 32 per vector, lane l = the four products 4l..4l+3, exactly the
// canonical lanes of gguf.h, so every path gives the generic kernel's bits.
// VNNI (AVX-512 VNNI + VL, or AVX-VNNI): VPDPBUSD takes the weights as unsigned bytes (Q4: the
// nibbles; Q6_K: the 6-bit values; Q8_0: q ^ 0x80 = q + 128) and starts from the offset
// correction -offset * (lane sum of x) (QuantRows::sum4), which leaves sum (q - offset) * x.
// Without VNNI, VPMADDUBSW + VPMADDWD give the same int32 lanes (no int16 pair can saturate:
// |u| <= 63 there, and Q8_0 takes |q| times x with q's sign).
#pragma once
#include <immintrin.h>

#include "mtp/gguf.h"
#include "mtp/isa.h"
#include "mtp/linear_args.h"

namespace mtp::x86 {

// One block of one weight row, loaded: u the unsigned (or, Q8_0 without VNNI, signed) bytes,
// the scale d, the offset m, and Q6_K's multipliers.
struct WBlock {
  __m256i u;
  __m256i mul;
  float d, m;
};

template <DType T>
MTP_TARGET_AVX2 inline void load_block(const uint8_t* row, int64_t b, WBlock& o) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  if constexpr (T == DType::Q4_0 || T == DType::Q4_1) {
    constexpr int64_t bytes = block_bytes(T);
    const uint8_t* blk = row + b * bytes;
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + bytes - 16));
    const __m128i low4_128 = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(v, low4_128), hi = _mm_and_si128(_mm_srli_epi16(v, 4), low4_128);
    o.u = _mm256_set_m128i(hi, lo);
    o.d = _cvtsh_ss(*reinterpret_cast<const uint16_t*>(blk));
    o.m = T == DType::Q4_1 ? _cvtsh_ss(*reinterpret_cast<const uint16_t*>(blk + 2)) : 0.f;
  } else if constexpr (T == DType::Q8_0) {
    const uint8_t* blk = row + b * 34;
    o.u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    o.d = _cvtsh_ss(*reinterpret_cast<const uint16_t*>(blk));
    o.m = 0.f;
  } else if constexpr (T == DType::Q4_K) {
    const uint8_t* s = row + b / 8 * 144;
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 16 + (b % 8) / 2 * 32));
    o.u = _mm256_and_si256(b % 2 ? _mm256_srli_epi16(v, 4) : v, low4);
    int sc, m;
    q4k_scale_min(s + 4, int(b % 8), &sc, &m);
    o.d = _cvtsh_ss(*reinterpret_cast<const uint16_t*>(s)) * float(sc);
    o.m = -(_cvtsh_ss(*reinterpret_cast<const uint16_t*>(s + 2)) * float(m));
  } else {  // Q6_K
    const uint8_t* s = row + b / 8 * 210;
    const int h = int(b % 8) / 4, g = int(b % 4);
    const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 64 * h + 32 * (g & 1)));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 128 + 32 * h));
    const __m256i nib = _mm256_and_si256(g >= 2 ? _mm256_srli_epi16(ql, 4) : ql, low4);
    const __m256i top = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * g)), _mm256_set1_epi8(3));
    o.u = _mm256_or_si256(nib, _mm256_slli_epi16(top, 4));
    const int8_t* sc = reinterpret_cast<const int8_t*>(s + 192 + 2 * (b % 8));
    o.mul = _mm256_setr_epi32(sc[0], sc[0], sc[0], sc[0], sc[1], sc[1], sc[1], sc[1]);
    o.d = _cvtsh_ss(*reinterpret_cast<const uint16_t*>(s + 208));
    o.m = 0.f;
  }
}

// The offset subtracted from the unsigned bytes: Q4_0 8, Q6_K 32, Q8_0 128 (VNNI only), else 0.
template <DType T, bool kVnni>
constexpr int offset_shift() {
  return T == DType::Q4_0 ? 3 : T == DType::Q6_K ? 5 : (T == DType::Q8_0 && kVnni) ? 7 : -1;
}

MTP_TARGET_AVX512_VNNI inline __m256i dpbusd256_evex(__m256i acc, __m256i u, __m256i s) {
  return _mm256_dpbusd_epi32(acc, u, s);
}
MTP_TARGET_AVX2_VNNI inline __m256i dpbusd256_vex(__m256i acc, __m256i u, __m256i s) {
  return _mm256_dpbusd_avx_epi32(acc, u, s);
}

// kVnni: 0 none (VPMADDUBSW), 1 AVX-512 VNNI (EVEX), 2 AVX-VNNI (VEX).
template <DType T, int kVnni>
MTP_TARGET_AVX2 inline __m256i lanes(const WBlock& w, __m256i x, __m256i corr) {
  __m256i acc = corr;
  if constexpr (kVnni != 0) {
    const __m256i u = T == DType::Q8_0 ? _mm256_xor_si256(w.u, _mm256_set1_epi8(char(0x80))) : w.u;
    if constexpr (kVnni == 1) acc = dpbusd256_evex(acc, u, x);
    else acc = dpbusd256_vex(acc, u, x);
  } else {
    __m256i pairs;
    if constexpr (T == DType::Q8_0) pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w.u), _mm256_sign_epi8(x, w.u));
    else pairs = _mm256_maddubs_epi16(w.u, x);
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
  }
  if constexpr (T == DType::Q6_K) acc = _mm256_mullo_epi32(acc, w.mul);
  return acc;
}

MTP_TARGET_AVX2 inline float sum8_256(__m256 a) {  // gguf.h's sum8, lane for lane
  const __m128 t = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));  // a_l + a_{l+4}
  const __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));                                 // (0 + 2), (1 + 3)
  return _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps(u, u, 1)));
}

// R rows x C columns (weight rows w[0..C)) over all blocks. Per block, each column's block is
// decoded once, then meets the R rows (read from L1 as memory operands): only the R x C
// accumulators and one decoded block stay in registers. Every loop over r and c is unrolled.
template <DType T, int kVnni, int R, int C>
MTP_TARGET_AVX2 inline void gguf_tile(const uint8_t* const* w, const QuantRows& xq, int64_t m0, int64_t nb,
                                      float (*out)[C]) {
  __m256 acc[R][C];
  float accm[R][C];
  const int8_t* xr[R];
  const int32_t* s4r[R];
  const float *dxr[R], *sr[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    xr[r] = xq.qrow(m0 + r); s4r[r] = xq.sum4row(m0 + r); dxr[r] = xq.dxrow(m0 + r); sr[r] = xq.srow(m0 + r);
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) {
      acc[r][c] = _mm256_setzero_ps();
      accm[r][c] = 0.f;
    }
  }
  constexpr int64_t kBytes32 = block_bytes(T) / (block_elems(T) / 32);  // bytes per 32 elements
  constexpr int shift = offset_shift<T, kVnni != 0>();
  for (int64_t b = 0; b < nb; ++b) {
    // Per row, once per block: the offset correction -offset * (lane sums of x) and dx.
    __m256i corr[R];
    __m256 dx[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      corr[r] = shift >= 0 ? _mm256_sub_epi32(_mm256_setzero_si256(),
                                              _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s4r[r] + b * 8)), shift))
                           : _mm256_setzero_si256();
      dx[r] = _mm256_broadcast_ss(dxr[r] + b);
    }
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) {
      _mm_prefetch(reinterpret_cast<const char*>(w[c] + (b + 8) * kBytes32), _MM_HINT_T0);
      WBlock wb;
      load_block<T>(w[c], b, wb);
      const __m256 d = _mm256_set1_ps(wb.d);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr[r] + b * 32));
        const __m256i L = lanes<T, kVnni>(wb, x, corr[r]);  // d * dx below: the scalar product, lane for lane
        acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(L), _mm256_mul_ps(d, dx[r]), acc[r][c]);
        if constexpr (block_has_offset(T)) accm[r][c] = std::fma(wb.m, sr[r][b], accm[r][c]);
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) out[r][c] = sum8_256(acc[r][c]) + accm[r][c];
}

template <DType T, int kVnni, int R>
MTP_TARGET_AVX2 inline void gguf_rows(const LinearArgs& a, const QuantRows& xq, int64_t m0, int64_t n0, int64_t n1) {
  constexpr int C = 4;
  const int64_t nb = a.K / 32;
  for (int64_t n = n0; n < n1; n += C) {
    const uint8_t* w[C];
    for (int c = 0; c < C; ++c)
      w[c] = static_cast<const uint8_t*>(a.w) + weight_row(a, std::min(n + c, n1 - 1)) * a.w_stride;
    float out[R][C];
    gguf_tile<T, kVnni, R, C>(w, xq, m0, nb, out);
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C && n + c < n1; ++c)
        a.y[(m0 + r) * a.y_stride + n + c] = a.bias ? out[r][c] + a.bias[n + c] : out[r][c];
  }
}

template <DType T, int kVnni, int R>
inline void gguf_rows_of(int rows, const LinearArgs& a, const QuantRows& xq, int64_t m0, int64_t n0, int64_t n1) {
  if constexpr (R > 1) {
    if (rows < R) return gguf_rows_of<T, kVnni, R - 1>(rows, a, xq, m0, n0, n1);
  }
  gguf_rows<T, kVnni, R>(a, xq, m0, n0, n1);
}

// Columns [n0, n1) of every row, the rows in equal groups of at most kRows (9 = 3 + 3 + 3:
// a group shares each decoded block); any grouping gives the same bits.
template <DType T, int kVnni, int kRows>
inline void gguf_linear_typed(const LinearArgs& a, const QuantRows& xq, int64_t n0, int64_t n1) {
  const int64_t groups = (a.M + kRows - 1) / kRows;
  for (int64_t i = 0, m = 0; i < groups; ++i) {
    const int rows = int((a.M - m) / (groups - i));
    gguf_rows_of<T, kVnni, kRows>(rows, a, xq, m, n0, n1);
    m += rows;
  }
}

template <int kVnni, int kRows>
inline void gguf_linear_vnni(const LinearArgs& a, const QuantRows& xq, int64_t n0, int64_t n1) {
  switch (a.w_dtype) {
    case DType::Q4_0: return gguf_linear_typed<DType::Q4_0, kVnni, kRows>(a, xq, n0, n1);
    case DType::Q4_1: return gguf_linear_typed<DType::Q4_1, kVnni, kRows>(a, xq, n0, n1);
    case DType::Q8_0: return gguf_linear_typed<DType::Q8_0, kVnni, kRows>(a, xq, n0, n1);
    case DType::Q4_K: return gguf_linear_typed<DType::Q4_K, kVnni, kRows>(a, xq, n0, n1);
    default: return gguf_linear_typed<DType::Q6_K, kVnni, kRows>(a, xq, n0, n1);
  }
}

// The entry points: each a flatten function of its target, into which everything above is
// inlined (the VNNI helpers have their own targets and inline only there).
#define MTP_GGUF_ENTRY_POINT(TARGET, NAME, VNNI, ROWS)                                              \
  TARGET __attribute__((flatten)) inline void NAME(const LinearArgs& a, const QuantRows& xq, int64_t n0, \
                                                   int64_t n1) {                                    \
    gguf_linear_vnni<VNNI, ROWS>(a, xq, n0, n1);                                                    \
  }
MTP_GGUF_ENTRY_POINT(MTP_TARGET_AVX512_VNNI, gguf_linear_avx512_vnni, 1, 4)
MTP_GGUF_ENTRY_POINT(MTP_TARGET_AVX512, gguf_linear_avx512_madd, 0, 4)
MTP_GGUF_ENTRY_POINT(MTP_TARGET_AVX2_VNNI, gguf_linear_avx2_vnni, 2, 2)
MTP_GGUF_ENTRY_POINT(MTP_TARGET_AVX2, gguf_linear_avx2_madd, 0, 2)

// AVX-512 (32 vector registers: groups of 4 rows) with AVX-512 VNNI where present; AVX2
// (16 registers: 2 rows) with AVX-VNNI where present. The same bits either way.
inline void gguf_linear_avx512(const LinearArgs& a, const QuantRows& xq, int64_t n0, int64_t n1) {
  has_avx512_vnni() ? gguf_linear_avx512_vnni(a, xq, n0, n1) : gguf_linear_avx512_madd(a, xq, n0, n1);
}
inline void gguf_linear_avx2(const LinearArgs& a, const QuantRows& xq, int64_t n0, int64_t n1) {
  has_avx_vnni() ? gguf_linear_avx2_vnni(a, xq, n0, n1) : gguf_linear_avx2_madd(a, xq, n0, n1);
}

}  // namespace mtp::x86
