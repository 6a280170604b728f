// x86 linear (AVX-512, AVX-512 + AVX512_BF16, AVX2+FMA+F16C): the simd/ kernel over the V512 /
// V256 traits. bf16 activations times bf16 weights on AVX-512 take chunks of 32 elements as 16
// pairs: lane l adds the product of elements 2l+1, then that of 2l (bf16 products are exact in
// fp32) — the order of VDPBF16PS, which Isa::Avx512Bf16 runs as one instruction (it also
// flushes subnormals to zero, so the two agree except where subnormals occur).
#pragma once
#include <cstring>
#include <type_traits>

#include "mtp/simd/linear.h"
#include "mtp/x86/vec.h"

namespace mtp::x86 {

// The bf16 x bf16 steps' common part: rows located and leftovers added as LaneDot does.
using Bf16Lanes = simd::LaneDot<V512, DType::BF16, DType::BF16>;

// The activations are split into their odd and even halves once per call (kPreparesX: per
// chunk 16 floats of elements 2l+1, then 16 of elements 2l), so that a tile step costs the
// two FMAs and its share of the weights' split only.
struct PairDot512 : Bf16Lanes {
  struct Pairs {
    __m512 odd, even;
  };
  using X = Pairs;
  using Wt = Pairs;
  static constexpr int kChunk = 32, kPreparedFloats = 32;
  static constexpr bool kPreparesX = true, kWideTiles = true;
  MTP_TARGET(Avx512) static void load(Pairs& out, const void* p, int64_t k) {
    const __m512i v = _mm512_loadu_si512(static_cast<const uint16_t*>(p) + k);
    out.odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xffff0000u))));
    out.even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  }
  MTP_TARGET(Avx512) static void prepare_x(float* out, const void* x, int64_t kv) {
    Pairs p;
    for (int64_t k = 0; k < kv; k += kChunk) {
      load(p, x, k);
      _mm512_storeu_ps(out + k, p.odd);
      _mm512_storeu_ps(out + k + 16, p.even);
    }
  }
  MTP_TARGET(Avx512) static void load_x(Pairs& out, const void* x, int64_t k) {
    const float* p = static_cast<const float*>(x) + k;
    out.odd = _mm512_loadu_ps(p);
    out.even = _mm512_loadu_ps(p + 16);
  }
  MTP_TARGET(Avx512) static void load_w(Pairs& out, const void* w, int64_t k) { load(out, w, k); }
  MTP_TARGET(Avx512) static void step(__m512& acc, const Pairs& x, const Pairs& w) {
    acc = _mm512_fmadd_ps(x.even, w.even, _mm512_fmadd_ps(x.odd, w.odd, acc));
  }
};

// One VDPBF16PS per chunk, x read as given. Wide tiles (4 weight rows from 3 to 5 rows); the
// weights ahead go to L2 only: with the L1 prefetch too, passes of 1-5 rows streaming their
// weights from DRAM ran 4-12% slower than on `avx512` (AMD EPYC; without it 0.91x-1.08x,
// bench/history/2026-11.md "VDPBF16PS on AMD").
struct Bf16Dot512 : Bf16Lanes {
  using X = __m512bh;
  using Wt = __m512bh;
  static constexpr int kChunk = 32;
  static constexpr bool kWideTiles = true, kPrefetchL1 = false;
  MTP_TARGET(Avx512Bf16) static void load(__m512bh& out, const void* p, int64_t k) {
    out = (__m512bh)_mm512_loadu_si512(static_cast<const uint16_t*>(p) + k);
  }
  MTP_TARGET(Avx512Bf16) static void load_x(__m512bh& out, const void* x, int64_t k) { load(out, x, k); }
  MTP_TARGET(Avx512Bf16) static void load_w(__m512bh& out, const void* w, int64_t k) { load(out, w, k); }
  MTP_TARGET(Avx512Bf16) static void step(__m512& acc, const __m512bh& x, const __m512bh& w) {
    acc = _mm512_dpbf16_ps(acc, x, w);
  }
};

// The step of each (activation, weight) dtype pair: pairs for bf16 x bf16, lanes otherwise.
template <class BF16_STEP>
struct DotFor {
  template <class V, DType XT, DType WT>
  using type = std::conditional_t<XT == DType::BF16 && WT == DType::BF16, BF16_STEP, simd::LaneDot<V, XT, WT>>;
};
template <class V, DType XT, DType WT>
using Avx512Dot = DotFor<PairDot512>::type<V, XT, WT>;
template <class V, DType XT, DType WT>
using Avx512Bf16Dot = DotFor<Bf16Dot512>::type<V, XT, WT>;

