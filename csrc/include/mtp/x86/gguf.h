// x86 products of GGUF block-type weights (gguf.h) with int8 activation rows, in 256-bit
// vectors; the integer block sums I are exact, then gguf.h's one chain per output element,
// so every path gives the generic kernel's bits.
// x8 layout: a vector lane is one of a group's 8 columns (4 bytes of its block per chunk),
// so a block's 8 sums come out of the dot products in one vector: one cvt + mul + fma per 8
// columns (the K-quants: x8_tile_k). File layout: one block per vector (lane l = products
// 4l..4l+3), 4 columns' lanes summed by a horizontal-add tree into one vector of 4 column sums.
// VNNI (AVX-512 VNNI + VL, or AVX-VNNI): VPDPBUSD takes the weights as unsigned bytes (Q4: the
// nibbles; Q5_0 / Q6_K: the 5- / 6-bit values; Q8_0: q ^ 0x80 = q + 128) and starts from the offset
// correction -offset * (lane sum of x) (QuantRows::sum4), which leaves sum (q - offset) * x.
// Without VNNI, VPMADDUBSW + VPMADDWD give the same int32 lanes (no int16 pair can saturate:
// |u| <= 63 there, and Q8_0 takes |q| times x with q's sign).
#pragma once
#include <immintrin.h>

#include <cstring>

#include "mtp/gguf.h"
#include "mtp/isa.h"
#include "mtp/linear_args.h"
#include "mtp/x86/vec.h"

namespace mtp::x86 {

// One block of one weight row, loaded: u the unsigned (or, Q8_0 without VNNI, signed) bytes,
// the scale d, the offset m, and Q6_K's multipliers.
struct WBlock {
  __m256i u;
  __m256i mul;
  float d, m;
};

template <DType T>
MTP_TARGET(Avx2) inline void load_block(const uint8_t* row, int64_t b, WBlock& o) {
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
  } else if constexpr (T == DType::Q5_0) {
    const uint8_t* blk = row + b * 22;
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 6));
    const __m128i low4_128 = _mm_set1_epi8(0x0F);
    const __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low4_128), _mm_and_si128(v, low4_128));
    // qh's bit e to byte e: byte e takes qh's byte e / 8, keeps bit e % 8, and becomes 0x10 or 0
    int32_t qh;
    std::memcpy(&qh, blk + 2, 4);
    const __m256i bytes = _mm256_shuffle_epi8(
        _mm256_set1_epi32(qh), _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
    o.u = _mm256_or_si256(nib, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    o.d = _cvtsh_ss(*reinterpret_cast<const uint16_t*>(blk));
    o.m = 0.f;
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

// The offset subtracted from the unsigned bytes: Q4_0 8, Q5_0 16, Q6_K 32, Q8_0 128 (VNNI
// only), else 0.
template <DType T, bool kVnni>
constexpr int offset_shift() {
  return T == DType::Q4_0 ? 3 : T == DType::Q5_0 ? 4 : T == DType::Q6_K ? 5 : (T == DType::Q8_0 && kVnni) ? 7 : -1;
}

MTP_TARGET_AVX512_VNNI inline __m256i dpbusd256_evex(__m256i acc, __m256i u, __m256i s) {
  return _mm256_dpbusd_epi32(acc, u, s);
}
MTP_TARGET_AVX2_VNNI inline __m256i dpbusd256_vex(__m256i acc, __m256i u, __m256i s) {
  return _mm256_dpbusd_avx_epi32(acc, u, s);
}

// kVnni: 0 none (VPMADDUBSW), 1 AVX-512 VNNI (EVEX), 2 AVX-VNNI (VEX).
template <DType T, int kVnni>
MTP_TARGET(Avx2) inline __m256i lanes(const WBlock& w, __m256i x, __m256i corr) {
  __m256i acc = corr;
  if constexpr (kVnni != 0) {
    const __m256i u = T == DType::Q8_0 ? _mm256_xor_si256(w.u, _mm256_set1_epi8(char(0x80))) : w.u;
    if constexpr (kVnni == 1)
      acc = dpbusd256_evex(acc, u, x);
    else
      acc = dpbusd256_vex(acc, u, x);
  } else {
    __m256i pairs;
    if constexpr (T == DType::Q8_0)
      pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w.u), _mm256_sign_epi8(x, w.u));
    else
      pairs = _mm256_maddubs_epi16(w.u, x);
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
  }
  if constexpr (T == DType::Q6_K) acc = _mm256_mullo_epi32(acc, w.mul);
  return acc;
}

