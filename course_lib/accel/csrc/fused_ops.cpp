// The elementwise steps of a decoder block, each in one pass over memory (CPU, float32/bfloat16/float16).
//
// Eager PyTorch runs `x * cos + rotate_half(x) * sin` as six kernels and an RMSNorm as eight, each a parallel
// region over a few thousand numbers. Each function here is the same arithmetic in one loop, rounding where
// PyTorch rounds (after every op, in the tensor's dtype), so results match the reference up to float32
// summation order. Inputs are contiguous rows; Python (`course_lib/accel/fused_ops.py`) checks shapes and dtypes.
// ATen's Vectorized<float> at the widest SIMD width -march=native allows (for exp in SiLU).
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#define CPU_CAPABILITY_AVX512
#elif defined(__AVX2__) && defined(__FMA__)
#define CPU_CAPABILITY_AVX2
#endif

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ATen.h>

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

namespace course_lib {
namespace {

// Each kernel works on float rows: load (T -> float), compute in plain float loops that the compiler
// vectorizes, `round_row` wherever PyTorch would round to T after an op, store. bfloat16 is converted with
// integer bit operations (round to nearest even, as c10::BFloat16 does) so those loops vectorize too.
template <typename T>
void load_row(const T* src, float* dst, int64_t n) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      uint32_t b = static_cast<uint32_t>(bits[i]) << 16;
      std::memcpy(dst + i, &b, 4);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
  }
}

inline uint16_t bf16_bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  if ((b & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  return static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

template <typename T>
void store_row(const float* src, T* dst, int64_t n) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    uint16_t* bits = reinterpret_cast<uint16_t*>(dst);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) bits[i] = bf16_bits(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(src[i]);
  }
}

// x = float(T(x)): the rounding an op whose result is a T tensor applies (nothing for float).
template <typename T>
void round_row(float* x, int64_t n) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      uint32_t b = static_cast<uint32_t>(bf16_bits(x[i])) << 16;
      std::memcpy(x + i, &b, 4);
    }
  } else if constexpr (!std::is_same_v<T, float>) {
    for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(static_cast<T>(x[i]));
  }
}

int64_t grain(int64_t row_len) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, row_len)); }

// out = weight * T(x * rsqrt(mean(x^2) + eps)) for each row, the norm in float32 (as Llama's RMSNorm);
// with `add`, x = T(x + add) first, written to `sum_out`: the residual stream and its norm in one pass.
template <typename T>
void rms_norm_rows(const T* x, const T* add, const T* weight, T* out, T* sum_out, int64_t rows, int64_t dim,
                   double eps) {
  std::vector<float> w(dim);
  load_row(weight, w.data(), dim);
  at::parallel_for(0, rows, grain(dim), [&](int64_t begin, int64_t end) {
    std::vector<float> row(dim), other(dim);
    for (int64_t r = begin; r < end; ++r) {
      load_row(x + r * dim, row.data(), dim);
      if (add != nullptr) {
        load_row(add + r * dim, other.data(), dim);
#pragma omp simd
        for (int64_t i = 0; i < dim; ++i) row[i] += other[i];
        round_row<T>(row.data(), dim);
        store_row(row.data(), sum_out + r * dim, dim);
      }
      float ss = 0.f;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < dim; ++i) ss += row[i] * row[i];
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(dim) + static_cast<float>(eps));
#pragma omp simd
      for (int64_t i = 0; i < dim; ++i) row[i] *= inv;
      round_row<T>(row.data(), dim);
#pragma omp simd
      for (int64_t i = 0; i < dim; ++i) row[i] *= w[i];
      store_row(row.data(), out + r * dim, dim);
    }
  });
}

// RoPE in place on the q and k heads of a packed qkv row [tokens, (heads + 2 kv_heads) * head_dim]:
// first half x1*cos - x2*sin, second half x2*cos + x1*sin (rotate_half); cos/sin [tokens, head_dim].
template <typename T>
void rope_rows(T* qkv, const T* cos, const T* sin, int64_t tokens, int64_t rot_heads, int64_t row_len,
               int64_t head_dim) {
  const int64_t half = head_dim / 2;
  at::parallel_for(0, tokens, grain(row_len), [&](int64_t begin, int64_t end) {
    std::vector<float> c(head_dim), s(head_dim), x(rot_heads * head_dim), a(head_dim), b(head_dim);
    for (int64_t t = begin; t < end; ++t) {
      load_row(cos + t * head_dim, c.data(), head_dim);
      load_row(sin + t * head_dim, s.data(), head_dim);
      load_row(qkv + t * row_len, x.data(), rot_heads * head_dim);
      for (int64_t h = 0; h < rot_heads; ++h) {
        float* xh = x.data() + h * head_dim;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          a[i] = xh[i] * c[i];                    // x * cos
          a[i + half] = xh[i + half] * c[i + half];
          b[i] = -xh[i + half] * s[i];            // rotate_half(x) * sin
          b[i + half] = xh[i] * s[i + half];
        }
        round_row<T>(a.data(), head_dim);
        round_row<T>(b.data(), head_dim);
#pragma omp simd
        for (int64_t i = 0; i < head_dim; ++i) xh[i] = a[i] + b[i];
      }
      store_row(x.data(), qkv + t * row_len, rot_heads * head_dim);
    }
  });
}

