"""A compiled decode step: one `torch.compile`d graph for a step where each sequence adds one token.

Eager PyTorch pays Python and dispatch time for each of the ~40 small ops of a layer. On a 2-core CPU
that is ~10 ms of a ~35 ms float32 decode step of the default model, whose matmuls alone take ~20 ms.
Inductor turns the whole step (30 layers, attention included) into generated C++: elementwise ops
fused into loops, no Python between ops (`cpp_wrapper`), and for bfloat16 the weights prepacked
for oneDNN (`freezing`, which uses AMX where the CPU has it). With `fast_path`, the layers choose
their own kernels (`packed_linear.pack_linears(opaque=False)`): the one-sequence graph of a bfloat16
model calls the C++ one-row kernel (`OneRowLinear`) on an Intel CPU, the batched one the AMX tiles on
a CPU with AMX (`AmxLinear`; 16 sequences: 1.54x a step against oneDNN's packed weights), a float32 graph MKL's
packed GEMM (`SgemmPackedLinear`) on an Intel CPU, oneDNN's packed weights elsewhere (`PackedLinear`,
through the operator `course_lib::onednn_linear`). A "cpu" INT8 layer's graph calls `course_lib::int8_linear`,
which picks PyTorch's INT8 op or a bfloat16 matmul by the step's rows as it runs (`quant.linear.use_graph_operator`).

    step(input_ids [n], positions [n], block_tables [n, blocks], cached_lens [n])
        -> logits [n, vocab], new_k and new_v [layers, n, kv_heads, head_dim]
    then one index_copy_ per cache stores every layer's new K/V at the sequences' slots.

Why the K/V store happens after the graph and not inside it: writing into the cache (an input of
the graph) from inside made Inductor copy the whole cache each step (measured: 103 ms a step
instead of 26 with a 64 MB cache). Inside, each sequence attends over its cached tokens plus the
new one (`decode_attention`, or with `use_cpp` the C++ kernel of `course_lib.attention.cpu_paged`,
called as the operator `course_lib::paged_decode_attention`), which is what attention after the
store would have seen.

Compiling takes minutes on a 2-core CPU, so it happens once, when the engine starts (`warmup`),
and `compile_seconds` says how long it took. Prefill and mixed steps stay eager. Batched decode
steps use the graph only with the C++ kernel: with attention compiled from PyTorch ops (a padded
gather), the dynamic-shape graph for many sequences was slower than eager (16 and 64 requests:
0.68-0.95x `transformers`, against 1.07-1.27x eager), while with the kernel it was faster than
eager (measured on a 2-core Xeon, bfloat16: 16 requests 422 against 400 tok/s, 64: 742 against 718).
"""
from __future__ import annotations

import functools
import time

import torch

from ..attention import cpu_paged
from ..attention.paged import PagedKVCache, gather_blocks
from ..model import Transformer
from ..quant.linear import use_graph_operator


def decode_attention(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, k_cache_layer: torch.Tensor,
                     v_cache_layer: torch.Tensor, block_tables: torch.Tensor, cached_lens: torch.Tensor) -> torch.Tensor:
    """One query per sequence over its cached tokens and its own new key/value (not yet stored).

    q [n, heads, head_dim]; k_new, v_new [n, kv_heads, head_dim]; k/v_cache_layer [num_blocks, block_size,
    kv_heads, head_dim]; block_tables [n, blocks] (valid block ids; entries past a sequence's cached
    tokens are read but masked); cached_lens [n]: tokens already in the cache. Returns [n, heads, head_dim].
    """
    n, num_heads, head_dim = q.shape
    kv_heads = k_new.shape[1]
    keys = torch.cat([gather_blocks(k_cache_layer, block_tables), k_new[:, None]], 1)  # [n, ctx + 1, kv_heads, d]
    values = torch.cat([gather_blocks(v_cache_layer, block_tables), v_new[:, None]], 1)
    ctx = keys.shape[1]
    # The query heads of one KV head act as that head's queries (GQA without copying K/V).
    scores = q.view(n, kv_heads, num_heads // kv_heads, head_dim) @ keys.permute(0, 2, 3, 1)  # [n, kvh, g, ctx+1]
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32)) * head_dim ** -0.5  # softmax in >= fp32
    pos = torch.arange(ctx, device=q.device)
    padding = (pos[None, :] >= cached_lens[:, None]) & (pos[None, :] < ctx - 1)  # [n, ctx+1]; last = new token
    probs = scores.masked_fill(padding[:, None, None, :], float("-inf")).softmax(-1).to(values.dtype)
    return (probs @ values.transpose(1, 2)).reshape(n, num_heads, head_dim)  # [n, kvh, g, d] -> [n, heads, d]