// The block sums of 4 columns: lane c = the sum of L[c]'s 8 lanes (exact int32).
MTP_TARGET(Avx2) inline __m128i sum_lanes4(const __m256i* L) {
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(L[0], L[1]), _mm256_hadd_epi32(L[2], L[3]));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// R rows x C = 4 columns (weight rows w[0..C)) over all blocks. Per block, the C columns'
// blocks are decoded once, then meet the R rows (read from L1 as memory operands); a lane of
// the R accumulators is a column. Every loop over r and c is unrolled.
template <DType T, int kVnni, int R, int C>
MTP_TARGET(Avx2) inline void gguf_tile(const uint8_t* const* w, const QuantRows& xq, int64_t m0, int64_t nb,
                                            float (*out)[C]) {
  static_assert(C == 4, "one __m128 of columns");
  __m128 acc[R], accm[R];
  const int8_t* xr[R];
  const int32_t* s4r[R];
  const float *dxr[R], *sr[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    xr[r] = xq.qrow(m0 + r);
    s4r[r] = xq.sum4row(m0 + r);
    dxr[r] = xq.dxrow(m0 + r);
    sr[r] = xq.srow(m0 + r);
    acc[r] = accm[r] = _mm_setzero_ps();
  }
  constexpr int64_t kBytes32 = block_bytes(T) / (block_elems(T) / 32);  // bytes per 32 elements
  constexpr int shift = offset_shift<T, kVnni != 0>();
  for (int64_t b = 0; b < nb; ++b) {
    WBlock wb[C];
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) {
      _mm_prefetch(reinterpret_cast<const char*>(w[c] + (b + 8) * kBytes32), _MM_HINT_T0);
      load_block<T>(w[c], b, wb[c]);
    }
    const __m128 d = _mm_setr_ps(wb[0].d, wb[1].d, wb[2].d, wb[3].d);
    const __m128 m = _mm_setr_ps(wb[0].m, wb[1].m, wb[2].m, wb[3].m);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      // the offset correction -offset * (lane sums of x), then the lanes of each column
      const __m256i corr =
          shift >= 0
              ? _mm256_sub_epi32(
                    _mm256_setzero_si256(),
                    _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s4r[r] + b * 8)), shift))
              : _mm256_setzero_si256();
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr[r] + b * 32));
      __m256i L[C];
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) L[c] = lanes<T, kVnni>(wb[c], x, corr);
      const __m128 I = _mm_cvtepi32_ps(sum_lanes4(L));
      acc[r] = _mm_fmadd_ps(I, _mm_mul_ps(d, _mm_broadcast_ss(dxr[r] + b)), acc[r]);
      if constexpr (block_has_offset(T)) accm[r] = _mm_fmadd_ps(m, _mm_broadcast_ss(sr[r] + b), accm[r]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) _mm_storeu_ps(out[r], _mm_add_ps(acc[r], accm[r]));
}

