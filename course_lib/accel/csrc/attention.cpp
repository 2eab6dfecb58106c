// Attention over the paged KV cache on the CPU: one query row per sequence (a decode token), or each token of
// a prompt as a row that sees the tokens up to itself (`accel/attention.py`).
//
// The CPU twin of the Triton kernel (accel/triton_paged.py), and like it checked against the PyTorch reference
// `course_lib.attention.paged.paged_decode_attention` (tests/test_paged_attention.py). One task per row:
//
//   1. load its query heads as float, times 1/sqrt(head_dim)
//   2. scores[h, t] = q[h] . k[t, h / group] for each cached token t, read in place through the block table
//   3. softmax over t (in float; double for double inputs)
//   4. out[h] = sum_t p[h, t] * v[t, h / group], read in place through the block table
//
// No gather into a padded tensor and no mask: each row reads exactly its own context_len tokens.
// Two versions of the same steps: `paged_decode` (plain loops, any dtype and head_dim: the readable one, and the
// one for float64) and `paged_decode_vec` (float, bfloat16, float16 with head_dim 64 or 128: the one that runs),
// written with ATen's Vectorized<float>. `paged_decode_vec` goes KV head by KV head (`attend_heads`): the query
// heads that share it keep their q, and later their outputs, in registers for the whole context, so a token
// costs one load of its K (V) part and the multiply-adds. Inside a decode step the K/V is never in cache (the
// layer's weights streamed through since it was read), so it prefetches rows ahead, into L2.
// `python -m benchmarks.decode_attention` measures it against the reference; benchmarks/RESULTS.md has the history.

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
#include <ATen/ATen.h>

#include <type_traits>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

namespace course_lib {
namespace {

// Where token t of a sequence starts in the cache, in elements: its slot (the block its table names, times
// block_size, plus its offset in the block: `slot_mapping` in paged.py) times one row's length.
inline int64_t token_offset(const int32_t* table, int64_t t, int64_t block_size, int64_t row_len) {
  return (static_cast<int64_t>(table[t / block_size]) * block_size + t % block_size) * row_len;
}

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
  at::parallel_for(0, num_seqs, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> qf(num_heads * head_dim), acc(num_heads * head_dim), row(row_len), scores;
    for (int64_t seq = begin; seq < end; ++seq) {
      const int64_t cached = context_lens[seq], ctx = cached + (k_new != nullptr);
      const int32_t* table = block_tables + seq * max_blocks;
      auto token_row = [&](const scalar_t* cache, const scalar_t* fresh, int64_t t) {  // token t's K or V row
        return t < cached ? cache + token_offset(table, t, block_size, row_len) : fresh + seq * row_len;
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

// Ask for the cache lines of a token's K (or V) part ahead of use. In a decode step the cache is cold (the
// layer's weights streamed through since it was last read) and a sequence's rows sit in scattered blocks,
// so without this each row waits on memory in turn. Into L2 (locality 2: prefetcht1 on x86), not L1: the
// L1 has few slots for lines in flight, and V, prefetched during step 2, is read only in step 4.
constexpr int64_t kPrefetchRows = 16;  // tokens ahead
template <typename scalar_t>
inline void prefetch_row(const scalar_t* row, int64_t len) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < len * int64_t(sizeof(scalar_t)); b += 64) __builtin_prefetch(p + b, 0, 2);
}

// Lane sums of kTile float vectors: out[j] = the sum of d[j]'s lanes, for j < n. With AVX-512, one
// transpose-and-add tree for all 16 (30 shuffles and 15 adds, against 4 dependent shuffle-adds per sum
// one at a time); elsewhere one horizontal sum each.
constexpr int64_t kTile = 16;
inline void lane_sums(const fVec* d, float* out, int64_t n) {
#if defined(CPU_CAPABILITY_AVX512)
  static_assert(fVec::size() == kTile);
  __m512 b[8], c[4], e[2];
  for (int i = 0; i < 8; ++i)  // each 128-bit chunk: [x0+x2, y0+y2, x1+x3, y1+y3] of x = d[2i], y = d[2i+1]
    b[i] = _mm512_add_ps(_mm512_unpacklo_ps(d[2 * i], d[2 * i + 1]), _mm512_unpackhi_ps(d[2 * i], d[2 * i + 1]));
  for (int i = 0; i < 4; ++i)  // each chunk: its partial sums of d[4i], ..., d[4i+3]
    c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0x44), _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0xEE));
  for (int i = 0; i < 2; ++i)  // chunks 0+2 and 1+3 of c[2i], then of c[2i+1]
    e[i] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0xEE));
  const fVec sums = _mm512_add_ps(_mm512_shuffle_f32x4(e[0], e[1], 0x88), _mm512_shuffle_f32x4(e[0], e[1], 0xDD));
  sums.store(out, n);
