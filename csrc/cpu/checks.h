// Argument checks shared by the CPU bindings: every message names the op, the argument,
// what was expected and what came.
#pragma once
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <initializer_list>
#include <utility>
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "mtp/common.h"

namespace mtp::cpu {

inline std::string dtype_list(std::initializer_list<at::ScalarType> ok) {
  std::ostringstream s;
  const char* sep = "";
  for (auto t : ok) { s << sep << t; sep = " or "; }
  return s.str();
}

inline void check_dtype(const char* op, const char* name, const at::Tensor& t, std::initializer_list<at::ScalarType> ok) {
  for (auto d : ok) if (t.scalar_type() == d) return;
  TORCH_CHECK(false, op, ": ", name, " must be ", dtype_list(ok), ", got ", t.scalar_type());
}

inline void check_dim(const char* op, const char* name, const at::Tensor& t, int64_t dim, const char* shape) {
  TORCH_CHECK(t.dim() == dim, op, ": ", name, " must be ", dim, "-D ", shape, ", got shape ", t.sizes());
}

inline void check_size(const char* op, const char* name, const at::Tensor& t, int64_t d, int64_t want, const char* what) {
  TORCH_CHECK(t.size(d) == want, op, ": ", name, ".size(", d, ") must equal ", what, " = ", want, ", got ", t.size(d),
              " (shape ", t.sizes(), ")");
}

inline void check_cpu(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu(), op, ": ", name, " must be on the CPU like the other arguments, got ", t.device());
}

constexpr std::initializer_list<at::ScalarType> kIdTypes = {at::kInt, at::kLong};
constexpr std::initializer_list<at::ScalarType> kFloatTypes = {at::kFloat, at::kBFloat16, at::kHalf};

inline DType to_dtype(at::ScalarType t) {
  return t == at::kFloat ? DType::F32 : t == at::kBFloat16 ? DType::BF16 : DType::F16;
}

inline void check_same_dtype(const char* op, const char* name, const at::Tensor& t, const char* ref_name,
                             const at::Tensor& ref) {
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), op, ": ", name, " must have ", ref_name, "'s dtype ",
              ref.scalar_type(), ", got ", t.scalar_type());
}

// A [B] vector of int32/int64 counts, each checked to lie in [0, hi], as int64 values
// (a plain loop: these vectors are tiny and tensor ops cost microseconds per decode step).
// b_what / hi_what say where B and hi come from.
inline std::vector<int64_t> checked_counts(const char* op, const char* name, const at::Tensor& n, int64_t B,
                                           const char* b_what, int64_t hi, const char* hi_what) {
  check_cpu(op, name, n);
  check_dtype(op, name, n, kIdTypes);
  check_dim(op, name, n, 1, "[B]");
  check_size(op, name, n, 0, B, b_what);
  std::vector<int64_t> out(B);
  AT_DISPATCH_INDEX_TYPES(n.scalar_type(), "checked_counts", [&] {
    const index_t* p = n.data_ptr<index_t>();
    for (int64_t b = 0; b < B; ++b) {
      out[b] = p[b * n.stride(0)];
      TORCH_CHECK(out[b] >= 0 && out[b] <= hi, op, ": ", name, " must lie in [0, ", hi_what, "] = [0, ", hi,
                  "], got ", name, "[", b, "] = ", out[b]);
    }
  });
  return out;
}

// num_drafts as int64 values in [0, K] (all K when absent).
inline std::vector<int64_t> checked_num_drafts(const char* op, const c10::optional<at::Tensor>& nd, int64_t B,
                                               int64_t K) {
  if (!nd.has_value()) return std::vector<int64_t>(B, K);
  return checked_counts(op, "num_drafts", *nd, B, "B (draft_tokens.size(0))", K, "K");
}

// Raises "op: msg" unless msg is empty (the checks shared with the C API, mtp/op_args.h).
inline void check_ok(const char* op, const std::string& msg) { TORCH_CHECK(msg.empty(), op, ": ", msg); }

// Runs fn(begin, end) over [0, n) on torch's intra-op thread pool.
struct TorchParallelFor {
  template <class Fn>
  void operator()(int64_t n, Fn&& fn) const {
    at::parallel_for(0, n, 1, [&](int64_t b, int64_t e) { fn(b, e); });
  }
};

}  // namespace mtp::cpu