// ---- the activation rows: quantize_rows (gguf.h) in vectors, the same bits ---------------
// Per block of 32 (4 vectors): amax by the magnitudes' bits, the scale by q8_block_scale (the
// scalar rule), then q = clamp(round_half_even(v / scale)) lane by lane (an
// IEEE division and the same add / subtract of 1.5 * 2^23: the scalar results exactly) and
// the 4-element sums of q by one VPMADDUBSW + VPMADDWD.
template <DType T>
MTP_TARGET(Avx2) inline void quantize_rows_of(const void* x, int64_t x_stride, int64_t m0, int64_t m1,
                                                   QuantRows& out) {
  const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
  const __m256 shift = _mm256_set1_ps(kRoundShift), lo = _mm256_set1_ps(-127.f), hi = _mm256_set1_ps(127.f);
  for (int64_t m = m0; m < m1; ++m) {
    const char* xm = static_cast<const char*>(x) + m * x_stride * int64_t(dtype_size(T));
    for (int64_t b = 0; b < out.nb; ++b) {
      __m256 v[4];
      __m256i bits = _mm256_setzero_si256();
      for (int i = 0; i < 4; ++i) {
        v[i] = load8<T>(xm, b * 32 + 8 * i);
        bits = _mm256_max_epu32(bits, _mm256_and_si256(_mm256_castps_si256(v[i]), magnitude));
      }
      __m128i h = _mm_max_epu32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
      h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4e));
      h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xb1));
      const float scale = q8_block_scale(uint32_t(_mm_cvtsi128_si32(h)));
      int8_t* q = out.q.data() + m * out.K + b * 32;
      int32_t* s4 = out.sum4.data() + (m * out.nb + b) * 8;
      __m256i qv = _mm256_setzero_si256();
      if (scale > 0.f) {
        const __m256 d = _mm256_set1_ps(scale);
        __m256i qi[4];
        for (int i = 0; i < 4; ++i) {
          const __m256 r = _mm256_sub_ps(_mm256_add_ps(_mm256_div_ps(v[i], d), shift), shift);
          qi[i] = _mm256_cvtps_epi32(_mm256_min_ps(hi, _mm256_max_ps(lo, r)));  // integral: exact
        }
        // the packs interleave 4-element groups per 128-bit half: 0a 1a 2a 3a | 0b 1b 2b 3b
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
        qv = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), qv);
      const __m256i sums = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), qv), _mm256_set1_epi16(1));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(s4), sums);
      __m128i t = _mm_add_epi32(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
      t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
      t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
      out.set_block(m, b, scale, _mm_cvtsi128_si32(t));
    }
  }
}

MTP_TARGET(Avx2) inline void quantize_row_range_avx2(const void* x, DType dt, int64_t x_stride, int64_t m0,
                                                          int64_t m1, QuantRows& out) {
  if (dt == DType::BF16) return quantize_rows_of<DType::BF16>(x, x_stride, m0, m1, out);
  if (dt == DType::F16) return quantize_rows_of<DType::F16>(x, x_stride, m0, m1, out);
  quantize_rows_of<DType::F32>(x, x_stride, m0, m1, out);
}
// AVX-512 machines take the same 256-bit code: a block of 32 is 4 vectors either way.
inline void quantize_row_range(Avx512, const void* x, DType dt, int64_t x_stride, int64_t m0, int64_t m1,
                               QuantRows& out) {
  quantize_row_range_avx2(x, dt, x_stride, m0, m1, out);
}
inline void quantize_row_range(Avx2, const void* x, DType dt, int64_t x_stride, int64_t m0, int64_t m1,
                               QuantRows& out) {
  quantize_row_range_avx2(x, dt, x_stride, m0, m1, out);
}
inline void quantize_rows(Avx512, const void* x, DType dt, int64_t x_stride, int64_t M, int64_t K, QuantRows& out) {
  out.resize(M, K);
  quantize_row_range_avx2(x, dt, x_stride, 0, M, out);
}
inline void quantize_rows(Avx2, const void* x, DType dt, int64_t x_stride, int64_t M, int64_t K, QuantRows& out) {
  out.resize(M, K);
  quantize_row_range_avx2(x, dt, x_stride, 0, M, out);
}

// ---- x8 layout ----------------------------------------------------------------------------

