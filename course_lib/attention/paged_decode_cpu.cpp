// Decode attention over the paged KV cache on the CPU: one query token per sequence.
//
// The CPU twin of the Triton kernel in triton_paged.py, and like it checked against the PyTorch
// reference `paged_decode_attention` (tests/test_paged_attention.py). One task per sequence:
//
//   1. load its query heads as float, times 1/sqrt(head_dim)
//   2. scores[h, t] = q[h] . k[t, h / group] for each cached token t, read in place through the block table
//   3. softmax over t (in float; double for double inputs)
//   4. out[h] = sum_t p[h, t] * v[t, h / group], read in place through the block table
//
// Each token's K (and V) row of all KV heads is contiguous in the cache, so it is read once, whole,
// and serves every query head (one task per KV head would read a third of each row, strided).
//
// No gather into a padded tensor and no mask: each sequence reads exactly its own context_len tokens.
//
// Two versions of the same steps: `paged_decode` (plain loops, any dtype and head_dim: the readable one,
// and the one for float64) and `paged_decode_vec` (float, bfloat16, float16 with head_dim 64 or 128: the
// one that runs), written with ATen's Vectorized<float> on the SIMD width this CPU was built for.
// Measured per call on a 2-core Xeon (AVX-512), bfloat16, 9 query and 3 KV heads of 64, plain -> vector:
// 16 sequences of 110 tokens 205 -> 136 us, 64 of 110 817 -> 654 us, 16 of 512 852 -> 649 us (that one
// reads 6.3 MB of K/V: ~350 us at the machine's 17.8 GB/s, so it is now mostly waiting on memory).
// Inside a decode step the K/V is never in cache (the layer's weights streamed through since it was read),
// so the vector version reads each token's row whole and in order and prefetches rows ahead. Against
// reading it a KV head at a time without prefetch, measured per call after 64 MB of other reads: bfloat16
// 16 sequences of 75 tokens 382 -> 228 us, 64 of 110 2378 -> 1161 us; whole eager decode steps of the
// default model, alternated in one process: bfloat16 64 requests 1.25x, 16 1.02x; float32 64 1.09x, 16 1.07x.

// Use the widest vector code this build's -march=native allows (ATen's own kernels are built per width).
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#define CPU_CAPABILITY_AVX512
#elif defined(__AVX2__) && defined(__FMA__)
#define CPU_CAPABILITY_AVX2
#endif

#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/extension.h>

#include <type_traits>

#include <algorithm>
#include <cmath>
#include <vector>

