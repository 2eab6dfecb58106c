"""Decode steps as CUDA graphs, one per batch-size bucket, as vLLM runs them.

A decode step of a small model is launch-bound: each of its ~40 ops a layer is a kernel launch of a few
microseconds, far longer than the kernel itself needs to read its share of the weights. A CUDA graph records
the launches of a whole step once and replays them with one call. A graph fixes every shape and address, so:

    buckets        one graph per batch size in `capture_sizes(max_num_seqs)`: 1, 2, 4, 8, 16, 24, 32, ...;
                   a step of n sequences replays the smallest bucket >= n, rows n.. padded; more than the
                   largest bucket: the engine's eager step (`takes` says no)
    static inputs  input_ids, positions, cached_lens [max_bucket], block_tables [max_bucket, max_blocks] with
                   max_blocks = ceil(max_model_len / block_size); each bucket's graph reads the first rows.
                   A step copies its inputs in; padded rows get token 0 at position 0 with no cached tokens
    static outputs logits [max_bucket, vocab] and the step's new K/V [layers, max_bucket, kv_heads, head_dim]:
                   each graph writes its first rows, a step reads the first n (one set for all buckets, so
                   memory does not grow with the number of graphs)

Inside the graph nothing is written to the KV cache: each sequence attends over its cached tokens plus its
new one (the kernels' `k_new`/`v_new`), and after the replay one `index_copy_` per cache stores only the n
real rows' K/V at their slots (as `compiled_decode.py` does). Padded rows thus never touch the cache, and
their logits are dropped. The graph's code reads no tensor's values on the host (no `.item()`, no tensor
built from a list): that happens before the replay, when the inputs are copied in.

All graphs are captured when the engine starts (`warmup`), the largest first, into one shared memory pool
(`torch.cuda.graph_pool_handle`): only one graph runs at a time, so their intermediate tensors share memory.

Why `torch.cuda.CUDAGraph` and not `torch.compile(mode="reduce-overhead")`: the graph is the whole idea
here, and capturing it by hand shows every part (static buffers, padding, the store after the replay); the
compiled route would trace and compile each bucket at start-up (minutes) and hide the buffers inside Dynamo.

Without CUDA, `EagerGraph` stands in for the capture: a replay runs the same step eagerly on the same static
buffers, so the CPU tests drive this whole module but the capture itself.
"""
from __future__ import annotations

import math
import time
from typing import Callable

import torch

from ..attention.paged import PagedKVCache
from ..host_copy import copy_into
from ..model import Transformer
from .attention import decode_attention_with_new

MAX_CAPTURE_SIZE = 512  # vLLM's default: larger batches are throughput-bound, eager steps serve them


def capture_sizes(max_num_seqs: int) -> list[int]:
    """The batch sizes that get a graph: 1, 2, 4, then multiples of 8 up to the first >= max_num_seqs."""
    sizes = [1, 2, 4] + list(range(8, MAX_CAPTURE_SIZE + 1, 8))
    top = next(s for s in sizes if s >= min(max_num_seqs, MAX_CAPTURE_SIZE))
    return [s for s in sizes if s <= top]


def bucket_for(num_seqs: int, sizes: list[int]) -> int | None:
    """The smallest size >= num_seqs, or None when the batch is larger than all of them."""
    return next((s for s in sizes if s >= num_seqs), None)


class EagerGraph:
    """The seam where a CUDA graph would be: `fn` (which reads and writes only static buffers) runs once now,
    as a capture would, and again at each `replay()`."""

    def __init__(self, fn: Callable[[], None]):
        self.fn = fn
        fn()

    def replay(self) -> None:
        self.fn()


class CudaGraph:
    """`fn` (which reads and writes only static buffers) captured as a `torch.cuda.CUDAGraph` into `pool`."""

    def __init__(self, fn: Callable[[], None], pool):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up outside the capture: Triton compiles, cuBLAS picks kernels
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):  # a host sync in fn would fail here
            fn()

    def replay(self) -> None:
        self.graph.replay()


class StaticDecodeAttention:
    """Attention backend inside a graph: each sequence attends over its cached tokens and its new one, read
    through the static block tables and lengths; writes each layer's new K/V into `new_k`, `new_v` [layers, n,
    kv_heads, head_dim], to be stored after the replay.

    `attend_fn(q, k_cache, v_cache, block_tables, cached_lens, k_new, v_new)`: the Triton kernel, the C++
    operator or `decode_attention_with_new`, which share that contract."""

    def __init__(self, kv_cache: PagedKVCache, block_tables: torch.Tensor, cached_lens: torch.Tensor,
                 attend_fn: Callable, new_k: torch.Tensor, new_v: torch.Tensor):
        self.kv_cache, self.block_tables, self.cached_lens = kv_cache, block_tables, cached_lens
        self.attend_fn, self.new_k, self.new_v = attend_fn, new_k, new_v

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [1, n, heads, d], k/v [1, n, kv_heads, d] -> [1, n, heads, d]."""
        self.new_k[layer_idx].copy_(k[0])
        self.new_v[layer_idx].copy_(v[0])
        k_cache, v_cache = self.kv_cache.k_cache[layer_idx], self.kv_cache.v_cache[layer_idx]
        return self.attend_fn(q[0], k_cache, v_cache, self.block_tables, self.cached_lens, k[0], v[0])[None]

    def advance(self, num_tokens: int) -> None:
        pass


def attention_function(attention: str) -> Callable:
    """The decode attention a plan's `attention` names, in the contract of `decode_attention_with_new`."""
    if attention == "triton":
        from .triton_paged import triton_paged_decode_attention

        return triton_paged_decode_attention
    if attention == "cpp":
        return torch.ops.course_lib.paged_decode_attention
    return decode_attention_with_new


