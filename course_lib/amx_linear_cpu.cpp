// A few rows through a bfloat16 linear layer with the CPU's matrix unit (Intel AMX): y = x W^T.
//
// A decode step of 16 or 64 sequences multiplies that many rows by every weight matrix. The time is
// the time to read the weights, but oneDNN's kernels for so few rows read them at ~7 GB/s on a
// 2-core Xeon that copies at 12-17. Here the weights are laid out once (`pack`) as the tiles AMX
// multiplies, in the order the kernel reads them, so one pass streams them from memory:
//
//   W [N, K] -> [N/16, K/32, 16, 32]: tile (j, s) is 16 pairs of K (rows) x 16 outputs, 1 KB:
//   tile[r][2n + e] = W[16j + n, 32s + 2r + e]   (AMX's "VNNI" layout: two K values side by side)
//
// `_tile_dpbf16ps(C, A, B)` then adds A [rows x 32 of K] times B to C [rows x 16 outputs] in float:
// products of two bfloat16 are exact in float, so y is the float sum rounded to bfloat16 once, as
// F.linear computes it (bit-identical in the tests up to 16 rows; within a rounding step beyond).
// Each task takes two output blocks (32 outputs) and every block of up to 16 rows of x.
//
// Measured on a 2-core Xeon with AMX, all linear layers of the default model (270 MB), alternated with
// oneDNN's packed weights in one process: 4 rows 36.2 -> 23.2 ms, 16 rows 42.2 -> 26.8 ms (6.4 -> 10
// GB/s), 64 rows 50.5 -> 40.1 ms, 128 rows 61.5 -> 58.3 ms, 256 rows 128 -> 110 ms; at 1024 rows (a
// prefill chunk) oneDNN is faster (475 against 569 ms), so `packed_linear.AmxLinear` uses it up to 256 rows.

#include <ATen/Parallel.h>
#include <torch/extension.h>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define HAVE_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

// The tile shapes: for tile t, rows[t] rows of colsb[t] bytes.
struct TileConfig {
  uint8_t palette_id = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// One block of `rows` (<= 16) rows of x times output blocks j (and j + 1 when `two`), into yb.
// Sums in tiles C0 and C1, x in tile A, weights in tiles 3 and 4. The intrinsics take tile numbers as
// literals, so the function is written once for full blocks (0, 1, 2) and once for the last (5, 6, 7).
// `ahead` (or null): the next pair's weights, asked from memory while these multiply
// (measured 1.02-1.08x over all layers of the default model, 4 to 64 rows).
#define DEFINE_BLOCK(NAME, C0, C1, A)                                                                      \
  inline void NAME(const at::BFloat16* xb, int64_t K, const at::BFloat16* w, int64_t KS, bool two,      \
                   int64_t rows, at::BFloat16* yb, int64_t N, float* c, const at::BFloat16* ahead) {    \
    _tile_zero(C0);                                                                                      \
    if (two) _tile_zero(C1);                                                                             \
    for (int64_t s = 0; s < KS; ++s) {                                                                   \
      if (ahead) /* 2 KB of them a step, all by the last (a prefetch never faults, past the end too) */   \
        for (int l = 0; l < 32; ++l) _mm_prefetch((const char*)(ahead + s * 1024) + l * 64, _MM_HINT_T0);   \
      _tile_loadd(A, xb + s * 32, K * 2); /* rows x 32 of K, row stride K bfloat16 */                    \
      _tile_loadd(3, w + s * 512, 64);    /* weight tile (j, s) */                                       \
      _tile_dpbf16ps(C0, A, 3);                                                                          \
      if (two) {                                                                                         \
        _tile_loadd(4, w + (KS + s) * 512, 64); /* weight tile (j + 1, s) */                             \
        _tile_dpbf16ps(C1, A, 4);                                                                        \
      }                                                                                                  \
    }                                                                                                    \
    _tile_stored(C0, c, 128); /* c [16, 32] float: the block's sums */                                   \
    if (two) _tile_stored(C1, c + 16, 128);                                                              \
    for (int64_t r = 0; r < rows; ++r) { /* to bfloat16, rounding to nearest even, 16 at a time */       \
      _mm256_storeu_si256((__m256i*)(yb + r * N), (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(c + r * 32))); \
      if (two)                                                                                           \
        _mm256_storeu_si256((__m256i*)(yb + r * N + 16),                                                 \
                            (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(c + r * 32 + 16)));               \
    }                                                                                                    \
  }
DEFINE_BLOCK(block_full, 0, 1, 2)
DEFINE_BLOCK(block_last, 5, 6, 7)

// Linux gives a process AMX's tile registers only when it asks (once per process).
bool enable() {
  constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}
#else
bool enable() { return false; }  // built for a CPU without AMX: the engine keeps oneDNN
#endif

// w [N, K] bfloat16, N % 16 == 0, K % 32 == 0 -> [N/16, K/32, 16, 32], the tiles in the order `linear` reads them
torch::Tensor pack(torch::Tensor w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kBFloat16 && w.size(0) % 16 == 0 && w.size(1) % 32 == 0,
              "amx pack: bfloat16 [N, K] with N % 16 == 0 and K % 32 == 0");
  const int64_t N = w.size(0), K = w.size(1);
  return w.contiguous().view({N / 16, 16, K / 32, 16, 2}).permute({0, 2, 3, 1, 4}).contiguous()
      .view({N / 16, K / 32, 16, 32});
}

