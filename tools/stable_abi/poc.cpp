// Proof of concept (docs/torch-versions.md, built by build.sh): mtp's binding patterns on
// torch's stable C ABI only (STABLE_TORCH_LIBRARY, torch::stable::Tensor, shim functions) and
// the Python limited API for the module object. Not part of the package.
#include <Python.h>

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <optional>
#include <sstream>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "mtp/rowwise.h"

using torch::stable::Tensor;
using torch::headeronly::ScalarType;

namespace {

// Our own check: the message alone (STD_TORCH_CHECK prefixes function, file and line).
template <class... A>
void check(bool ok, const A&... a) {
  if (ok) return;
  std::ostringstream s;
  ((s << a), ...);
  throw std::runtime_error(s.str());
}

mtp::DType to_dtype(ScalarType t) {
  return t == ScalarType::Float ? mtp::DType::F32 : t == ScalarType::BFloat16 ? mtp::DType::BF16 : mtp::DType::F16;
}

Tensor rms_norm(Tensor x, Tensor weight, double eps) {
  check(x.is_cpu(), "mtpstable.rms_norm: x must be on the CPU");
  check(x.scalar_type() == ScalarType::Float || x.scalar_type() == ScalarType::BFloat16 ||
            x.scalar_type() == ScalarType::Half,
        "mtpstable.rms_norm: x must be Float or BFloat16 or Half, got ", x.scalar_type());
  check(weight.dim() == 1 && weight.size(0) == x.size(x.dim() - 1), "mtpstable.rms_norm: weight must be [H], got dim ",
        weight.dim());
  const int64_t H = x.size(x.dim() - 1), M = H ? x.numel() / H : 0;
  Tensor xr = torch::stable::contiguous(torch::stable::reshape(x, {M, H}));
  Tensor w = torch::stable::contiguous(weight);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  Tensor out = torch::stable::empty(shape, x.scalar_type(), std::nullopt, x.device());
  if (M == 0) return out;
  mtp::RmsNormArgs a;
  a.M = M; a.H = H; a.dtype = to_dtype(x.scalar_type());
  a.x = xr.data_ptr(); a.x_stride = xr.stride(0);
  a.out = out.data_ptr(); a.out_stride = H;
  a.weight = w.data_ptr(); a.w_dtype = to_dtype(w.scalar_type());
  a.eps = float(eps);
  mtp::rms_norm(a, mtp::current_isa());
  return out;
}

// Every argument kind of our schemas: Tensor?, Tensor[], int[]?, int?, float?, bool, a tuple
// of tensors out; and parallel_for, get_num_threads, to(dtype), empty on a device.
std::tuple<Tensor, Tensor> probe(Tensor x, std::optional<Tensor> opt, std::vector<Tensor> ws,
                                 std::optional<std::vector<int64_t>> types, std::optional<int64_t> g,
                                 std::optional<double> s, bool flag) {
  int64_t total = 0;
  for (const Tensor& w : ws) total += w.numel();
  const int64_t ntypes = types ? int64_t(types->size()) : -1;
  Tensor xf = torch::stable::to(x, ScalarType::Float);  // a copy when x is not float
  Tensor filled = torch::stable::empty({8}, ScalarType::Long, std::nullopt, x.device());
  int64_t* p = filled.mutable_data_ptr<int64_t>();
  p[0] = opt.has_value() ? opt->numel() : -1; p[1] = total; p[2] = ntypes; p[3] = g.value_or(-1);
  p[4] = s ? int64_t(*s * 1000) : -1; p[5] = flag; p[6] = int64_t(torch::stable::get_num_threads());
  // parallel_for: each element of a float buffer written by the range that owns it.
  Tensor y = torch::stable::empty({1000}, ScalarType::Float, std::nullopt, x.device());
  float* py = y.mutable_data_ptr<float>();
  torch::stable::parallel_for(0, 1000, 1, [&](int64_t b, int64_t e) { for (int64_t i = b; i < e; ++i) py[i] = float(i); });
  double sum = 0;
  for (int i = 0; i < 1000; ++i) sum += py[i];
  p[7] = int64_t(sum);
  check(xf.numel() == x.numel(), "mtpstable.probe: internal error");
  return {filled, xf};
}

}  // namespace

STABLE_TORCH_LIBRARY(mtpstable, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("probe(Tensor x, Tensor? opt, Tensor[] ws, int[]? types, int? g, float? s, bool flag) -> (Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(mtpstable, CPU, m) {
  m.impl("rms_norm", TORCH_BOX(&rms_norm));
  m.impl("probe", TORCH_BOX(&probe));
}

// The module object through the limited API only (abi3).
static PyObject* get_isa(PyObject*, PyObject*) { return PyUnicode_FromString(mtp::isa_name(mtp::current_isa())); }
static PyMethodDef kMethods[] = {{"get_isa", get_isa, METH_NOARGS, "isa"}, {nullptr, nullptr, 0, nullptr}};
static PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_stable_poc", "poc", -1, kMethods};
PyMODINIT_FUNC PyInit__stable_poc(void) { return PyModule_Create(&kModule); }
