// What the extension offers, in one place: the Python functions (pybind11, for eager steps: the cheapest call
// from Python), the operators compiled graphs call (TORCH_LIBRARY, so Inductor's C++ wrapper calls them
// without going back to Python), and `DecodeLayers`, a decode step's layers as one call of those kernels
// (accel/cpp_decode.py). The kernels are in fused_ops.cpp, linear.cpp and attention.cpp.

#include <torch/library.h>
#include <torch/python.h>
#include <ATen/Parallel.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace course_lib {
// fused_ops.cpp
at::Tensor rms_norm(at::Tensor x, at::Tensor weight, double eps);
std::vector<at::Tensor> add_rms_norm(at::Tensor x, at::Tensor add, at::Tensor weight, double eps);
void rope_qk_(at::Tensor qkv, at::Tensor cos, at::Tensor sin, int64_t rot_heads, int64_t head_dim);
at::Tensor silu_mul(at::Tensor gate_up);
void rms_norm_into(const at::Tensor& x, const at::Tensor& weight, double eps, at::Tensor& out);
void add_rms_norm_into(const at::Tensor& x, const at::Tensor& add, const at::Tensor& weight, double eps,
                       at::Tensor& sum, at::Tensor& out);
void silu_mul_into(const at::Tensor& gate_up, at::Tensor& out);
// linear.cpp
int64_t panel_width(at::ScalarType dtype);
at::Tensor pack_panels(const at::Tensor& w);
at::Tensor by_panels(const at::Tensor& x, const at::Tensor& panels);
int64_t keep(at::Tensor packed);
void release(int64_t handle);
int64_t kept();
at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias);
at::Tensor onednn_linear(const at::Tensor& x, int64_t handle, int64_t out_features,
                         const std::optional<at::Tensor>& panels, int64_t panel_rows);
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                       int64_t many_rows);
std::vector<std::string> w4a8_paths();
at::Tensor w4a8_linear(const at::Tensor& x, const at::Tensor& packed, int64_t out_features, const std::string& isa);
struct W4A8Product;  // x quantized for one W4A8 product, and its output
std::shared_ptr<W4A8Product> w4a8_product();
void w4a8_begin(W4A8Product& c, const at::Tensor& x, const at::Tensor& packed, int64_t out_features,
                const std::string& isa, const std::optional<at::Tensor>& y);
int64_t w4a8_panel_count(const W4A8Product& c);
void w4a8_run_panels(const W4A8Product& c, int64_t begin, int64_t end);
// attention.cpp
at::Tensor paged_decode_attention(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache,
                                  at::Tensor block_tables, at::Tensor context_lens,
                                  c10::optional<at::Tensor> k_new, c10::optional<at::Tensor> v_new);
bool paged_decode_heads_fit(at::ScalarType dtype, int64_t head_dim);
void paged_decode_heads(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                        const at::Tensor& block_tables, const at::Tensor& context_lens, at::Tensor& out,
                        int64_t kv_begin, int64_t kv_end);

// A linear layer as the decode loop calls it: the W4A8 kernel (`packed` from accel/w4a8.py), or a oneDNN packed
// weight with, for 1 to `panel_rows` rows, its panels: each the kernel the layer's eager forward calls.
struct DecodeLinear {
  at::Tensor weight;  // W4A8: [n/16, blocks, 320] uint8; else oneDNN's packed weight
  std::optional<at::Tensor> panels, bias;
  int64_t out_features = 0, panel_rows = 0;
  std::string w4a8_isa;  // W4A8 layers: the path ("" = the widest here)
  bool w4a8 = false;

  at::Tensor operator()(const at::Tensor& x) const {
    if (!w4a8 && !(panels && x.size(0) <= panel_rows)) return packed_linear(x, weight, bias);
    auto y = w4a8 ? w4a8_linear(x, weight, out_features, w4a8_isa) : by_panels(x, *panels);
    return bias ? y + bias->to(y.scalar_type()) : y;
  }
};