#else
  for (int64_t j = 0; j < n; ++j) out[j] = at::vec::vec_reduce_all<float>([](fVec& a, fVec& b) { return a + b; }, d[j]);
#endif
}

// The four steps of `paged_decode` for HB query heads that share one KV head, over one sequence's ctx
// tokens. The HB heads' q and their outputs stay in registers for the whole context, so each token's K (V)
// costs a load of its KV head's part and HB * HEAD_DIM fused multiply-adds. `k_rows[t]` / `v_rows[t]`: where
// token t's K / V row of all KV heads starts; `part`: this KV head's offset in a row. qf: the heads' q, scaled,
// float; scores: room for [HB, ctx]; dots: for [HB, kTile] vectors; out: [HB, HEAD_DIM], float.
template <typename scalar_t, int64_t HEAD_DIM, int64_t HB>
void attend_heads(const float* qf, int64_t ctx, const scalar_t* const* k_rows, const scalar_t* const* v_rows,
                  int64_t part, float* scores, fVec* dots, float* out) {
  constexpr int64_t V = HEAD_DIM / fVec::size();  // float vectors per head
  fVec qv[HB][V], x[V];
  for (int64_t h = 0; h < HB; ++h)
    for (int64_t i = 0; i < V; ++i) qv[h][i] = fVec::loadu(qf + h * HEAD_DIM + i * fVec::size());
  for (int64_t t0 = 0; t0 < ctx; t0 += kTile) {  // 2. scores, kTile tokens at a time
    const int64_t n = std::min(kTile, ctx - t0);
    for (int64_t j = 0; j < n; ++j) {
      if (const int64_t ahead = t0 + j + kPrefetchRows; ahead < ctx) {  // V is read in step 4
        prefetch_row(k_rows[ahead] + part, HEAD_DIM);
        prefetch_row(v_rows[ahead] + part, HEAD_DIM);
      }
      load_as_float<scalar_t, HEAD_DIM>(k_rows[t0 + j] + part, x);
      for (int64_t h = 0; h < HB; ++h) {  // q . k as a vector of partial sums; lane_sums adds them up
        fVec dot = qv[h][0] * x[0];
        for (int64_t i = 1; i < V; ++i) dot = at::vec::fmadd(qv[h][i], x[i], dot);
        dots[h * kTile + j] = dot;
      }
    }
    for (int64_t h = 0; h < HB; ++h) lane_sums(dots + h * kTile, scores + h * ctx + t0, n);
  }
  for (int64_t h = 0; h < HB; ++h) {  // 3. softmax of each head's row
    float* p = scores + h * ctx;
    const float max = at::vec::reduce_all<float>([](fVec& a, fVec& b) { return at::vec::maximum(a, b); }, p, ctx);
    at::vec::map([max](fVec s) { return (s - fVec(max)).exp_u20(); }, p, p, ctx);
    const float inv = 1.0f / at::vec::reduce_all<float>([](fVec& a, fVec& b) { return a + b; }, p, ctx);
    at::vec::map([inv](fVec s) { return s * fVec(inv); }, p, p, ctx);
  }
  fVec acc[HB][V];  // 4. out = P V, token by token
  for (int64_t h = 0; h < HB; ++h)
    for (int64_t i = 0; i < V; ++i) acc[h][i] = fVec(0.0f);
  for (int64_t t = 0; t < ctx; ++t) {
    load_as_float<scalar_t, HEAD_DIM>(v_rows[t] + part, x);
    for (int64_t h = 0; h < HB; ++h) {
      const fVec p(scores[h * ctx + t]);
      for (int64_t i = 0; i < V; ++i) acc[h][i] = at::vec::fmadd(p, x[i], acc[h][i]);
    }
  }
  for (int64_t h = 0; h < HB; ++h)
    for (int64_t i = 0; i < V; ++i) acc[h][i].store(out + h * HEAD_DIM + i * fVec::size());
}

