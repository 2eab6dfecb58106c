// float32 linear layers on the CPU, with the weight laid out once so that no call re-lays it out:
// MKL's packed GEMM for many rows (a prefill chunk, a decode step of 64 sequences), and for a few rows
// (a decode step of 1 to 32 sequences) a short AVX-512 kernel over the weight cut into panels of 16 outputs.
//
// F.linear (x @ W^T) lets MKL re-lay-out W inside every call. For the few rows of a decode step that
// re-layout costs as much as the product: all linear layers of the default model at 16 rows took 74 ms
// with F.linear and 43 ms with the weight packed once by cblas_sgemm_pack (4 rows 47 -> 32 ms, 64 rows
// 109 -> 78 ms; 1024 rows level), measured with torch 2.13 on a 2-core Xeon. A weight packed once serves
// any number of rows (checked against F.linear in tests/test_packed_linear.py).
//
// For 1 to 32 rows MKL's packed GEMM still reads the weights below the machine's bandwidth, so those
// rows go through `by_panels`: the weight as panels [N/16, K, 16] (16 outputs side by side for each k), and
// for each k one load of a panel row serves every row of x (broadcast, fused multiply-add into 16 float
// sums per row and panel). Measured on a 2-core Xeon with AMX, all layers of the default model (538 MB),
// alternated with MKL's packed GEMM in one process: 1 row 37.8 -> 30.4 ms (1.24x; 14 -> 18 GB/s),
// 2 rows 1.39x, 8 rows 1.33x, 16 rows 61.1 -> 48.5 ms (1.26x), 24 rows 1.17x, 32 rows 1.03-1.08x, 48 rows level,
// 64 rows 0.88x (there the product, not the reading, takes the time, and MKL's code does it better). A
// faster kernel costs memory: a layer holds its weight twice, MKL's packing and the panels.
// `python -m benchmarks.float32_linear` measures all three (F.linear too) on your machine.
//
// The MKL functions come from libtorch_cpu, which links MKL statically and exports them on x86 builds;
// where it does not (other torch builds), loading this module fails and course_lib/packed_linear.py keeps
// its PyTorch path. MKL has no header here, so the four declarations are written out (CBLAS's ABI).

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <array>
#include <utility>

extern "C" {
size_t cblas_sgemm_pack_get_size(int identifier, int m, int n, int k);
void cblas_sgemm_pack(int layout, int identifier, int trans, int m, int n, int k, float alpha, const float* src,
                      int ld, float* dest);
void cblas_sgemm_compute(int layout, int transa, int transb, int m, int n, int k, const float* a, int lda,
                         const float* b, int ldb, float beta, float* c, int ldc);
}

namespace {
enum { kRowMajor = 101, kNoTrans = 111, kTrans = 112, kPacked = 151, kBMatrix = 162 };  // CBLAS constants
constexpr int kPackRows = 64;  // the m MKL packs for; measured: the packed weight serves 1 to 1024 rows as fast
constexpr int64_t kPanelRows = 32;  // up to this many rows go through the panels (see the figures above)
}

// w [n, k] float32 (an nn.Linear's weight) -> MKL's packed B = w^T, as an opaque float32 buffer.
// MKL asks for ~2-9x the weight's size (11.6 MB for a 576x576 layer) but writes about the weight's
// size into it: the rest of the allocation is never touched, so it costs address space, not memory.
torch::Tensor pack(torch::Tensor w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat, "pack: a float32 weight [n, k]");
  const auto wc = w.contiguous();
  const int n = wc.size(0), k = wc.size(1);
  const size_t bytes = cblas_sgemm_pack_get_size(kBMatrix, kPackRows, n, k);
  auto packed = torch::empty({int64_t((bytes + 3) / 4)}, wc.options());
  cblas_sgemm_pack(kRowMajor, kBMatrix, kTrans, kPackRows, n, k, 1.0f, wc.data_ptr<float>(), k,
                   packed.data_ptr<float>());
  return packed;
}

// w [n, k] float32, n % 16 == 0 -> panels [n/16, k, 16]: panels[j][i][o] = w[16j + o][i]
torch::Tensor pack_panels(torch::Tensor w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat && w.size(0) % 16 == 0,
              "pack_panels: a float32 weight [n, k] with n % 16 == 0");
  return w.contiguous().view({w.size(0) / 16, 16, w.size(1)}).transpose(1, 2).contiguous();
}

#ifdef __AVX512F__
#include <immintrin.h>

