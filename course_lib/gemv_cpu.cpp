// A few rows through a bfloat16 linear layer on the CPU, with AVX512-BF16: y = x @ W^T.
//
// `gemv`, one row: y[j] = W[j, :] . x. A decode step of one sequence multiplies a single row by every weight
// matrix: the time is the time to read the weights, once. This kernel reads each weight row once; one
// instruction (vdpbf16ps) multiplies 32 bfloat16 weight/x pairs and adds them into 16 float sums (float
// accumulation, as PyTorch's bfloat16 matmuls do), four rows at a time so each load of x serves four of them.
// Measured on a 2-core Xeon, all linear layers of the default model (298 MB): 17.6 ms (17 GB/s, the machine's
// copy bandwidth) against 27.5 ms for oneDNN's packed weights and 39.9 ms for F.linear. A portable version
// that converted the weights to float in registers took 26.1 ms, no better than oneDNN, and in float32 MKL's
// F.linear was as fast, so this is bfloat16 on AVX512-BF16 only (`supported`); course_lib/packed_linear.py uses it.
//
// `by_panels`, 1 to ~64 rows (the decode steps of 1 to 64 sequences): the float32 panel kernel of
// sgemm_packed_cpu.cpp in bfloat16. The weight is cut into panels of 16 outputs, each output's bfloat16 pairs
// (k, k+1) side by side: [n/16, k/2, 16, 2], so one 64-byte line holds a k-pair of 16 outputs. One vdpbf16ps
// multiplies that line by a row's pair (x[k], x[k+1]) broadcast, into 16 float sums; each line loaded serves
// every row of x. On a 2-core AMD EPYC (Zen 4), all layers of the default model with the vocabulary head
// (269 MB), taking turns with oneDNN's packed weights in one process, oneDNN / panels: 1 row 1.91x (11.7 ->
// 22.3 GB/s), 4 rows 1.92x, 16 rows 1.55x, 32 rows 1.50x, 48 rows 1.23x, 64 rows 1.09-1.36x (309-333 GFLOP/s),
// 96-128 rows 1.1-1.2x, 256 rows level. There oneDNN's one-row code is the slower one, so the engine keeps
// `gemv` for Intel CPUs and gives the others the panels (`PackedLinear(panels=True)`).

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <array>
#include <cstring>
#include <utility>

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

// y[r, 16p + o] = sum over pairs i of x[r, 2i .. 2i+1] . panel_p[i][o], for R rows of x (row stride K) and P
// panels (one after the other from w), rounded to bfloat16 once at the end. R * P float sums of 16 live in
// registers. `ahead` (or null): the next task's panels, asked from memory one line per panel and pair.
template <int R, int P>
void rows_by_panels(const at::BFloat16* x, int64_t K, const at::BFloat16* w, at::BFloat16* y, int64_t N,
                    const at::BFloat16* ahead) {
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  const int64_t pairs = K / 2;
  for (int64_t i = 0; i < pairs; ++i) {
    if (ahead)
      for (int p = 0; p < P; ++p) _mm_prefetch((const char*)(ahead + (p * pairs + i) * 32), _MM_HINT_T0);
    __m512bh b[P];
    for (int p = 0; p < P; ++p) b[p] = (__m512bh)_mm512_loadu_si512(w + (p * pairs + i) * 32);
    for (int r = 0; r < R; ++r) {
      int32_t pair;  // x[r, 2i] and x[r, 2i + 1], broadcast to all 16 lanes
      std::memcpy(&pair, x + r * K + 2 * i, sizeof(pair));
      const __m512bh xr = (__m512bh)_mm512_set1_epi32(pair);
      for (int p = 0; p < P; ++p) acc[r][p] = _mm512_dpbf16_ps(acc[r][p], b[p], xr);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + r * N + p * 16), (__m256i)_mm512_cvtneps_pbh(acc[r][p]));
}

// rows_by_panels<R, P> for R = 1 .. sizeof(Rs), chosen at run time by the number of rows.
using Kernel = void (*)(const at::BFloat16*, int64_t, const at::BFloat16*, at::BFloat16*, int64_t,
                        const at::BFloat16*);
template <int P, int... Rs>
constexpr std::array<Kernel, sizeof...(Rs)> by_rows(std::integer_sequence<int, Rs...>) {
  return {&rows_by_panels<Rs + 1, P>...};
}
constexpr auto kFour = by_rows<4>(std::make_integer_sequence<int, 4>{});  // 1-4 rows x 64 outputs
constexpr auto kTwo = by_rows<2>(std::make_integer_sequence<int, 12>{});  // 1-12 rows x 32 outputs
constexpr auto kOne = by_rows<1>(std::make_integer_sequence<int, 12>{});  // the last panels of a layer
#endif

