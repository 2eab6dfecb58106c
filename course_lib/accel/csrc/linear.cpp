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
#include <memory>
#include <mutex>
#include <optional>
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

// x [m, in] @ w^T (+ bias) for a weight oneDNN packed (accel/linear.py, PackedLinear.packed_weight).
at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  // mkldnn::_linear_pointwise(Tensor X, Tensor W, Tensor? B, str attr, Scalar?[] scalars, str? algorithm)
  torch::jit::Stack stack{x.contiguous(), w, bias ? c10::IValue(*bias) : c10::IValue(), std::string("none"),
                          c10::List<std::optional<at::Scalar>>(), c10::IValue()};
  op.callBoxed(&stack);
  return stack[0].toTensor();
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
  auto y = packed_linear(x, w, std::nullopt);
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

// ---------------------------------------------------------------------------------------------------------------
// W4A8: Q4_1 weights (4-bit codes, a float16 step and minimum per 32 inputs) times activations quantized per row
// in blocks of 32 to int8 (a float step and the block's sum, as llama.cpp's Q8_1), multiplied as integers.
// course_lib/quant/w4a8.py is the same arithmetic in PyTorch, and fixes the order of the float operations:
//
//   for b = 0, 1, ...:  acc = (acc + float(isum_b) * (dw_b * dx_b)) + mw_b * sx_b     each op rounded on its own
//
// so every path below gives the same bits as the reference (tests/test_w4a8.py). This part of the file is compiled
// without -ffast-math and without contracting a multiply and an add into one FMA, which would change the bits.
//
// Packed weight (accel/w4a8.py, pack_w4a8), uint8 [N/16 panels, blocks, 320]: for each panel of 16 outputs and
// each block of 32 inputs, four 64-byte chunks of codes, then 16 float16 steps dw, then 16 float16 minimums mw.
// Chunk j holds, for output o and t = 0..3, byte 4o + t = c[o][8j + t] | c[o][8j + 4 + t] << 4: the low nibbles of
// a 32-bit lane are 4 consecutive codes of one output, so one vpdpbusd multiplies them by 4 broadcast int8
// activations and adds into that output's int32 sum; 16 outputs (AVX-512) or 8 (256-bit) at once.
// Paths, the widest this CPU runs chosen at run time, narrower ones on request (COURSE_LIB_W4A8_ISA or `isa`):
//   avx512vnni  512-bit vpdpbusd           avxvnni  256-bit vpdpbusd (AVX-VNNI, or AVX512-VNNI with VL)
//   avx2        vpmaddubsw + vpmaddwd      scalar   portable C++
// ---------------------------------------------------------------------------------------------------------------
#if defined(__clang__)  // clang ignores GCC's optimize pragma: its own, to the end of the file
#pragma float_control(precise, on, push)
#pragma clang fp contract(off)
#else
#pragma GCC push_options
#pragma GCC optimize("no-fast-math", "fp-contract=off")
#endif

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace course_lib {
namespace {

constexpr int64_t kQBlock = 32, kQPanel = 16, kQCodeBytes = 256, kQBlockBytes = 320;
constexpr int64_t kQPrefetch = 16 * kQBlockBytes;  // blocks are asked for 16 ahead of use (RESULTS.md: the gain)
enum Isa : int { kScalar = 0, kAvx2 = 1, kAvxVnni = 2, kAvx512Vnni = 3 };
const char* const kIsaNames[] = {"scalar", "avx2", "avxvnni", "avx512vnni"};

bool isa_compiled(int isa) {
  switch (isa) {
    case kScalar: return true;
#if defined(__AVX2__)
    case kAvx2: return __builtin_cpu_supports("avx2");
#endif
#if defined(__AVXVNNI__)
    case kAvxVnni: return __builtin_cpu_supports("avxvnni");
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
    case kAvxVnni: return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    case kAvx512Vnni: return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
#endif
    default: return false;
  }
}

// One row of x [K] (float or bfloat16) -> q [Kp] int8, dx and sx [B] float, Kp = 32 B >= K (zeros past K).
template <typename T>
void quantize_row(const T* x, int64_t K, int64_t B, int8_t* q, float* dx, float* sx) {
  for (int64_t b = 0; b < B; ++b) {
    float v[kQBlock];
    for (int64_t i = 0; i < kQBlock; ++i) v[i] = b * kQBlock + i < K ? static_cast<float>(x[b * kQBlock + i]) : 0.f;
    float amax = 0.f;
    for (int64_t i = 0; i < kQBlock; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float d = amax / 127.f, inverse = d == 0.f ? 0.f : 1.f / d;
    int32_t sum = 0;
    for (int64_t i = 0; i < kQBlock; ++i) {
      const float r = std::min(127.f, std::max(-127.f, std::nearbyint(v[i] * inverse)));  // half to even
      q[b * kQBlock + i] = static_cast<int8_t>(r);
      sum += static_cast<int32_t>(r);
    }
    dx[b] = d;
    sx[b] = d * static_cast<float>(sum);
  }
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
// The same row quantization 16 lanes at a time, the same bits: |x| and max are exact, and the product, the
// rounding half to even (vrndscaleps) and the clamp are each one IEEE operation, as in the loop above.
inline __m512 load16(const float* x, __mmask16 m) { return _mm512_maskz_loadu_ps(m, x); }
inline __m512 load16(const at::BFloat16* x, __mmask16 m) {  // bfloat16 -> float32: the bits shifted up
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, x)), 16));
}
template <typename T>
void quantize_row_avx512(const T* x, int64_t K, int64_t B, int8_t* q, float* dx, float* sx) {
  const __m512 top = _mm512_set1_ps(127.f), bottom = _mm512_set1_ps(-127.f);
  for (int64_t b = 0; b < B; ++b) {
    __m512 v[2];
    for (int h = 0; h < 2; ++h) {
      const int64_t start = b * kQBlock + 16 * h, left = std::max<int64_t>(0, std::min<int64_t>(16, K - start));
      v[h] = load16(x + start, static_cast<__mmask16>((1u << left) - 1));
    }
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])));
    const float d = amax / 127.f, inverse = d == 0.f ? 0.f : 1.f / d;
    __m512i sum = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      const __m512 r = _mm512_min_ps(top, _mm512_max_ps(bottom, _mm512_roundscale_ps(
          _mm512_mul_ps(v[h], _mm512_set1_ps(inverse)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
      const __m512i ri = _mm512_cvtps_epi32(r);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kQBlock + 16 * h), _mm512_cvtepi32_epi8(ri));
      sum = _mm512_add_epi32(sum, ri);
    }
    dx[b] = d;
    sx[b] = d * static_cast<float>(_mm512_reduce_add_epi32(sum));
  }
}
#endif

