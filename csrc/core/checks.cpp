#include "checks.h"

#include <algorithm>

#include "mtp/op_args.h"
#include "mtp/parallel.h"

namespace mtp::capi {

std::string& last_error() {
  thread_local std::string message;
  return message;
}

const char* dtype_name(int32_t dtype) {
  switch (dtype) {
    case MTP_FLOAT32: return "float32";
    case MTP_BFLOAT16: return "bfloat16";
    case MTP_FLOAT16: return "float16";
    case MTP_INT32: return "int32";
    case MTP_INT64: return "int64";
    case MTP_INT8: return "int8";
    case MTP_Q4_0:
    case MTP_Q4_1:
    case MTP_Q5_0:
    case MTP_Q8_0:
    case MTP_Q4_K:
    case MTP_Q6_K:
    case MTP_Q4_0_X8:
    case MTP_Q4_1_X8:
    case MTP_Q8_0_X8:
    case MTP_Q4_K_X8:
    case MTP_Q6_K_X8: return block_type_name(DType(dtype));
    default: return "unknown";
  }
}

namespace {
std::string dims_of(const mtp_tensor* t, const int64_t* v) {
  std::ostringstream s;
  s << "[";
  for (int32_t d = 0; d < t->ndim && d < MTP_MAX_DIMS; ++d) s << (d ? ", " : "") << v[d];
  s << "]";
  return s.str();
}
std::string sizes_of(const mtp_tensor* t) { return dims_of(t, t->sizes); }
std::string strides_of(const mtp_tensor* t) { return dims_of(t, t->strides); }
}  // namespace

bool Checker::tensor(const char* name, const mtp_tensor* t, int32_t ndim, const char* shape,
                     std::initializer_list<mtp_dtype> ok) {
  if (!t) return fail(MTP_ERROR_NULL_POINTER, name, " is NULL");
  bool known = false;
  for (mtp_dtype d : ok) known |= t->dtype == d;
  if (!known) {
    std::ostringstream want;
    const char* sep = "";
    for (mtp_dtype d : ok) {
      want << sep << dtype_name(d);
      sep = " or ";
    }
    return fail(MTP_ERROR_UNSUPPORTED_DTYPE, name, " must be ", want.str(), ", got ", dtype_name(t->dtype),
                " (dtype value ", t->dtype, ")");
  }
  if (t->ndim != ndim)
    return fail(MTP_ERROR_INVALID_ARGUMENT, name, " must be ", ndim, "-D ", shape, ", got ndim = ", t->ndim);
  int64_t extent = 0;  // offset of the last element
  bool empty = false;
  for (int32_t d = 0; d < ndim; ++d) {
    if (t->sizes[d] < 0)
      return fail(MTP_ERROR_INVALID_ARGUMENT, name, ".sizes[", d, "] must be >= 0, got ", t->sizes[d]);
    if (t->strides[d] < 0)
      return fail(MTP_ERROR_INVALID_ARGUMENT, name, ".strides[", d, "] must be >= 0, got ", t->strides[d]);
    empty |= t->sizes[d] == 0;
  }
  // The kernels form row addresses (index * stride * element bytes) before any loop runs, even
  // for an empty view or over a size-1 dimension: every stride and the extent over the non-empty
  // dimensions must be byte offsets int64 holds (8: the widest element).
  for (int32_t d = 0; d < ndim; ++d) {
    int64_t step;
    if (__builtin_mul_overflow(t->strides[d], int64_t(8), &step) ||
        __builtin_mul_overflow(std::max<int64_t>(t->sizes[d] - 1, 0), t->strides[d], &step) ||
        __builtin_add_overflow(extent, step, &extent) || __builtin_mul_overflow(extent + 1, int64_t(8), &step))
      return fail(MTP_ERROR_INVALID_ARGUMENT, name, " of sizes ", sizes_of(t),
                  " has an extent beyond int64 bytes (strides ", strides_of(t), ")");
  }
  int64_t numel = 1;  // loops run over the sizes: their product must be countable
  for (int32_t d = 0; d < ndim && !empty; ++d)
    if (!checked_mul(numel, t->sizes[d], &numel))
      return fail(MTP_ERROR_INVALID_ARGUMENT, name, " of sizes ", sizes_of(t), " has more elements than int64 counts");
  if (!t->data && !empty)
    return fail(MTP_ERROR_NULL_POINTER, name, ".data is NULL for a non-empty ", sizes_of(t), " view");
  return true;
}

bool Checker::size(const char* name, const mtp_tensor* t, int32_t d, int64_t want, const char* what) {
  if (t->sizes[d] == want) return true;
  return fail(MTP_ERROR_INVALID_ARGUMENT, name, ".sizes[", d, "] must equal ", what, " = ", want, ", got ", t->sizes[d],
              " (sizes ", sizes_of(t), ")");
}

bool Checker::same_sizes(const char* name, const mtp_tensor* t, const char* ref_name, const mtp_tensor* ref) {
  for (int32_t d = 0; d < ref->ndim; ++d)
    if (t->sizes[d] != ref->sizes[d])
      return fail(MTP_ERROR_INVALID_ARGUMENT, name, " must have ", ref_name, "'s sizes ", sizes_of(ref), ", got ",
                  sizes_of(t));
  return true;
}

bool Checker::block_rows(const std::string& name, const mtp_tensor* t) {
  const DType dt = DType(t->dtype);
  const int64_t N = t->sizes[0], K = t->sizes[1];
  const int64_t row_bytes = K % block_elems(dt) == 0 ? block_row_bytes(dt, K) : 0;
  if (std::string e = gguf_weight_error(dt, N, K, row_bytes, t->strides[0], t->strides[1]); !e.empty())
    return fail(MTP_ERROR_INVALID_ARGUMENT, name, ": ", e);
  if (N > 1 && t->strides[0] < row_bytes)
    return fail(MTP_ERROR_INVALID_ARGUMENT, name, ": a ", block_type_name(dt), " row of K = ", K, " elements is ",
                row_bytes, " bytes, so strides[0] (bytes between rows, for a block dtype) must be >= ", row_bytes,
                ", got ", t->strides[0]);
  return true;
}

bool Checker::counts(const char* name, const mtp_tensor* t, int64_t B, const char* b_what, int64_t hi,
                     const char* hi_what, std::vector<int64_t>* out) {
  if (!tensor(name, t, 1, "[B]", kIdTypes) || !size(name, t, 0, B, b_what)) return false;
  out->assign(size_t(B), 0);
  for (int64_t b = 0; b < B; ++b) {
    int64_t n = load_id(t, b * t->strides[0]);
    if (n < 0 || n > hi)
      return fail(MTP_ERROR_INVALID_ARGUMENT, name, "[", b, "] = ", n, " is outside [0, ", hi_what, "] = [0, ", hi,
                  "]");
    (*out)[size_t(b)] = n;
  }
  return true;
}

bool Checker::num_drafts(const mtp_tensor* t, int64_t B, int64_t K, std::vector<int64_t>* out) {
  if (!t) {
    out->assign(size_t(B), K);
    return true;
  }
  return counts("num_drafts", t, B, "B (draft_tokens.sizes[0])", K, "K", out);
}

bool Checker::threads(int32_t num_threads, int* out) {
  if (num_threads < 0)
    return fail(MTP_ERROR_INVALID_ARGUMENT, "num_threads must be >= 0 (0: one per hardware thread), got ", num_threads);
  if (num_threads > MTP_MAX_THREADS)  // an error, not a clamp: the pool never grows past the cap
    return fail(MTP_ERROR_INVALID_ARGUMENT, "num_threads must be <= MTP_MAX_THREADS = ", MTP_MAX_THREADS,
                " (the thread cap), got ", num_threads);
  *out = resolve_threads(num_threads);
  return true;
}

static_assert(MTP_MAX_THREADS == kMaxThreads, "mtp.h's MTP_MAX_THREADS must equal parallel.h's kMaxThreads");

}  // namespace mtp::capi