// One pre-norm block of the fused model (accel/fused_model.py, FusedBlock) and its layer of the paged KV cache.
struct DecodeLayer {
  at::Tensor input_norm, post_attention_norm, k_cache, v_cache;  // caches [blocks, block_size, kv_heads, head_dim]
  DecodeLinear qkv, o, gate_up, down;
};

// A decode step's layers, each a call of the kernels the eager step calls one by one from Python, in the same
// order and with the same inputs, so the same bits: x [n, hidden] (one token per sequence) -> the residual stream
// after the last layer; each layer's K/V stored at `slots` on the way.
class DecodeLayers {
 public:
  DecodeLayers(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps)
      : heads_(num_heads), kv_heads_(num_kv_heads), head_dim_(head_dim), eps_(eps) {}
  void add(DecodeLayer layer) {
    for (const auto* l : {&layer.qkv, &layer.o, &layer.gate_up, &layer.down}) all_w4a8_ &= l->w4a8 && !l->bias;
    if (!layers_.empty()) {  // run_in_one_region sizes its buffers by the first layer
      const auto& f = layers_[0];
      all_w4a8_ &= layer.qkv.out_features == f.qkv.out_features && layer.o.out_features == f.o.out_features &&
                   layer.gate_up.out_features == f.gate_up.out_features &&
                   layer.down.out_features == f.down.out_features;
    }
    layers_.push_back(std::move(layer));
  }

  // cos, sin [n, head_dim]; block_tables [n, blocks] and context_lens [n] (the new token included), contiguous
  // int32; slots [n] int64 (the new token's flat cache slot, -1: none).
  at::Tensor run(at::Tensor x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& block_tables,
                 const at::Tensor& context_lens, const at::Tensor& slots) const {
    TORCH_CHECK(x.dim() == 2 && slots.numel() == x.size(0) && slots.scalar_type() == at::kLong,
                "DecodeLayers.run: x [n, hidden], slots [n] int64");
    TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == x.size(0) && context_lens.numel() == x.size(0) &&
                    block_tables.scalar_type() == at::kInt && context_lens.scalar_type() == at::kInt &&
                    block_tables.is_contiguous() && context_lens.is_contiguous(),
                "DecodeLayers.run: block_tables [n, blocks] and context_lens [n], contiguous int32");
    if (!layers_.empty()) {  // what the kernels read stays inside the tables
      const int64_t most = block_tables.size(1) * layers_[0].k_cache.size(1);
      const int32_t* lens = context_lens.data_ptr<int32_t>();
      for (int64_t i = 0; i < context_lens.numel(); ++i)
        TORCH_CHECK(lens[i] >= 1 && lens[i] <= most, "DecodeLayers.run: context_lens[", i, "] = ", lens[i],
                    " is not in [1, ", most, "]");
    }
#ifdef _OPENMP
    if (all_w4a8_ && !layers_.empty() && at::get_num_threads() > 1 && !at::in_parallel_region())
      return run_in_one_region(x, cos, sin, block_tables, context_lens, slots);
#endif
    for (const auto& L : layers_) {
      auto qkv = L.qkv(rms_norm(x, L.input_norm, eps_));  // [n, q + 2 kv]
      auto sum_norm = add_rms_norm(x, L.o(attend(L, qkv, cos, sin, block_tables, context_lens, slots)),
                                   L.post_attention_norm, eps_);
      x = sum_norm[0];
      add_(x, L.down(silu_mul(L.gate_up(sum_norm[1]))));
    }
    return x;
  }

 private:
  // RoPE on qkv [n, q + 2 kv] in place, its k and v stored at their slots, attention -> [n, q].
  at::Tensor attend(const DecodeLayer& L, const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                    const at::Tensor& block_tables, const at::Tensor& context_lens, const at::Tensor& slots) const {
    return attend_rotated(L, rotate_and_store(L, qkv, cos, sin, slots), block_tables, context_lens)
        .view({qkv.size(0), heads_ * head_dim_});
  }

  // Attention of rotated q [n, heads, head_dim] over the cache (its K/V stored) -> [n, heads, head_dim].
  at::Tensor attend_rotated(const DecodeLayer& L, const at::Tensor& q, const at::Tensor& block_tables,
                            const at::Tensor& context_lens) const {
    return paged_decode_attention(q, L.k_cache, L.v_cache, block_tables, context_lens, c10::nullopt, c10::nullopt);
  }

  // RoPE on qkv [n, q + 2 kv] in place and its k and v stored at their slots; returns q [n, heads, head_dim].
  at::Tensor rotate_and_store(const DecodeLayer& L, const at::Tensor& qkv, const at::Tensor& cos,
                              const at::Tensor& sin, const at::Tensor& slots) const {
    auto q = at::empty({qkv.size(0), heads_, head_dim_}, qkv.options());
    rotate_and_store_into(L, qkv, cos, sin, slots, q);
    return q;
  }

  // The same, q written to the caller's q [n, heads, head_dim].
  void rotate_and_store_into(const DecodeLayer& L, const at::Tensor& qkv, const at::Tensor& cos,
                             const at::Tensor& sin, const at::Tensor& slots, at::Tensor& q) const {
    const int64_t n = qkv.size(0), q_size = heads_ * head_dim_, kv_size = kv_heads_ * head_dim_;
    rope_qk_(qkv, cos, sin, heads_ + kv_heads_, head_dim_);
    const int64_t* slot = slots.data_ptr<int64_t>();
    const int64_t e = qkv.element_size(), row_bytes = kv_size * e;
    const char* base = static_cast<const char*>(qkv.data_ptr());
    for (int64_t i = 0; i < n; ++i) {  // this token's q to q; store_kvcache: its k and v at its slot
      const char* row = base + i * qkv.size(1) * e;
      std::memcpy(static_cast<char*>(q.data_ptr()) + i * q_size * e, row, q_size * e);
      if (slot[i] < 0) continue;
      std::memcpy(static_cast<char*>(L.k_cache.data_ptr()) + slot[i] * row_bytes, row + q_size * e, row_bytes);
      std::memcpy(static_cast<char*>(L.v_cache.data_ptr()) + slot[i] * row_bytes, row + (q_size + kv_size) * e,
                  row_bytes);
    }
  }