// w [n, k] bfloat16, n % 16 == 0, k even -> panels [n/16, k/2, 16, 2]: panels[j][i][o][e] = w[16j + o][2i + e]
torch::Tensor pack_panels(torch::Tensor w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kBFloat16 && w.size(0) % 16 == 0 && w.size(1) % 2 == 0,
              "pack_panels: a bfloat16 weight [n, k] with n % 16 == 0 and k even");
  return w.contiguous().view({w.size(0) / 16, 16, w.size(1) / 2, 2}).permute({0, 2, 1, 3}).contiguous();
}

// x [m, k] bfloat16, panels (pack_panels of a [n, k] weight) -> x @ w^T [m, n], bfloat16. Any m works;
// course_lib/packed_linear.py sends it up to ONEDNN_PANEL_ROWS rows. The tasks as in sgemm_packed_cpu.cpp.
torch::Tensor by_panels(const torch::Tensor& x_in, const torch::Tensor& panels) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kBFloat16, "by_panels: bfloat16 x [m, k]");
  TORCH_CHECK(panels.dim() == 4 && panels.size(1) * 2 == x_in.size(1) && panels.size(2) == 16 &&
                  panels.size(3) == 2 && panels.scalar_type() == at::kBFloat16 && panels.is_contiguous(),
              "by_panels: panels [n/16, k/2, 16, 2] from pack_panels");
#ifdef __AVX512BF16__
  const auto x = x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1), NB = panels.size(0), N = NB * 16;
  auto y = torch::empty({M, N}, x.options());
  if (M == 0) return y;
  const at::BFloat16 *X = x.data_ptr<at::BFloat16>(), *W = panels.data_ptr<at::BFloat16>();
  at::BFloat16* Y = y.data_ptr<at::BFloat16>();
  // Up to 4 rows: 4 panels a task. More: 2 panels, and the rows in even blocks of up to 12 (24 sums).
  const int64_t P = M <= 4 ? 4 : 2, blocks = (M + 11) / 12, R = P == 4 ? M : (M + blocks - 1) / blocks;
  const Kernel* kernel = P == 4 ? kFour.data() : kTwo.data();
  const int64_t full = NB / P, tasks = full + NB % P;  // the last NB % P panels one per task
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t first = t < full ? t * P : full * P + (t - full);  // the task's first panel
      const at::BFloat16* w = W + first * K * 16;
      const at::BFloat16* next = t + 1 < end ? w + (t < full ? P : 1) * K * 16 : nullptr;  // a prefetch never faults
      for (int64_t r0 = 0; r0 < M; r0 += R) {
        const int64_t rows = std::min(R, M - r0);
        (t < full ? kernel : kOne.data())[rows - 1](X + r0 * K, K, w, Y + r0 * N + first * 16, N,
                                                  r0 == 0 ? next : nullptr);
      }
    }
  });
  return y;
#else
  TORCH_CHECK(false, "by_panels: this CPU has no AVX512-BF16");
#endif
}

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
// course_lib::bf16_by_panels is what onednn_linear_cpu.cpp calls for the few rows of a bfloat16 layer with panels.
TORCH_LIBRARY_FRAGMENT(course_lib, m) {
  m.def("gemv(Tensor x, Tensor weight) -> Tensor");
  m.def("bf16_by_panels(Tensor x, Tensor panels) -> Tensor");
}
TORCH_LIBRARY_IMPL(course_lib, CPU, m) {
  m.impl("gemv", &gemv);
  m.impl("bf16_by_panels", &by_panels);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
#ifdef __AVX512BF16__
  m.attr("supported") = true;
#else
  m.attr("supported") = false;  // built without AVX512-BF16: gemv raises, the engine keeps oneDNN
#endif
  m.def("gemv", &gemv, "one bfloat16 row times a weight matrix [n, k]: [1, k] -> [1, n] (CPU)", py::arg("x"),
        py::arg("w"));
  m.def("pack_panels", &pack_panels, "an nn.Linear's bfloat16 weight [n, k] as panels [n/16, k/2, 16, 2]");
  m.def("by_panels", &by_panels, "x [m, k] bfloat16 @ w^T through the panels of w, at any m: [m, n]");
}
