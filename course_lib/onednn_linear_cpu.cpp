// Linear layers through oneDNN with the weight packed once, callable from a compiled graph.
//
// PyTorch packs a weight for oneDNN with mkldnn::_reorder_linear_weight and multiplies by it with
// mkldnn::_linear_pointwise (course_lib/packed_linear.py: PackedLinear). The packed weight is an opaque
// oneDNN tensor, with no storage: torch.compile cannot trace a graph that takes one as an input. So
// this file keeps the packed weights in a table, and a graph names a weight by its number (a constant
// in the graph): course_lib::onednn_linear(x, handle, out_features) looks it up and calls oneDNN.
//
// Why float32 goes through oneDNN on some CPUs: MKL (F.linear's float32 kernel, and the packed GEMM of
// sgemm_packed_cpu.cpp) chooses its code by the CPU's vendor. Measured with torch 2.13 on a 2-core AMD
// EPYC (Zen 5, AVX-512), the 120 float32 layers of the default model (425 MB, read from memory), MKL packed
// against oneDNN packed: 1 row 19.4 vs 10.9 ms; 16 rows 43.7 vs 17.4; 64 rows 92.4 vs 39.5; 512 rows 558 vs
// 235 (F.linear: 25.3, 39.0, 88.4, 544).
//
// For the few rows of a decode step, the panel kernel of sgemm_packed_cpu.cpp beat oneDNN there too: on a
// 2-core AMD EPYC (Zen 4), all layers of the default model with the vocabulary head (538 MB), taking turns in
// one process, oneDNN / panels: 1 row 1.43-1.74x, 4 rows 1.34x, 16 rows 1.16-1.19x, 24-48 rows 1.2-1.4x,
// 64 rows 1.06-1.29x, 96 and 128 rows level, 256 rows 0.97x (`python -m benchmarks.float32_linear`); and in
// bfloat16 its twin in gemv_cpu.cpp (1.9x at one row, 1.1-1.4x at 64; figures there). So a layer may hold its
// weight as panels as well, and this operator sends calls of up to `panel_rows` rows to them (through the
// operator course_lib::by_panels, float32, or course_lib::bf16_by_panels, which those files define).

#include <torch/extension.h>

#include <ATen/core/dispatch/Dispatcher.h>

#include <mutex>
#include <unordered_map>

namespace {
std::mutex table_mutex;
std::unordered_map<int64_t, at::Tensor> table;  // handle -> packed weight (kept alive here until released)
int64_t next_handle = 1;

at::Tensor packed_weight(int64_t handle) {
  std::lock_guard<std::mutex> lock(table_mutex);
  auto it = table.find(handle);
  TORCH_CHECK(it != table.end(), "onednn_linear: no packed weight ", handle, " (its layer was freed)");
  return it->second;
}
}  // namespace

// A packed weight (from mkldnn::_reorder_linear_weight) -> its handle. The table holds a reference.
int64_t keep(at::Tensor packed) {
  std::lock_guard<std::mutex> lock(table_mutex);
  table.emplace(next_handle, std::move(packed));
  return next_handle++;
}

// Drop the table's reference (its layer is gone). Releasing an unknown handle does nothing.
void release(int64_t handle) {
  std::lock_guard<std::mutex> lock(table_mutex);
  table.erase(handle);
}

int64_t kept() {
  std::lock_guard<std::mutex> lock(table_mutex);
  return int64_t(table.size());
}

// x [m, in] @ w^T for the weight kept under `handle` -> [m, out_features]; with `panels` (the same weight as
// panels: sgemm_packed_cpu.cpp's in float32, gemv_cpu.cpp's in bfloat16), calls of 1 to `panel_rows` rows go
// through those instead.
at::Tensor linear(const at::Tensor& x, int64_t handle, int64_t out_features, const std::optional<at::Tensor>& panels,
                  int64_t panel_rows) {
  if (panels && x.dim() == 2 && x.size(0) >= 1 && x.size(0) <= panel_rows) {
    using Panels = at::Tensor(const at::Tensor&, const at::Tensor&);
    auto find = [](const char* name) {
      return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Panels>();
    };
    if (panels->scalar_type() == at::kBFloat16) {
      static const auto bf16_by_panels = find("course_lib::bf16_by_panels");  // gemv_cpu.cpp
      return bf16_by_panels.call(x, *panels);
    }
    static const auto by_panels = find("course_lib::by_panels");  // sgemm_packed_cpu.cpp
    return by_panels.call(x, *panels);
  }
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  const auto w = packed_weight(handle);
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == w.scalar_type(), "onednn_linear: x [m, in] of the weight's dtype");
  // mkldnn::_linear_pointwise(Tensor X, Tensor W, Tensor? B, str attr, Scalar?[] scalars, str? algorithm)
  torch::jit::Stack stack{x.contiguous(), w, c10::IValue(), std::string("none"),
                          c10::List<std::optional<at::Scalar>>(), c10::IValue()};
  op.callBoxed(&stack);
  auto y = stack[0].toTensor();
  TORCH_CHECK(y.size(-1) == out_features, "onednn_linear: the weight under ", handle, " has ", y.size(-1),
              " outputs, not ", out_features);
  return y;
}

TORCH_LIBRARY_FRAGMENT(course_lib, m) {
  m.def("onednn_linear(Tensor x, int handle, int out_features, Tensor? panels=None, int panel_rows=0) -> Tensor");
}
TORCH_LIBRARY_IMPL(course_lib, CPU, m) { m.impl("onednn_linear", &linear); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("keep", &keep, "keep a packed oneDNN weight in the table; returns its handle");
  m.def("release", &release, "drop the packed weight under a handle");
  m.def("kept", &kept, "how many packed weights the table holds");
  m.def("linear", &linear, "x [m, in] @ w^T through the packed weight under a handle (or the panels): [m, out]",
        py::arg("x"), py::arg("handle"), py::arg("out_features"), py::arg("panels") = py::none(),
        py::arg("panel_rows") = 0);
}
