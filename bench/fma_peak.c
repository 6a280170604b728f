// One core's rate of 512-bit VFMADD (16 fp32 multiply-adds), VDPBF16PS (32 bf16 products
// into 16 fp32 lanes) and VPDPBUSD (64 int8 products into 16 int32 lanes: the GGUF kernels'
// dot product: an extra row of a verify pass costs at least its products / this rate)
// with 1, 4, 8 and 16 independent chains: one chain gives the latency, many the issue rate.
// What decides the linear layer's default instruction set (mtp/isa.h).
//   gcc -O2 -mavx512f -mavx512bf16 -mavx512vnni bench/fma_peak.c -o /tmp/fma_peak && /tmp/fma_peak
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// CHAINS accumulators, each updated N / CHAINS times by OP; prints instructions and products
// per second. The start values come from a volatile so that the chains stay distinct.
#define RATE(CHAINS, NAME, OP, PRODUCTS) \
  RATE_OF(__m512, _mm512_set1_ps, _mm512_reduce_add_ps, CHAINS, NAME, OP, PRODUCTS)
#define RATE_OF(VEC, SET1, REDUCE, CHAINS, NAME, OP, PRODUCTS)                                                      \
  {                                                                                                                 \
    VEC a[CHAINS];                                                                                                  \
    volatile float start = 0.5f;                                                                                    \
    for (int j = 0; j < CHAINS; ++j) a[j] = SET1(start + j);                                                        \
    const long n = 200000000 / CHAINS;                                                                              \
    const double t0 = now();                                                                                        \
    for (long i = 0; i < n; ++i) {                                                                                  \
      _Pragma("GCC unroll 16") for (int j = 0; j < CHAINS; ++j) a[j] = OP(a[j]);                                    \
    }                                                                                                               \
    const double s = now() - t0;                                                                                    \
    float sink = 0;                                                                                                 \
    for (int j = 0; j < CHAINS; ++j) sink += REDUCE(a[j]);                                                          \
    printf("%-9s %2d chains: %.2f G instructions/s, %6.1f G products/s  (%g)\n", NAME, CHAINS, n* CHAINS / s / 1e9, \
           n * CHAINS * (double)PRODUCTS / s / 1e9, sink);                                                          \
  }

int main(void) {
  const __m512 x = _mm512_set1_ps(1.0000001f), y = _mm512_set1_ps(0.9999999f);
  volatile short one = 0x3f80;  // bf16 1.0
  const __m512bh b = (__m512bh)_mm512_set1_epi16(one);
#define FMA(acc) _mm512_fmadd_ps(acc, x, y)
#define DOT(acc) _mm512_dpbf16_ps(acc, b, b)
  RATE(1, "vfmadd", FMA, 16);
  RATE(4, "vfmadd", FMA, 16);
  RATE(8, "vfmadd", FMA, 16);
  RATE(16, "vfmadd", FMA, 16);
  RATE(1, "vdpbf16ps", DOT, 32);
  RATE(4, "vdpbf16ps", DOT, 32);
  RATE(8, "vdpbf16ps", DOT, 32);
  RATE(16, "vdpbf16ps", DOT, 32);
  volatile char w = 3;  // unsigned weight bytes times signed activation bytes
  const __m512i u = _mm512_set1_epi8(w), v = _mm512_set1_epi8((char)(w - 5));
#define DPBUSD(acc) _mm512_dpbusd_epi32(acc, u, v)
#define RATE_I(CHAINS) RATE_OF(__m512i, _mm512_set1_epi32, _mm512_reduce_add_epi32, CHAINS, "vpdpbusd", DPBUSD, 64)
  RATE_I(1);
  RATE_I(4);
  RATE_I(8);
  RATE_I(16);
  return 0;
}
