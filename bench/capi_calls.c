/* Per-call cost of the C API's argument checks: tiny calls, where the checks are most of the
 * time (verify B=1 K=2 V=64; linear 1x64 @ 64x64 fp32; head_attention B=1 T=1 Hq=3 Hkv=1 D=64
 * over 8 keys; cache_append of one token), then two calls of a real decode step's size beside them
 * (verify B=1 K=5 over SmolLM2's V=49152; linear 1x576 @ 1536x576 bf16-sized fp32). Prints
 * "<call> <median ns>" over 15 timings of `reps` calls each, one thread.
 * bench/ab_capi.sh builds it against two commits' libmtp_core and alternates them.
 *   capi_calls [reps] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mtp/mtp.h"

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

#define TIME(name, call)                                       \
  do {                                                         \
    double t[15];                                              \
    for (int r = 0; r < 15; ++r) {                             \
      const double t0 = now_ns();                              \
      for (long i = 0; i < reps; ++i)                          \
        if ((call) != MTP_OK) {                                \
          fprintf(stderr, "%s: %s\n", name, mtp_last_error()); \
          return 1;                                            \
        }                                                      \
      t[r] = (now_ns() - t0) / reps;                           \
    }                                                          \
    qsort(t, 15, sizeof t[0], cmp);                            \
    printf("%s %.0f\n", name, t[7]);                           \
  } while (0)

int main(int argc, char** argv) {
  long reps = argc > 1 ? atol(argv[1]) : 20000;
  static float logits[3 * 64], x[64], w[64 * 64], y[64], q[3 * 64], kc[8 * 64], vc[8 * 64], o[3 * 64], kn[64], vn[64];
  static int64_t drafts[2] = {1, 2}, acc[1], out[3], lens[1] = {8}, lens_app[1] = {7};
  for (int i = 0; i < 3 * 64; ++i) logits[i] = (float)(i % 13);
  const int64_t sd[] = {1, 2}, sl[] = {1, 3, 64}, s1[] = {1}, so[] = {1, 3}, sx[] = {1, 64}, sw[] = {64, 64},
                sq[] = {1, 1, 3, 64}, sk[] = {1, 1, 8, 64}, sn[] = {1, 1, 1, 64};
  mtp_tensor td = mtp_contiguous(drafts, MTP_INT64, 2, sd), tl = mtp_contiguous(logits, MTP_FLOAT32, 3, sl),
             ta = mtp_contiguous(acc, MTP_INT64, 1, s1), to = mtp_contiguous(out, MTP_INT64, 2, so),
             tx = mtp_contiguous(x, MTP_FLOAT32, 2, sx), tw = mtp_contiguous(w, MTP_FLOAT32, 2, sw),
             ty = mtp_contiguous(y, MTP_FLOAT32, 2, sx), tq = mtp_contiguous(q, MTP_FLOAT32, 4, sq),
             tk = mtp_contiguous(kc, MTP_FLOAT32, 4, sk), tv = mtp_contiguous(vc, MTP_FLOAT32, 4, sk),
             tout = mtp_contiguous(o, MTP_FLOAT32, 4, sq), tlen = mtp_contiguous(lens, MTP_INT64, 1, s1),
             tkn = mtp_contiguous(kn, MTP_FLOAT32, 4, sn), tvn = mtp_contiguous(vn, MTP_FLOAT32, 4, sn),
             tlen7 = mtp_contiguous(lens_app, MTP_INT64, 1, s1);
  TIME("verify", mtp_verify(&td, &tl, NULL, -1, &ta, &to, 1));
  TIME("linear", mtp_linear(&tx, &tw, NULL, &ty, 1));
  TIME("head_attention", mtp_head_attention(&tq, &tk, &tv, &tlen, NULL, NULL, NULL, 0, &tout, 1));
  TIME("cache_append", mtp_cache_append(&tk, &tv, &tkn, &tvn, &tlen7, 1));

  enum { KB = 5, VB = 49152, HB = 576, NB = 1536 };
  float* big_logits = calloc((size_t)(KB + 1) * VB, sizeof(float));
  float *bx = calloc(HB, sizeof(float)), *bw = calloc((size_t)NB * HB, sizeof(float)), *by = calloc(NB, sizeof(float));
  static int64_t bdrafts[KB], bout[KB + 1];
  const int64_t sbd[] = {1, KB}, sbl[] = {1, KB + 1, VB}, sbo[] = {1, KB + 1}, sbx[] = {1, HB}, sbw[] = {NB, HB},
                sby[] = {1, NB};
  mtp_tensor tbd = mtp_contiguous(bdrafts, MTP_INT64, 2, sbd), tbl = mtp_contiguous(big_logits, MTP_FLOAT32, 3, sbl),
             tbo = mtp_contiguous(bout, MTP_INT64, 2, sbo), tbx = mtp_contiguous(bx, MTP_FLOAT32, 2, sbx),
             tbw = mtp_contiguous(bw, MTP_FLOAT32, 2, sbw), tby = mtp_contiguous(by, MTP_FLOAT32, 2, sby);
  const long small = reps;
  reps = small / 50 > 0 ? small / 50 : 1;
  TIME("verify_V49152", mtp_verify(&tbd, &tbl, NULL, -1, &ta, &tbo, 1));
  TIME("linear_576x1536", mtp_linear(&tbx, &tbw, NULL, &tby, 1));
  free(big_logits), free(bx), free(bw), free(by);
  return 0;
}