MTP_TARGET(Avx2) inline __m256i bcast4(const int8_t* p) {  // 4 bytes into every int32 lane
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// I += the lanes' dot products of 4 unsigned weight bytes (Q8_0 without VNNI: signed) with
// the 4 activation bytes in every lane.
template <DType T, int kVnni>
MTP_TARGET(Avx2) inline __m256i dot4(__m256i I, __m256i u, __m256i x) {
  if constexpr (kVnni == 1)
    return dpbusd256_evex(I, u, x);
  else if constexpr (kVnni == 2)
    return dpbusd256_vex(I, u, x);
  else {
    const __m256i pairs = T == DType::Q8_0 ? _mm256_maddubs_epi16(_mm256_abs_epi8(u), _mm256_sign_epi8(x, u))
                                           : _mm256_maddubs_epi16(u, x);
    return _mm256_add_epi32(I, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
  }
}

// R rows x the 8 columns of one x8 group (T: the blocks' file type) over all blocks: y[r]
// lane c = column c. Per block and row: I starts from the offset correction -offset * sum(x)
// and takes 8 dot products (chunks of 4 bytes per lane), then one cvt + mul + fma.
template <DType T, int kVnni, int R>
MTP_TARGET(Avx2) inline void x8_tile(const uint8_t* group, const QuantRows& xq, int64_t m0, int64_t nb,
                                          __m256* y) {
  constexpr int64_t gb = kX8Rows * block_bytes(T);
  constexpr int shift = offset_shift<T, kVnni != 0>();
  const __m256i low4 = _mm256_set1_epi8(0x0F), flip = _mm256_set1_epi8(char(0x80));
  __m256 acc[R], accm[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r] = accm[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = group + b * gb;
    const uint8_t* qs = blk + x8_head_bytes(T);
    __m256i I[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
      I[r] = shift >= 0 ? _mm256_set1_epi32(-(xq.sumrow(m0 + r)[b] * (1 << shift))) : _mm256_setzero_si256();
    if constexpr (T == DType::Q8_0) {
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * j));
        if constexpr (kVnni != 0) v = _mm256_xor_si256(v, flip);  // q + 128, unsigned
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) I[r] = dot4<T, kVnni>(I[r], v, bcast4(xq.qrow(m0 + r) + b * 32 + 4 * j));
      }
    } else {
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * j));
        const __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          const int8_t* x = xq.qrow(m0 + r) + b * 32 + 4 * j;
          I[r] = dot4<T, kVnni>(dot4<T, kVnni>(I[r], lo, bcast4(x)), hi, bcast4(x + 16));
        }
      }
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)));
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I[r]), _mm256_mul_ps(d, _mm256_set1_ps(xq.dxrow(m0 + r)[b])), acc[r]);
    if constexpr (block_has_offset(T)) {
      const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16)));
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) accm[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(xq.srow(m0 + r)[b]), accm[r]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) y[r] = _mm256_add_ps(acc[r], accm[r]);
}

// x8_tile over two adjacent groups at once (AVX-512 VNNI, the 32-element types): 16 columns
// per 512-bit vector, so each activation broadcast, dot product and epilogue instruction serves
// twice the columns. The lanes are x8_tile's, the same operations in the same order: the same
// bits. From how many rows of a call it runs depends on the host (wide_tile_pays): the two
// groups are two streams, which AMD Zen 4's prefetchers follow poorly from DRAM
// (bench/core_gguf.cpp, streamed: 2x slower than x8_tile at 1-8 rows; software prefetch did
// not help), so there only a prefill's row groups take it (kWideTileRows), which read the
// matrix again from the caches, where it is 1.3-1.6x faster; on Intel Xeon it is faster at
// every row count from the caches and from DRAM no slower at one row, faster at more
// (bench/RESULTS.md, "The two-group tile from one row").
MTP_TARGET_AVX512_VNNI inline __m512i both_groups(const uint8_t* p0, const uint8_t* p1) {  // 32 bytes of each
  return _mm512_inserti64x4(_mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p0))),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p1)), 1);
}
MTP_TARGET_AVX512_VNNI inline __m512 both_halves(const uint8_t* p0, const uint8_t* p1) {  // 8 fp16 of each, widened
  return _mm512_cvtph_ps(_mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p1)),
                                          _mm_loadu_si128(reinterpret_cast<const __m128i*>(p0))));
}

constexpr int64_t kWideTileRows = 16;  // x8_tile16 from this many rows of a call, where it does not pay from one

