// CPU binding of mtp.linear: the shape-invariant small-M linear layer.
#include <torch/library.h>

#include "checks.h"
#include "mtp/op_args.h"

namespace mtp::cpu {
namespace {

constexpr const char* kLinear = "mtp.linear";

at::Tensor linear_cpu(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  check_cpu(kLinear, "x", x);
  check_cpu(kLinear, "weight", weight);
  check_dtype(kLinear, "x", x, {at::kFloat, at::kBFloat16});
  check_dtype(kLinear, "weight", weight, {at::kFloat, at::kBFloat16});
  TORCH_CHECK(x.dim() >= 1, kLinear, ": x must have at least 1 dimension [..., K], got a scalar");
  check_dim(kLinear, "weight", weight, 2, "[N, K]");
  const int64_t K = x.size(-1), N = weight.size(0);
  check_size(kLinear, "weight", weight, 1, K, "K (x.size(-1))");
  check_ok(kLinear, weight_rows_error(K, weight.stride(0), weight.stride(1)));
  at::Tensor b;
  if (bias.has_value()) {
    check_cpu(kLinear, "bias", *bias);
    check_dim(kLinear, "bias", *bias, 1, "[N]");
    check_size(kLinear, "bias", *bias, 0, N, "N (weight.size(0))");
    b = bias->to(at::kFloat).contiguous();
  }
  const int64_t M = c10::multiply_integers(x.sizes().slice(0, x.dim() - 1));
  at::Tensor x2 = x.reshape({M, K}).contiguous();  // activations are small: a copy only if strided
  at::Tensor y = at::empty({M, N}, x.options().dtype(at::kFloat));

  LinearArgs a;
  a.M = M; a.N = N; a.K = K;
  a.x = x2.data_ptr(); a.x_dtype = to_dtype(x.scalar_type()); a.x_stride = K;
  a.w = weight.data_ptr(); a.w_dtype = to_dtype(weight.scalar_type()); a.w_stride = weight.stride(0);
  a.bias = b.defined() ? b.data_ptr<float>() : nullptr;
  a.y = y.data_ptr<float>(); a.y_stride = N;
  if (M > 0 && N > 0) linear(a, current_isa(), TorchParallelFor{});

  auto out_shape = x.sizes().vec();
  out_shape.back() = N;
  return y.to(x.scalar_type()).reshape(out_shape);
}

}  // namespace

TORCH_LIBRARY_IMPL(mtp, CPU, m) { m.impl("linear", &linear_cpu); }

}  // namespace mtp::cpu