// HEAD_DIM > 0 fixes head_dim at compile time (64 and 128 are common), so the inner loops have a known
// length and vectorize without a remainder; 0 reads it at run time.
template <typename scalar_t, int64_t HEAD_DIM>
void paged_decode(const scalar_t* q, const scalar_t* k_cache, const scalar_t* v_cache, const int32_t* block_tables,
                  const int32_t* context_lens, const scalar_t* k_new, const scalar_t* v_new, scalar_t* out,
                  int64_t num_seqs, int64_t num_heads, int64_t kv_heads, int64_t runtime_head_dim,
                  int64_t block_size, int64_t max_blocks) {
  const int64_t head_dim = HEAD_DIM > 0 ? HEAD_DIM : runtime_head_dim;
  using acc_t = at::opmath_type<scalar_t>;  // float for bfloat16, float16 and float32; double for double
  const acc_t scale = acc_t(1) / std::sqrt(static_cast<acc_t>(head_dim));
  const int64_t group = num_heads / kv_heads;  // query heads per KV head (GQA): head h reads KV head h / group
  const int64_t row_len = kv_heads * head_dim;  // one token's K (or V) of all KV heads, contiguous in the cache
  const int64_t block_stride = block_size * row_len;  // cache: [num_blocks, block_size, kv_heads, head_dim]
  at::parallel_for(0, num_seqs, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> qf(num_heads * head_dim), acc(num_heads * head_dim), row(row_len), scores;
    for (int64_t seq = begin; seq < end; ++seq) {
      const int64_t cached = context_lens[seq], ctx = cached + (k_new != nullptr);
      const int32_t* table = block_tables + seq * max_blocks;
      auto token_row = [&](const scalar_t* cache, const scalar_t* fresh, int64_t t) {  // token t's K or V row
        return t < cached ? cache + table[t / block_size] * block_stride + (t % block_size) * row_len
                          : fresh + seq * row_len;
      };
      const scalar_t* q_seq = q + seq * num_heads * head_dim;  // q: [num_seqs, num_heads, head_dim]
      for (int64_t i = 0; i < num_heads * head_dim; ++i) qf[i] = static_cast<acc_t>(q_seq[i]) * scale;
      scores.assign(num_heads * ctx, acc_t(0));  // [num_heads, ctx]
      for (int64_t t = 0; t < ctx; ++t) {  // 2. scores: read each token's K row once, for every head
        const scalar_t* k = token_row(k_cache, k_new, t);
        for (int64_t i = 0; i < row_len; ++i) row[i] = static_cast<acc_t>(k[i]);
        for (int64_t h = 0; h < num_heads; ++h) {
          const acc_t* kh = row.data() + (h / group) * head_dim;
          const acc_t* qh = qf.data() + h * head_dim;
          acc_t dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int64_t d = 0; d < head_dim; ++d) dot += qh[d] * kh[d];
          scores[h * ctx + t] = dot;
        }
      }
      for (int64_t h = 0; h < num_heads; ++h) {  // 3. softmax of each head's row
        acc_t* p = scores.data() + h * ctx;
        const acc_t max = *std::max_element(p, p + ctx);
        acc_t sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < ctx; ++t) sum += (p[t] = std::exp(p[t] - max));
        for (int64_t t = 0; t < ctx; ++t) p[t] /= sum;
      }
      std::fill(acc.begin(), acc.end(), acc_t(0));
      for (int64_t t = 0; t < ctx; ++t) {  // 4. out = P V: read each token's V row once
        const scalar_t* v = token_row(v_cache, v_new, t);
        for (int64_t i = 0; i < row_len; ++i) row[i] = static_cast<acc_t>(v[i]);
        for (int64_t h = 0; h < num_heads; ++h) {
          const acc_t p = scores[h * ctx + t];
          const acc_t* vh = row.data() + (h / group) * head_dim;
          acc_t* oh = acc.data() + h * head_dim;
#pragma omp simd
          for (int64_t d = 0; d < head_dim; ++d) oh[d] += p * vh[d];
        }
      }
      scalar_t* o = out + seq * num_heads * head_dim;
      for (int64_t i = 0; i < num_heads * head_dim; ++i) o[i] = static_cast<scalar_t>(acc[i]);
    }
  });
}

using fVec = at::vec::Vectorized<float>;

// HEAD_DIM values of p as HEAD_DIM / fVec::size() float vectors.
template <typename scalar_t, int64_t HEAD_DIM>
inline void load_as_float(const scalar_t* p, fVec* out) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    for (int64_t i = 0; i < HEAD_DIM / fVec::size(); ++i) out[i] = fVec::loadu(p + i * fVec::size());
  } else {
    using hVec = at::vec::Vectorized<scalar_t>;  // twice as many lanes as fVec
    for (int64_t i = 0; i < HEAD_DIM / hVec::size(); ++i) {
      auto [lo, hi] = at::vec::convert_to_float<scalar_t>(hVec::loadu(p + i * hVec::size()));
      out[2 * i] = lo;
      out[2 * i + 1] = hi;
    }
  }
}

// Load the cache lines of one token's K (or V) row of all KV heads ahead of use. In a decode step the
// cache is cold (the layer's weights streamed through since it was last read) and a sequence's rows sit
// in scattered blocks, so without this each row waits on memory in turn.
constexpr int64_t kPrefetchRows = 8;  // tokens ahead
template <typename scalar_t>
inline void prefetch_row(const scalar_t* row, int64_t len) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < len * int64_t(sizeof(scalar_t)); b += 64) __builtin_prefetch(p + b, 0, 3);
}

