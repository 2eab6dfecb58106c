// Linear layers on the CPU for the few rows of a decode step, and the operators compiled graphs call.
//
// A decode step of n sequences multiplies n rows by every weight matrix: its time is the time to read the
// weights. oneDNN's packed weights (accel/linear.py, PackedLinear) serve every row count; for 1 to a few
// dozen rows the kernels here read the weights faster, laid out once as panels:
//
//   float32   W [N, K] -> [N/W, K, W]: for each k, W outputs side by side (W = the vector width, 16 with
//             AVX-512). One load of a panel line serves every row of x (broadcast, fused multiply-add).
//   bfloat16  W [N, K] -> [N/16, K/2, 16, 2]: for each pair (k, k+1), 16 outputs side by side, so that one
//             AVX512-BF16 instruction (vdpbf16ps) multiplies a line by a row's pair into 16 float sums.
//             ATen's portable vectors have no bfloat16 dot product: this one needs AVX512-BF16.
//
// Both sum in float and round once, as PyTorch's matmuls do. The operators:
//   course_lib::onednn_linear  a packed oneDNN weight, named by a number (a compiled graph cannot take an
//                              opaque oneDNN tensor as an input), or the panels for up to `panel_rows` rows
//   course_lib::int8_linear    the "cpu" INT8 layer's choice (quant/linear.py) made as the step runs

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#define CPU_CAPABILITY_AVX512
#elif defined(__AVX2__) && defined(__FMA__)
#define CPU_CAPABILITY_AVX2
#endif

#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ATen.h>

#include <array>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <utility>

#ifdef __AVX512BF16__
#include <immintrin.h>
#endif

namespace course_lib {
namespace {

using fVec = at::vec::Vectorized<float>;
constexpr int64_t kWidth = fVec::size();  // float32 outputs in a panel
#if defined(CPU_CAPABILITY_AVX2)
constexpr int kRegisters = 16;
#else
constexpr int kRegisters = 32;  // AVX-512, NEON
#endif
constexpr int kFewP = kRegisters / 8;    // panels a task for up to 4 rows
constexpr int kManyP = kRegisters / 16;  // panels a task for more rows, in blocks of up to 12

// The tasks of a panel kernel: P panels a task (the last NB % P panels one each), rows of x in blocks of R.
// run(rows, r0, first_panel, P_or_1, next_task_weights) does one block of one task.
template <typename Run>
void for_tasks(int64_t M, int64_t NB, int64_t P, int64_t panel_elems, Run run) {
  const int64_t blocks = (M + 11) / 12, R = M <= 4 ? M : (M + blocks - 1) / blocks;
  const int64_t full = NB / P, tasks = full + NB % P;
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t first = t < full ? t * P : full * P + (t - full), p = t < full ? P : 1;
      const int64_t next = t + 1 < end ? (first + p) * panel_elems : -1;  // where the next task's panels start
      for (int64_t r0 = 0; r0 < M; r0 += R) run(std::min(R, M - r0), r0, first, p, r0 == 0 ? next : -1);
    }
  });
}

// A table of kernels<R, P> for R = 1 .. sizeof(Rs): the row count picks one at run time.
template <typename K, template <int, int> class F, int P, int... Rs>
constexpr std::array<K, sizeof...(Rs)> by_rows(std::integer_sequence<int, Rs...>) {
  return {&F<Rs + 1, P>::run...};
}