// What one call of a panel kernel reads: R rows of quantized x and one panel's blocks; writes out [R][16] floats.
struct PanelArgs {
  const int8_t* q;   // [rows, Kp]
  const float* dx;   // [rows, B]
  const float* sx;   // [rows, B]
  int64_t Kp, B;
  const uint8_t* w;  // [B, 320]
  float* out;        // [R, 16]
};

template <int R>
void panel_scalar(const PanelArgs& a) {
  for (int r = 0; r < R; ++r) {
    const int8_t* q = a.q + r * a.Kp;
    for (int o = 0; o < kQPanel; ++o) {
      float acc = 0.f;
      for (int64_t b = 0; b < a.B; ++b) {
        const uint8_t* blk = a.w + b * kQBlockBytes;
        int32_t isum = 0;
        for (int j = 0; j < 4; ++j)
          for (int t = 0; t < 4; ++t) {
            const uint8_t byte = blk[64 * j + 4 * o + t];
            isum += (byte & 0x0F) * q[b * kQBlock + 8 * j + t] + (byte >> 4) * q[b * kQBlock + 8 * j + 4 + t];
          }
        const float dw = static_cast<float>(reinterpret_cast<const c10::Half*>(blk + kQCodeBytes)[o]);
        const float mw = static_cast<float>(reinterpret_cast<const c10::Half*>(blk + kQCodeBytes + 32)[o]);
        const float scale = dw * a.dx[r * a.B + b], weighted = static_cast<float>(isum) * scale;
        const float offset = mw * a.sx[r * a.B + b];
        acc = (acc + weighted) + offset;
      }
      a.out[r * kQPanel + o] = acc;
    }
  }
}

