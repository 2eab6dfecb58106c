// One row through a bfloat16 linear layer on the CPU: y[j] = W[j, :] . x, with AVX512-BF16.
//
// A decode step of one sequence multiplies a single row by every weight matrix: the time is the time to
// read the weights, once. This kernel reads each weight row once; one instruction (vdpbf16ps) multiplies
// 32 bfloat16 weight/x pairs and adds them into 16 float sums (float accumulation, as PyTorch's bfloat16
// matmuls do), four rows at a time so each load of x serves four of them. Measured on a 2-core Xeon, all
// linear layers of the default model (298 MB): 17.6 ms (17 GB/s, the machine's copy bandwidth) against
// 27.5 ms for oneDNN's packed weights and 39.9 ms for F.linear. A portable version that converted the
// weights to float in registers took 26.1 ms, no better than oneDNN, and in float32 MKL's F.linear was as
// fast, so this is bfloat16 on AVX512-BF16 only (`supported`); course_lib/packed_linear.py uses it.

#include <ATen/Parallel.h>
#include <torch/extension.h>

#ifdef __AVX512BF16__
#include <immintrin.h>

// y[0 .. R) = W[0 .. R) . x for the R rows starting at w (row stride k).
template <int R>
inline void rows(const at::BFloat16* w, const at::BFloat16* x, int64_t k, at::BFloat16* y) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t i = 0; i < k; i += 32) {
    const __mmask32 m = k - i >= 32 ? ~__mmask32(0) : (__mmask32(1) << (k - i)) - 1;  // a last, partial 32: zeros
    const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(m, x + i);
    for (int r = 0; r < R; ++r)
      acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_maskz_loadu_epi16(m, w + r * k + i), xv);
  }
  for (int r = 0; r < R; ++r) y[r] = at::BFloat16(_mm512_reduce_add_ps(acc[r]));
}
#endif

// x [1, k], w [n, k], both bfloat16 and contiguous -> y [1, n]
torch::Tensor gemv(torch::Tensor x, torch::Tensor w) {
  TORCH_CHECK(x.dim() == 2 && x.size(0) == 1 && w.dim() == 2 && x.size(1) == w.size(1), "gemv: x [1, k], w [n, k]");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16, "gemv: bfloat16 only");
#ifdef __AVX512BF16__
  const auto xc = x.contiguous(), wc = w.contiguous();
  const int64_t n = w.size(0), k = w.size(1);
  auto y = torch::empty({1, n}, x.options());
  const at::BFloat16 *W = wc.data_ptr<at::BFloat16>(), *X = xc.data_ptr<at::BFloat16>();
  at::BFloat16* Y = y.data_ptr<at::BFloat16>();
  at::parallel_for(0, n / 4, 16, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin * 4; j < end * 4; j += 4) rows<4>(W + j * k, X, k, Y + j);
  });
  for (int64_t j = n / 4 * 4; j < n; ++j) rows<1>(W + j * k, X, k, Y + j);  // the last n % 4 rows
  return y;
#else
  TORCH_CHECK(false, "gemv: this CPU has no AVX512-BF16");
#endif
}

// The same function as the operator course_lib::gemv, registered here in C++ so that a compiled graph
// (Inductor's C++ wrapper) calls it through the dispatcher without going back to Python: ~3 us a call
// instead of ~16 us for an operator defined in Python (`torch.library.custom_op`).
TORCH_LIBRARY_FRAGMENT(course_lib, m) { m.def("gemv(Tensor x, Tensor weight) -> Tensor"); }
TORCH_LIBRARY_IMPL(course_lib, CPU, m) { m.impl("gemv", &gemv); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
#ifdef __AVX512BF16__
  m.attr("supported") = true;
#else
  m.attr("supported") = false;  // built without AVX512-BF16: gemv raises, the engine keeps oneDNN
#endif
  m.def("gemv", &gemv, "one bfloat16 row times a weight matrix [n, k]: [1, k] -> [1, n] (CPU)", py::arg("x"),
        py::arg("w"));
}
