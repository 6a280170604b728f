// x86 linear (AVX-512, AVX-512 + AVX512_BF16, AVX2+FMA+F16C): the simd/ kernel over the V512 /
// V256 traits. bf16 activations times bf16 weights on AVX-512 take chunks of 32 elements as 16
// pairs: lane l adds the product of elements 2l+1, then that of 2l (bf16 products are exact in
// fp32) — the order of VDPBF16PS, which Isa::Avx512Bf16 runs as one instruction (it also
// flushes subnormals to zero, so the two agree except where subnormals occur).
#pragma once
#include <type_traits>

#include "mtp/simd/linear.h"
#include "mtp/x86/vec.h"

namespace mtp::x86 {

// The bf16 x bf16 steps' common part: rows located and leftovers added as LaneDot does.
using Bf16Lanes = simd::LaneDot<V512, DType::BF16, DType::BF16>;

struct PairDot512 : Bf16Lanes {
  struct Pairs { __m512 odd, even; };
  using X = Pairs;
  using Wt = Pairs;
  static constexpr int kChunk = 32;
  MTP_TARGET_AVX512 static void load(Pairs& out, const void* p, int64_t k) {
    const __m512i v = _mm512_loadu_si512(static_cast<const uint16_t*>(p) + k);
    out.odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xffff0000u))));
    out.even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  }
  MTP_TARGET_AVX512 static void load_x(Pairs& out, const void* x, int64_t k) { load(out, x, k); }
  MTP_TARGET_AVX512 static void load_w(Pairs& out, const void* w, int64_t k) { load(out, w, k); }
  MTP_TARGET_AVX512 static void step(__m512& acc, const Pairs& x, const Pairs& w) {
    acc = _mm512_fmadd_ps(x.even, w.even, _mm512_fmadd_ps(x.odd, w.odd, acc));
  }
};

struct Bf16Dot512 : Bf16Lanes {
  using X = __m512bh;
  using Wt = __m512bh;
  static constexpr int kChunk = 32;
  MTP_TARGET_AVX512_BF16 static void load(__m512bh& out, const void* p, int64_t k) {
    out = (__m512bh)_mm512_loadu_si512(static_cast<const uint16_t*>(p) + k);
  }
  MTP_TARGET_AVX512_BF16 static void load_x(__m512bh& out, const void* x, int64_t k) { load(out, x, k); }
  MTP_TARGET_AVX512_BF16 static void load_w(__m512bh& out, const void* w, int64_t k) { load(out, w, k); }
  MTP_TARGET_AVX512_BF16 static void step(__m512& acc, const __m512bh& x, const __m512bh& w) {
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

MTP_LINEAR_ENTRY_POINT_WITH(MTP_TARGET_AVX512, V512, linear_avx512, Avx512Dot)
MTP_LINEAR_ENTRY_POINT_WITH(MTP_TARGET_AVX512_BF16, V512, linear_avx512_bf16, Avx512Bf16Dot)
MTP_LINEAR_ENTRY_POINT(MTP_TARGET_AVX2, V256, linear_avx2)

}  // namespace mtp::x86
