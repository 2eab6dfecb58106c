// The "cpu" INT8 linear layer's choice between two products, made when the step runs: the operator
// course_lib::int8_linear that compiled decode graphs call (course_lib/quant/linear.py, QuantLinear).
//
// Eager steps choose in Python by their number of rows: PyTorch's weight-only op
// (torch._weight_int8pack_mm) for a few rows, where it reads the int8 weight fastest, and from
// many_rows rows a bfloat16 matmul of the codes cast to bfloat16, scaled after, where the op computes far
// below the CPU's bfloat16 kernels (figures at INT8_DEQUANTIZE_ROWS in linear.py). A branch on the rows
// inside torch.compile would need a graph for each side; inside this operator it costs nothing, so a
// compiled step of 64 sequences gets the matmul and one of 1 to 23 the op, from the same graph.

#include <torch/extension.h>

// x [m, in] bfloat16, codes [out, in] int8, scales [out] bfloat16 -> x @ (codes * scales)^T, [m, out] bfloat16.
// The many-row side is the "torch" backend's formula (F.linear of the codes cast, times the scales): the
// same operations, so the same bits as an eager step of as many rows.
torch::Tensor int8_linear(const torch::Tensor& x, const torch::Tensor& codes, const torch::Tensor& scales,
                          int64_t many_rows) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "int8_linear: bfloat16 x [m, in]");
  if (x.size(0) < many_rows) return at::_weight_int8pack_mm(x, codes, scales);
  return at::linear(x, codes.to(x.scalar_type())) * scales.to(x.scalar_type());
}

TORCH_LIBRARY_FRAGMENT(course_lib, m) {
  m.def("int8_linear(Tensor x, Tensor codes, Tensor scales, int many_rows) -> Tensor");
}
TORCH_LIBRARY_IMPL(course_lib, CPU, m) { m.impl("int8_linear", &int8_linear); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int8_linear", &int8_linear, "x [m, in] bf16 @ int8 weight: the op below many_rows rows, else bf16 matmul",
        py::arg("x"), py::arg("codes"), py::arg("scales"), py::arg("many_rows"));
}
