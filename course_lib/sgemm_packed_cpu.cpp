// float32 linear layers through MKL's packed GEMM: the weight laid out once, every call reuses it.
//
// F.linear (x @ W^T) lets MKL re-lay-out W inside every call. For the few rows of a decode step that
// re-layout costs as much as the product: all linear layers of the default model at 16 rows took 74 ms
// with F.linear and 43 ms with the weight packed once by cblas_sgemm_pack (4 rows 47 -> 32 ms, 64 rows
// 109 -> 78 ms; 1024 rows level), measured with torch 2.13 on a 2-core Xeon. A weight packed once serves
// any number of rows (checked against F.linear in tests/test_fast_path.py).
//
// The MKL functions come from libtorch_cpu, which links MKL statically and exports them on x86 builds;
// where it does not (other torch builds), loading this module fails and course_lib/fast_path.py keeps
// its PyTorch path. MKL has no header here, so the four declarations are written out (CBLAS's ABI).

#include <torch/extension.h>

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

// x [m, k] float32, packed from `pack` of a [n, k] weight -> x @ w^T, [m, n]
torch::Tensor linear(torch::Tensor x, torch::Tensor packed, int64_t n) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "linear: float32 x [m, k]");
  const auto xc = x.contiguous();
  const int m = xc.size(0), k = xc.size(1);
  auto y = torch::empty({m, n}, xc.options());
  if (m > 0)
    cblas_sgemm_compute(kRowMajor, kNoTrans, kPacked, m, n, k, xc.data_ptr<float>(), k, packed.data_ptr<float>(),
                        k, 0.0f, y.data_ptr<float>(), n);
  return y;
}

// The operator course_lib::sgemm_linear for compiled graphs, registered in C++ (no Python in the call).
TORCH_LIBRARY_FRAGMENT(course_lib, m) { m.def("sgemm_linear(Tensor x, Tensor packed, int out_features) -> Tensor"); }
TORCH_LIBRARY_IMPL(course_lib, CPU, m) { m.impl("sgemm_linear", &linear); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack", &pack, "an nn.Linear's float32 weight [n, k], packed by MKL");
  m.def("linear", &linear, "x [m, k] @ w^T through the packed weight: [m, n]");
}