template <DType T, int R>
MTP_TARGET_AVX512_VNNI inline void x8_tile16(const uint8_t* g0, const uint8_t* g1, const QuantRows& xq, int64_t m0,
                                             int64_t nb, __m512* y) {
  constexpr int64_t gb = kX8Rows * block_bytes(T);
  constexpr int shift = offset_shift<T, true>();
  const __m512i low4 = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8(char(0x80));
  __m512 acc[R], accm[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r] = accm[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t *blk0 = g0 + b * gb, *blk1 = g1 + b * gb;
    const uint8_t *qs0 = blk0 + x8_head_bytes(T), *qs1 = blk1 + x8_head_bytes(T);
    __m512i I[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
      I[r] = shift >= 0 ? _mm512_set1_epi32(-(xq.sumrow(m0 + r)[b] * (1 << shift))) : _mm512_setzero_si512();
    if constexpr (T == DType::Q8_0) {
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const __m512i v = _mm512_xor_si512(both_groups(qs0 + 32 * j, qs1 + 32 * j), flip);  // q + 128, unsigned
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          int32_t x;
          std::memcpy(&x, xq.qrow(m0 + r) + b * 32 + 4 * j, 4);
          I[r] = _mm512_dpbusd_epi32(I[r], v, _mm512_set1_epi32(x));
        }
      }
    } else {
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const __m512i v = both_groups(qs0 + 32 * j, qs1 + 32 * j);
        const __m512i lo = _mm512_and_si512(v, low4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          const int8_t* xr = xq.qrow(m0 + r) + b * 32 + 4 * j;
          int32_t x0, x1;
          std::memcpy(&x0, xr, 4), std::memcpy(&x1, xr + 16, 4);
          I[r] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(I[r], lo, _mm512_set1_epi32(x0)), hi, _mm512_set1_epi32(x1));
        }
      }
    }
    const __m512 d = both_halves(blk0, blk1);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[r]), _mm512_mul_ps(d, _mm512_set1_ps(xq.dxrow(m0 + r)[b])), acc[r]);
    if constexpr (block_has_offset(T)) {
      const __m512 m = both_halves(blk0 + 16, blk1 + 16);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) accm[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(xq.srow(m0 + r)[b]), accm[r]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) y[r] = _mm512_add_ps(acc[r], accm[r]);
}

// 8 bytes (one per column) widened to int32 lanes: unsigned, or signed (Q6_K's scales).
MTP_TARGET(Avx2) inline __m256i bytes8(const uint8_t* p, bool is_signed) {
  const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return is_signed ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v);
}

// x8_tile for the K-quants (Q4_K, Q6_K: superblocks of 8 blocks of 32): per superblock the
// 8 columns' scales come from one 8-byte load per scale byte (the x8 layout keeps byte i of
// the 8 rows together), per block as x8_tile. Q4_K: d_b = d * sc_j, m_b = -(dmin * m_j)
// (exact, the generic kernel's), the nibbles of chunk pair j / 2; Q6_K: the two half-block
// sums (each from its offset correction -32 * sum(x)) times their int8 scales.
template <DType T, int kVnni, int R>
MTP_TARGET(Avx2) inline void x8_tile_k(const uint8_t* group, const QuantRows& xq, int64_t m0, int64_t nb,
                                            __m256* y) {
  constexpr int64_t gb = kX8Rows * block_bytes(T);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256 acc[R], accm[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r] = accm[r] = _mm256_setzero_ps();
  for (int64_t s = 0; s < nb / 8; ++s) {
    const uint8_t* sb = group + s * gb;
    // the superblock's 8 fp16 d (Q4_K: field 0, then dmin; Q6_K: field 3), once for its 8 blocks
    const __m256 dsb = _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + x8_field_at(T, T == DType::Q4_K ? 0 : 3))));
    const __m256 dmin = T == DType::Q4_K
                            ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + x8_field_at(T, 1))))
                            : _mm256_setzero_ps();
    for (int j = 0; j < 8; ++j) {
      const int64_t b = 8 * s + j;
      __m256i I[R];
      __m256 d = dsb, m = _mm256_setzero_ps();
      if constexpr (T == DType::Q4_K) {
        constexpr int64_t scales = x8_field_at(T, 2), values = x8_field_at(T, 3);
        const uint8_t* sc = sb + scales;
        const __m256i six = _mm256_set1_epi32(63);
        __m256i scj, mj;
        if (j < 4) {
          scj = _mm256_and_si256(bytes8(sc + 8 * j, false), six);
          mj = _mm256_and_si256(bytes8(sc + 8 * (j + 4), false), six);
        } else {
          const __m256i hi = bytes8(sc + 8 * (j + 4), false);
          scj = _mm256_or_si256(_mm256_and_si256(hi, _mm256_set1_epi32(15)),
                                _mm256_slli_epi32(_mm256_srli_epi32(bytes8(sc + 8 * (j - 4), false), 6), 4));
          mj = _mm256_or_si256(_mm256_srli_epi32(hi, 4),
                               _mm256_slli_epi32(_mm256_srli_epi32(bytes8(sc + 8 * j, false), 6), 4));
        }
        d = _mm256_mul_ps(dsb, _mm256_cvtepi32_ps(scj));
        m = _mm256_xor_ps(_mm256_mul_ps(dmin, _mm256_cvtepi32_ps(mj)), _mm256_set1_ps(-0.f));
        const uint8_t* qs = sb + values + 32 * 8 * (j / 2);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) I[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * k));
          const __m256i u = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(v, 4) : v, low4);
