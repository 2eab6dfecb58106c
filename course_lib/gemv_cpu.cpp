// One row through a linear layer on the CPU: y[j] = W[j, :] . x, for bfloat16, float16 or float32.
//
// A decode step of one sequence multiplies a single row by every weight matrix: the time is the time to
// read the weights, once. This kernel reads each weight row once and accumulates in float (as PyTorch's
// bfloat16 matmuls do), four rows at a time so each load of x serves four of them. On CPUs with
// AVX512-BF16 one instruction (vdpbf16ps) multiplies and adds 32 bfloat16 pairs; elsewhere the weights
// are converted to float in registers. Measured on a 2-core Xeon with AVX512-BF16, all linear layers of
// the default model in bfloat16 (298 MB): 17.6 ms (17 GB/s, the machine's copy bandwidth) against
// 27.5 ms for oneDNN's packed weights and 39.9 ms for F.linear; the conversion path took 26.1 ms, and in
// float32 MKL's F.linear was as fast or faster, so the engine uses it for bfloat16 only
// (course_lib/fast_path.py: PackedLinear(keep_weight=True), OneRowLinear).

// Use the widest vector code this build's -march=native allows (ATen's own kernels are built per width).
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#define CPU_CAPABILITY_AVX512
#elif defined(__AVX2__) && defined(__FMA__)
#define CPU_CAPABILITY_AVX2
#endif

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/extension.h>

#include <type_traits>
#ifdef __AVX512BF16__
#include <immintrin.h>
#endif

using fVec = at::vec::Vectorized<float>;

// acc[r] += W[r, i:i+2*fVec::size()] * x[i:...] for the R rows starting at w (row stride k), as float.
template <typename scalar_t, int R>
inline void dot_step(const scalar_t* w, int64_t k, const float* x, int64_t i, fVec* acc) {
  const fVec x0 = fVec::loadu(x + i), x1 = fVec::loadu(x + i + fVec::size());
  for (int r = 0; r < R; ++r) {
    fVec w0, w1;
    if constexpr (std::is_same_v<scalar_t, float>) {
      w0 = fVec::loadu(w + r * k + i);
      w1 = fVec::loadu(w + r * k + i + fVec::size());
    } else {
      std::tie(w0, w1) = at::vec::convert_to_float<scalar_t>(at::vec::Vectorized<scalar_t>::loadu(w + r * k + i));
    }
    acc[r] = at::vec::fmadd(w0, x0, acc[r]);
    acc[r] = at::vec::fmadd(w1, x1, acc[r]);
  }
}

// y[j .. j+R) = W[j .. j+R) . x
template <typename scalar_t, int R>
inline void rows(const scalar_t* w, const float* x, int64_t k, scalar_t* y) {
  constexpr int64_t step = 2 * fVec::size();
  fVec acc[R];
  for (int r = 0; r < R; ++r) acc[r] = fVec(0.0f);
  int64_t i = 0;
  for (; i + step <= k; i += step) dot_step<scalar_t, R>(w, k, x, i, acc);
  for (int r = 0; r < R; ++r) {
    float sum = at::vec::vec_reduce_all<float>([](fVec& a, fVec& b) { return a + b; }, acc[r]);
    for (int64_t t = i; t < k; ++t) sum += static_cast<float>(w[r * k + t]) * x[t];  // k not a multiple of step
    y[r] = static_cast<scalar_t>(sum);
  }
}

#ifdef __AVX512BF16__
// bfloat16 on CPUs with AVX512-BF16: one instruction multiplies 32 weight/x pairs and adds them into 16
// float sums (vdpbf16ps), with no conversion of the weights. Rows r0 .. r0+R of W [n, k], k % 32 == 0.
template <int R>
inline void rows_bf16_dp(const at::BFloat16* w, const at::BFloat16* x, int64_t k, at::BFloat16* y) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t i = 0; i < k; i += 32) {
    const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + i);
    for (int r = 0; r < R; ++r) acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_loadu_si512(w + r * k + i), xv);
  }
  for (int r = 0; r < R; ++r) y[r] = at::BFloat16(_mm512_reduce_add_ps(acc[r]));
}
#endif

template <typename scalar_t>
void gemv_rows(const scalar_t* W, const float* X, scalar_t* Y, int64_t n, int64_t k) {
  at::parallel_for(0, n / 4, 16, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin * 4; j < end * 4; j += 4) rows<scalar_t, 4>(W + j * k, X, k, Y + j);
  });
  for (int64_t j = n / 4 * 4; j < n; ++j) rows<scalar_t, 1>(W + j * k, X, k, Y + j);  // the last n % 4 rows
}

// x [1, k], w [n, k] (contiguous, one dtype) -> y [1, n]
torch::Tensor gemv(torch::Tensor x, torch::Tensor w) {
  TORCH_CHECK(x.dim() == 2 && x.size(0) == 1 && w.dim() == 2 && x.size(1) == w.size(1), "gemv: x [1, k], w [n, k]");
  TORCH_CHECK(x.scalar_type() == w.scalar_type() && w.is_contiguous(), "gemv: one dtype, contiguous weight");
  const int64_t n = w.size(0), k = w.size(1);
  auto y = torch::empty({1, n}, x.options());
#ifdef __AVX512BF16__
  if (w.scalar_type() == at::kBFloat16 && k % 32 == 0) {
    const auto xc = x.contiguous();
    const at::BFloat16 *W = w.data_ptr<at::BFloat16>(), *X = xc.data_ptr<at::BFloat16>();
    at::BFloat16* Y = y.data_ptr<at::BFloat16>();
    at::parallel_for(0, n / 4, 16, [&](int64_t begin, int64_t end) {
      for (int64_t j = begin * 4; j < end * 4; j += 4) rows_bf16_dp<4>(W + j * k, X, k, Y + j);
    });
    for (int64_t j = n / 4 * 4; j < n; ++j) rows_bf16_dp<1>(W + j * k, X, k, Y + j);
    return y;
  }
#endif
  const auto xf = x.to(torch::kFloat).contiguous();  // x is read n / 4 times: convert it once
  const float* X = xf.data_ptr<float>();
  switch (w.scalar_type()) {
    case at::kFloat: gemv_rows(w.data_ptr<float>(), X, y.data_ptr<float>(), n, k); break;
    case at::kBFloat16: gemv_rows(w.data_ptr<at::BFloat16>(), X, y.data_ptr<at::BFloat16>(), n, k); break;
    case at::kHalf: gemv_rows(w.data_ptr<at::Half>(), X, y.data_ptr<at::Half>(), n, k); break;
    default: TORCH_CHECK(false, "gemv: float32, bfloat16 or float16 only, got ", w.scalar_type());
  }
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
#ifdef __AVX512BF16__
  m.attr("bf16_dot_product") = true;  // bfloat16 runs on vdpbf16ps: the case that beats oneDNN
#else
  m.attr("bf16_dot_product") = false;
#endif
  m.def("gemv", &gemv, "one row times a weight matrix [n, k]: [1, k] -> [1, n] (CPU)", py::arg("x"), py::arg("w"));
}
