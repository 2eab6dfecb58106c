"""Checkers for chapter 06, the KV cache (KV 缓存): bytes per token, wasted slots, prefix-cache hits.

Each one checks the learner's function against the engine itself: the bytes `PagedKVCache` allocates
(on the "meta" device, so nothing is really allocated), the blocks `BlockManager` hands out, and the
tokens `BlockManager` finds in its prefix cache.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..attention.paged import PagedKVCache
from ..engine.block_manager import BlockManager
from ..profiling.memory import as_model_config
from .check import Case, run_checks

# Hugging Face config.json fields of real models (only the sizes). Llama-2 has no num_key_value_heads
# (multi-head attention); Qwen2.5 has no head_dim (hidden_size / heads); Mistral-Nemo's head_dim is not
# hidden_size / heads (5120 / 32 = 160, but 128).
KV_CONFIGS: dict[str, dict[str, Any]] = {
    "SmolLM2-135M": {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
                     "num_key_value_heads": 3},
    "Llama-3-8B": {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                   "num_key_value_heads": 8, "head_dim": 128},
    "Llama-2-7B": {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32},
    "Qwen2.5-7B": {"hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28,
                   "num_key_value_heads": 4},
    "Mistral-Nemo-12B": {"hidden_size": 5120, "num_hidden_layers": 40, "num_attention_heads": 32,
                         "num_key_value_heads": 8, "head_dim": 128},
}


def engine_kv_bytes_per_token(config: dict[str, Any], dtype: torch.dtype) -> int:
    """Bytes per token the engine's `PagedKVCache` allocates for `config` (one block of one token, on "meta")."""
    cache = PagedKVCache(as_model_config(config), num_blocks=1, block_size=1, device="meta", dtype=dtype)
    return cache.nbytes


def _kv_hint(config: dict[str, Any], dtype: torch.dtype, got: Any) -> str:
    layers, heads = config["num_hidden_layers"], config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    size = torch.empty((), dtype=dtype).element_size()
    naive_dim = config["hidden_size"] // heads
    if got == layers * kv_heads * head_dim * size:
        return "; that is K or V alone: the cache keeps both, a factor 2"
    if got == 2 * layers * heads * head_dim * size and heads != kv_heads:
        return "; you counted every query head, but only the num_key_value_heads KV heads are cached (GQA)"
    if got == 2 * layers * kv_heads * naive_dim * size and head_dim != naive_dim:
        return "; use the config's head_dim when it has one (here it is not hidden_size / heads)"
    if got == 2 * layers * kv_heads * head_dim:
        return "; multiply by the bytes per value of the dtype (torch.empty((), dtype=dtype).element_size())"
    return ""


def check_kv_bytes_per_token(fn: Callable[[dict, torch.dtype], int]) -> bool:
    """`fn(config, dtype)`: KV-cache bytes of one token for a Hugging Face config dict, as the engine allocates."""
    cases = []
    for name, dtype in [("SmolLM2-135M", torch.float32), ("SmolLM2-135M", torch.bfloat16),
                        ("Llama-3-8B", torch.bfloat16), ("Llama-2-7B", torch.float16),
                        ("Qwen2.5-7B", torch.bfloat16), ("Mistral-Nemo-12B", torch.bfloat16),
                        ("Llama-3-8B", torch.float8_e4m3fn)]:
        config, want = KV_CONFIGS[name], engine_kv_bytes_per_token(KV_CONFIGS[name], dtype)

        def verify(got, config=config, want=want, dtype=dtype):
            assert isinstance(got, int) and not isinstance(got, bool), f"return an int, got {type(got).__name__}"
            assert got == want, f"got {got:,} bytes, the engine allocates {want:,}{_kv_hint(config, dtype, got)}"

        cases.append(Case(f"{name} in {str(dtype).removeprefix('torch.')}: "
                          f"{want:,} bytes/token", (dict(config), dtype), verify))
    return run_checks("kv_bytes_per_token", fn, cases)


@dataclass
class _Seq:
    """The three fields `BlockManager` reads and writes on a sequence."""

    token_ids: list[int]
    block_table: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0


