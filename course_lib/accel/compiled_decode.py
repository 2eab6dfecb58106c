"""A compiled decode step: one `torch.compile`d graph for a step where each sequence adds one token.

Eager PyTorch pays Python and dispatch time for each of the ~40 small ops of a layer. Inductor turns the whole
step (all layers, attention included) into generated C++: elementwise ops fused into loops and no Python
between ops (`cpp_wrapper`). The layers keep their kernels: a `PackedLinear` is called through the operator
`course_lib::onednn_linear`, attention through `course_lib::paged_decode_attention` when the plan has the C++
kernels, and a oneDNN INT8 layer (`OneDNNQuantLinear`) through `course_lib::int8_linear`, which picks its product
by the step's rows as it runs (a branch on the rows in Python would need a graph per side).

    step(input_ids [n], positions [n], block_tables [n, blocks], cached_lens [n])
        -> logits [n, vocab], new_k and new_v [layers, n, kv_heads, head_dim]
    then one index_copy_ per cache stores every layer's new K/V at the sequences' slots.

The K/V store happens after the graph, not inside it: writing into the cache (an input of the graph) from
inside made Inductor copy the whole cache each step. Inside, each sequence attends over its cached tokens plus
the new one, which is what attention after the store would have seen.

Compiling takes minutes on a 2-core CPU, so it happens once, when the engine starts (`warmup`), and
`compile_seconds` says how long it took. Prefill and mixed steps stay eager. Batched decode steps use the graph
only with the C++ kernel: attention compiled from PyTorch ops (a padded gather) made the batched graph slower
than eager steps.
"""
from __future__ import annotations

import functools
import time

import torch

from ..attention.paged import PagedKVCache
from ..host_copy import staged
from ..model import Transformer
from .attention import decode_attention_with_new
from .quant_linear import INT8_DEQUANTIZE_ROWS, OneDNNQuantLinear


class DecodeStepAttention:
    """Attention backend for one compiled decode step: attends, and keeps each layer's new K/V for later.

    `use_cpp`: attend through the C++ kernel (the operator the graph calls) instead of `decode_attention_with_new`,
    which Inductor compiles into a padded gather."""

    def __init__(self, kv_cache: PagedKVCache, block_tables: torch.Tensor, cached_lens: torch.Tensor,
                 use_cpp: bool = False):
        self.kv_cache, self.block_tables, self.cached_lens = kv_cache, block_tables, cached_lens
        self.use_cpp = use_cpp
        self.new_k: list[torch.Tensor] = []
        self.new_v: list[torch.Tensor] = []

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [1, n, heads, d], k/v [1, n, kv_heads, d] -> [1, n, heads, d]."""
        self.new_k.append(k[0])
        self.new_v.append(v[0])
        k_cache, v_cache = self.kv_cache.k_cache[layer_idx], self.kv_cache.v_cache[layer_idx]
        attend = torch.ops.course_lib.paged_decode_attention if self.use_cpp else decode_attention_with_new
        return attend(q[0], k_cache, v_cache, self.block_tables, self.cached_lens, k[0], v[0])[None]

    def advance(self, num_tokens: int) -> None:
        pass


def decode_step(model: Transformer, kv_cache: PagedKVCache, input_ids: torch.Tensor, positions: torch.Tensor,
                block_tables: torch.Tensor, cached_lens: torch.Tensor, use_cpp: bool = False):
    """The function `CompiledDecodeStep` compiles: input_ids, positions, cached_lens [n], block_tables [n, blocks]
    -> logits [n, vocab], new_k and new_v [layers, n, kv_heads, head_dim]. Reads the cache, writes nothing."""
    attn = DecodeStepAttention(kv_cache, block_tables, cached_lens, use_cpp)
    logits = model(input_ids[None], positions[None], kv=attn)[0]  # [n, vocab]
    return logits, torch.stack(attn.new_k), torch.stack(attn.new_v)


class Int8GraphLinear(OneDNNQuantLinear):
    """An INT8 `OneDNNQuantLinear` whose compiled graph calls `course_lib::int8_linear`, which chooses between
    PyTorch's INT8 op and a bfloat16 matmul of the codes by the step's rows as it runs (eager: as its parent)."""

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_compiling():
            return super().matmul(x)
        x2 = x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()  # [tokens, in]
        y = torch.ops.course_lib.int8_linear(x2, self.qweight, self.scales, INT8_DEQUANTIZE_ROWS)
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)


def use_int8_operator(model: Transformer) -> int:
    """Make every INT8 `OneDNNQuantLinear` an `Int8GraphLinear`, in place; returns how many."""
    layers = [m for m in model.modules() if type(m) is OneDNNQuantLinear and m.method == "int8"]
    for layer in layers:
        layer.__class__ = Int8GraphLinear
    return len(layers)


class CompiledDecodeStep:
    """`decode_step` through `torch.compile`, compiled once by `warmup()`, plus the K/V store after it.

    `use_cpp`: the built extension's operators are there (attention, and the layers' own)."""

    MIN_BLOCKS = 2  # tables are padded to >= 2 columns: a size of 1 would make torch.compile build another graph

    def __init__(self, model: Transformer, kv_cache: PagedKVCache, use_cpp: bool = False):
        self.model, self.kv_cache, self.use_cpp = model, kv_cache, use_cpp
        if use_cpp:
            use_int8_operator(model)
        # freezing prepacks for oneDNN the weights F.linear reads: it pays in bfloat16 where the layers are plain
        options = {"cpp_wrapper": True, "freezing": model.dtype != torch.float32} if model.device.type == "cpu" else {}
        self._step = torch.compile(functools.partial(decode_step, model, kv_cache, use_cpp=use_cpp),
                                   dynamic=True, options=options)
        self.compile_seconds = 0.0
        self.steps = 0  # decode steps run through the compiled graph
        self.warm = False  # set by warmup: every graph a step can need is compiled

    def takes(self, num_seqs: int) -> bool:
        """Whether a decode-only step of `num_seqs` sequences runs through the graph (batches: with the kernel)."""
        return num_seqs == 1 or self.use_cpp

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
        """The compiled step. Once warm, Dynamo checks only the guards that tell its graphs apart (one sequence
        or more, the inputs' kind), not those on every weight and buffer it traced: the model and cache never
        change, so those hold. An input no graph fits (say, tensors made outside inference mode) makes Dynamo
        refuse to compile under that setting; then the step goes back to checking every guard, and compiles."""
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
        tables = staged([t + [0] * (width - len(t)) for t in block_tables], torch.int32,
                        input_ids.device)  # [n, blocks], the kernel's int32; padding reads block 0, masked
        logits, new_k, new_v = self._run(input_ids, positions, tables, positions.to(torch.int32))
        self.steps += 1
        layers, _, kv_heads, head_dim = new_k.shape
        for cache, new in ((self.kv_cache.k_cache, new_k), (self.kv_cache.v_cache, new_v)):
            cache.view(layers, -1, kv_heads, head_dim).index_copy_(1, slot_mapping, new)
        return logits
