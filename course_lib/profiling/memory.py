"""Where the memory goes: weights, KV cache, activations, and what the process holds.

    weights      = parameters x bytes per value                 (fixed once loaded)
    KV cache     = 2 x layers x KV heads x head_dim x bytes x tokens   (grows with users x context)
    activations  = the transient tensors of one forward pass    (grows with tokens in the step)

The KV term is why serving runs out of memory long before the weights do: an 8B Llama
(32 layers, 8 KV heads, head_dim 128) in bf16 keeps 128 KiB per token, so 32 users at
8k tokens need 32 GiB of cache, over twice its 15 GiB of weights.
"""
from __future__ import annotations

import os
import weakref
from typing import Any, Mapping

import pandas as pd
import psutil
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..config import ModelConfig
from ..dtypes import resolve_device, resolve_dtype

ConfigLike = ModelConfig | Mapping[str, Any]
GiB = 1024 ** 3


def bytes_per_value(dtype: torch.dtype | str) -> int:
    """Bytes one element of `dtype` takes (4 for float32, 2 for bf16/fp16, 1 for int8)."""
    return torch.empty((), dtype=resolve_dtype(dtype)).element_size()


def as_model_config(config: ConfigLike) -> ModelConfig:
    """A `ModelConfig` from itself or from a Hugging Face-style `config.json` dict.

    Only the sizes are read, so any decoder's config works here, even one the engine cannot run.
    """
    if isinstance(config, ModelConfig):
        return config
    c = dict(config)
    heads = c["num_attention_heads"]
    return ModelConfig(
        vocab_size=c.get("vocab_size", 1), hidden_size=c["hidden_size"],
        intermediate_size=c.get("intermediate_size", 4 * c["hidden_size"]),
        num_layers=c["num_hidden_layers"], num_heads=heads,
        num_kv_heads=c.get("num_key_value_heads") or heads, head_dim=c.get("head_dim"),
        tie_word_embeddings=c.get("tie_word_embeddings", False), name=c.get("_name_or_path", ""),
    )