// attend_heads with HB = hb, for hb in 1..MAX_HB (one instance each).
template <typename scalar_t, int64_t HEAD_DIM, int64_t MAX_HB, typename... Args>
void attend_heads_by(int64_t hb, Args&&... args) {
  if constexpr (MAX_HB > 1) {
    if (hb < MAX_HB) return attend_heads_by<scalar_t, HEAD_DIM, MAX_HB - 1>(hb, std::forward<Args>(args)...);
  }
  attend_heads<scalar_t, HEAD_DIM, MAX_HB>(std::forward<Args>(args)...);
}

// The same four steps as `paged_decode`, by KV head: for each sequence and KV head, its query heads (up to
// kMaxHB at a time, as many as registers hold) go through `attend_heads`. Float accumulation throughout.
template <typename scalar_t, int64_t HEAD_DIM>
void paged_decode_vec(const scalar_t* q, const scalar_t* k_cache, const scalar_t* v_cache, const int32_t* block_tables,
                      const int32_t* context_lens, const scalar_t* k_new, const scalar_t* v_new, scalar_t* out,
                      int64_t num_seqs, int64_t num_heads, int64_t kv_heads, int64_t /*head_dim*/,
                      int64_t block_size, int64_t max_blocks, int64_t kv_begin, int64_t kv_end) {
  // KV heads [kv_begin, kv_end) and their query heads (all of them: 0, kv_heads); the other heads are not written
  constexpr int64_t V = HEAD_DIM / fVec::size();
  // attend_heads holds HB heads' vectors (their q, later their outputs) and a row's: give the heads at most
  // half the registers (AVX-512 has 32, AVX2 16). head_dim 64: 4 heads with AVX-512, 1 with AVX2.
  constexpr int64_t kRegisters = fVec::size() == 16 ? 32 : 16;
  constexpr int64_t kMaxHB = std::clamp<int64_t>(kRegisters / (2 * V), 1, 4);
  const float scale = 1.0f / std::sqrt(static_cast<float>(HEAD_DIM));
  const int64_t group = num_heads / kv_heads, row_len = kv_heads * HEAD_DIM;
  at::parallel_for(0, num_seqs, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(num_heads * HEAD_DIM), acc(num_heads * HEAD_DIM), scores;
    std::vector<fVec> dots(kMaxHB * kTile);
    std::vector<const scalar_t*> k_rows, v_rows;  // where each token's K / V row starts
    for (int64_t r = begin; r < end; ++r) {
      // Rows taken from both ends in turn (0, n-1, 1, n-2, ...): when the rows are a prompt's tokens, the i-th
      // seeing i + 1 of them, each thread's share of rows then holds about as many (token, query) pairs.
      const int64_t seq = r % 2 == 0 ? r / 2 : num_seqs - 1 - r / 2;
      const int64_t cached = context_lens[seq], ctx = cached + (k_new != nullptr);
      const int32_t* table = block_tables + seq * max_blocks;
      k_rows.resize(ctx), v_rows.resize(ctx);  // looked up once for all KV heads: no division per token in the loops
      for (int64_t t = 0; t < cached; ++t) {
        const int64_t row = token_offset(table, t, block_size, row_len);
        k_rows[t] = k_cache + row, v_rows[t] = v_cache + row;
      }
      if (ctx > cached) k_rows[cached] = k_new + seq * row_len, v_rows[cached] = v_new + seq * row_len;
      const scalar_t* q_seq = q + seq * num_heads * HEAD_DIM;
      for (int64_t i = 0; i < num_heads * HEAD_DIM; ++i) qf[i] = static_cast<float>(q_seq[i]) * scale;  // 1.
      scores.resize(kMaxHB * ctx);
      for (int64_t g = kv_begin; g < kv_end; ++g) {  // KV head g serves query heads g * group .. (g + 1) * group - 1
        for (int64_t h = g * group, hb; h < (g + 1) * group; h += hb) {
          hb = std::min(kMaxHB, (g + 1) * group - h);
          attend_heads_by<scalar_t, HEAD_DIM, kMaxHB>(hb, qf.data() + h * HEAD_DIM, ctx, k_rows.data(),
                                                      v_rows.data(), g * HEAD_DIM, scores.data(), dots.data(),
                                                      acc.data() + h * HEAD_DIM);
        }
      }
      scalar_t* o = out + seq * num_heads * HEAD_DIM;
      for (int64_t i = kv_begin * group * HEAD_DIM; i < kv_end * group * HEAD_DIM; ++i)
        o[i] = static_cast<scalar_t>(acc[i]);
    }
  });
}

}  // namespace

