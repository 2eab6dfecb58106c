"""The generation loop at its simplest: one sequence, a contiguous KV cache, one token per step.

    prefill:  the whole prompt in one forward  -> K/V of every prompt token cached, first token sampled
    decode:   the last token alone             -> its K/V appended, next token sampled ... until a stop

`LLM` serves many requests at once through `course_lib.engine`; this loop is the reference the
notebooks step through and the "one at a time" baseline the benchmarks compare against.
"""
from __future__ import annotations

from typing import Iterator

import torch

from .engine.sequence import Sequence
from .kv_cache import KVCache
from .model import Transformer
from .sampling import Sampler


@torch.inference_mode()
def generate_stream(model: Transformer, seq: Sequence, sampler: Sampler | None = None) -> Iterator[str]:
    """Run `seq` to completion with a contiguous cache, yielding text deltas as tokens are produced."""
    sampler = sampler or Sampler()
    max_len = min(len(seq) + seq.params.max_tokens, seq.max_model_len)
    cache = KVCache(model.config, max_seq_len=max_len, device=model.device, dtype=model.dtype)
    seq.metrics.record_scheduled()
    ids = torch.tensor([seq.token_ids], device=model.device)  # [1, prompt_len]
    try:
        while True:
            logits = model(ids, kv=cache, last_only=True)[:, -1]  # [1, vocab]
            token = sampler(logits, [seq.params], [seq.token_ids], [seq.request_id])[0]
            seq.append_token(token)
            delta = seq.take_delta()
            if delta:
                yield delta
            if seq.is_finished:
                return
            ids = torch.tensor([[token]], device=model.device)  # [1, 1]: decode feeds only the new token
    finally:
        seq.abort()  # a consumer that stops early (or an error) leaves no half-open request
        sampler.release(seq.request_id)
