/* One decode step of attention through the C API of libmtp_core: append the new token's key
 * and value to a KV cache kept as [B, Lmax, Hkv, D] (seen as [B, Hkv, Lmax, D] through
 * strides, nothing copied), then attend over the cache. All keys are zero here, so each query
 * weighs the 3 cached values equally and the output is their mean (exact in fp32):
 *   (0 3 6 9 + 3 3 3 3 + 6 0 3 0) / 3 = 3 2 4 4 for both query heads (GQA: 2 query heads
 * share the one kv head). */
#include <stdio.h>

#include "mtp/mtp.h"

enum { B = 1, Hq = 2, Hkv = 1, D = 4, Lmax = 8 };

static mtp_tensor cache_view(float* buf) { /* [B, Lmax, Hkv, D] buffer as [B, Hkv, Lmax, D] */
  int64_t sizes[4] = {B, Hkv, Lmax, D};
  mtp_tensor t = mtp_contiguous(buf, MTP_FLOAT32, 4, sizes);
  t.strides[0] = Lmax * Hkv * D;
  t.strides[1] = D;
  t.strides[2] = Hkv * D;
  return t;
}

int main(void) {
  static float kbuf[B][Lmax][Hkv][D], vbuf[B][Lmax][Hkv][D] = {{{{0, 3, 6, 9}}, {{3, 3, 3, 3}}}};
  float k_new[B][1][Hkv][D] = {{{{0, 0, 0, 0}}}}, v_new[B][1][Hkv][D] = {{{{6, 0, 3, 0}}}};
  float q[B][1][Hq][D] = {{{{1, 2, 3, 4}, {-1, 0, 1, 0}}}}, out[B][1][Hq][D] = {{{{0}}}};
  int32_t lens[B] = {2}; /* two tokens cached */
  int64_t new_sizes[4] = {B, 1, Hkv, D}, q_sizes[4] = {B, 1, Hq, D}, lens_size[1] = {B};
  int h, d;

  mtp_tensor k = cache_view(&kbuf[0][0][0][0]), v = cache_view(&vbuf[0][0][0][0]);
  mtp_tensor kn = mtp_contiguous(k_new, MTP_FLOAT32, 4, new_sizes),
             vn = mtp_contiguous(v_new, MTP_FLOAT32, 4, new_sizes);
  mtp_tensor qv = mtp_contiguous(q, MTP_FLOAT32, 4, q_sizes), ov = mtp_contiguous(out, MTP_FLOAT32, 4, q_sizes);
  mtp_tensor lv = mtp_contiguous(lens, MTP_INT32, 1, lens_size);

  mtp_status st = mtp_cache_append(&k, &v, &kn, &vn, &lv, 1);
  if (st == MTP_OK) {
    lens[0] += 1; /* the caller advances the length */
    st = mtp_head_attention(&qv, &k, &v, &lv, NULL, NULL, NULL, /*causal=*/0, &ov, 1);
  }
  if (st != MTP_OK) {
    fprintf(stderr, "%s: %s\n", mtp_status_name(st), mtp_last_error());
    return 1;
  }
  for (h = 0; h < Hq; ++h) {
    printf("head %d:", h);
    for (d = 0; d < D; ++d) printf(" %.3f", out[0][0][h][d]);
    printf("\n");
  }

  /* A full cache is refused, and nothing is written. */
  lens[0] = Lmax;
  st = mtp_cache_append(&k, &v, &kn, &vn, &lv, 1);
  printf("full cache: %s: %s\n", mtp_status_name(st), mtp_last_error());
  return st == MTP_ERROR_INVALID_ARGUMENT ? 0 : 1;
}