#pragma GCC unroll 16
          for (int r = 0; r < R; ++r) I[r] = dot4<T, kVnni>(I[r], u, bcast4(xq.qrow(m0 + r) + b * 32 + 4 * k));
        }
      } else {  // Q6_K
        constexpr int64_t high = x8_field_at(T, 1), scales = x8_field_at(T, 2);
        const int h = j / 4, g = j % 4;
        const uint8_t* ql = sb + 32 * (16 * h + 8 * (g & 1));
        const uint8_t* qh = sb + high + 32 * 8 * h;
        const __m128i top_shift = _mm_cvtsi32_si128(2 * g);
        __m256i I1[R];
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          const int32_t* s4 = xq.sum4row(m0 + r) + b * 8;
          I[r] = _mm256_set1_epi32(-(s4[0] + s4[1] + s4[2] + s4[3]) * 32);
          I1[r] = _mm256_set1_epi32(-(s4[4] + s4[5] + s4[6] + s4[7]) * 32);
        }
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) {
          const __m256i l = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32 * k));
          const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * k));
          const __m256i nib = _mm256_and_si256(g >= 2 ? _mm256_srli_epi16(l, 4) : l, low4);
          const __m256i top = _mm256_and_si256(_mm256_srl_epi16(hb, top_shift), _mm256_set1_epi8(3));
          const __m256i u = _mm256_or_si256(nib, _mm256_slli_epi16(top, 4));
#pragma GCC unroll 16
          for (int r = 0; r < R; ++r) {
            __m256i& half = k < 4 ? I[r] : I1[r];
            half = dot4<T, kVnni>(half, u, bcast4(xq.qrow(m0 + r) + b * 32 + 4 * k));
          }
        }
        const __m256i mul0 = bytes8(sb + scales + 8 * (2 * j), true),
                      mul1 = bytes8(sb + scales + 8 * (2 * j + 1), true);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r)
          I[r] = _mm256_add_epi32(_mm256_mullo_epi32(I[r], mul0), _mm256_mullo_epi32(I1[r], mul1));
      }
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        acc[r] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(I[r]), _mm256_mul_ps(d, _mm256_set1_ps(xq.dxrow(m0 + r)[b])), acc[r]);
        if constexpr (block_has_offset(T)) accm[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(xq.srow(m0 + r)[b]), accm[r]);
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) y[r] = _mm256_add_ps(acc[r], accm[r]);
}

// x8_rows' columns [n0, n1) 16 at a time (x8_tile16) while 16 are left; returns where it stopped.
template <DType T, int R>
MTP_TARGET_AVX512_VNNI inline int64_t x8_rows16(const LinearArgs& a, const QuantRows& xq, int64_t m0, int64_t n0,
                                                int64_t n1) {
  int64_t n = n0;
  for (; n + 2 * kX8Rows <= n1; n += 2 * kX8Rows) {
    const uint8_t* g0 = static_cast<const uint8_t*>(a.w) + n * a.w_stride;
    __m512 y[R];
    x8_tile16<T, R>(g0, g0 + kX8Rows * a.w_stride, xq, m0, a.K / 32, y);
    for (int r = 0; r < R; ++r)
      _mm512_storeu_ps(a.y + (m0 + r) * a.y_stride + n,
                       a.bias ? _mm512_add_ps(y[r], _mm512_loadu_ps(a.bias + n)) : y[r]);
  }
  return n;
}