def weight_bytes(module: nn.Module) -> int:
    """Bytes of a module's parameters and buffers, each shared (tied) tensor counted once.

    A tensor with no storage to read (on the meta device, or in an opaque layout) counts as its logical
    size, shared with nothing."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for t in [*module.parameters(), *module.buffers()]:
        opaque = t.device.type == "meta" or t.layout != torch.strided
        key = (id(t), 0) if opaque else (t.untyped_storage().data_ptr(), t.storage_offset())
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def kv_bytes_per_token(config: ConfigLike, dtype: torch.dtype | str = torch.bfloat16) -> int:
    """2 (K and V) x layers x KV heads x head_dim x bytes per value: the cache cost of one token."""
    return as_model_config(config).kv_bytes_per_token(dtype)


def kv_cache_bytes(config: ConfigLike, num_tokens: int, batch: int = 1,
                   dtype: torch.dtype | str = torch.bfloat16) -> int:
    """Bytes of KV cache for `batch` sequences of `num_tokens` tokens each."""
    return kv_bytes_per_token(config, dtype) * num_tokens * batch


def kv_cache_report(config: ConfigLike, num_users: int, context_len: int,
                    dtype: torch.dtype | str = torch.bfloat16,
                    weight_dtype: torch.dtype | str | None = None) -> dict[str, float]:
    """The serving calculator: KV for `num_users` x `context_len` tokens next to the weights.

    `weight_dtype` defaults to `dtype`. Sizes are in GiB except the per-token bytes.
    """
    c = as_model_config(config)
    kv = kv_cache_bytes(c, context_len, num_users, dtype)
    weights = c.num_parameters() * bytes_per_value(weight_dtype or dtype)
    return {
        "kv_bytes_per_token": kv_bytes_per_token(c, dtype),
        "kv_cache_gib": kv / GiB,
        "weights_gib": weights / GiB,
        "total_gib": (kv + weights) / GiB,
        "kv_share": kv / (kv + weights),
    }


def activation_bytes(config: ConfigLike, num_tokens: int, batch: int = 1,
                     dtype: torch.dtype | str = torch.float32, logits_tokens: int | None = None) -> int:
    """Rough peak of the live activations of one inference forward over `num_tokens` new tokens.

    Without autograd each layer's tensors are freed as the next layer runs, so the peak is the
    largest single working set: one block's MLP (residual + normed input + gate, up and their
    product), its attention (residual + normed input + q, k, v, output), or the logits
    (`logits_tokens` per sequence, default all). Attention scores are not counted: the fused
    kernels (flash, SDPA) never hold the [tokens x context] matrix.
    """
    c = as_model_config(config)
    tokens = batch * num_tokens
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    mlp = tokens * (2 * c.hidden_size + 3 * c.intermediate_size)
    attn = tokens * (2 * c.hidden_size + 2 * q + 2 * kv)
    logits = batch * (num_tokens if logits_tokens is None else logits_tokens) * c.vocab_size
    return max(mlp, attn, logits) * bytes_per_value(dtype)


def process_memory(device: torch.device | str | None = "cpu") -> dict[str, int]:
    """What the process holds now, in bytes: CPU resident set size, plus the CUDA allocator's
    counters (allocated, peak allocated, reserved) when `device` is a GPU."""
    out = {"cpu_rss": psutil.Process(os.getpid()).memory_info().rss}
    dev = resolve_device(device)
    if dev.type == "cuda":
        out.update(
            cuda_allocated=torch.cuda.memory_allocated(dev),
            cuda_max_allocated=torch.cuda.max_memory_allocated(dev),
            cuda_reserved=torch.cuda.memory_reserved(dev),
        )
    return out


def memory_breakdown(model: nn.Module | ConfigLike, num_tokens: int, batch: int = 1,
                     dtype: torch.dtype | str | None = None, kv_cache: Any | None = None,
                     kv_dtype: torch.dtype | str | None = None, logits_tokens: int | None = 1) -> dict[str, int]:
    """Bytes of weights, KV cache and activations for `batch` sequences of `num_tokens` tokens.

    `model` is a module (weights measured, config and dtype read from it) or a config
    (weights from the parameter count). With a `kv_cache` object (anything with `nbytes`)
    the KV entry is what it allocated and "kv_in_use" what `num_tokens` tokens fill;
    otherwise both are the formula. Activations are `activation_bytes` for a prefill of
    `num_tokens` with logits for the last `logits_tokens` positions of each sequence: 1, as an inference
    engine computes them (None: every position, as training does). Keys: weights, kv_cache, kv_in_use,
    activations, total.
    """
    if isinstance(model, nn.Module):
        config = model.config
        dtype = resolve_dtype(dtype, getattr(model, "dtype", torch.float32))
        weights = weight_bytes(model)
    else:
        config = as_model_config(model)
        dtype = resolve_dtype(dtype)
        weights = config.num_parameters() * bytes_per_value(dtype)
    kv_dtype = resolve_dtype(kv_dtype, kv_cache.k.dtype if hasattr(kv_cache, "k") else dtype)
    in_use = kv_cache_bytes(config, num_tokens, batch, kv_dtype)
    allocated = kv_cache.nbytes if kv_cache is not None else in_use
    acts = activation_bytes(config, num_tokens, batch, dtype, logits_tokens)
    return {"weights": weights, "kv_cache": allocated, "kv_in_use": in_use,
            "activations": acts, "total": weights + allocated + acts}


def breakdown_frame(breakdown: Mapping[str, int]) -> pd.DataFrame:
    """A `memory_breakdown` dict as a table: bytes, MiB and share of the total per row."""
    frame = pd.DataFrame({"bytes": pd.Series(breakdown, dtype="int64")})
    frame["MiB"] = frame["bytes"] / 2 ** 20
    total = breakdown.get("total") or sum(v for k, v in breakdown.items() if k != "kv_in_use")
    frame["share"] = frame["bytes"] / total
    return frame


class PeakMemory(TorchDispatchMode):
    """Peak bytes of the tensors created inside `with PeakMemory() as pm:`, on any device: `pm.peak`.

    Counts each new storage once (a view or an in-place op reuses its input's) and subtracts it when
    it is freed. A fused kernel's private scratch (kept on chip, not a tensor) is not counted, which is
    the point when comparing attention implementations: what each one materialises in memory.
    """

    def __enter__(self) -> "PeakMemory":
        self.live = self.peak = 0
        self._alive: dict[int, weakref.ref] = {}  # storage id -> weak reference that subtracts its bytes when freed
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {id(t.untyped_storage()) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and id(t.untyped_storage()) not in inputs | self._alive.keys():
                storage = t.untyped_storage()
                self.live += storage.nbytes()
                self.peak = max(self.peak, self.live)
                self._alive[id(storage)] = weakref.ref(storage, self._on_free(id(storage), storage.nbytes()))
        return out

    def _on_free(self, key: int, nbytes: int):
        def freed(_):
            self.live -= nbytes
            self._alive.pop(key, None)
        return freed
