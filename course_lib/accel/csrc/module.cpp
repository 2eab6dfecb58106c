// What the extension offers, in one place: the Python functions (pybind11, for eager steps: the cheapest call
// from Python) and the operators compiled graphs call (TORCH_LIBRARY, so Inductor's C++ wrapper calls them
// without going back to Python). The kernels are in fused_ops.cpp, linear.cpp and attention.cpp.

#include <torch/library.h>
#include <torch/python.h>

namespace course_lib {
// fused_ops.cpp
at::Tensor rms_norm(at::Tensor x, at::Tensor weight, double eps);
std::vector<at::Tensor> add_rms_norm(at::Tensor x, at::Tensor add, at::Tensor weight, double eps);
void rope_qk_(at::Tensor qkv, at::Tensor cos, at::Tensor sin, int64_t rot_heads, int64_t head_dim);
at::Tensor silu_mul(at::Tensor gate_up);
// linear.cpp
int64_t panel_width(at::ScalarType dtype);
at::Tensor pack_panels(const at::Tensor& w);
at::Tensor by_panels(const at::Tensor& x, const at::Tensor& panels);
int64_t keep(at::Tensor packed);
void release(int64_t handle);
int64_t kept();
at::Tensor onednn_linear(const at::Tensor& x, int64_t handle, int64_t out_features,
                         const std::optional<at::Tensor>& panels, int64_t panel_rows);
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                       int64_t many_rows);
std::vector<std::string> w4a8_paths();
at::Tensor w4a8_linear(const at::Tensor& x, const at::Tensor& packed, int64_t out_features, const std::string& isa);
// attention.cpp
at::Tensor paged_decode_attention(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache,
                                  at::Tensor block_tables, at::Tensor context_lens,
                                  c10::optional<at::Tensor> k_new, c10::optional<at::Tensor> v_new);
}  // namespace course_lib

TORCH_LIBRARY(course_lib, m) {
  m.def("onednn_linear(Tensor x, int handle, int out_features, Tensor? panels=None, int panel_rows=0) -> Tensor");
  m.def("int8_linear(Tensor x, Tensor codes, Tensor scales, int many_rows) -> Tensor");
  m.def("w4a8_linear(Tensor x, Tensor packed, int out_features, str isa='') -> Tensor");
  m.def("paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor context_lens, Tensor? k_new=None, Tensor? v_new=None) -> Tensor");
}
TORCH_LIBRARY_IMPL(course_lib, CPU, m) {
  m.impl("onednn_linear", &course_lib::onednn_linear);
  m.impl("int8_linear", &course_lib::int8_linear);
  m.impl("w4a8_linear", &course_lib::w4a8_linear);
  m.impl("paged_decode_attention", &course_lib::paged_decode_attention);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace course_lib;
  m.def("rms_norm", &rms_norm, "RMSNorm of each row, one pass");
  m.def("add_rms_norm", &add_rms_norm, "(x + add, rms_norm(x + add)): residual add and norm, one pass");
  m.def("rope_qk_", &rope_qk_, "RoPE in place on the first rot_heads heads of packed qkv rows");
  m.def("silu_mul", &silu_mul, "silu(gate) * up from [.., 2 * inter] rows");
  m.attr("panel_width") = py::dict(py::arg("float32") = panel_width(at::kFloat),  // 0: no panel kernel
                                    py::arg("bfloat16") = panel_width(at::kBFloat16));
  m.def("pack_panels", &pack_panels, "a linear layer's weight [n, k] as panels");
  m.def("by_panels", &by_panels, "x [m, k] @ w^T through the panels of w: [m, n]");
  m.def("keep", &keep, "keep a packed oneDNN weight in the table; returns its handle");
  m.def("release", &release, "drop the packed weight under a handle");
  m.def("kept", &kept, "how many packed weights the table holds");
  m.def("onednn_linear", &onednn_linear, "x [m, in] @ w^T through the weight under a handle (or the panels)",
        py::arg("x"), py::arg("handle"), py::arg("out_features"), py::arg("panels") = py::none(),
        py::arg("panel_rows") = 0);
  m.def("w4a8_paths", &w4a8_paths, "the W4A8 paths this CPU and build run, narrowest first");
  m.def("w4a8_linear", &w4a8_linear, "x [m, k] @ W^T, W as packed Q4_1 blocks, x quantized to int8 per block",
        py::arg("x"), py::arg("packed"), py::arg("out_features"), py::arg("isa") = "");
  m.def("paged_decode_attention", &paged_decode_attention, "attention over the paged KV cache, a query row each",
        py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("block_tables"), py::arg("context_lens"),
        py::arg("k_new") = py::none(), py::arg("v_new") = py::none());
}