// ---- quantize_x: integer dot products (simd::Int8DotBase). With VNNI, VPDPBUSD (u8 x s8)
// takes the weight offset to unsigned (q ^ 0x80 = q + 128) and starts from -128 * the x
// values' lane sums, which leaves exactly sum q * x (any int8 q, -128 included). Without
// VNNI, VPMADDUBSW takes |q| (<= 128) times x with q's sign (|x| <= 127: the int16 pair sums
// cannot saturate), then VPMADDWD adds the pairs: the same int32 lanes.

// acc += the dot products of 4 u8 x s8 per int32 lane (VPDPBUSD). Out of line with their own
// target so that the steps keep the base one (the madd variants must compile without VNNI);
// flatten inlines them into the VNNI entry points.
MTP_TARGET_AVX512_VNNI inline void dpbusd(__m512i& acc, const __m512i& u8, const __m512i& s8) {
  acc = _mm512_dpbusd_epi32(acc, u8, s8);
}
MTP_TARGET_AVX2_VNNI inline void dpbusd(__m256i& acc, const __m256i& u8, const __m256i& s8) {
  acc = _mm256_dpbusd_avx_epi32(acc, u8, s8);
}

// AVX-512: a chunk is 64 elements, two blocks: int32 lanes 0-7 the first, 8-15 the second.
// The quantized rows are prepared once per call (kPreparesX): per chunk the 64 values, the
// two scales spread over their lanes and, with VNNI, the offset correction, so that a tile
// step reads them instead of recomputing them for every weight tile.
template <bool kVnni>
struct Int8Dot512 : simd::Int8DotBase {
  static constexpr int kChunk = 64, kPreparedFloats = kVnni ? 48 : 32;  // q, scale (, corr): 16 floats each
  static constexpr bool kPreparesX = true, kWideTiles = true;
  struct X {
    __m512i q, corr;
    __m512 scale;
  };  // corr: VNNI only
  struct Wt {
    __m512i q;
    __mmask64 neg;
    __m512 scale;
  };
  // Two block scales, each over its 8 lanes; m: which of the two to read.
  MTP_TARGET(Avx512) static __m512 halves(const float* s, __mmask16 m) {
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                 _mm512_maskz_loadu_ps(m, s));
  }
  MTP_TARGET(Avx512) static void prepare_x(float* out, const void* row, int64_t kv) {
    for (int64_t k = 0; k < kv; k += kChunk, out += kPreparedFloats) {
      const __m512i q = _mm512_loadu_si512(xq(row, k));
      _mm512_storeu_si512(out, q);
      _mm512_storeu_ps(out + 16, halves(xs(row, k), 3));
      if constexpr (kVnni) {
        const __m512i neg_x = _mm512_sub_epi8(_mm512_setzero_si512(), q);  // |x| <= 127: no overflow
        __m512i corr = _mm512_setzero_si512();
        dpbusd(corr, _mm512_set1_epi8(char(0x80)), neg_x);
        _mm512_storeu_si512(out + 32, corr);
      }
    }
  }
  MTP_TARGET(Avx512) static void load_x(X& out, const void* prepared, int64_t k) {
    const float* p = static_cast<const float*>(prepared) + k / kChunk * kPreparedFloats;
    out.q = _mm512_loadu_si512(p);
    out.scale = _mm512_loadu_ps(p + 16);
    if constexpr (kVnni) out.corr = _mm512_loadu_si512(p + 32);
  }
  MTP_TARGET(Avx512) static void load_w(Wt& out, Col w, int64_t k) {
    const int64_t left = w.K - k;  // the last chunk: zeros past K, and its second scale only if that block exists
    const __m512i q = left >= 64 ? _mm512_loadu_si512(w.q + k) : _mm512_maskz_loadu_epi8((1ull << left) - 1, w.q + k);
    out.scale = halves(w.s + k / kQ8Block, left > kQ8Block ? 3 : 1);
    if constexpr (kVnni) {
      out.q = _mm512_xor_si512(q, _mm512_set1_epi8(char(0x80)));
    } else {
      out.q = _mm512_abs_epi8(q);
      out.neg = _mm512_movepi8_mask(q);
    }
  }
  MTP_TARGET(Avx512) static void step(__m512& acc, const X& x, const Wt& w) {
    __m512i sums;
    if constexpr (kVnni) {
      sums = x.corr;
      dpbusd(sums, w.q, x.q);
    } else {
      const __m512i signed_x = _mm512_mask_sub_epi8(x.q, w.neg, _mm512_setzero_si512(), x.q);
      sums = _mm512_madd_epi16(_mm512_maddubs_epi16(w.q, signed_x), _mm512_set1_epi16(1));
    }
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_mul_ps(x.scale, w.scale), acc);
  }
};