inline int32_t four_bytes(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
template <int R>
void panel_avx512vnni(const PanelArgs& a) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F), high = _mm512_set1_epi8(static_cast<char>(0xF0));
  for (int64_t b = 0; b < a.B; ++b) {
    const uint8_t* blk = a.w + b * kQBlockBytes;
    for (int64_t c = 0; c < kQBlockBytes; c += 64)
      _mm_prefetch(reinterpret_cast<const char*>(blk + kQPrefetch + c), _MM_HINT_T0);
    // The high nibbles stay in place (16 x code, at most 240: no overflow in vpdpbusd's int32 sums), and their
    // sum is divided by 16 once, exactly; two independent chains of dot products instead of one.
    __m512i isum[R], isum16[R];
    for (int r = 0; r < R; ++r) isum[r] = isum16[r] = _mm512_setzero_si512();
    for (int j = 0; j < 4; ++j) {
      const __m512i v = _mm512_loadu_si512(blk + 64 * j);
      const __m512i lo = _mm512_and_si512(v, low), hi16 = _mm512_and_si512(v, high);
      for (int r = 0; r < R; ++r) {
        const int8_t* q = a.q + r * a.Kp + b * kQBlock + 8 * j;
        isum[r] = _mm512_dpbusd_epi32(isum[r], lo, _mm512_set1_epi32(four_bytes(q)));
        isum16[r] = _mm512_dpbusd_epi32(isum16[r], hi16, _mm512_set1_epi32(four_bytes(q + 4)));
      }
    }
    for (int r = 0; r < R; ++r) isum[r] = _mm512_add_epi32(isum[r], _mm512_srai_epi32(isum16[r], 4));
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kQCodeBytes)));
    const __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kQCodeBytes + 32)));
    for (int r = 0; r < R; ++r) {
      const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(a.dx[r * a.B + b]));
      const __m512 weighted = _mm512_mul_ps(_mm512_cvtepi32_ps(isum[r]), scale);
      const __m512 offset = _mm512_mul_ps(mw, _mm512_set1_ps(a.sx[r * a.B + b]));
      acc[r] = _mm512_add_ps(_mm512_add_ps(acc[r], weighted), offset);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(a.out + r * kQPanel, acc[r]);
}
#endif

#if defined(__AVX2__)
// 256-bit paths: outputs 0-7 from the first 32 bytes of a chunk, 8-15 from the second. Dot: 4 u8*s8 products
// summed into each int32 lane of `sum`, by vpdpbusd or by vpmaddubsw (pairs into int16: at most 2 * 15 * 127,
// never saturating) then vpmaddwd by ones.
struct DotAvx2 {
  static __m256i dot(__m256i sum, __m256i w, __m256i x) {
    return _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
  }
};
#if defined(__AVXVNNI__)
struct DotVnni256 {
  static __m256i dot(__m256i sum, __m256i w, __m256i x) { return _mm256_dpbusd_avx_epi32(sum, w, x); }
};
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
struct DotVnni256 {
  static __m256i dot(__m256i sum, __m256i w, __m256i x) { return _mm256_dpbusd_epi32(sum, w, x); }
};
#endif

template <typename Dot, int R>
void panel_256(const PanelArgs& a) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int64_t b = 0; b < a.B; ++b) {
    const uint8_t* blk = a.w + b * kQBlockBytes;
    __m256i isum[R][2];
    for (int r = 0; r < R; ++r) isum[r][0] = isum[r][1] = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j)
      for (int h = 0; h < 2; ++h) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * j + 32 * h));
        const __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        for (int r = 0; r < R; ++r) {
          const int8_t* q = a.q + r * a.Kp + b * kQBlock + 8 * j;
          isum[r][h] = Dot::dot(isum[r][h], lo, _mm256_set1_epi32(four_bytes(q)));
          isum[r][h] = Dot::dot(isum[r][h], hi, _mm256_set1_epi32(four_bytes(q + 4)));
        }
      }
    for (int h = 0; h < 2; ++h) {
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kQCodeBytes + 16 * h)));
      const __m256 mw =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kQCodeBytes + 32 + 16 * h)));
      for (int r = 0; r < R; ++r) {
        const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(a.dx[r * a.B + b]));
        const __m256 weighted = _mm256_mul_ps(_mm256_cvtepi32_ps(isum[r][h]), scale);
        const __m256 offset = _mm256_mul_ps(mw, _mm256_set1_ps(a.sx[r * a.B + b]));
        acc[r][h] = _mm256_add_ps(_mm256_add_ps(acc[r][h], weighted), offset);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h) _mm256_storeu_ps(a.out + r * kQPanel + 8 * h, acc[r][h]);
}
#endif