class DecodeStepAttention:
    """Attention backend for one compiled decode step: attends, and keeps each layer's new K/V for later.

    `use_cpp`: attend through the C++ kernel (`cpu_paged`, as an operator the graph calls) instead
    of `decode_attention`, which Inductor compiles into a padded gather."""

    def __init__(self, kv_cache: PagedKVCache, block_tables: torch.Tensor, cached_lens: torch.Tensor,
                 use_cpp: bool = False):
        self.kv_cache, self.block_tables, self.cached_lens = kv_cache, block_tables, cached_lens
        self.use_cpp = use_cpp
        if use_cpp and not torch.compiler.is_compiling():  # an eager call: loading the kernel defines its operator
            cpu_paged.available()  # (a compiled step loaded it before tracing: CompiledDecodeStep.__init__)
        self.new_k: list[torch.Tensor] = []
        self.new_v: list[torch.Tensor] = []

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [1, n, heads, d], k/v [1, n, kv_heads, d] -> [1, n, heads, d]."""
        self.new_k.append(k[0])
        self.new_v.append(v[0])
        k_cache, v_cache = self.kv_cache.k_cache[layer_idx], self.kv_cache.v_cache[layer_idx]
        if self.use_cpp:
            out = torch.ops.course_lib.paged_decode_attention(q[0], k_cache, v_cache, self.block_tables,
                                                              self.cached_lens, k[0], v[0])
        else:
            out = decode_attention(q[0], k[0], v[0], k_cache, v_cache, self.block_tables, self.cached_lens)
        return out[None]

    def advance(self, num_tokens: int) -> None:
        pass


def decode_step(model: Transformer, kv_cache: PagedKVCache, input_ids: torch.Tensor, positions: torch.Tensor,
                block_tables: torch.Tensor, cached_lens: torch.Tensor, use_cpp: bool = False):
    """The function `CompiledDecodeStep` compiles: input_ids, positions, cached_lens [n], block_tables [n, blocks]
    -> logits [n, vocab], new_k and new_v [layers, n, kv_heads, head_dim]. Reads the cache, writes nothing."""
    attn = DecodeStepAttention(kv_cache, block_tables, cached_lens, use_cpp)
    logits = model(input_ids[None], positions[None], kv=attn)[0]  # [n, vocab]
    return logits, torch.stack(attn.new_k), torch.stack(attn.new_v)


class CompiledDecodeStep:
    """`decode_step` through `torch.compile`, compiled once by `warmup()`, plus the K/V store after it."""

    MIN_BLOCKS = 2  # tables are padded to >= 2 columns: a size of 1 would make torch.compile build another graph

    def __init__(self, model: Transformer, kv_cache: PagedKVCache, use_cpp: bool = False):
        self.model, self.kv_cache = model, kv_cache
        # Batched steps use the graph only with the C++ kernel: with attention compiled from PyTorch ops the
        # batched graph was slower than eager (see the module docstring); with the kernel it was faster.
        self.use_cpp = use_cpp and cpu_paged.available(model.device)
        use_graph_operator(model)  # "cpu" INT8 layers: the product chosen by the rows as a step runs
        options = {}
        if model.device.type == "cpu":
            # freezing prepacks the weights F.linear reads for oneDNN: it pays in bfloat16 (AMX) where the
            # layers have no kernel of their own (`AmxLinear`); in float32 it was measured level (batch 1:
            # 26.9 vs 26.2 ms a step; 16 sequences: 193 vs 187 tok/s).
            options = {"cpp_wrapper": True, "freezing": model.dtype != torch.float32}
        self._step = torch.compile(functools.partial(decode_step, model, kv_cache, use_cpp=self.use_cpp),
                                   dynamic=True, options=options)
        self.compile_seconds = 0.0
        self.steps = 0  # decode steps run through the compiled graph
        self.warm = False  # set by warmup: every graph a step can need is compiled

    @torch.inference_mode()
    def warmup(self) -> float:
        """Compile at two context sizes (so later lengths reuse the dynamic graph), for one sequence and,
        when batches use the graph, for two and three (a size of 1 gets a graph of its own).

        Returns the seconds it took, also kept in `compile_seconds`. Writes nothing to the cache.
        """
        device, t = self.model.device, time.perf_counter()
        sizes = [(1, 2), (1, 3)] + ([(2, 2), (3, 3)] if self.use_cpp else [])  # (sequences, blocks)
        # No "duck sizing": by default sizes that happen to be equal while tracing (2 sequences, 2 blocks, a
        # model of 2 layers) become one symbol, and a later step where they differ compiles again.
        with torch.fx.experimental._config.patch(use_duck_shape=False):
            for n, blocks in sizes:
                self._step(torch.zeros(n, dtype=torch.long, device=device), torch.full((n,), 5, device=device),
                           torch.zeros(n, blocks, dtype=torch.int32, device=device),
                           torch.full((n,), 5, dtype=torch.int32, device=device))
        self.compile_seconds += time.perf_counter() - t
        self.warm = True
        return self.compile_seconds

    def _run(self, *inputs: torch.Tensor):
        """The compiled step. Once warm, Dynamo checks only the guards that tell its graphs apart (one
        sequence or more, the inputs' kind), not those on every weight and buffer it traced: 1.3 -> 0.6 ms
        a step (float32, batch 1, under the profiler). The model and cache never change, so those hold. An
        input no graph fits (say, tensors made outside inference mode) makes Dynamo refuse to compile under
        that setting; then the step goes back to checking every guard, and compiles."""
        if self.warm:
            try:
                with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                    return self._step(*inputs)
            except RuntimeError as e:
                if "Recompilation triggered" not in str(e):
                    raise
                self.warm = False
        return self._step(*inputs)

    @torch.inference_mode()
    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, block_tables: list[list[int]],
                 slot_mapping: torch.Tensor) -> torch.Tensor:
        """input_ids, positions, slot_mapping [n]; block_tables: each sequence's blocks, enough for its
        position. Stores the new K/V at `slot_mapping` and returns logits [n, vocab]."""
        width = max(self.MIN_BLOCKS, max(map(len, block_tables)))
        tables = torch.tensor([t + [0] * (width - len(t)) for t in block_tables], dtype=torch.int32,
                              device=input_ids.device)  # [n, blocks], the kernel's int32; padding reads block 0, masked
        logits, new_k, new_v = self._run(input_ids, positions, tables, positions.to(torch.int32))
        self.steps += 1
        layers, _, kv_heads, head_dim = new_k.shape
        for cache, new in ((self.kv_cache.k_cache, new_k), (self.kv_cache.v_cache, new_v)):
            cache.view(layers, -1, kv_heads, head_dim).index_copy_(1, slot_mapping, new)
        return logits
