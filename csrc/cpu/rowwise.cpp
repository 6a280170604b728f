// CPU bindings of the row-local layer ops (mtp.rms_norm, mtp.add_rms_norm, mtp.rope_,
// mtp.silu_mul, mtp.gelu_tanh_mul): checks, tensors -> rows and strides. No threads: see
// mtp/rowwise.h.
#include <torch/csrc/stable/library.h>

#include <cmath>

#include "../torch/adapter.h"
#include "mtp/rowwise.h"

namespace mtp::cpu {
namespace {

using namespace mtp::torch_adapter;  // csrc/torch/adapter.h

constexpr const char* kRmsNorm = "mtp.rms_norm";
constexpr const char* kAddRmsNorm = "mtp.add_rms_norm";
constexpr const char* kRope = "mtp.rope_";
constexpr const char* kSiluMul = "mtp.silu_mul";
constexpr const char* kGeluTanhMul = "mtp.gelu_tanh_mul";

// t [..., n] as [M, n] rows with a unit element stride: a view when its layout allows, else
// a copy (activations are small).
Tensor as_rows(const Tensor& t, int64_t n) {
  Tensor r = torch::stable::reshape(t, {leading_rows(t), n});
  return n > 1 && r.stride(1) != 1 ? torch::stable::contiguous(r) : r;
}

void check_norm_inputs(const char* op, const Tensor& x, const Tensor& weight, double eps) {
  check_cpu(op, "x", x);
  check_cpu(op, "weight", weight);
  check_dtype(op, "x", x, kFloatTypes);
  MTP_CHECK(x.dim() >= 1, op, ": x must have at least 1 dimension [..., H], got a scalar");
  check_dtype(op, "weight", weight, kFloatTypes);
  check_dim(op, "weight", weight, 1, "[H]");
  check_size(op, "weight", weight, 0, x.size(-1), "H (x.size(-1))");
  check_ok(op, eps_error(eps));  // as the float the kernel gets
}

// out = RMSNorm(residual ? x + residual : x); sum (when residual) = x + residual.
void run_rms_norm(const Tensor& x, const Tensor* residual, const Tensor& weight, double eps, Tensor& out, Tensor* sum) {
  const int64_t H = x.size(-1);
  if (x.numel() == 0) return;
  const Tensor xr = as_rows(x, H), w = torch::stable::contiguous(weight);
  RmsNormArgs a;
  a.M = xr.size(0);
  a.H = H;
  a.dtype = to_dtype(x.scalar_type());
  a.x = xr.data_ptr();
  a.x_stride = xr.stride(0);
  Tensor rr;
  if (residual) {
    rr = as_rows(*residual, H);
    a.residual = rr.data_ptr();
    a.residual_stride = rr.stride(0);
    a.sum = sum->data_ptr();
    a.sum_stride = H;
  }
  a.out = out.data_ptr();
  a.out_stride = H;
  a.weight = w.data_ptr();
  a.w_dtype = to_dtype(w.scalar_type());
  a.eps = float(eps);
  rms_norm(a, current_isa());
}

Tensor rms_norm_cpu(const Tensor& x, const Tensor& weight, double eps) {
  check_norm_inputs(kRmsNorm, x, weight, eps);
  Tensor out = empty_like_on(x, x.sizes());
  run_rms_norm(x, nullptr, weight, eps, out, nullptr);
  return out;
}

std::tuple<Tensor, Tensor> add_rms_norm_cpu(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps) {
  check_norm_inputs(kAddRmsNorm, x, weight, eps);
  check_cpu(kAddRmsNorm, "residual", residual);
  check_same_dtype(kAddRmsNorm, "residual", residual, "x", x);
  MTP_CHECK(same_shape(residual, x), kAddRmsNorm, ": residual must have x's shape ", shape_of(x), ", got ",
            shape_of(residual));
  Tensor sum = empty_like_on(x, x.sizes()), out = empty_like_on(x, x.sizes());
  run_rms_norm(x, &residual, weight, eps, out, &sum);
  return {sum, out};
}

void rope_cpu(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  check_cpu(kRope, "x", x);
  check_dtype(kRope, "x", x, kFloatTypes);
  check_dim(kRope, "x", x, 4, "[B, T, H, D]");
  MTP_CHECK(x.size(3) % 2 == 0, kRope, ": x.size(3) (the head dim D, rotated as two halves) must be even, got ",
            x.size(3));
  RopeArgs a;
  a.B = x.size(0);
  a.T = x.size(1);
  a.H = x.size(2);
  a.D = x.size(3);
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"cos", &cos}, {"sin", &sin}}) {
    check_cpu(kRope, name, *t);
    check_dtype(kRope, name, *t, {ScalarType::Float});
    check_dim(kRope, name, *t, 3, "[B, T, D]");
    check_size(kRope, name, *t, 0, a.B, "B (x.size(0))");
    check_size(kRope, name, *t, 1, a.T, "T (x.size(1))");
    check_size(kRope, name, *t, 2, a.D, "D (x.size(3))");
  }
  // x is rotated in place: its elements distinct, no memory shared with the tables.
  check_written(kRope, "it is rotated in place", {{"x", &x}}, {{"cos", &cos}, {"sin", &sin}});
  if (x.numel() == 0) return;
  a.dtype = to_dtype(x.scalar_type());
  a.x = x.data_ptr();
  strides_of(x, a.x_stride);
  a.cos = cos.mutable_data_ptr<float>();
  a.sin = sin.mutable_data_ptr<float>();
  for (int d = 0; d < 3; ++d) {
    a.cos_stride[d] = cos.stride(d);
    a.sin_stride[d] = sin.stride(d);
  }
  rope(a, current_isa());
}