using PanelKernel = void (*)(const PanelArgs&);
constexpr int kQRows = 4;  // rows of x a kernel call serves: the panel's codes are unpacked once for all of them

template <template <int> class K>
struct Table {
  static constexpr PanelKernel rows[kQRows] = {&K<1>::run, &K<2>::run, &K<3>::run, &K<4>::run};
};
template <int R> struct Scalar { static void run(const PanelArgs& a) { panel_scalar<R>(a); } };
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
template <int R> struct Avx512Vnni { static void run(const PanelArgs& a) { panel_avx512vnni<R>(a); } };
#endif
#if defined(__AVX2__)
template <int R> struct Avx2 { static void run(const PanelArgs& a) { panel_256<DotAvx2, R>(a); } };
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
template <int R> struct AvxVnni { static void run(const PanelArgs& a) { panel_256<DotVnni256, R>(a); } };
#endif
#endif

const PanelKernel* kernels(int isa) {
  switch (isa) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    case kAvx512Vnni: return Table<Avx512Vnni>::rows;
#endif
#if defined(__AVX2__) && (defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__)))
    case kAvxVnni: return Table<AvxVnni>::rows;
#endif
#if defined(__AVX2__)
    case kAvx2: return Table<Avx2>::rows;
#endif
    default: return Table<Scalar>::rows;
  }
}

// The path a call takes: `name` if given, else COURSE_LIB_W4A8_ISA if set, else the widest this CPU runs.
int choose_isa(const std::string& name) {
  static const std::string forced = [] {
    const char* env = std::getenv("COURSE_LIB_W4A8_ISA");
    return std::string(env ? env : "");
  }();
  const std::string& want = name.empty() ? forced : name;
  if (want.empty()) {
    for (int isa = kAvx512Vnni; isa > kScalar; --isa)
      if (isa_compiled(isa)) return isa;
    return kScalar;
  }
  for (int isa = kScalar; isa <= kAvx512Vnni; ++isa)
    if (want == kIsaNames[isa]) {
      TORCH_CHECK(isa_compiled(isa), "w4a8_linear: the ", want, " path is not available on this CPU or build");
      return isa;
    }
  TORCH_CHECK(false, "w4a8_linear: unknown path '", want, "' (scalar, avx2, avxvnni, avx512vnni)");
}

}  // namespace

// The W4A8 paths this CPU and build can run, narrowest first.
std::vector<std::string> w4a8_paths() {
  std::vector<std::string> names;
  for (int isa = kScalar; isa <= kAvx512Vnni; ++isa)
    if (isa_compiled(isa)) names.emplace_back(kIsaNames[isa]);
  return names;
}

// A W4A8 product in two parts: the rows of x quantized (once), then any range of the weight's panels (one
// thread's share). w4a8_linear runs the panels with at::parallel_for; DecodeLayers (module.cpp) splits them
// among the threads of its one parallel region, and keeps one W4A8Product for all its products: the buffers
// that hold x's quantized rows are then allocated once.
struct W4A8Product {
  std::vector<int8_t> q;
  std::vector<float> dx, sx;
  const uint8_t* w;
  int isa;
  int64_t M, B, Kp, NP, out_features;
  at::Tensor y;  // [M, out_features] in x's dtype
};

std::shared_ptr<W4A8Product> w4a8_product() { return std::make_shared<W4A8Product>(); }

