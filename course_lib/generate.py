"""The generation loop at its simplest: one sequence, a contiguous KV cache, one token per step.

    prefill:  the whole prompt in one forward  -> K/V of every prompt token cached, first token sampled
    decode:   the last token alone             -> its K/V appended, next token sampled ... until a stop

`LLM` serves many requests at once through `course_lib.engine`; this loop is the reference the
notebooks step through and the "one at a time" baseline the benchmarks compare against.
"""
from __future__ import annotations

from typing import Callable, Iterator

import torch

from .engine.sequence import Sequence
from .kv_cache import KVCache
from .model import Transformer
from .sampling import Sampler


@torch.inference_mode()
def generate_tokens(model: Transformer, prompt_ids: list[int], next_token: Callable[[torch.Tensor], int],
                    max_new_tokens: int, prefill_chunk: int | None = None) -> Iterator[int]:
    """Prefill `prompt_ids`, then decode one token per step; yields at most `max_new_tokens` new token ids.
    `next_token(logits [1, vocab]) -> id` picks each (greedy, a sampler, ...); the caller stops by leaving the
    loop. `prefill_chunk`: prefill that many prompt tokens per forward (chunked prefill), not all at once."""
    cache = KVCache(model.config, max_seq_len=len(prompt_ids) + max_new_tokens, device=model.device, dtype=model.dtype)
    ids = torch.tensor([prompt_ids], device=model.device)  # [1, prompt_len]: the first step is the prefill
    chunk = prefill_chunk or ids.shape[1]
    for start in range(0, ids.shape[1] - chunk, chunk):  # every chunk but the last only fills the cache
        model(ids[:, start:start + chunk], kv=cache, last_only=True)
    ids = ids[:, (ids.shape[1] - 1) // chunk * chunk:]  # [1, last chunk]
    for _ in range(max_new_tokens):
        token = next_token(model(ids, kv=cache, last_only=True)[:, -1])  # logits [1, vocab]
        yield token
        ids = torch.tensor([[token]], device=model.device)  # [1, 1]: decode feeds only the new token


def generate_stream(model: Transformer, seq: Sequence, sampler: Sampler | None = None) -> Iterator[str]:
    """Run `seq` to completion with a contiguous cache, yielding text deltas as tokens are produced."""
    sampler = sampler or Sampler()
    pick = lambda logits: sampler(logits, [seq.params], [seq.token_ids], [seq.request_id])[0]  # noqa: E731
    max_new = min(len(seq) + seq.params.max_tokens, seq.max_model_len) - len(seq)
    seq.metrics.record_scheduled()
    try:
        for token in generate_tokens(model, seq.token_ids, pick, max_new):
            seq.append_token(token)  # checks EOS, stop strings, max_tokens and the context window
            delta = seq.take_delta()
            if delta:
                yield delta
            if seq.is_finished:
                return
    finally:
        seq.abort()  # a consumer that stops early (or an error) leaves no half-open request
        sampler.release(seq.request_id)