// x [M, K] bfloat16, packed = pack(W) -> [M, N] = x W^T
torch::Tensor linear(torch::Tensor x, torch::Tensor packed) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && packed.dim() == 4 &&
              x.size(1) == packed.size(1) * 32, "amx linear: x [M, K] bfloat16 and a packed weight of K columns");
#ifdef HAVE_AMX
  const auto xc = x.contiguous();
  const int64_t M = x.size(0), K = x.size(1), NB = packed.size(0), KS = packed.size(1), N = NB * 16;
  auto y = torch::empty({M, N}, x.options());
  const at::BFloat16 *X = xc.data_ptr<at::BFloat16>(), *W = packed.data_ptr<at::BFloat16>();
  at::BFloat16* Y = y.data_ptr<at::BFloat16>();
  const int64_t full = M / 16, last = M % 16;
  at::parallel_for(0, (NB + 1) / 2, 4, [&](int64_t begin, int64_t end) {
    TileConfig cfg;  // per thread: the tile registers belong to the thread that configured them
    for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64;
    cfg.rows[0] = cfg.rows[1] = cfg.rows[2] = 16;                      // a full block: sums, x
    cfg.rows[3] = cfg.rows[4] = 16;                                    // weights
    cfg.rows[5] = cfg.rows[6] = cfg.rows[7] = last ? last : 16;        // the last block: sums, x
    _tile_loadconfig(&cfg);
    alignas(64) float c[16 * 32];
    for (int64_t p = begin; p < end; ++p) {
      const int64_t j = 2 * p;  // output blocks j and j + 1
      const bool two = j + 1 < NB;
      const at::BFloat16* w = W + j * KS * 512;
      const at::BFloat16* next = p + 1 < end && two ? w + 2 * KS * 512 : nullptr;  // the next pair's weights
      at::BFloat16* y = Y + j * 16;  // outputs 16j .. 16j + 31 of every row
      for (int64_t b = 0; b < full; ++b)  // the first block of rows prefetches
        block_full(X + b * 16 * K, K, w, KS, two, 16, y + b * 16 * N, N, c, b == 0 ? next : nullptr);
      if (last) block_last(X + full * 16 * K, K, w, KS, two, last, y + full * 16 * N, N, c, full == 0 ? next : nullptr);
    }
    _tile_release();
  });
  return y;
#else
  TORCH_CHECK(false, "amx linear: this build has no AMX");
#endif
}

// The operator course_lib::amx_linear for compiled graphs, registered in C++ (no Python in the call).
TORCH_LIBRARY_FRAGMENT(course_lib, m) { m.def("amx_linear(Tensor x, Tensor amx_weight) -> Tensor"); }
TORCH_LIBRARY_IMPL(course_lib, CPU, m) { m.impl("amx_linear", &linear); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("enable", &enable, "ask Linux for AMX's tile registers; False where this build or CPU has none");
  m.def("pack", &pack, "a bfloat16 weight [N, K] laid out as AMX tiles", py::arg("w"));
  m.def("linear", &linear, "x [M, K] times a packed weight: [M, N] (bfloat16, CPU with AMX)", py::arg("x"),
        py::arg("packed"));
}
