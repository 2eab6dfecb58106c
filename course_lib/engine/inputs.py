"""Checks at the engine's door: a request's prompt, params and ids against the model, before anything is queued.
Each error names the field (its `param`: "prompt", "stop_token_ids", "logit_bias"), so bad input never reaches
torch (an id outside the vocabulary is an IndexError on the CPU and a device-side assert on a GPU).
"""
from __future__ import annotations

from ..checks import Integral, Real, invalid, with_param
from ..sampling import SamplingParams
from ..tokenizer import Tokenizer


def check_request(prompt: str | list[int], params: SamplingParams, tokenizer: Tokenizer, vocab_size: int,
                  max_model_len: int) -> list[int]:
    """Check a prompt (text or token ids) and its params against a model; return the prompt's token ids."""
    if not isinstance(params, SamplingParams):
        raise TypeError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
    try:
        ids = check_prompt(prompt, tokenizer, vocab_size, max_model_len)
    except (TypeError, ValueError) as e:
        with_param(e, "prompt")
        raise
    if any(t >= vocab_size for t in params.stop_token_ids):
        raise invalid(ValueError, "SamplingParams.stop_token_ids", f"ids in [0, {vocab_size}) (the vocabulary)",
                      params.stop_token_ids)
    outside = {t: b for t, b in (params.logit_bias or {}).items() if t >= vocab_size}
    if outside:
        raise invalid(ValueError, "SamplingParams.logit_bias", f"token ids in [0, {vocab_size}) (the vocabulary)",
                      outside)
    return ids


def check_prompt(prompt: str | list[int], tokenizer: Tokenizer, vocab_size: int, max_model_len: int) -> list[int]:
    """A prompt's token ids: text encoded, ids checked against the vocabulary; shorter than the context window."""
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt)
    elif isinstance(prompt, (list, tuple)):
        allowed = f"a prompt of token ids must hold integers in [0, {vocab_size}) (the vocabulary)"
        if not all(isinstance(t, Integral) and not isinstance(t, bool) for t in prompt):
            raise TypeError(f"{allowed}, got {[t for t in prompt if not isinstance(t, Integral)][:1]!r}")
        ids = [int(t) for t in prompt]
        if not all(0 <= t < vocab_size for t in ids):
            raise ValueError(f"{allowed}, got {[t for t in ids if not 0 <= t < vocab_size][0]}")
    else:
        raise TypeError(f"a prompt must be a str or a list of token ids, got {type(prompt).__name__}")
    if not ids:
        raise ValueError("prompt is empty: it must hold at least one token")
    if len(ids) >= max_model_len:
        raise ValueError(f"prompt is {len(ids)} tokens, but the context window (max_model_len) is "
                         f"{max_model_len}: the prompt must be shorter than {max_model_len} tokens")
    return ids


def check_request_id(request_id, arrival_time) -> None:
    """A caller's own request id (a str, or None for the engine's) and arrival time (seconds, or None: now)."""
    if request_id is not None and not isinstance(request_id, str):
        raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
    if arrival_time is not None and (not isinstance(arrival_time, Real) or isinstance(arrival_time, bool)):
        raise TypeError(f"arrival_time must be a number (seconds, time.perf_counter()), got {arrival_time!r}")