// The same four steps as `paged_decode`, a token at a time: each token's K (V) row of all KV heads is
// read once, in order, as float vectors; each KV head's part serves its `group` query heads. Float
// accumulation throughout.
template <typename scalar_t, int64_t HEAD_DIM>
void paged_decode_vec(const scalar_t* q, const scalar_t* k_cache, const scalar_t* v_cache, const int32_t* block_tables,
                      const int32_t* context_lens, const scalar_t* k_new, const scalar_t* v_new, scalar_t* out,
                      int64_t num_seqs, int64_t num_heads, int64_t kv_heads, int64_t /*head_dim*/,
                      int64_t block_size, int64_t max_blocks) {
  constexpr int64_t V = HEAD_DIM / fVec::size();  // float vectors per head
  const float scale = 1.0f / std::sqrt(static_cast<float>(HEAD_DIM));
  const int64_t group = num_heads / kv_heads, row_len = kv_heads * HEAD_DIM, block_stride = block_size * row_len;
  at::parallel_for(0, num_seqs, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(num_heads * HEAD_DIM), acc(num_heads * HEAD_DIM), scores;
    for (int64_t seq = begin; seq < end; ++seq) {
      const int64_t cached = context_lens[seq], ctx = cached + (k_new != nullptr);
      const int32_t* table = block_tables + seq * max_blocks;
      auto token_row = [&](const scalar_t* cache, const scalar_t* fresh, int64_t t) {
        return t < cached ? cache + table[t / block_size] * block_stride + (t % block_size) * row_len
                          : fresh + seq * row_len;
      };
      const scalar_t* q_seq = q + seq * num_heads * HEAD_DIM;
      for (int64_t i = 0; i < num_heads * HEAD_DIM; ++i) qf[i] = static_cast<float>(q_seq[i]) * scale;  // 1.
      scores.resize(num_heads * ctx);  // [num_heads, ctx]
      std::fill(acc.begin(), acc.end(), 0.0f);
      auto prefetch = [&](int64_t t) {  // token t's K and V rows (V is read in step 4)
        if (t < ctx) {
          prefetch_row(token_row(k_cache, k_new, t), row_len);
          prefetch_row(token_row(v_cache, v_new, t), row_len);
        }
      };
      for (int64_t t = 0; t < kPrefetchRows; ++t) prefetch(t);  // the first rows; the loop asks for the rest
      fVec x[V];
      for (int64_t t = 0; t < ctx; ++t) {  // 2. scores, token by token: each K row read once, whole, in order
        prefetch(t + kPrefetchRows);
        const scalar_t* k_row = token_row(k_cache, k_new, t);
        for (int64_t g = 0; g < kv_heads; ++g) {  // KV head g serves query heads g * group .. (g + 1) * group - 1
          load_as_float<scalar_t, HEAD_DIM>(k_row + g * HEAD_DIM, x);
          for (int64_t h = g * group; h < (g + 1) * group; ++h) {
            const float* qh = qf.data() + h * HEAD_DIM;
            fVec dot = fVec::loadu(qh) * x[0];
            for (int64_t i = 1; i < V; ++i) dot = at::vec::fmadd(fVec::loadu(qh + i * fVec::size()), x[i], dot);
            scores[h * ctx + t] = at::vec::vec_reduce_all<float>([](fVec& a, fVec& b) { return a + b; }, dot);
          }
        }
      }
      for (int64_t h = 0; h < num_heads; ++h) {  // 3. softmax
        float* p = scores.data() + h * ctx;
        const float max = at::vec::reduce_all<float>([](fVec& a, fVec& b) { return at::vec::maximum(a, b); }, p, ctx);
        at::vec::map([max](fVec s) { return (s - fVec(max)).exp_u20(); }, p, p, ctx);
        const float inv = 1.0f / at::vec::reduce_all<float>([](fVec& a, fVec& b) { return a + b; }, p, ctx);
        at::vec::map([inv](fVec s) { return s * fVec(inv); }, p, p, ctx);
      }
      for (int64_t t = 0; t < ctx; ++t) {  // 4. out = P V, token by token
        const scalar_t* v_row = token_row(v_cache, v_new, t);
        for (int64_t g = 0; g < kv_heads; ++g) {
          load_as_float<scalar_t, HEAD_DIM>(v_row + g * HEAD_DIM, x);
          for (int64_t h = g * group; h < (g + 1) * group; ++h) {
            const fVec p(scores[h * ctx + t]);
            float* oh = acc.data() + h * HEAD_DIM;
            for (int64_t i = 0; i < V; ++i)
              at::vec::fmadd(p, x[i], fVec::loadu(oh + i * fVec::size())).store(oh + i * fVec::size());
          }
        }
      }
      scalar_t* o = out + seq * num_heads * HEAD_DIM;
      for (int64_t i = 0; i < num_heads * HEAD_DIM; ++i) o[i] = static_cast<scalar_t>(acc[i]);
    }
  });
}

