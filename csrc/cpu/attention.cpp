// CPU bindings of mtp.head_attention and mtp.cache_append: checks, tensors -> pointers
// and strides (caches are read and written in place, whatever their strides), threads.
#include <torch/library.h>

#include <algorithm>
#include <string>

#include "checks.h"
#include "mtp/op_args.h"

namespace mtp::cpu {
namespace {

constexpr const char* kAttn = "mtp.head_attention";
constexpr const char* kAppend = "mtp.cache_append";

// The cache views of either op's argument struct, read/written in place.
template <class Args>
void set_caches(Args& a, const at::Tensor& k_cache, const at::Tensor& v_cache, const std::vector<int64_t>& lens) {
  set_cache_views(a, k_cache.data_ptr(), k_cache.strides().data(), v_cache.data_ptr(), v_cache.strides().data(),
                  lens.data());
}

// k_cache / v_cache: [B, Hkv, L, D] views of `ref`'s dtype, both the same shape.
void check_caches(const char* op, const at::Tensor& k, const at::Tensor& v, const char* ref_name, const at::Tensor& ref) {
  check_cpu(op, "k_cache", k);
  check_cpu(op, "v_cache", v);
  check_dim(op, "k_cache", k, 4, "[B, Hkv, L, D]");
  check_dim(op, "v_cache", v, 4, "[B, Hkv, L, D]");
  check_same_dtype(op, "k_cache", k, ref_name, ref);
  check_same_dtype(op, "v_cache", v, ref_name, ref);
  TORCH_CHECK(v.sizes() == k.sizes(), op, ": v_cache must have k_cache's shape ", k.sizes(), ", got ", v.sizes());
}

at::Tensor head_attention_cpu(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                              const at::Tensor& cache_lens, const c10::optional<at::Tensor>& k_local,
                              const c10::optional<at::Tensor>& v_local, c10::optional<double> scale, bool causal) {
  check_cpu(kAttn, "q", q);
  check_dtype(kAttn, "q", q, kFloatTypes);
  check_dim(kAttn, "q", q, 4, "[B, T, Hq, D]");
  check_caches(kAttn, k_cache, v_cache, "q", q);
  const int64_t B = q.size(0), T = q.size(1), Hq = q.size(2), D = q.size(3);
  const int64_t Hkv = k_cache.size(1), L = k_cache.size(2);
  check_size(kAttn, "k_cache", k_cache, 0, B, "B (q.size(0))");
  check_size(kAttn, "k_cache", k_cache, 3, D, "the head dim D (q.size(3))");
  check_ok(kAttn, gqa_error(Hq, Hkv));
  std::vector<int64_t> lens = checked_counts(kAttn, "cache_lens", cache_lens, B, "B (q.size(0))", L, "L (k_cache.size(2))");
  check_ok(kAttn, causal_error(lens, T, causal));
  check_ok(kAttn, local_pair_error(k_local.has_value(), v_local.has_value()));

  AttentionArgs a;
  a.B = B; a.T = T; a.Hq = Hq; a.Hkv = Hkv; a.D = D;
  a.dtype = to_dtype(q.scalar_type());
  a.q = q.data_ptr();
  std::copy_n(q.strides().data(), 4, a.q_stride);
  set_caches(a, k_cache, v_cache, lens);
  if (k_local.has_value()) {
    const at::Tensor &kl = *k_local, &vl = *v_local;
    check_cpu(kAttn, "k_local", kl);
    check_cpu(kAttn, "v_local", vl);
    check_dim(kAttn, "k_local", kl, 4, "[B, Hkv, S, D]");
    check_same_dtype(kAttn, "k_local", kl, "q", q);
    check_same_dtype(kAttn, "v_local", vl, "q", q);
    check_size(kAttn, "k_local", kl, 0, B, "B (q.size(0))");
    check_size(kAttn, "k_local", kl, 1, Hkv, "Hkv (k_cache.size(1))");
    check_size(kAttn, "k_local", kl, 3, D, "the head dim D (q.size(3))");
    TORCH_CHECK(vl.sizes() == kl.sizes(), kAttn, ": v_local must have k_local's shape ", kl.sizes(), ", got ",
                vl.sizes());
    set_local_views(a, kl.size(2), kl.data_ptr(), kl.strides().data(), vl.data_ptr(), vl.strides().data());
  }
  a.scale = scale.has_value() ? float(*scale) : default_attention_scale(D);
  a.causal = causal;
  at::Tensor out = at::empty({B, T, Hq, D}, q.options());
  a.out = out.data_ptr();
  attention(a, at::get_num_threads(), current_isa(), TorchParallelFor{});
  return out;
}

void cache_append_cpu(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k_new,
                      const at::Tensor& v_new, const at::Tensor& cache_lens) {
  check_cpu(kAppend, "k_new", k_new);
  check_cpu(kAppend, "v_new", v_new);
  check_dtype(kAppend, "k_new", k_new, kFloatTypes);
  check_dim(kAppend, "k_new", k_new, 4, "[B, T, Hkv, D]");
  check_same_dtype(kAppend, "v_new", v_new, "k_new", k_new);
  TORCH_CHECK(v_new.sizes() == k_new.sizes(), kAppend, ": v_new must have k_new's shape ", k_new.sizes(), ", got ",
              v_new.sizes());
  check_caches(kAppend, k_cache, v_cache, "k_new", k_new);
  const int64_t B = k_new.size(0), T = k_new.size(1), Hkv = k_new.size(2), D = k_new.size(3), L = k_cache.size(2);
  check_size(kAppend, "k_cache", k_cache, 0, B, "B (k_new.size(0))");
  check_size(kAppend, "k_cache", k_cache, 1, Hkv, "Hkv (k_new.size(2))");
  check_size(kAppend, "k_cache", k_cache, 3, D, "the head dim D (k_new.size(3))");
  std::vector<int64_t> lens = checked_counts(kAppend, "cache_lens", cache_lens, B, "B (k_new.size(0))", L, "L (k_cache.size(2))");

  CacheAppendArgs a;
  a.B = B; a.T = T; a.Hkv = Hkv; a.D = D; a.L = L;
  a.dtype = to_dtype(k_new.scalar_type());
  set_caches(a, k_cache, v_cache, lens);
  set_new_views(a, k_new.data_ptr(), k_new.strides().data(), v_new.data_ptr(), v_new.strides().data());
  check_ok(kAppend, capacity_error(a));
  cache_append(a, TorchParallelFor{});
}

}  // namespace

TORCH_LIBRARY_IMPL(mtp, CPU, m) {
  m.impl("head_attention", &head_attention_cpu);
  m.impl("cache_append", &cache_append_cpu);
}

}  // namespace mtp::cpu