#ifdef _OPENMP
  // The same steps for a model whose linear layers are all W4A8 (an INT4 model) inside one OpenMP parallel
  // region: each product's panels split among the threads, the steps between products on the calling thread,
  // barriers between. Starting a parallel region for each product (w4a8_linear) costs more than a small
  // layer's product takes; a barrier costs a fraction of that. Each step's output has a buffer made once per
  // call, which the steps fill: making a small tensor costs more than the step that fills it.
  at::Tensor run_in_one_region(const at::Tensor& x_in, const at::Tensor& cos, const at::Tensor& sin,
                               const at::Tensor& block_tables, const at::Tensor& context_lens,
                               const at::Tensor& slots) const {
    const int64_t n = x_in.size(0);
    const DecodeLayer& first = layers_[0];
    auto buffer = [&](int64_t width) { return at::empty({n, width}, x_in.options()); };
    at::Tensor x = x_in.clone(at::MemoryFormat::Contiguous), h = buffer(x.size(1));  // residual stream, its norm
    at::Tensor qkv = buffer(first.qkv.out_features), q = at::empty({n, heads_, head_dim_}, x_in.options());
    at::Tensor attn = buffer(heads_ * head_dim_), o = buffer(first.o.out_features);
    at::Tensor gate_up = buffer(first.gate_up.out_features), act = buffer(first.gate_up.out_features / 2);
    at::Tensor down = buffer(first.down.out_features), attn_heads = attn.view({n, heads_, head_dim_});
    const std::shared_ptr<W4A8Product> product = w4a8_product();
    std::exception_ptr error;
    auto serial = [&](auto&& step) {  // on the calling thread; an exception stops the loop, rethrown after it
      if (error) return;
      try {
        step();
      } catch (...) {
        error = std::current_exception();
      }
    };
    auto begin = [&](const at::Tensor& in, const DecodeLinear& l, const at::Tensor& out) {
      w4a8_begin(*product, in, l.weight, l.out_features, l.w4a8_isa, out);
    };
    const bool split = paged_decode_heads_fit(x.scalar_type(), head_dim_);  // threads share attention by KV head
#pragma omp parallel num_threads(at::get_num_threads())
    {
      const int64_t thread = omp_get_thread_num(), threads = omp_get_num_threads();
      auto share = [&] {  // this thread's panels of the product begun on the calling thread
#pragma omp barrier
        if (!error) {
          const int64_t panels = w4a8_panel_count(*product), per = (panels + threads - 1) / threads;
          w4a8_run_panels(*product, std::min(panels, thread * per), std::min(panels, (thread + 1) * per));
        }
#pragma omp barrier
      };
      for (const auto& L : layers_) {
#pragma omp master
        serial([&] {
          rms_norm_into(x, L.input_norm, eps_, h);
          begin(h, L.qkv, qkv);
        });
        share();
#pragma omp master
        serial([&] {
          rotate_and_store_into(L, qkv, cos, sin, slots, q);
          if (!split) attn_heads.copy_(attend_rotated(L, q, block_tables, context_lens));
        });
#pragma omp barrier
        if (split && !error) {  // each thread its KV heads (and their query heads) of the same sequences
          const int64_t per = (kv_heads_ + threads - 1) / threads;
          const int64_t g0 = std::min(kv_heads_, thread * per), g1 = std::min(kv_heads_, (thread + 1) * per);
          if (g0 < g1) paged_decode_heads(q, L.k_cache, L.v_cache, block_tables, context_lens, attn_heads, g0, g1);
        }
#pragma omp barrier
#pragma omp master
        serial([&] { begin(attn, L.o, o); });
        share();
#pragma omp master
        serial([&] {
          add_rms_norm_into(x, o, L.post_attention_norm, eps_, x, h);
          begin(h, L.gate_up, gate_up);
        });
        share();
#pragma omp master
        serial([&] {
          silu_mul_into(gate_up, act);
          begin(act, L.down, down);
        });
        share();
#pragma omp master
        serial([&] { add_(x, down); });
      }
    }
    if (error) std::rethrow_exception(error);
    return x;
  }

