// The same probe op as poc.cpp through the C++ API (TORCH_LIBRARY), for the per-call A/B.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

namespace {
std::tuple<at::Tensor, at::Tensor> probe(const at::Tensor& x, const c10::optional<at::Tensor>& opt, at::TensorList ws,
                                         at::OptionalIntArrayRef types, c10::optional<int64_t> g,
                                         c10::optional<double> s, bool flag) {
  int64_t total = 0;
  for (const at::Tensor& w : ws) total += w.numel();
  const int64_t ntypes = types ? int64_t(types->size()) : -1;
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor filled = at::empty({8}, x.options().dtype(at::kLong));
  int64_t* p = filled.data_ptr<int64_t>();
  p[0] = opt.has_value() ? opt->numel() : -1; p[1] = total; p[2] = ntypes; p[3] = g.value_or(-1);
  p[4] = s ? int64_t(*s * 1000) : -1; p[5] = flag; p[6] = at::get_num_threads();
  at::Tensor y = at::empty({1000}, x.options().dtype(at::kFloat));
  float* py = y.data_ptr<float>();
  at::parallel_for(0, 1000, 1, [&](int64_t b, int64_t e) { for (int64_t i = b; i < e; ++i) py[i] = float(i); });
  double sum = 0;
  for (int i = 0; i < 1000; ++i) sum += py[i];
  p[7] = int64_t(sum);
  return {filled, xf};
}
}  // namespace

TORCH_LIBRARY(mtpclassic, m) {
  m.def("probe(Tensor x, Tensor? opt, Tensor[] ws, int[]? types, int? g, float? s, bool flag) -> (Tensor, Tensor)");
}
TORCH_LIBRARY_IMPL(mtpclassic, CPU, m) { m.impl("probe", &probe); }
