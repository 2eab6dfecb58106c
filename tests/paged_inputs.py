"""Random inputs for the paged-attention tests and benchmarks: block tables as a long-running engine hands them
out, and a batch of decode rows over them."""
from __future__ import annotations

import torch


def shuffled_block_tables(lengths: list[int], block_size: int, num_blocks: int, seed: int = 0) -> list[list[int]]:
    """Blocks for sequences of `lengths` tokens, taken in turn from a random permutation of `num_blocks`: not
    contiguous and not in order, as a long-running engine's free list hands them out."""
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
    tables, start = [], 0
    for n in lengths:
        need = -(-n // block_size)
        tables.append(perm[start:start + need])
        start += need
    return tables


def random_decode_batch(context_lens: list[int] | tuple[int, ...], heads: int = 6, kv_heads: int = 2,
                        head_dim: int = 8, block_size: int = 4, dtype: torch.dtype = torch.float32,
                        device: torch.device | str = "cpu", spare_blocks: int = 3, seed: int = 0) -> tuple:
    """Random inputs for the decode kernels, for their tests and benchmarks: q, k_cache, v_cache, block_tables
    (shuffled, padded with -1 and one spare column), context_lens, as `paged_decode_attention` takes them."""
    g = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-c // block_size) for c in context_lens) + spare_blocks
    k = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)
    v = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)
    q = torch.randn(len(context_lens), heads, head_dim, generator=g)
    tables = shuffled_block_tables(list(context_lens), block_size, num_blocks, seed)
    width = max(len(t) for t in tables) + 1
    padded = torch.tensor([t + [-1] * (width - len(t)) for t in tables], dtype=torch.int32)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    return tuple(t.to(device, dtype) for t in (q, k, v)) + (padded.to(device), lens.to(device))