def engine_kv_waste(lengths: list[int], block_size: int, max_model_len: int) -> tuple[int, int]:
    """(contiguous, paged) token slots reserved but empty: `max_model_len` per request against the blocks
    the engine's `BlockManager` hands out for `lengths`."""
    bm = BlockManager(num_blocks=sum(-(-n // block_size) for n in lengths) or 1, block_size=block_size,
                      enable_prefix_caching=False)
    for n in lengths:
        bm.allocate(_Seq(list(range(n))))
    return len(lengths) * max_model_len - sum(lengths), bm.num_used_blocks * block_size - sum(lengths)


def check_kv_waste(fn: Callable[[list[int], int, int], tuple[int, int]]) -> bool:
    """`fn(lengths, block_size, max_model_len)` -> (contiguous waste, paged waste) in token slots."""
    mixes = [([100], 16, 2048), ([16, 32, 48], 16, 512), ([1, 17, 33, 1000], 16, 1024),
             ([5, 9, 13, 250, 2048], 32, 2048), ([300, 150, 75, 1200, 7, 64], 16, 4096)]
    cases = []
    for lengths, block_size, max_len in mixes:
        want = engine_kv_waste(lengths, block_size, max_len)

        def verify(got, lengths=lengths, block_size=block_size, want=want):
            assert isinstance(got, tuple) and len(got) == 2, f"return a tuple (contiguous, paged), got {got!r}"
            contiguous, paged = got
            assert contiguous == want[0], (f"contiguous waste: got {contiguous}, expected {want[0]} "
                                           f"(each request reserves max_model_len slots and fills its length)")
            hint = ""
            if paged == sum(block_size * (n // block_size + 1) - n for n in lengths):
                hint = "; a length that is a multiple of block_size fills its last block exactly (use ceil)"
            elif paged == sum(block_size * (n // block_size) - n for n in lengths):
                hint = "; round the number of blocks up: a partial block is still a whole block"
            assert paged == want[1], f"paged waste: got {paged}, the BlockManager leaves {want[1]} slots empty{hint}"

        description = (f"{len(lengths)} requests, block {block_size}, max_model_len {max_len}: "
                       f"contiguous wastes {want[0]}, paged {want[1]} slots")
        cases.append(Case(description, (list(lengths), block_size, max_len), verify))
    return run_checks("kv_waste", fn, cases)


def engine_prefix_hit_tokens(first: list[int], second: list[int], block_size: int) -> int:
    """Tokens of `second` the engine's `BlockManager` takes from the prefix cache once `first` was prefilled."""
    bm = BlockManager(num_blocks=len(first) + len(second) + 2, block_size=block_size, enable_prefix_caching=True)
    a = _Seq(list(first))
    bm.allocate(a)
    bm.cache_full_blocks(a, len(first))  # the prefill computed every prompt token of `first`
    b = _Seq(list(second))
    bm.allocate(b)
    return b.num_cached_tokens


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def check_prefix_hit_tokens(fn: Callable[[list[int], list[int], int], int]) -> bool:
    """`fn(first, second, block_size)`: prompt tokens of `second` served from the prefix cache after `first`."""
    system = list(range(100, 140))  # a 40-token "system prompt"
    pairs = [
        ("shared 10-token prefix, blocks of 4", list(range(10)) + [50, 51], list(range(10)) + [60, 61, 62], 4),
        ("nothing in common", [1, 2, 3, 4, 5, 6, 7, 8, 9], [9, 2, 3, 4, 5, 6, 7, 8, 9], 4),
        ("the same 12-token prompt twice, blocks of 4", list(range(12)), list(range(12)), 4),
        ("first is shorter than one block", [1, 2, 3], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 4),
        ("second is the first 9 tokens of first", list(range(20)), list(range(9)), 4),
        ("first's last block is partial", list(range(10)), list(range(15)), 4),
        ("a 40-token system prompt, blocks of 16", system + [1, 2, 3], system + [7, 8, 9, 10, 11], 16),
        ("a 40-token system prompt, blocks of 8", system + [1, 2, 3], system + [7, 8, 9, 10, 11], 8),
    ]
    cases = []
    for description, first, second, block_size in pairs:
        want = engine_prefix_hit_tokens(first, second, block_size)

        def verify(got, first=first, second=second, block_size=block_size, want=want):
            assert isinstance(got, int) and not isinstance(got, bool), f"return an int, got {type(got).__name__}"
            common = _common_prefix(first, second)
            hint = ""
            if got == min(common, len(first)) // block_size * block_size:
                hint = ("; the engine never takes a prompt's last token from the cache: it must compute at "
                        "least one token to get logits")
            elif got == common:
                hint = "; only whole blocks are cached and shared, not single tokens"
            elif got % block_size:
                hint = "; hits come in whole blocks, so the answer is a multiple of block_size"
            assert got == want, f"got {got}, the BlockManager finds {want} cached tokens{hint}"

        cases.append(Case(f"{description}: {want} tokens", (list(first), list(second), block_size), verify))
    return run_checks("prefix_hit_tokens", fn, cases)