// q [num_seqs, num_heads, head_dim]; k/v_cache [num_blocks, block_size, kv_heads, head_dim] (one layer);
// block_tables [num_seqs, max_blocks], context_lens [num_seqs]: cached tokens of each sequence.
// k_new, v_new [num_seqs, kv_heads, head_dim] (optional): one more token per sequence, not yet in the cache,
// attended after the cached ones (the compiled decode step stores K/V after its graph). Any strides and
// integer types: made contiguous and int32 here (no copy when they are; a compiled graph passes q as a view).
torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor block_tables, torch::Tensor context_lens,
                                     c10::optional<torch::Tensor> k_new, c10::optional<torch::Tensor> v_new) {
  q = q.contiguous(), k_cache = k_cache.contiguous(), v_cache = v_cache.contiguous();
  block_tables = block_tables.to(at::kInt).contiguous(), context_lens = context_lens.to(at::kInt).contiguous();
  if (k_new.has_value()) k_new = k_new->contiguous();
  if (v_new.has_value()) v_new = v_new->contiguous();
  TORCH_CHECK(k_cache.scalar_type() == q.scalar_type() && v_cache.scalar_type() == q.scalar_type(),
              "q, k_cache and v_cache must have one dtype");
  TORCH_CHECK(k_new.has_value() == v_new.has_value(), "pass both k_new and v_new, or neither");
  const int64_t num_seqs = q.size(0), num_heads = q.size(1), head_dim = q.size(2);
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2);
  TORCH_CHECK(num_heads % kv_heads == 0 && k_cache.size(3) == head_dim, "q and the cache do not match");
  if (k_new.has_value()) {
    for (const auto& t : {*k_new, *v_new})
      TORCH_CHECK(t.scalar_type() == q.scalar_type() && t.dim() == 3 && t.size(0) == num_seqs &&
                  t.size(1) == kv_heads && t.size(2) == head_dim, "k_new and v_new must be [num_seqs, kv_heads, head_dim]");
  }
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == num_seqs && context_lens.numel() == num_seqs,
              "block_tables must be [num_seqs, max_blocks] and context_lens [num_seqs]");
  const int64_t least = k_new.has_value() ? 0 : 1, most = block_tables.size(1) * block_size;
  const int32_t* lens = context_lens.data_ptr<int32_t>();
  for (int64_t i = 0; i < num_seqs; ++i)  // else the kernel would divide by a zero sum, or read past a table
    TORCH_CHECK(lens[i] >= least && lens[i] <= most, "context_lens[", i, "] = ", lens[i], ": each must be in [",
                least, ", ", most, "] (at least one token to attend to; at most what its block table holds)");
  auto out = torch::empty_like(q);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_decode", [&] {
    auto run = [&](auto kernel) {
      kernel(q.data_ptr<scalar_t>(), k_cache.data_ptr<scalar_t>(), v_cache.data_ptr<scalar_t>(),
             block_tables.data_ptr<int32_t>(), context_lens.data_ptr<int32_t>(),
             k_new ? k_new->data_ptr<scalar_t>() : nullptr, v_new ? v_new->data_ptr<scalar_t>() : nullptr,
             out.data_ptr<scalar_t>(), num_seqs, num_heads, kv_heads, head_dim, block_size, block_tables.size(1));
    };
    if constexpr (std::is_same_v<scalar_t, double>) {
      run(paged_decode<scalar_t, 0>);
    } else {
      if (head_dim == 64) run(paged_decode_vec<scalar_t, 64>);
      else if (head_dim == 128) run(paged_decode_vec<scalar_t, 128>);
      else run(paged_decode<scalar_t, 0>);
    }
  });
  return out;
}

// The operator course_lib::paged_decode_attention for compiled graphs, registered in C++ so the graph calls
// it without going back to Python.
TORCH_LIBRARY_FRAGMENT(course_lib, m) {
  m.def("paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor context_lens, Tensor? k_new=None, Tensor? v_new=None) -> Tensor");
}
TORCH_LIBRARY_IMPL(course_lib, CPU, m) { m.impl("paged_decode_attention", &paged_decode_attention); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &paged_decode_attention, "decode attention over the paged KV cache (CPU)",
        py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("block_tables"), py::arg("context_lens"),
        py::arg("k_new") = py::none(), py::arg("v_new") = py::none());
}