// act(gate) * up of gate_up [..., 2I] -> [..., I] (mtp.silu_mul, mtp.gelu_tanh_mul).
Tensor gated_mul_cpu(const char* op, GatedAct act, const Tensor& gate_up) {
  check_cpu(op, "gate_up", gate_up);
  check_dtype(op, "gate_up", gate_up, kFloatTypes);
  MTP_CHECK(gate_up.dim() >= 1, op, ": gate_up must have at least 1 dimension [..., 2I], got a scalar");
  const int64_t n = gate_up.size(-1), I = n / 2;
  MTP_CHECK(n % 2 == 0, op, ": gate_up.size(-1) must be even [..., 2I] (gate, then up), got ", n);
  std::vector<int64_t> shape = sizes_vec(gate_up);
  shape.back() = I;
  Tensor out = empty_like_on(gate_up, shape);
  if (out.numel() == 0) return out;
  const Tensor x = as_rows(gate_up, n);
  GatedMulArgs a;
  a.act = act;
  a.M = x.size(0);
  a.I = I;
  a.dtype = to_dtype(gate_up.scalar_type());
  a.x = x.data_ptr();
  a.x_stride = x.stride(0);
  a.out = out.data_ptr();
  a.out_stride = I;
  gated_mul(a, current_isa());
  return out;
}

Tensor silu_mul_cpu(const Tensor& gate_up) { return gated_mul_cpu(kSiluMul, GatedAct::Silu, gate_up); }

Tensor gelu_tanh_mul_cpu(const Tensor& gate_up) { return gated_mul_cpu(kGeluTanhMul, GatedAct::GeluTanh, gate_up); }

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(mtp, CPU, m) {
  m.impl("rms_norm", TORCH_BOX(&rms_norm_cpu));
  m.impl("add_rms_norm", TORCH_BOX(&add_rms_norm_cpu));
  m.impl("rope_", TORCH_BOX(&rope_cpu));
  m.impl("silu_mul", TORCH_BOX(&silu_mul_cpu));
  m.impl("gelu_tanh_mul", TORCH_BOX(&gelu_tanh_mul_cpu));
}

}  // namespace mtp::cpu