class CUDAGraphDecodeStep:
    """Decode steps through one captured graph per bucket; the same interface as `CompiledDecodeStep`.

    `attention`: the plan's ("triton" on CUDA). `max_num_seqs` and `max_model_len` size the buckets and the
    block tables' width."""

    def __init__(self, model: Transformer, kv_cache: PagedKVCache, attention: str, max_num_seqs: int,
                 max_model_len: int):
        self.model, self.kv_cache = model, kv_cache
        self.attend_fn = attention_function(attention)
        self.sizes = capture_sizes(max_num_seqs)
        self.max_blocks = math.ceil(max_model_len / kv_cache.block_size)
        rows, device = self.sizes[-1], model.device
        with torch.inference_mode():
            self.input_ids = torch.zeros(rows, dtype=torch.long, device=device)  # [max_bucket]
            self.positions = torch.zeros(rows, dtype=torch.long, device=device)
            self.cached_lens = torch.zeros(rows, dtype=torch.int32, device=device)  # the kernels' int32
            self.block_tables = torch.zeros(rows, self.max_blocks, dtype=torch.int32, device=device)
            self.tables_in = torch.zeros(rows * self.max_blocks, dtype=torch.int32, device=device)  # staging
            self.logits = torch.zeros(rows, model.config.vocab_size, dtype=model.dtype, device=device)
            kv_shape = (model.config.num_layers, rows, *kv_cache.k_cache.shape[-2:])  # [layers, rows, kv_heads, d]
            self.new_k = torch.zeros(kv_shape, dtype=kv_cache.k_cache.dtype, device=device)
            self.new_v = torch.zeros_like(self.new_k)
        self.pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
        self.graphs: dict[int, CudaGraph | EagerGraph] = {}
        self.capture_seconds = 0.0
        self.compile_seconds = 0.0  # nothing is compiled (`CompiledDecodeStep` counts it)
        self.steps = 0  # decode steps replayed through a graph

    def takes(self, num_seqs: int) -> bool:
        """Whether a decode-only step of `num_seqs` sequences fits a bucket."""
        return bucket_for(num_seqs, self.sizes) is not None

    def _step(self, rows: int) -> None:
        """The graph's body for a bucket of `rows`: from the first `rows` of the static inputs to the first
        `rows` of logits, new_k and new_v. Writes nothing to the cache."""
        attn = StaticDecodeAttention(self.kv_cache, self.block_tables[:rows], self.cached_lens[:rows],
                                     self.attend_fn, self.new_k[:, :rows], self.new_v[:, :rows])
        self.logits[:rows].copy_(self.model(self.input_ids[None, :rows], self.positions[None, :rows], kv=attn)[0])

    @torch.inference_mode()
    def warmup(self) -> float:
        """Capture a graph for every bucket, the largest first (the smaller ones reuse its pool memory), with
        the padding inputs (no cached tokens: no cache is read). Returns the seconds, kept in
        `capture_seconds`."""
        t = time.perf_counter()
        for buffer in (self.input_ids, self.positions, self.cached_lens, self.block_tables):
            buffer.zero_()
        for rows in reversed(self.sizes):
            step = lambda rows=rows: self._step(rows)  # noqa: E731
            self.graphs[rows] = CudaGraph(step, self.pool) if self.pool is not None else EagerGraph(step)
        if self.pool is not None:
            torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - t
        return self.capture_seconds

    @torch.inference_mode()
    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, block_tables: list[list[int]],
                 slot_mapping: torch.Tensor) -> torch.Tensor:
        """input_ids, positions, slot_mapping [n]; block_tables: each sequence's blocks, enough for its
        position. Stores the new K/V at `slot_mapping` and returns logits [n, vocab] (rows of the static
        output: valid until the next step)."""
        n = len(block_tables)
        rows, width = bucket_for(n, self.sizes), max(map(len, block_tables))
        if rows is None or width > self.max_blocks:
            raise ValueError(f"a step of {n} sequences with up to {width} blocks fits no graph (buckets up to "
                             f"{self.sizes[-1]}, {self.max_blocks} blocks): ask `takes` first")
        # [n, width] from pinned memory into the first n * width ints of a flat buffer (a contiguous target: one
        # host->device copy), then into the graph's [rows, max_blocks] tables on the device; later columns hold
        # stale block ids, masked by cached_lens
        padded = [t + [0] * (width - len(t)) for t in block_tables]  # [n, width]
        tables = copy_into(self.tables_in[:n * width].view(n, width), padded)
        self.block_tables[:n, :width].copy_(tables)
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.cached_lens[:n].copy_(positions)  # a decode token's position = the tokens cached before it
        for buffer in (self.input_ids, self.positions, self.cached_lens):
            buffer[n:rows].zero_()  # padded rows
        self.graphs[rows].replay()
        self.steps += 1
        layers, _, kv_heads, head_dim = self.new_k.shape
        for cache, new in ((self.kv_cache.k_cache, self.new_k), (self.kv_cache.v_cache, self.new_v)):
            cache.view(layers, -1, kv_heads, head_dim).index_copy_(1, slot_mapping, new[:, :n])  # real rows only
        return self.logits[:n]