// Columns [n0, n1) in groups of 8 (x8_columns: in place, or gathered through a row map; only
// then can n1 - n0 end in a partial group); two groups at a time (x8_tile16, AVX-512 VNNI) in
// a call of at least kWideFrom rows.
template <DType T, int kVnni, int64_t kWideFrom, int R>
MTP_TARGET(Avx2) inline void x8_rows(const LinearArgs& a, const QuantRows& xq, int64_t m0, int64_t n0,
                                          int64_t n1) {
  const int64_t nb = a.K / 32;
  thread_local std::vector<uint8_t> gathered;
  int64_t n = n0;
  if constexpr (kVnni == 1 && block_elems(T) == 32)  // where the groups lie in place
    if (!a.w_rows && a.M >= kWideFrom) n = x8_rows16<T, R>(a, xq, m0, n0, n1);
  for (; n < n1; n += kX8Rows) {
    __m256 y[R];
    if constexpr (block_elems(T) == 256)
      x8_tile_k<T, kVnni, R>(x8_columns(a, n, n1, gathered), xq, m0, nb, y);
    else
      x8_tile<T, kVnni, R>(x8_columns(a, n, n1, gathered), xq, m0, nb, y);
    const int64_t cols = std::min<int64_t>(kX8Rows, n1 - n);
    for (int r = 0; r < R; ++r) {
      alignas(32) float out[kX8Rows];
      _mm256_store_ps(out, y[r]);
      for (int64_t c = 0; c < cols; ++c) a.y[(m0 + r) * a.y_stride + n + c] = a.bias ? out[c] + a.bias[n + c] : out[c];
    }
  }
}