// AVX2: a chunk is one block of 32 elements, 8 int32 lanes.
template <bool kVnni>
struct Int8Dot256 : simd::Int8DotBase {
  static constexpr int kChunk = 32;
  struct X {
    __m256i q, corr;
    __m256 scale;
  };  // corr: VNNI only
  struct Wt {
    __m256i q, sign;
    __m256 scale;
  };  // sign: the weights themselves, without VNNI
  MTP_TARGET(Avx2) static void load_x(X& out, const void* row, int64_t k) {
    out.q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq(row, k)));
    out.scale = _mm256_broadcast_ss(xs(row, k));
    if constexpr (kVnni) {
      const __m256i neg_x = _mm256_sub_epi8(_mm256_setzero_si256(), out.q);
      out.corr = _mm256_setzero_si256();
      dpbusd(out.corr, _mm256_set1_epi8(char(0x80)), neg_x);
    }
  }
  MTP_TARGET(Avx2) static void load_w(Wt& out, Col w, int64_t k) {
    const int64_t left = w.K - k;
    alignas(32) int8_t tail[32] = {};  // the last, partial block (AVX2 has no masked byte load)
    const int8_t* p = w.q + k;
    if (left < 32) p = static_cast<const int8_t*>(std::memcpy(tail, p, size_t(left)));
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    out.scale = _mm256_broadcast_ss(w.s + k / kQ8Block);
    if constexpr (kVnni) {
      out.q = _mm256_xor_si256(q, _mm256_set1_epi8(char(0x80)));
    } else {
      out.q = _mm256_abs_epi8(q);
      out.sign = q;
    }
  }
  MTP_TARGET(Avx2) static void step(__m256& acc, const X& x, const Wt& w) {
    __m256i sums;
    if constexpr (kVnni) {
      sums = x.corr;
      dpbusd(sums, w.q, x.q);
    } else {
      sums = _mm256_madd_epi16(_mm256_maddubs_epi16(w.q, _mm256_sign_epi8(x.q, w.sign)), _mm256_set1_epi16(1));
    }
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(x.scale, w.scale), acc);
  }
};

MTP_LINEAR_ENTRY_POINT_WITH(Avx512, V512, Avx512Dot)
MTP_LINEAR_ENTRY_POINT_WITH(Avx512Bf16, V512, Avx512Bf16Dot)
MTP_LINEAR_ENTRY_POINT(Avx2, V256)
MTP_LINEAR_Q8DOT_ENTRY_POINT(MTP_TARGET_AVX512_VNNI, V512, linear_q8dot_avx512_vnni, Int8Dot512<true>)
MTP_LINEAR_Q8DOT_ENTRY_POINT(MTP_TARGET(Avx512), V512, linear_q8dot_avx512_madd, Int8Dot512<false>)
MTP_LINEAR_Q8DOT_ENTRY_POINT(MTP_TARGET_AVX2_VNNI, V256, linear_q8dot_avx2_vnni, Int8Dot256<true>)
MTP_LINEAR_Q8DOT_ENTRY_POINT(MTP_TARGET(Avx2), V256, linear_q8dot_avx2_madd, Int8Dot256<false>)

// quantize_x on Avx512 / Avx2: VNNI where the CPU has it (the same bits either way).
inline void linear_q8dot(Avx512, const LinearArgs& a, int64_t n0, int64_t n1) {
  has_avx512_vnni() ? linear_q8dot_avx512_vnni(a, n0, n1) : linear_q8dot_avx512_madd(a, n0, n1);
}
inline void linear_q8dot(Avx2, const LinearArgs& a, int64_t n0, int64_t n1) {
  has_avx_vnni() ? linear_q8dot_avx2_vnni(a, n0, n1) : linear_q8dot_avx2_madd(a, n0, n1);
}

}  // namespace mtp::x86
