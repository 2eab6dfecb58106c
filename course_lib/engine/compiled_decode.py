"""A compiled decode step: one `torch.compile`d graph for a step where each sequence adds one token.

Eager PyTorch pays Python and dispatch time for each of the ~40 small ops of a layer. On a 2-core CPU
that is ~10 ms of a ~35 ms float32 decode step of the default model, whose matmuls alone take ~20 ms.
Inductor turns the whole step (30 layers, attention included) into generated C++: elementwise ops
fused into loops, no Python between ops (`cpp_wrapper`), and for bfloat16 the weights prepacked
for oneDNN (`freezing`, which uses AMX where the CPU has it).

    step(input_ids [n], positions [n], block_tables [n, blocks], cached_lens [n])
        -> logits [n, vocab], new_k and new_v [layers, n, kv_heads, head_dim]
    then one index_copy_ per cache stores every layer's new K/V at the sequences' slots.

Why the K/V store happens after the graph and not inside it: writing into the cache (an input of
the graph) from inside made Inductor copy the whole cache each step (measured: 103 ms a step
instead of 26 with a 64 MB cache). Inside, each sequence attends over its cached tokens plus the
new one (`decode_attention`), which is what attention after the store would have seen.

Compiling takes minutes on a 2-core CPU, so it happens once, when the engine starts (`warmup`),
and `compile_seconds` says how long it took. Prefill, mixed and batched steps stay eager: measured
on a 2-core Xeon (benchmarks/compare.py), the compiled step pays for one sequence (batch-1 decode
1.37x `transformers` in float32, 1.42x in bfloat16, against 0.91x and 1.05x eager) but its dynamic-shape
graph for many sequences was slower than eager (16 and 64 requests: 0.68-0.95x `transformers`,
against 1.07-1.27x eager), so only steps of `MAX_SEQS` sequences use it.
"""
from __future__ import annotations

import functools
import time

import torch

from ..attention.paged import PagedKVCache, gather_blocks
from ..model import Transformer


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
    """Attention backend for one compiled decode step: attends, and keeps each layer's new K/V for later."""

    def __init__(self, kv_cache: PagedKVCache, block_tables: torch.Tensor, cached_lens: torch.Tensor):
        self.kv_cache, self.block_tables, self.cached_lens = kv_cache, block_tables, cached_lens
        self.new_k: list[torch.Tensor] = []
        self.new_v: list[torch.Tensor] = []

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [1, n, heads, d], k/v [1, n, kv_heads, d] -> [1, n, heads, d]."""
        self.new_k.append(k[0])
        self.new_v.append(v[0])
        out = decode_attention(q[0], k[0], v[0], self.kv_cache.k_cache[layer_idx], self.kv_cache.v_cache[layer_idx],
                               self.block_tables, self.cached_lens)
        return out[None]

    def advance(self, num_tokens: int) -> None:
        pass


def decode_step(model: Transformer, kv_cache: PagedKVCache, input_ids: torch.Tensor, positions: torch.Tensor,
                block_tables: torch.Tensor, cached_lens: torch.Tensor):
    """The function `CompiledDecodeStep` compiles: input_ids, positions, cached_lens [n], block_tables [n, blocks]
    -> logits [n, vocab], new_k and new_v [layers, n, kv_heads, head_dim]. Reads the cache, writes nothing."""
    attn = DecodeStepAttention(kv_cache, block_tables, cached_lens)
    logits = model(input_ids[None], positions[None], kv=attn)[0]  # [n, vocab]
    return logits, torch.stack(attn.new_k), torch.stack(attn.new_v)


class CompiledDecodeStep:
    """`decode_step` through `torch.compile`, compiled once by `warmup()`, plus the K/V store after it."""

    MAX_SEQS = 1  # steps with more sequences run eagerly (see the module docstring)
    MIN_BLOCKS = 2  # tables are padded to >= 2 columns: a size of 1 would make torch.compile build another graph

    def __init__(self, model: Transformer, kv_cache: PagedKVCache):
        self.model, self.kv_cache = model, kv_cache
        options = {}
        if model.device.type == "cpu":
            # freezing prepacks the weights for oneDNN: it pays in bfloat16 (AMX); in float32 it was
            # measured level (batch 1: 26.9 vs 26.2 ms a step; 16 sequences: 193 vs 187 tok/s).
            options = {"cpp_wrapper": True, "freezing": model.dtype != torch.float32}
        self._step = torch.compile(functools.partial(decode_step, model, kv_cache), dynamic=True, options=options)
        self.compile_seconds = 0.0
        self.steps = 0  # decode steps run through the compiled graph

    @torch.inference_mode()
    def warmup(self) -> float:
        """Compile for one sequence at two context sizes (so later lengths reuse the dynamic graph).

        Returns the seconds it took, also kept in `compile_seconds`. Writes nothing to the cache.
        """
        device, t = self.model.device, time.perf_counter()
        for blocks in (2, 3):
            self._step(torch.zeros(1, dtype=torch.long, device=device), torch.full((1,), 5, device=device),
                       torch.zeros(1, blocks, dtype=torch.long, device=device),
                       torch.full((1,), 5, dtype=torch.int32, device=device))
        self.compile_seconds += time.perf_counter() - t
        return self.compile_seconds

    @torch.inference_mode()
    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, block_tables: list[list[int]],
                 slot_mapping: torch.Tensor) -> torch.Tensor:
        """input_ids, positions, slot_mapping [n]; block_tables: each sequence's blocks, enough for its
        position. Stores the new K/V at `slot_mapping` and returns logits [n, vocab]."""
        width = max(self.MIN_BLOCKS, max(map(len, block_tables)))
        tables = torch.tensor([t + [0] * (width - len(t)) for t in block_tables], dtype=torch.long,
                              device=input_ids.device)  # [n, blocks]; padding reads block 0, masked
        logits, new_k, new_v = self._step(input_ids, positions, tables, positions.to(torch.int32))
        self.steps += 1
        layers, _, kv_heads, head_dim = new_k.shape
        for cache, new in ((self.kv_cache.k_cache, new_k), (self.kv_cache.v_cache, new_v)):
            cache.view(layers, -1, kv_heads, head_dim).index_copy_(1, slot_mapping, new)
        return logits