// x's rows quantized into c for a product with `packed`, whose output goes to y ([m, out_features] in x's
// dtype, contiguous), or to a new tensor if y is not given.
void w4a8_begin(W4A8Product& c, const at::Tensor& x_in, const at::Tensor& packed, int64_t out_features,
                const std::string& isa_name, const std::optional<at::Tensor>& y) {
  TORCH_CHECK(x_in.dim() == 2 && (x_in.scalar_type() == at::kFloat || x_in.scalar_type() == at::kBFloat16),
              "w4a8_linear: x [m, k] float32 or bfloat16");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == at::kByte && packed.size(2) == kQBlockBytes &&
                  packed.is_contiguous(), "w4a8_linear: packed [n/16, blocks, 320] uint8 (pack_w4a8)");
  const int64_t NP = packed.size(0), B = packed.size(1), Kp = B * kQBlock;
  const auto x = x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(K <= Kp && K > Kp - kQBlock, "w4a8_linear: x has ", K, " features, the weight ", Kp, " (padded)");
  TORCH_CHECK(out_features <= NP * kQPanel && out_features > (NP - 1) * kQPanel, "w4a8_linear: out_features ",
              out_features, " does not fit ", NP, " panels");
  TORCH_CHECK(!y || (y->sizes() == at::IntArrayRef{M, out_features} && y->scalar_type() == x.scalar_type() &&
                     y->is_contiguous()), "w4a8_linear: y must be [m, out_features] in x's dtype, contiguous");
  c.q.resize(M * Kp), c.dx.resize(M * B), c.sx.resize(M * B);
  c.w = packed.data_ptr<uint8_t>(), c.isa = choose_isa(isa_name);
  c.M = M, c.B = B, c.Kp = Kp, c.NP = M == 0 ? 0 : NP, c.out_features = out_features;
  c.y = y ? *y : at::empty({M, out_features}, x.options());
  const bool is_float = x.scalar_type() == at::kFloat;
  const void* xp = x.data_ptr();
  at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      int8_t* qr = c.q.data() + r * Kp;
      float *dr = c.dx.data() + r * B, *sr = c.sx.data() + r * B;
#if defined(__AVX512F__) && defined(__AVX512BW__)
      if (is_float) quantize_row_avx512(static_cast<const float*>(xp) + r * K, K, B, qr, dr, sr);
      else quantize_row_avx512(static_cast<const at::BFloat16*>(xp) + r * K, K, B, qr, dr, sr);
#else
      if (is_float) quantize_row(static_cast<const float*>(xp) + r * K, K, B, qr, dr, sr);
      else quantize_row(static_cast<const at::BFloat16*>(xp) + r * K, K, B, qr, dr, sr);
#endif
    }
  });
}

int64_t w4a8_panel_count(const W4A8Product& c) { return c.NP; }

// Outputs of panels [begin, end) for every row.
void w4a8_run_panels(const W4A8Product& c, int64_t begin, int64_t end) {
  const bool is_float = c.y.scalar_type() == at::kFloat;
  void* yp = c.y.data_ptr();
  const int64_t M = c.M, B = c.B, Kp = c.Kp, N = c.out_features;
  const PanelKernel* table = kernels(c.isa);
  float out[kQRows * kQPanel];
  for (int64_t p = begin; p < end; ++p) {
    const int64_t n0 = p * kQPanel, width = std::min(kQPanel, N - n0);
    for (int64_t r0 = 0; r0 < M; r0 += kQRows) {
      const int64_t R = std::min<int64_t>(kQRows, M - r0);
      table[R - 1]({c.q.data() + r0 * Kp, c.dx.data() + r0 * B, c.sx.data() + r0 * B, Kp, B,
                      c.w + p * B * kQBlockBytes, out});
      for (int64_t r = 0; r < R; ++r) {
        const int64_t first = (r0 + r) * N + n0;
        if (is_float) {
          std::memcpy(static_cast<float*>(yp) + first, out + r * kQPanel, width * 4);
        } else {
          at::BFloat16* yr = static_cast<at::BFloat16*>(yp) + first;
          for (int64_t o = 0; o < width; ++o) yr[o] = at::BFloat16(out[r * kQPanel + o]);
        }
      }
    }
  }
}

// x [m, k] (float32 or bfloat16) @ W^T for W packed by pack_w4a8 ([n/16, blocks, 320] uint8) -> [m, n] in x's dtype.
at::Tensor w4a8_linear(const at::Tensor& x, const at::Tensor& packed, int64_t out_features,
                       const std::string& isa_name) {
  W4A8Product c;
  w4a8_begin(c, x, packed, out_features, isa_name, std::nullopt);
  at::parallel_for(0, c.NP, 1, [&](int64_t begin, int64_t end) { w4a8_run_panels(c, begin, end); });
  return c.y;
}

}  // namespace course_lib
#if defined(__clang__)
#pragma float_control(pop)
#else
#pragma GCC pop_options
#endif