// y[r, 16p + o] = sum over i of x[r, i] * panel_p[i][o], for R rows of x (row stride K) and P panels
// (one after the other from w). R * P float sums of 16 live in registers. `ahead` (or null): the next
// task's panels, asked from memory one line per panel and k while these multiply.
template <int R, int P>
void rows_by_panels(const float* x, int64_t K, const float* w, float* y, int64_t N, const float* ahead) {
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  for (int64_t i = 0; i < K; ++i) {
    if (ahead)
      for (int p = 0; p < P; ++p) _mm_prefetch((const char*)(ahead + (p * K + i) * 16), _MM_HINT_T0);
    __m512 b[P];
    for (int p = 0; p < P; ++p) b[p] = _mm512_loadu_ps(w + (p * K + i) * 16);
    for (int r = 0; r < R; ++r) {
      const __m512 xr = _mm512_set1_ps(x[r * K + i]);
      for (int p = 0; p < P; ++p) acc[r][p] = _mm512_fmadd_ps(xr, b[p], acc[r][p]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) _mm512_storeu_ps(y + r * N + p * 16, acc[r][p]);
}

// rows_by_panels<R, P> for R = 1 .. sizeof(Rs), chosen at run time by the number of rows.
using Kernel = void (*)(const float*, int64_t, const float*, float*, int64_t, const float*);
template <int P, int... Rs>
constexpr std::array<Kernel, sizeof...(Rs)> by_rows(std::integer_sequence<int, Rs...>) {
  return {&rows_by_panels<Rs + 1, P>...};
}
constexpr auto kFour = by_rows<4>(std::make_integer_sequence<int, 4>{});     // 1-4 rows x 64 outputs
constexpr auto kTwo = by_rows<2>(std::make_integer_sequence<int, 12>{});     // 1-12 rows x 32 outputs
constexpr auto kOne = by_rows<1>(std::make_integer_sequence<int, 12>{});     // the last panels of a layer

// x [m, k] float32, panels (pack_panels of a [n, k] weight) -> x @ w^T [m, n]. Any m works; `linear` sends it up
// to kPanelRows rows (benchmarks/float32_linear.py times it at more, to show where MKL takes over).
torch::Tensor by_panels(const torch::Tensor& x_in, const torch::Tensor& panels) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat, "by_panels: float32 x [m, k]");
  TORCH_CHECK(panels.dim() == 3 && panels.size(1) == x_in.size(1) && panels.size(2) == 16 &&
                  panels.scalar_type() == at::kFloat && panels.is_contiguous(),
              "by_panels: panels [n/16, k, 16] from pack_panels");
  const auto x = x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1), NB = panels.size(0), N = NB * 16;
  auto y = torch::empty({M, N}, x.options());
  if (M == 0) return y;
  const float *X = x.data_ptr<float>(), *W = panels.data_ptr<float>();
  float* Y = y.data_ptr<float>();
  // Up to 4 rows: 4 panels a task. More: 2 panels, and the rows in even blocks of up to 12 (24 sums).
  const int64_t P = M <= 4 ? 4 : 2, blocks = (M + 11) / 12, R = P == 4 ? M : (M + blocks - 1) / blocks;
  const Kernel* kernel = P == 4 ? kFour.data() : kTwo.data();
  const int64_t full = NB / P, tasks = full + NB % P;  // the last NB % P panels one per task
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t first = t < full ? t * P : full * P + (t - full);  // the task's first panel
      const float* w = W + first * K * 16;
      const float* next = t + 1 < end ? w + (t < full ? P : 1) * K * 16 : nullptr;  // a prefetch never faults
      for (int64_t r0 = 0; r0 < M; r0 += R) {
        const int64_t rows = std::min(R, M - r0);
        (t < full ? kernel : kOne.data())[rows - 1](X + r0 * K, K, w, Y + r0 * N + first * 16, N,
                                                  r0 == 0 ? next : nullptr);
      }
    }
  });
  return y;
}
constexpr bool kHasPanels = true;
#else
torch::Tensor by_panels(const torch::Tensor& x, const torch::Tensor&) {
  TORCH_CHECK(false, "by_panels: built without AVX-512");
}
constexpr bool kHasPanels = false;  // packed_linear.SgemmPackedLinear then keeps no panels
#endif

// x [m, k] float32 -> x @ w^T, [m, n]: through `panels` (pack_panels of w) for up to kPanelRows rows when
// given, else through `packed` (pack of w)
torch::Tensor linear(torch::Tensor x, torch::Tensor packed, std::optional<torch::Tensor> panels, int64_t n) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "linear: float32 x [m, k]");
  const auto xc = x.contiguous();
  const int m = xc.size(0), k = xc.size(1);
  if (panels && m >= 1 && m <= kPanelRows) {
    TORCH_CHECK(panels->size(0) * 16 == n, "linear: panels of a weight with n outputs");
    return by_panels(xc, *panels);
  }
  auto y = torch::empty({m, n}, xc.options());
  if (m > 0)
    cblas_sgemm_compute(kRowMajor, kNoTrans, kPacked, m, n, k, xc.data_ptr<float>(), k, packed.data_ptr<float>(),
                        k, 0.0f, y.data_ptr<float>(), n);
  return y;
}

// The operator course_lib::sgemm_linear for compiled graphs, registered in C++ (no Python in the call), and
// course_lib::by_panels, which onednn_linear_cpu.cpp calls for a few rows where oneDNN takes the many.
TORCH_LIBRARY_FRAGMENT(course_lib, m) {
  m.def("sgemm_linear(Tensor x, Tensor packed, Tensor? panels, int out_features) -> Tensor");
  m.def("by_panels(Tensor x, Tensor panels) -> Tensor");
}
TORCH_LIBRARY_IMPL(course_lib, CPU, m) {
  m.impl("sgemm_linear", &linear);
  m.impl("by_panels", &by_panels);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("has_panels") = kHasPanels;
  m.attr("panel_rows") = kPanelRows;
  m.def("pack", &pack, "an nn.Linear's float32 weight [n, k], packed by MKL");
  m.def("pack_panels", &pack_panels, "an nn.Linear's float32 weight [n, k] as panels [n/16, k, 16]");
  m.def("by_panels", &by_panels, "x [m, k] (contiguous) @ w^T through the panels of w, at any m: [m, n]");
  m.def("linear", &linear, "x [m, k] @ w^T through the packed weight, or the panels for a few rows: [m, n]",
        py::arg("x"), py::arg("packed"), py::arg("panels"), py::arg("n"));
}
