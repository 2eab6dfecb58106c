"""The KV cache a default engine reserves: what its seats can use, within what the device can spare.

    budget = min(max_num_seqs x ceil(max_model_len / block_size) x bytes_per_block,
                 CPU_KV_CACHE_BYTES on the CPU, GPU_KV_CACHE_MAX_FRACTION x free memory on CUDA)

vLLM takes 0.9 of the whole card, because a vLLM server owns its GPU. A course notebook does not: it holds a
`transformers` reference, a second engine or a quantized copy in the same process, often on a 16 GB T4, so
a default `LLM()` leaves room for them. A chapter that wants a fixed pool passes `kv_cache_memory=`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..attention.paged import PagedKVCache
from ..config import ModelConfig

if TYPE_CHECKING:
    from .config import EngineConfig

CPU_KV_CACHE_BYTES = 512 * 2**20  # the most a default engine reserves on the CPU
GPU_KV_CACHE_MAX_FRACTION = 0.5  # the most a default engine reserves on CUDA: this share of the free memory


def free_device_memory(device: torch.device) -> int:
    return int(torch.cuda.mem_get_info(device)[0])


def default_kv_cache_memory(config: ModelConfig, max_num_seqs: int, max_model_len: int | None, block_size: int,
                            device: torch.device | str, dtype: torch.dtype | str,
                            free_memory=free_device_memory) -> int:
    """Bytes of KV cache for `max_num_seqs` sequences of `max_model_len` tokens (None: the model's context),
    capped by the device (the scheduler preempts when fewer fit). A `max_model_len` asked for whose one sequence
    does not fit under the cap is a ValueError; a default one shrinks later to what the cache holds."""
    device = torch.device(device)
    length = min(max_model_len or config.max_position_embeddings, config.max_position_embeddings)
    per_block = PagedKVCache.bytes_per_block(config, block_size, dtype)
    one_seq = -(-length // block_size) * per_block  # ceil(length / block_size) blocks
    if device.type == "cuda":
        free = free_memory(device)
        cap = int(GPU_KV_CACHE_MAX_FRACTION * free)
        where = f"{GPU_KV_CACHE_MAX_FRACTION} of the {free / 2**30:.2f} GiB free on {device}"
    else:
        cap, where = CPU_KV_CACHE_BYTES, f"the default CPU budget (CPU_KV_CACHE_BYTES, {_mib(CPU_KV_CACHE_BYTES)})"
    if max_model_len is not None and one_seq > cap:
        raise ValueError(f"one sequence of max_model_len={max_model_len} tokens needs {_mib(one_seq)} of KV cache, "
                         f"more than {where} ({_mib(cap)}); lower max_model_len or pass kv_cache_memory=")
    return min(max_num_seqs * one_seq, cap)


def kv_pool(config: ModelConfig, engine: EngineConfig, device: torch.device | str, dtype: torch.dtype | str,
            free_memory=free_device_memory) -> tuple[int, int]:
    """An engine's KV pool, worked out before any tensor exists: (blocks, max_model_len). A test sizes every
    chapter's engines with it for a card it does not have (`free_memory` stands in for the card)."""
    device, budget = torch.device(device), engine.kv_cache_memory
    if budget is None:  # what max_num_seqs x max_model_len can use, within the device's cap
        budget = default_kv_cache_memory(config, engine.max_num_seqs, engine.max_model_len, engine.block_size,
                                         device, dtype, free_memory)
    elif isinstance(budget, float):  # a fraction of the free memory
        if device.type != "cuda":
            raise ValueError("kv_cache_memory as a fraction of free GPU memory needs a CUDA device; "
                             "on the CPU pass a byte budget (int)")
        budget = int(budget * free_memory(device))
    per_block = PagedKVCache.bytes_per_block(config, engine.block_size, dtype)
    if budget < per_block:
        raise ValueError(f"kv_cache_memory={engine.kv_cache_memory!r} ({budget} bytes) holds no KV block "
                         f"of {per_block} bytes ({engine.block_size} tokens); raise the budget")
    blocks = budget // per_block
    limit = min(config.max_position_embeddings, blocks * engine.block_size)
    if engine.max_model_len is not None and not 1 <= engine.max_model_len <= limit:
        raise ValueError(f"max_model_len must be in [1, {limit}] (the model's context and the KV cache), "
                         f"got {engine.max_model_len}")
    return blocks, engine.max_model_len or limit


def _mib(num_bytes: int) -> str:
    return f"{num_bytes / 2**20:,.1f} MiB"
