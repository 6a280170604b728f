// Argument checks of the C API, torch-free and exception-free: each returns false after
// recording the first failure (status + message naming the function, the argument, what
// was expected and what came), so an entry point reads `if (!c.tensor(...)) return c.status;`.
#pragma once
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include "mtp/common.h"
#include "mtp/gguf.h"
#include "mtp/mtp.h"

namespace mtp::capi {

// This thread's last error message ("" after a success).
std::string& last_error();

const char* dtype_name(int32_t dtype);                            // "unknown" outside mtp_dtype
inline DType float_dtype(int32_t dtype) { return DType(dtype); }  // mtp_dtype float values == DType

constexpr std::initializer_list<mtp_dtype> kIdTypes = {MTP_INT32, MTP_INT64};
constexpr std::initializer_list<mtp_dtype> kFloatTypes = {MTP_FLOAT32, MTP_BFLOAT16, MTP_FLOAT16};
// GGUF block-quantized weights (mtp/gguf.h): sizes in elements, strides[0] in bytes; the
// mtp_dtype codes are the DType values.
inline bool is_block_dtype(int32_t dtype) { return is_block_type(DType(dtype)); }

class Checker {
 public:
  explicit Checker(const char* op) : op_(op) { last_error().clear(); }

  mtp_status status = MTP_OK;

  // Records the failure (the first one only) and returns false.
  template <class... Parts>
  bool fail(mtp_status s, const Parts&... parts) {
    if (status != MTP_OK) return false;
    std::ostringstream m;
    m << op_ << ": ";
    (m << ... << parts);
    status = s;
    last_error() = m.str();
    return false;
  }

  // A view of rank `ndim` (shape text such as "[B, K]"), dtype among `ok`, sizes and strides
  // >= 0, no int64 overflow in its extent, data non-NULL unless it is empty.
  bool tensor(const char* name, const mtp_tensor* t, int32_t ndim, const char* shape,
              std::initializer_list<mtp_dtype> ok);

  bool size(const char* name, const mtp_tensor* t, int32_t d, int64_t want, const char* what);

  // Every size equal to ref's ("v_cache must have k_cache's sizes").
  bool same_sizes(const char* name, const mtp_tensor* t, const char* ref_name, const mtp_tensor* ref);

  // A weight view [N, K] of a block dtype (already checked by tensor()): K a multiple of the
  // block, strides[1] = 1, an x8 layout's N a multiple of 8 and its rows contiguous
  // (gguf_weight_error's wording), rows strides[0] >= the row's bytes apart. Messages start
  // with `name`.
  bool block_rows(const std::string& name, const mtp_tensor* t);

  // A [B] int32/int64 view (shape already checked to be 1-D) -> int64 values, each checked
  // to lie in [0, hi]; hi_what says where hi comes from ("K", "L (k_cache.sizes[2])").
  bool counts(const char* name, const mtp_tensor* t, int64_t B, const char* b_what, int64_t hi, const char* hi_what,
              std::vector<int64_t>* out);

  // Optional num_drafts [B] (NULL: all K) -> int64 values, each checked to lie in [0, K].
  bool num_drafts(const mtp_tensor* t, int64_t B, int64_t K, std::vector<int64_t>* out);

  // One of the shared value checks of mtp/op_args.h ("" = fine) as an invalid argument.
  bool ok(const std::string& msg) { return msg.empty() || fail(MTP_ERROR_INVALID_ARGUMENT, msg); }

  // num_threads in [0, MTP_MAX_THREADS] (0: one per hardware thread, capped) -> the count to use.
  bool threads(int32_t num_threads, int* out);

 private:
  const char* op_;
};

// Element i of an int32/int64 array, as int64.
inline int64_t load_id(const mtp_tensor* t, int64_t offset) {
  return t->dtype == MTP_INT32 ? static_cast<const int32_t*>(t->data)[offset]
                               : static_cast<const int64_t*>(t->data)[offset];
}

// Calls body(checker) and turns anything thrown (out of memory) into a status: nothing
// crosses the C boundary.
template <class Body>
mtp_status guarded(const char* op, Body&& body) {
  Checker c(op);
#if defined(__cpp_exceptions)
  try {
    return body(c);
  } catch (const std::bad_alloc&) {
    c.fail(MTP_ERROR_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    c.fail(MTP_ERROR_INTERNAL, "internal error: ", e.what());
  } catch (...) {
    c.fail(MTP_ERROR_INTERNAL, "internal error");
  }
  return c.status;
#else
  return body(c);
#endif
}

}  // namespace mtp::capi