// out [rows, inter] = silu(gate) * up, from gate_up [rows, 2 * inter] (gate first): SwiGLU's middle.
template <typename T>
void silu_mul_rows(const T* gate_up, T* out, int64_t rows, int64_t inter) {
  at::parallel_for(0, rows, grain(2 * inter), [&](int64_t begin, int64_t end) {
    std::vector<float> g(inter), u(inter);
    for (int64_t r = begin; r < end; ++r) {
      load_row(gate_up + r * 2 * inter, g.data(), inter);
      load_row(gate_up + r * 2 * inter + inter, u.data(), inter);
      using fVec = at::vec::Vectorized<float>;
      int64_t i = 0;
      for (; i + fVec::size() <= inter; i += fVec::size()) {  // exp_u20: ATen's inline polynomial exp
        fVec x = fVec::loadu(g.data() + i);
        (x / (fVec(1.f) + x.neg().exp_u20())).store(g.data() + i);
      }
      for (; i < inter; ++i) g[i] = g[i] / (1.f + std::exp(-g[i]));
      round_row<T>(g.data(), inter);
#pragma omp simd
      for (int64_t i = 0; i < inter; ++i) g[i] *= u[i];
      store_row(g.data(), out + r * inter, inter);
    }
  });
}

}  // namespace

// The `_into` forms write into the caller's tensors (DecodeLayers' buffers, module.cpp): no allocation.
// add_rms_norm_into: sum may be x itself (each row is read before its sum is written).
void rms_norm_into(const at::Tensor& x, const at::Tensor& weight, double eps, at::Tensor& out) {
  const int64_t dim = x.size(-1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm", [&] {
    rms_norm_rows<scalar_t>(x.data_ptr<scalar_t>(), nullptr, weight.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                            nullptr, x.numel() / dim, dim, eps);
  });
}

void add_rms_norm_into(const at::Tensor& x, const at::Tensor& add, const at::Tensor& weight, double eps,
                       at::Tensor& sum, at::Tensor& out) {
  const int64_t dim = x.size(-1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "add_rms_norm", [&] {
    rms_norm_rows<scalar_t>(x.data_ptr<scalar_t>(), add.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(),
                            out.data_ptr<scalar_t>(), sum.data_ptr<scalar_t>(), x.numel() / dim, dim, eps);
  });
}

at::Tensor rms_norm(at::Tensor x, at::Tensor weight, double eps) {
  auto out = at::empty_like(x);
  rms_norm_into(x, weight, eps, out);
  return out;
}

std::vector<at::Tensor> add_rms_norm(at::Tensor x, at::Tensor add, at::Tensor weight, double eps) {
  auto sum = at::empty_like(x);
  auto out = at::empty_like(x);
  add_rms_norm_into(x, add, weight, eps, sum, out);
  return {sum, out};
}

void rope_qk_(at::Tensor qkv, at::Tensor cos, at::Tensor sin, int64_t rot_heads, int64_t head_dim) {
  const int64_t row_len = qkv.size(-1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, qkv.scalar_type(), "rope_qk_", [&] {
    rope_rows<scalar_t>(qkv.data_ptr<scalar_t>(), cos.data_ptr<scalar_t>(), sin.data_ptr<scalar_t>(),
                        qkv.numel() / row_len, rot_heads, row_len, head_dim);
  });
}

void silu_mul_into(const at::Tensor& gate_up, at::Tensor& out) {
  const int64_t inter = gate_up.size(-1) / 2;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gate_up.scalar_type(), "silu_mul", [&] {
    silu_mul_rows<scalar_t>(gate_up.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), gate_up.numel() / (2 * inter),
                            inter);
  });
}

at::Tensor silu_mul(at::Tensor gate_up) {
  auto sizes = gate_up.sizes().vec();
  sizes.back() /= 2;
  auto out = at::empty(sizes, gate_up.options());
  silu_mul_into(gate_up, out);
  return out;
}

}  // namespace course_lib
