/* mtp.h: the C API of the torch-free core (libmtp_core). Plain C (C99 and later) and C++.
 *
 * Arrays are passed as mtp_tensor views: a data pointer, a dtype, sizes and strides in
 * elements (any non-negative strides: slices of bigger buffers are fine, nothing is copied).
 * Every function validates all its arguments and returns a status; it never aborts or throws.
 * On failure mtp_last_error() gives a message naming the function, the argument, what was
 * expected and what came, and the outputs are left untouched (all checks precede any write).
 *
 * The kernels are the same ones the torch ops (torch.ops.mtp.*) run: same results, bit for bit.
 */
#ifndef MTP_MTP_H_
#define MTP_MTP_H_

#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define MTP_API __attribute__((visibility("default")))
#else
#define MTP_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mtp_status {
  MTP_OK = 0,
  MTP_ERROR_NULL_POINTER = 1,     /* a required pointer is NULL */
  MTP_ERROR_INVALID_ARGUMENT = 2, /* wrong rank, size, stride or value */
  MTP_ERROR_UNSUPPORTED_DTYPE = 3,/* unknown dtype, or one the argument does not take */
  MTP_ERROR_UNSUPPORTED = 4,      /* e.g. an instruction set this CPU lacks */
  MTP_ERROR_OUT_OF_MEMORY = 5,
  MTP_ERROR_INTERNAL = 6
} mtp_status;

/* Element types. The values are part of the ABI. */
typedef enum mtp_dtype {
  MTP_FLOAT32 = 0,
  MTP_BFLOAT16 = 1,
  MTP_FLOAT16 = 2,
  MTP_INT32 = 3,
  MTP_INT64 = 4
} mtp_dtype;

#define MTP_MAX_DIMS 6

/* A strided view. dtype is an int32_t holding an mtp_dtype, so that a bad value can be
 * reported rather than being undefined behaviour. Inputs are only read through `data`. */
typedef struct mtp_tensor {
  void* data;
  int32_t dtype;
  int32_t ndim;
  int64_t sizes[MTP_MAX_DIMS];
  int64_t strides[MTP_MAX_DIMS]; /* in elements */
} mtp_tensor;

/* A row-major contiguous view of `ndim` (<= MTP_MAX_DIMS) sizes. */
static inline mtp_tensor mtp_contiguous(const void* data, mtp_dtype dtype, int32_t ndim, const int64_t* sizes) {
  mtp_tensor t;
  int32_t d;
  int64_t stride = 1;
  t.data = (void*)data;
  t.dtype = (int32_t)dtype;
  t.ndim = ndim;
  for (d = 0; d < MTP_MAX_DIMS; ++d) { t.sizes[d] = 0; t.strides[d] = 0; }
  for (d = ndim - 1; d >= 0 && d < MTP_MAX_DIMS; --d) {
    t.sizes[d] = sizes[d];
    t.strides[d] = stride;
    stride *= sizes[d];
  }
  return t;
}

/* Greedy chain verification (torch.ops.mtp.verify).
 *   draft_tokens  [B, K]      int32 | int64
 *   target_logits [B, K+1, V] float32 | bfloat16 | float16, V >= 1, any strides
 *   num_drafts    [B]         int32 | int64, each in [0, K]; NULL: all K
 *   accepted      [B]         output, dtype of draft_tokens
 *   out_tokens    [B, K+1]    output, dtype of draft_tokens
 * accepted[b] = the longest prefix n <= num_drafts[b] with draft == argmax of the logits
 * (ties, NaN and -0.0 as torch.argmax); out_tokens[b] = the n drafts, the backbone's token at
 * position n, then pad_id. A draft id outside [0, V) never matches.
 * num_threads: 1 = serial on the calling thread, 0 = one per hardware thread; results never
 * depend on it. */
MTP_API mtp_status mtp_verify(const mtp_tensor* draft_tokens, const mtp_tensor* target_logits,
                              const mtp_tensor* num_drafts, int64_t pad_id, const mtp_tensor* accepted,
                              const mtp_tensor* out_tokens, int32_t num_threads);

/* accepted[b] = longest n <= num_drafts[b] with draft_tokens[b, t] == target_tokens[b, t] for
 * t < n (torch.ops.mtp.accept_prefix).
 *   draft_tokens [B, K] int32 | int64;  target_tokens [B, K+1] or [B, K] int32 | int64
 *   num_drafts   [B] int32 | int64 or NULL;  accepted [B] output, dtype of draft_tokens */
MTP_API mtp_status mtp_accept_prefix(const mtp_tensor* draft_tokens, const mtp_tensor* target_tokens,
                                     const mtp_tensor* num_drafts, const mtp_tensor* accepted);

/* The message of this thread's last failed call ("" after a successful one). Valid until the
 * thread's next mtp_* call. */
MTP_API const char* mtp_last_error(void);

/* "MTP_OK", "MTP_ERROR_NULL_POINTER", ... ("unknown status" otherwise). */
MTP_API const char* mtp_status_name(mtp_status status);

/* Instruction sets: "generic", "avx2", "avx512", "neon", "neon_fp16". The best one the CPU
 * supports is chosen at load time unless the environment variable MTP_ISA names another. */
MTP_API const char* mtp_get_isa(void);
MTP_API int mtp_isa_supported(const char* name); /* 1 or 0 (0 for an unknown name) */
MTP_API mtp_status mtp_set_isa(const char* name); /* process-wide */

#ifdef __cplusplus
}
#endif

#endif /* MTP_MTP_H_ */