// y[r, W p + o] = sum over k of x[r, k] * panel_p[k][o], for R rows of x and P panels.
template <int R, int P>
struct F32Panels {
  static void run(const float* x, int64_t K, const float* w, float* y, int64_t N, const float* ahead) {
    fVec acc[R][P];
    for (int r = 0; r < R; ++r)
      for (int p = 0; p < P; ++p) acc[r][p] = fVec(0.f);
    for (int64_t i = 0; i < K; ++i) {
      if (ahead)  // the next task's panels, asked from memory one line per panel while these multiply
        for (int p = 0; p < P; ++p) __builtin_prefetch(ahead + (p * K + i) * kWidth, 0, 3);
      fVec b[P];
      for (int p = 0; p < P; ++p) b[p] = fVec::loadu(w + (p * K + i) * kWidth);
      for (int r = 0; r < R; ++r) {
        const fVec xr(x[r * K + i]);
        for (int p = 0; p < P; ++p) acc[r][p] = at::vec::fmadd(xr, b[p], acc[r][p]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int p = 0; p < P; ++p) acc[r][p].store(y + r * N + p * kWidth);
  }
};
using F32Kernel = void (*)(const float*, int64_t, const float*, float*, int64_t, const float*);
constexpr auto kF32Few = by_rows<F32Kernel, F32Panels, kFewP>(std::make_integer_sequence<int, 4>{});
constexpr auto kF32Many = by_rows<F32Kernel, F32Panels, kManyP>(std::make_integer_sequence<int, 12>{});
constexpr auto kF32One = by_rows<F32Kernel, F32Panels, 1>(std::make_integer_sequence<int, 12>{});

#ifdef __AVX512BF16__
// y[r, 16p + o] = sum over pairs i of x[r, 2i .. 2i+1] . panel_p[i][o], rounded to bfloat16 once.
template <int R, int P>
struct Bf16Panels {
  static void run(const at::BFloat16* x, int64_t K, const at::BFloat16* w, at::BFloat16* y, int64_t N,
                  const at::BFloat16* ahead) {
    __m512 acc[R][P];
    for (int r = 0; r < R; ++r)
      for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
    const int64_t pairs = K / 2;
    for (int64_t i = 0; i < pairs; ++i) {
      if (ahead)
        for (int p = 0; p < P; ++p) __builtin_prefetch(ahead + (p * pairs + i) * 32, 0, 3);
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
};
using Bf16Kernel = void (*)(const at::BFloat16*, int64_t, const at::BFloat16*, at::BFloat16*, int64_t,
                            const at::BFloat16*);
constexpr auto kBf16Few = by_rows<Bf16Kernel, Bf16Panels, 4>(std::make_integer_sequence<int, 4>{});
constexpr auto kBf16Many = by_rows<Bf16Kernel, Bf16Panels, 2>(std::make_integer_sequence<int, 12>{});
constexpr auto kBf16One = by_rows<Bf16Kernel, Bf16Panels, 1>(std::make_integer_sequence<int, 12>{});
constexpr bool kBf16Panels = true;
#else
constexpr bool kBf16Panels = false;
#endif

}  // namespace

// The panel width for `dtype` on this build (0: no panel kernel for it).
int64_t panel_width(at::ScalarType dtype) {
  if (dtype == at::kFloat) return kWidth;
  return dtype == at::kBFloat16 && kBf16Panels ? 16 : 0;
}

// w [n, k] -> panels: float32 [n/W, k, W]; bfloat16 [n/16, k/2, 16, 2]. n must be a multiple of the width.
at::Tensor pack_panels(const at::Tensor& w) {
  const int64_t width = panel_width(w.scalar_type());
  TORCH_CHECK(w.dim() == 2 && width > 0 && w.size(0) % width == 0, "pack_panels: a weight [n, k] of a dtype with ",
              "panels here, n a multiple of ", width);
  const int64_t n = w.size(0), k = w.size(1);
  if (w.scalar_type() == at::kFloat) return w.contiguous().view({n / width, width, k}).transpose(1, 2).contiguous();
  TORCH_CHECK(k % 2 == 0, "pack_panels: bfloat16 panels need an even k");
  return w.contiguous().view({n / 16, 16, k / 2, 2}).permute({0, 2, 1, 3}).contiguous();
}

// x [m, k] @ w^T [m, n] through the panels of w (pack_panels), at any m.
at::Tensor by_panels(const at::Tensor& x_in, const at::Tensor& panels) {
  const bool f32 = panels.scalar_type() == at::kFloat;
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == panels.scalar_type() && panels.is_contiguous() &&
                  panel_width(panels.scalar_type()) > 0, "by_panels: x [m, k] of the panels' dtype");
  const auto x = x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1), NB = panels.size(0);
  TORCH_CHECK((f32 ? panels.size(1) : 2 * panels.size(1)) == K, "by_panels: x has ", K, " features, the panels ",
              f32 ? panels.size(1) : 2 * panels.size(1));
  const int64_t width = f32 ? kWidth : 16, N = NB * width, panel_elems = K * width;
  auto y = at::empty({M, N}, x.options());
  if (M == 0) return y;
  if (f32) {
    const float *X = x.data_ptr<float>(), *W = panels.data_ptr<float>();
    float* Y = y.data_ptr<float>();
    const int64_t P = M <= 4 ? kFewP : kManyP;
    for_tasks(M, NB, P, panel_elems, [&](int64_t rows, int64_t r0, int64_t first, int64_t p, int64_t next) {
      const F32Kernel* table = p == 1 ? kF32One.data() : M <= 4 ? kF32Few.data() : kF32Many.data();
      table[rows - 1](X + r0 * K, K, W + first * panel_elems, Y + r0 * N + first * width, N,
                      next >= 0 ? W + next : nullptr);
    });
    return y;
  }
#ifdef __AVX512BF16__
  const at::BFloat16 *X = x.data_ptr<at::BFloat16>(), *W = panels.data_ptr<at::BFloat16>();
  at::BFloat16* Y = y.data_ptr<at::BFloat16>();
  for_tasks(M, NB, M <= 4 ? 4 : 2, panel_elems, [&](int64_t rows, int64_t r0, int64_t first, int64_t p, int64_t next) {
    const Bf16Kernel* table = p == 1 ? kBf16One.data() : M <= 4 ? kBf16Few.data() : kBf16Many.data();
    table[rows - 1](X + r0 * K, K, W + first * panel_elems, Y + r0 * N + first * 16, N,
                    next >= 0 ? W + next : nullptr);
  });
#endif
  return y;
}

// The packed oneDNN weights compiled graphs name by number: handle -> weight, kept alive until released.
namespace {
std::mutex table_mutex;
std::unordered_map<int64_t, at::Tensor> table;
int64_t next_handle = 1;
}  // namespace

int64_t keep(at::Tensor packed) {
  std::lock_guard<std::mutex> lock(table_mutex);
  table.emplace(next_handle, std::move(packed));
  return next_handle++;
}

void release(int64_t handle) {
  std::lock_guard<std::mutex> lock(table_mutex);
  table.erase(handle);
}

int64_t kept() {
  std::lock_guard<std::mutex> lock(table_mutex);
  return int64_t(table.size());
}

// x [m, in] @ w^T for the weight kept under `handle` -> [m, out_features]; with `panels`, 1 to `panel_rows` rows
// go through them instead.
at::Tensor onednn_linear(const at::Tensor& x, int64_t handle, int64_t out_features,
                         const std::optional<at::Tensor>& panels, int64_t panel_rows) {
  if (panels && x.dim() == 2 && x.size(0) >= 1 && x.size(0) <= panel_rows) return by_panels(x, *panels);
  at::Tensor w;
  {
    std::lock_guard<std::mutex> lock(table_mutex);
    auto it = table.find(handle);
    TORCH_CHECK(it != table.end(), "onednn_linear: no packed weight ", handle, " (its layer was freed)");
    w = it->second;
  }
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == w.scalar_type(), "onednn_linear: x [m, in] of the weight's dtype");
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  // mkldnn::_linear_pointwise(Tensor X, Tensor W, Tensor? B, str attr, Scalar?[] scalars, str? algorithm)
  torch::jit::Stack stack{x.contiguous(), w, c10::IValue(), std::string("none"),
                          c10::List<std::optional<at::Scalar>>(), c10::IValue()};
  op.callBoxed(&stack);
  auto y = stack[0].toTensor();
  TORCH_CHECK(y.size(-1) == out_features, "onednn_linear: the weight under ", handle, " has ", y.size(-1),
              " outputs, not ", out_features);
  return y;
}

// x [m, in] bfloat16 @ (codes [out, in] int8 * scales [out])^T: PyTorch's weight-only op below many_rows rows,
// else a bfloat16 matmul of the codes (the "torch" backend's formula, so the same bits as an eager step).
// A branch on the rows inside torch.compile would need a graph for each side; here it costs nothing.
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                       int64_t many_rows) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "int8_linear: bfloat16 x [m, in]");
  if (x.size(0) < many_rows) return at::_weight_int8pack_mm(x, codes, scales);
  return at::linear(x, codes.to(x.scalar_type())) * scales.to(x.scalar_type());
}

}  // namespace course_lib