// `paged_decode_attention` for KV heads [kv_begin, kv_end) and their query heads only, into `out` (the caller's
// [num_seqs, heads, head_dim]; other heads untouched), for the threads of DecodeLayers (module.cpp) to share one
// sequence's heads: each head's arithmetic as in the whole call. Contiguous inputs, int32 tables and lengths,
// head_dim 64 or 128 (`paged_decode_heads_fit`), checked by the caller once.
bool paged_decode_heads_fit(at::ScalarType dtype, int64_t head_dim) {
  return dtype != at::kDouble && (head_dim == 64 || head_dim == 128);
}

void paged_decode_heads(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                        const at::Tensor& block_tables, const at::Tensor& context_lens, at::Tensor& out,
                        int64_t kv_begin, int64_t kv_end) {
  const int64_t num_seqs = q.size(0), num_heads = q.size(1), head_dim = q.size(2);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_decode_heads", [&] {
    if constexpr (!std::is_same_v<scalar_t, double>) {
      auto kernel = head_dim == 64 ? paged_decode_vec<scalar_t, 64> : paged_decode_vec<scalar_t, 128>;
      kernel(q.data_ptr<scalar_t>(), k_cache.data_ptr<scalar_t>(), v_cache.data_ptr<scalar_t>(),
             block_tables.data_ptr<int32_t>(), context_lens.data_ptr<int32_t>(), nullptr, nullptr,
             out.data_ptr<scalar_t>(), num_seqs, num_heads, k_cache.size(2), head_dim, k_cache.size(1),
             block_tables.size(1), kv_begin, kv_end);
    }
  });
}

// q [num_seqs, num_heads, head_dim]; k/v_cache [num_blocks, block_size, kv_heads, head_dim] (one layer);
// block_tables [num_seqs, max_blocks], context_lens [num_seqs]: cached tokens of each sequence.
// k_new, v_new [num_seqs, kv_heads, head_dim] (optional): one more token per sequence, not yet in the cache,
// attended after the cached ones (the compiled decode step stores K/V after its graph). Any strides and
// integer types: made contiguous and int32 here (no copy when they are; a compiled graph passes q as a view).
at::Tensor paged_decode_attention(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache,
                                  at::Tensor block_tables, at::Tensor context_lens,
                                  c10::optional<at::Tensor> k_new, c10::optional<at::Tensor> v_new) {
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
  auto out = at::empty_like(q);
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
      auto all_heads = [&](auto kernel) {
        return [&, kernel](auto... args) { kernel(args..., int64_t(0), kv_heads); };
      };
      if (head_dim == 64) run(all_heads(paged_decode_vec<scalar_t, 64>));
      else if (head_dim == 128) run(all_heads(paged_decode_vec<scalar_t, 128>));
      else run(paged_decode<scalar_t, 0>);
    }
  });
  return out;
}

}  // namespace course_lib
