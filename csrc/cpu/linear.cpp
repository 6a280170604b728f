// CPU binding of mtp.linear: the shape-invariant small-M linear layer (float, int8 Q8 or GGUF
// block-type weights).
#include <torch/csrc/stable/library.h>

#include "../torch/adapter.h"
#include "mtp/op_args.h"

namespace mtp::cpu {
namespace {

using namespace mtp::torch_adapter;  // csrc/torch/adapter.h

constexpr const char* kLinear = "mtp.linear";

Tensor linear_cpu(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias,
                  const std::optional<Tensor>& weight_scale, bool quantize_x, std::optional<int64_t> gguf_type) {
  check_cpu(kLinear, "x", x);
  LinearCall c = prepare_linear(kLinear, x, weight, bias, weight_scale, quantize_x, gguf_type);
  if (c.args.M == 0 || c.args.N == 0) return c.result();
  if (c.out_dtype != ScalarType::BFloat16) {
    linear(c.args, current_isa(), TorchParallelFor{});
    return c.result();
  }
  // bf16 out: rounded where each column block was computed, not by a copy after the call
  Tensor out = empty_like_on(x, c.out_shape);
  linear_to_bf16(c.args, reinterpret_cast<uint16_t*>(out.data_ptr()), c.args.N, current_isa(), TorchParallelFor{});
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(mtp, CPU, m) { m.impl("linear", TORCH_BOX(&linear_cpu)); }

}  // namespace mtp::cpu