#endif

  // x += y in place (the residual add): each sum in float, rounded once to x's dtype, as at::add does.
  static void add_(at::Tensor& x, const at::Tensor& y) {
    const auto dtype = x.scalar_type();
    if (y.scalar_type() != dtype || !x.is_contiguous() || !y.is_contiguous() ||
        (dtype != at::kFloat && dtype != at::kBFloat16)) {
      x = x + y;
      return;
    }
    AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, dtype, "add_", [&] {
      scalar_t* xp = x.data_ptr<scalar_t>();
      const scalar_t* yp = y.data_ptr<scalar_t>();
      for (int64_t i = 0; i < x.numel(); ++i) xp[i] = scalar_t(static_cast<float>(xp[i]) + static_cast<float>(yp[i]));
    });
  }

  int64_t heads_, kv_heads_, head_dim_;
  double eps_;
  bool all_w4a8_ = true;
  std::vector<DecodeLayer> layers_;
};
}  // namespace course_lib

TORCH_LIBRARY(course_lib, m) {
  m.def("onednn_linear(Tensor x, int handle, int out_features, Tensor? panels=None, int panel_rows=0) -> Tensor");
  m.def("int8_linear(Tensor x, Tensor codes, Tensor scales, int many_rows) -> Tensor");
  m.def("w4a8_linear(Tensor x, Tensor packed, int out_features, str isa='') -> Tensor");
  m.def("paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor context_lens, Tensor? k_new=None, Tensor? v_new=None) -> Tensor");
}
TORCH_LIBRARY_IMPL(course_lib, CPU, m) {
  m.impl("onednn_linear", &course_lib::onednn_linear);
  m.impl("int8_linear", &course_lib::int8_linear);
  m.impl("w4a8_linear", &course_lib::w4a8_linear);
  m.impl("paged_decode_attention", &course_lib::paged_decode_attention);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace course_lib;
  m.def("rms_norm", &rms_norm, "RMSNorm of each row, one pass");
  m.def("add_rms_norm", &add_rms_norm, "(x + add, rms_norm(x + add)): residual add and norm, one pass");
  m.def("rope_qk_", &rope_qk_, "RoPE in place on the first rot_heads heads of packed qkv rows");
  m.def("silu_mul", &silu_mul, "silu(gate) * up from [.., 2 * inter] rows");
  m.attr("panel_width") = py::dict(py::arg("float32") = panel_width(at::kFloat),  // 0: no panel kernel
                                    py::arg("bfloat16") = panel_width(at::kBFloat16));
  m.def("pack_panels", &pack_panels, "a linear layer's weight [n, k] as panels");
  m.def("by_panels", &by_panels, "x [m, k] @ w^T through the panels of w: [m, n]");
  m.def("keep", &keep, "keep a packed oneDNN weight in the table; returns its handle");
  m.def("release", &release, "drop the packed weight under a handle");
  m.def("kept", &kept, "how many packed weights the table holds");
  m.def("onednn_linear", &onednn_linear, "x [m, in] @ w^T through the weight under a handle (or the panels)",
        py::arg("x"), py::arg("handle"), py::arg("out_features"), py::arg("panels") = py::none(),
        py::arg("panel_rows") = 0);
  m.def("w4a8_paths", &w4a8_paths, "the W4A8 paths this CPU and build run, narrowest first");
  m.def("w4a8_linear", &w4a8_linear, "x [m, k] @ W^T, W as packed Q4_1 blocks, x quantized to int8 per block",
        py::arg("x"), py::arg("packed"), py::arg("out_features"), py::arg("isa") = "");
  m.def("paged_decode_attention", &paged_decode_attention, "attention over the paged KV cache, a query row each",
        py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("block_tables"), py::arg("context_lens"),
        py::arg("k_new") = py::none(), py::arg("v_new") = py::none());
  py::class_<DecodeLinear>(m, "DecodeLinear", "a linear layer as DecodeLayers calls it")
      .def(py::init([](at::Tensor weight, std::optional<at::Tensor> panels, std::optional<at::Tensor> bias,
                       int64_t out_features, int64_t panel_rows, std::string w4a8_isa, bool w4a8) {
             return DecodeLinear{weight, panels, bias, out_features, panel_rows, w4a8_isa, w4a8};
           }),
           py::arg("weight"), py::arg("panels"), py::arg("bias"), py::arg("out_features"), py::arg("panel_rows"),
           py::arg("w4a8_isa"), py::arg("w4a8"));
  py::class_<DecodeLayers>(m, "DecodeLayers", "a decode step's layers as one call")
      .def(py::init<int64_t, int64_t, int64_t, double>(), py::arg("num_heads"), py::arg("num_kv_heads"),
           py::arg("head_dim"), py::arg("eps"))
      .def("add", [](DecodeLayers& self, at::Tensor input_norm, at::Tensor post_attention_norm, at::Tensor k_cache,
                     at::Tensor v_cache, DecodeLinear qkv, DecodeLinear o, DecodeLinear gate_up, DecodeLinear down) {
             self.add({input_norm, post_attention_norm, k_cache, v_cache, qkv, o, gate_up, down});
           })
      .def("run", &DecodeLayers::run, py::call_guard<py::gil_scoped_release>(), py::arg("x"), py::arg("cos"),
           py::arg("sin"), py::arg("block_tables"), py::arg("context_lens"), py::arg("slots"));
}
