/* One draft-and-verify step through the C API of libmtp_core, on made-up numbers.
 * Two requests, K = 3 drafted tokens each, a vocabulary of V = 6. The backbone's logits for
 * the K+1 positions are written so that its greedy tokens are known:
 *   request 0: greedy 4 1 5 2, drafts 4 1 3 -> accepts 2, then the correction 5
 *   request 1: greedy 0 3 3 1, drafts 0 3 3 -> accepts all 3, then the bonus token 1 */
#include <stdio.h>

#include "mtp/mtp.h"

enum { B = 2, K = 3, V = 6 };

int main(void) {
  const int greedy[B][K + 1] = {{4, 1, 5, 2}, {0, 3, 3, 1}};
  int32_t drafts[B][K] = {{4, 1, 3}, {0, 3, 3}};
  float logits[B][K + 1][V];
  int32_t accepted[B] = {0}, out_tokens[B][K + 1] = {{0}};
  int64_t draft_sizes[2] = {B, K}, logit_sizes[3] = {B, K + 1, V}, acc_sizes[1] = {B}, out_sizes[2] = {B, K + 1};
  int b, t, v;

  for (b = 0; b < B; ++b)
    for (t = 0; t <= K; ++t)
      for (v = 0; v < V; ++v) logits[b][t][v] = (v == greedy[b][t]) ? 2.5f : -0.25f * (float)v;

  mtp_tensor d = mtp_contiguous(drafts, MTP_INT32, 2, draft_sizes);
  mtp_tensor l = mtp_contiguous(logits, MTP_FLOAT32, 3, logit_sizes);
  mtp_tensor a = mtp_contiguous(accepted, MTP_INT32, 1, acc_sizes);
  mtp_tensor o = mtp_contiguous(out_tokens, MTP_INT32, 2, out_sizes);

  /* NULL num_drafts: every request drafted K tokens; pad_id -1; 2 threads. */
  mtp_status st = mtp_verify(&d, &l, NULL, -1, &a, &o, 2);
  if (st != MTP_OK) {
    fprintf(stderr, "mtp_verify: %s: %s\n", mtp_status_name(st), mtp_last_error());
    return 1;
  }
  for (b = 0; b < B; ++b) {
    printf("request %d: accepted %d, tokens", b, (int)accepted[b]);
    for (t = 0; t <= K; ++t) printf(" %d", (int)out_tokens[b][t]);
    printf("\n");
  }

  /* A bad argument is reported, not crashed on: num_threads must be >= 0. */
  st = mtp_verify(&d, &l, NULL, -1, &a, &o, -1);
  printf("bad call: %s: %s\n", mtp_status_name(st), mtp_last_error());
  return st == MTP_ERROR_INVALID_ARGUMENT ? 0 : 1;
}