template <DType T, int kVnni, int R>
MTP_TARGET(Avx2) inline void gguf_rows(const LinearArgs& a, const QuantRows& xq, int64_t m0, int64_t n0,
                                            int64_t n1) {
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

// rows (1..R) as a template argument: Tile<R>::run for the largest R that fits.
template <template <int> class Tile, int R>
inline void rows_of(int rows, const LinearArgs& a, const QuantRows& xq, int64_t m0, int64_t n0, int64_t n1) {
  if constexpr (R > 1) {
    if (rows < R) return rows_of<Tile, R - 1>(rows, a, xq, m0, n0, n1);
  }
  Tile<R>::run(a, xq, m0, n0, n1);
}

// Columns [n0, n1) of every row, the rows in equal groups of at most kRows (9 = 3 + 3 + 3:
// a group shares each decoded block), or in one group up to kOneGroup rows: a verify pass of
// 1 + 8 drafts split 5 + 4 read every matrix twice, 1.3x the time of 8 rows on a Xeon (bench/
// RESULTS.md, "Nine rows in one group"). Any grouping gives the same bits.
template <template <int> class Tile, int kRows, int kOneGroup = kRows>
inline void in_row_groups(const LinearArgs& a, const QuantRows& xq, int64_t n0, int64_t n1) {
  if constexpr (kOneGroup > kRows)
    if (a.M <= kOneGroup) return rows_of<Tile, kOneGroup>(int(a.M), a, xq, 0, n0, n1);
  const int64_t groups = (a.M + kRows - 1) / kRows;
  for (int64_t i = 0, m = 0; i < groups; ++i) {
    const int rows = int((a.M - m) / (groups - i));
    rows_of<Tile, kRows>(rows, a, xq, m, n0, n1);
    m += rows;
  }
}

// The R-row pass of a layout (kX8: x8_rows, else gguf_rows) as rows_of's Tile<R>.
template <DType T, int kVnni, bool kX8, int64_t kWideFrom>
struct Layout {
  template <int R>
  struct Of {
    static void run(const LinearArgs& a, const QuantRows& xq, int64_t m0, int64_t n0, int64_t n1) {
      if constexpr (kX8)
        x8_rows<T, kVnni, kWideFrom, R>(a, xq, m0, n0, n1);
      else
        gguf_rows<T, kVnni, R>(a, xq, m0, n0, n1);
    }
  };
};

// kRows: rows sharing a decoded file-layout block; kRowsX8: rows sharing an x8 chunk (up to
// kOneGroupX8 in a call of that many rows); kWideFrom: x8_rows' threshold.
template <int kVnni, int kRows, int kRowsX8, int kOneGroupX8, int64_t kWideFrom>
inline void gguf_linear_vnni(const LinearArgs& a, const QuantRows& xq, int64_t n0, int64_t n1) {
  switch (a.w_dtype) {
    case DType::Q4_0:
      return in_row_groups<Layout<DType::Q4_0, kVnni, false, kWideFrom>::template Of, kRows>(a, xq, n0, n1);
    case DType::Q4_1:
      return in_row_groups<Layout<DType::Q4_1, kVnni, false, kWideFrom>::template Of, kRows>(a, xq, n0, n1);
    case DType::Q5_0:
      return in_row_groups<Layout<DType::Q5_0, kVnni, false, kWideFrom>::template Of, kRows>(a, xq, n0, n1);
    case DType::Q8_0:
      return in_row_groups<Layout<DType::Q8_0, kVnni, false, kWideFrom>::template Of, kRows>(a, xq, n0, n1);
    case DType::Q4_K:
      return in_row_groups<Layout<DType::Q4_K, kVnni, false, kWideFrom>::template Of, kRows>(a, xq, n0, n1);
    case DType::Q6_K:
      return in_row_groups<Layout<DType::Q6_K, kVnni, false, kWideFrom>::template Of, kRows>(a, xq, n0, n1);
    case DType::Q4_0_X8:
      return in_row_groups<Layout<DType::Q4_0, kVnni, true, kWideFrom>::template Of, kRowsX8, kOneGroupX8>(a, xq, n0,
                                                                                                           n1);
    case DType::Q4_1_X8:
      return in_row_groups<Layout<DType::Q4_1, kVnni, true, kWideFrom>::template Of, kRowsX8, kOneGroupX8>(a, xq, n0,
                                                                                                           n1);
    case DType::Q4_K_X8:
      return in_row_groups<Layout<DType::Q4_K, kVnni, true, kWideFrom>::template Of, kRowsX8, kOneGroupX8>(a, xq, n0,
                                                                                                           n1);
    case DType::Q6_K_X8:
      return in_row_groups<Layout<DType::Q6_K, kVnni, true, kWideFrom>::template Of, kRowsX8, kOneGroupX8>(a, xq, n0,
                                                                                                           n1);
    default:
      return in_row_groups<Layout<DType::Q8_0, kVnni, true, kWideFrom>::template Of, kRowsX8, kOneGroupX8>(a, xq, n0,
                                                                                                           n1);
  }
}

// The entry points: each a flatten function of its target, into which everything above is
// inlined (the VNNI helpers have their own targets and inline only there).
#define MTP_GGUF_ENTRY_POINT(TARGET, NAME, VNNI, ROWS, ROWS_X8, ONE_GROUP_X8, WIDE_FROM)                               \
  TARGET __attribute__((flatten)) inline void NAME(const LinearArgs& a, const QuantRows& xq, int64_t n0, int64_t n1) { \
    gguf_linear_vnni<VNNI, ROWS, ROWS_X8, ONE_GROUP_X8, WIDE_FROM>(a, xq, n0, n1);                                     \
  }
MTP_GGUF_ENTRY_POINT(MTP_TARGET_AVX512_VNNI, gguf_linear_avx512_vnni, 1, 4, 8, 9, kWideTileRows)
MTP_GGUF_ENTRY_POINT(MTP_TARGET_AVX512_VNNI, gguf_linear_avx512_vnni_wide, 1, 4, 8, 9, 1)
MTP_GGUF_ENTRY_POINT(MTP_TARGET(Avx512), gguf_linear_avx512_madd, 0, 4, 8, 8, 0)
MTP_GGUF_ENTRY_POINT(MTP_TARGET_AVX2_VNNI, gguf_linear_avx2_vnni, 2, 2, 4, 4, 0)
MTP_GGUF_ENTRY_POINT(MTP_TARGET(Avx2), gguf_linear_avx2_madd, 0, 2, 4, 4, 0)

// AVX-512 (32 vector registers: groups of 4 rows, x8 8, 9 in one with VNNI) with AVX-512
// VNNI where present (its two-group tile from one row where that pays); AVX2 (16 registers:
// 2 rows, x8 4) with AVX-VNNI where present. The same bits either way.
inline void gguf_linear(Avx512, const LinearArgs& a, const QuantRows& xq, int64_t n0, int64_t n1) {
  if (!has_avx512_vnni()) return gguf_linear_avx512_madd(a, xq, n0, n1);
  wide_tile_pays() ? gguf_linear_avx512_vnni_wide(a, xq, n0, n1) : gguf_linear_avx512_vnni(a, xq, n0, n1);
}
inline void gguf_linear(Avx2, const LinearArgs& a, const QuantRows& xq, int64_t n0, int64_t n1) {
  has_avx_vnni() ? gguf_linear_avx2_vnni(a, xq, n0, n1) : gguf_linear_avx2_madd(a, xq, n0, n1);
}

}  // namespace mtp::x86
