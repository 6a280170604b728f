// CPU bindings of mtp.head_attention and mtp.cache_append: checks (shared with the CUDA
// bindings, torch/adapter.h), tensors -> pointers and strides (caches are read and written in
// place, whatever their strides), threads.
#include <torch/csrc/stable/library.h>

#include "../torch/adapter.h"

namespace mtp::cpu {
namespace {

using namespace mtp::torch_adapter;  // csrc/torch/adapter.h

constexpr const char* kAttn = "mtp.head_attention";
constexpr const char* kAppend = "mtp.cache_append";

Tensor head_attention_cpu(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& cache_lens,
                          const std::optional<Tensor>& k_local, const std::optional<Tensor>& v_local,
                          std::optional<double> scale, bool causal, std::optional<int64_t> window) {
  AttentionArgs a = attention_args(kAttn, q, k_cache, v_cache, k_local, v_local, scale, causal, kCpu);
  check_ok(kAttn, set_window(a, window.value_or(0), k_local.has_value()));
  std::vector<int64_t> lens =
      checked_counts(kAttn, "cache_lens", cache_lens, a.B, "B (q.size(0))", k_cache.size(2), "L (k_cache.size(2))");
  check_attention_lens(kAttn, a, lens);
  a.cache_lens = lens.data();
  Tensor out = empty_like_on(q, {a.B, a.T, a.Hq, a.D});
  a.out = out.data_ptr();
  attention(a, int(torch::stable::get_num_threads()), current_isa(), TorchParallelFor{});
  return out;
}

void cache_append_cpu(const Tensor& k_cache, const Tensor& v_cache, const Tensor& k_new, const Tensor& v_new,
                      const Tensor& cache_lens) {
  CacheAppendArgs a = cache_append_args(kAppend, k_cache, v_cache, k_new, v_new, kCpu);
  std::vector<int64_t> lens =
      checked_counts(kAppend, "cache_lens", cache_lens, a.B, "B (k_new.size(0))", a.L, "L (k_cache.size(2))");
  check_append_lens(kAppend, a, lens);
  a.cache_lens = lens.data();
  cache_append(a, TorchParallelFor{});
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(mtp, CPU, m) {
  m.impl("head_attention", TORCH_BOX(&head_attention_cpu));
  m.impl("cache_append", TORCH_BOX(&cache_append_cpu));
}

}  // namespace mtp::cpu
