"""Checkers for chapter 00 (one chat turn, step by step): the loop's finish, the cache's length, prefill against
decode, stop strings.

    check_greedy_chat(greedy_chat, llm)          fn(model, tokenizer, messages, max_tokens) -> (finish_reason, last id)
    check_cached_tokens(cached_tokens, llm)      fn(prompt_len, output_len, ended_with_eos) -> tokens in the cache
    check_prefill_vs_decode(prefill_vs_decode, llm)   fn(model, lengths) -> (ratios, twice_at)
    check_stop_strings(finish_with_stop, llm)    fn(tokenizer, output_ids, stop, max_tokens)
                                                     -> (text, finish_reason, stop_reason)

The references run on the chapter's own model (`llm.model`: its device and dtype): a plain greedy loop with a
contiguous `KVCache`, whose cache length is read after the run; the engine's `Sequence.append_token`, which decides
every stop in the engine; and, for timing, stand-in models whose cost per forward pass is known exactly.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..config import ModelConfig
from ..kv_cache import KVCache
from .check import Case, as_int, run_checks

# Questions whose greedy answers have clear winners (top-2 logit margin of about 0.5 or more at every step, in float32
# and bfloat16), so a loop written another way (no `last_only`, no cache) still picks the same tokens.
JAPAN, SKY, SUM = "What is the capital of Japan?", "What colour is the sky?", "What is 2+2?"


@dataclass(frozen=True)
class GreedyRun:
    """One greedy answer computed by the plain loop, and the length of its KV cache afterwards."""

    prompt_ids: list[int]
    output_ids: list[int]
    cached_tokens: int  # cache.seq_len after the loop
    ended_with_eos: bool


_RUNS: dict[tuple, GreedyRun] = {}


def greedy_run(model: Any, tokenizer: Any, question: str, max_tokens: int) -> GreedyRun:
    """The chapter's loop: prefill the chat prompt, then one token per step until EOS or `max_tokens` (memoised)."""
    key = (id(model), str(model.device), model.dtype, question, max_tokens)
    if key not in _RUNS:
        prompt_ids = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": question}]))
        cache = KVCache(model.config, len(prompt_ids) + max_tokens, device=model.device, dtype=model.dtype)
        ids = torch.tensor([prompt_ids], device=model.device)  # [1, prompt_len]: the prefill
        out: list[int] = []
        with torch.inference_mode():
            while True:
                out.append(int(model(ids, kv=cache, last_only=True)[0, -1].argmax()))
                if out[-1] in tokenizer.eos_token_ids or len(out) >= max_tokens:
                    break
                ids = torch.tensor([[out[-1]]], device=model.device)  # [1, 1]: decode feeds the newest token
        if len(_RUNS) > 32:
            _RUNS.clear()
        _RUNS[key] = GreedyRun(prompt_ids, out, cache.seq_len, out[-1] in tokenizer.eos_token_ids)
    return _RUNS[key]


# --- exercise 1: the finish of a greedy chat turn -------------------------------------------------------------------


def check_greedy_chat(fn: Callable[[Any, Any, list[dict], int], tuple[str, int]], llm: Any) -> bool:
    """`fn(model, tokenizer, messages, max_tokens)` -> (finish_reason, last token id) of the greedy answer.

    Checked against the plain greedy loop on `llm.model`, on questions the chapter does not use, with a max_tokens
    that cuts the answer, one that lets it end, and one equal to the answer's length (EOS wins: "stop").
    """
    model, tok = llm.model, llm.tokenizer
    eos = tok.eos_token_ids
    full = {q: greedy_run(model, tok, q, n) for q, n in ((JAPAN, 40), (SUM, 1))}
    scenarios = [(JAPAN, 40, "the answer ends by itself"), (JAPAN, len(full[JAPAN].output_ids),
                                                           "max_tokens equal to the answer's length, EOS included"),
                 (JAPAN, 5, "max_tokens cuts the answer"),
                 (SUM, 1, "another question, max_tokens=1: the prefill's token is the whole answer")]
    cases = []
    for question, max_tokens, what in scenarios:
        ids = full[question].output_ids[:max_tokens]
        want = ("stop" if ids[-1] in eos else "length", ids[-1])

        def verify(got, ids=ids, want=want, max_tokens=max_tokens):
            assert isinstance(got, (tuple, list)) and len(got) == 2, \
                f"return a pair (finish_reason, last_token_id), got {got!r}"
            reason, last = got[0], as_int(got[1], "the last token id")
            assert reason in ("stop", "length"), f"finish_reason is 'stop' or 'length', got {reason!r}"
            if reason != want[0]:
                hint = (f"the answer ended with EOS (id {ids[-1]}) as token {len(ids)} of max_tokens={max_tokens}: "
                        "check for EOS before the length, EOS wins" if want[0] == "stop" else
                        f"max_tokens={max_tokens} stopped it before any EOS")
                raise AssertionError(f"finish_reason should be {want[0]!r}, got {reason!r}: {hint}")
            if last != want[1]:
                where = {ids[k]: k + 1 for k in range(len(ids) - 1)}
                hint = (f"that is token {where[last]} of {len(ids)}: the loop stopped early" if last in where else
                        "a token after the last one: the loop made one token too many (at most max_tokens, the "
                        "prefill's token counts)" if len(ids) == max_tokens else "")
                raise AssertionError(f"the last token should be {want[1]} ({tok.decode([want[1]])!r}), got {last}"
                                     + (f"; {hint}" if hint else ""))

        messages = [{"role": "user", "content": question}]
        cases.append(Case(f"{question!r}, max_tokens={max_tokens}: {what}", (model, tok, messages, max_tokens),
                          verify))
    return run_checks("check_greedy_chat", fn, cases)


# --- exercise 2: how many tokens the KV cache holds ------------------------------------------------------------------


def check_cached_tokens(fn: Callable[[int, int, bool], int], llm: Any) -> bool:
    """`fn(prompt_len, output_len, ended_with_eos)` -> tokens in the KV cache after the greedy loop.

    Each case is a real run of the loop on `llm.model` (prompts of different lengths, ended by EOS or by
    max_tokens); the answer must equal `cache.seq_len` after it.
    """
    model, tok = llm.model, llm.tokenizer
    cases = []
    for question, max_tokens in ((JAPAN, 40), (JAPAN, 5), (SKY, 3), (SUM, 1), (SUM, 40)):
        run = greedy_run(model, tok, question, max_tokens)
        P, N, eos = len(run.prompt_ids), len(run.output_ids), run.ended_with_eos

        def verify(got, P=P, N=N, eos=eos, want=run.cached_tokens):
            got = as_int(got, "the number of cached tokens")
            if got == want:
                return
            hint = ("the last token is sampled but never fed back, so its K and V are never written" if got == P + N
                    else "the prompt's K and V are all in the cache after the prefill" if got in (N, N - 1) else "")
            raise AssertionError(f"the real cache holds {want} tokens after this run, you said {got}"
                                 + (f"; {hint}" if hint else ""))

        how = "ended with EOS" if eos else f"cut by max_tokens={max_tokens}"
        cases.append(Case(f"prompt of {P} tokens, {N} output token{'s' * (N != 1)}, {how}", (P, N, eos),
                          verify))
    return run_checks("check_cached_tokens", fn, cases)


# --- exercise 3: one prefill against one decode step ------------------------------------------------------------------


class StandInModel:
    """Looks like the engine's `Transformer` to a timing function, but a forward pass over T new tokens only sleeps
    `base_s + per_token_s * T` seconds (and advances the cache): a machine whose costs are known exactly."""

    def __init__(self, base_s: float, per_token_s: float):
        self.base_s, self.per_token_s = base_s, per_token_s
        self.config = ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                                  num_kv_heads=1, max_position_embeddings=1 << 16, name="stand-in")
        self.device, self.dtype = torch.device("cpu"), torch.float32

    def __call__(self, input_ids: torch.Tensor, positions: Any = None, kv: Any = None, last_only: bool = False,
                 logits_index: Any = None) -> torch.Tensor:
        B, T = input_ids.shape
        if kv is not None and kv.seq_len + T > kv.max_seq_len:
            raise ValueError(f"KV cache full: {kv.seq_len} + {T} tokens > max_seq_len {kv.max_seq_len}")
        time.sleep(self.base_s + self.per_token_s * T)
        if kv is not None:
            kv.advance(T)
        return torch.zeros(B, 1 if last_only else T, self.config.vocab_size)  # [batch, seq, vocab]

    forward = __call__

    def expected_ratio(self, n: int) -> float:
        """A prefill of n tokens over one decode step."""
        return (self.base_s + self.per_token_s * n) / (self.base_s + self.per_token_s)


def _first_at_least(lengths: list[int], ratios: list[float], factor: float = 2.0) -> int | None:
    return next((n for n, r in zip(lengths, ratios) if r >= factor), None)


def _ratios_and_twice(got: Any, lengths: list[int]) -> tuple[list[float], Any]:
    assert isinstance(got, (tuple, list)) and len(got) == 2, f"return a pair (ratios, twice_at), got {got!r}"
    ratios, twice_at = got
    assert len(ratios) == len(lengths), f"one ratio per length: {len(lengths)} lengths, {len(ratios)} ratios"
    ratios = [float(r) for r in ratios]
    assert all(math.isfinite(r) and r > 0 for r in ratios), f"ratios are positive numbers, got {ratios}"
    assert twice_at is None or twice_at in lengths, \
        f"twice_at is one of the lengths {lengths} or None, got {twice_at!r}"
    want = _first_at_least(lengths, ratios)
    assert twice_at == want, (f"with your ratios {[round(r, 2) for r in ratios]}, the first length whose prefill costs "
                              f"at least twice a decode step is {want}, but twice_at is {twice_at}")
    return ratios, twice_at


def _ratio_hint(got: float, want: float, n: int) -> str:
    near = lambda a, b: abs(a / b - 1) < 0.3  # noqa: E731
    if near(got, 1 / want) and n > 1:
        return "; that looks inverted: a prefill's time divided by a decode step's"
    if near(got, n / want) and n > 1:
        return "; that is n decode steps over one prefill: the ratio asked is one prefill over ONE decode step"
    if near(got, want / n) and n > 1:
        return "; that is the prefill's time per token: divide the whole prefill's time"
    return ""


def _stand_in_case(base_ms: float, per_token_ms: float, lengths: list[int], what: str) -> Case:
    model = StandInModel(base_ms / 1e3, per_token_ms / 1e3)
    want = [model.expected_ratio(n) for n in lengths]

    def verify(got):
        ratios, _ = _ratios_and_twice(got, lengths)
        for n, r, w in zip(lengths, ratios, want):
            assert abs(r / w - 1) <= 0.25, (f"prefill of {n} tokens: ratio {r:.2f}, expected {w:.2f} on this stand-in "
                                            f"(within 25%){_ratio_hint(r, w, n)}")
        assert _first_at_least(lengths, ratios) == _first_at_least(lengths, want), \
            f"twice_at should be {_first_at_least(lengths, want)} on this stand-in"

    return Case(f"stand-in model, a forward pass costs {base_ms:g} ms + {per_token_ms:g} ms per token ({what}), "
                f"lengths {lengths}", (model, lengths), verify, attempts=3)


def check_prefill_vs_decode(fn: Callable[[Any, list[int]], tuple[list[float], int | None]], llm: Any) -> bool:
    """`fn(model, lengths)` -> (ratios, twice_at): for each n, time of a prefill of n tokens / time of one decode
    step with n tokens cached; twice_at = the first n whose ratio is >= 2 (None if none).

    Timing is noisy (and on a shared machine very noisy), so no measured value is checked against another
    measurement: on two stand-in models with a known cost per forward pass the ratios must come within 25% of the
    truth; on `llm.model` only the shape of the answer is checked; and twice_at must always agree with the ratios.
    """
    lengths_real = [1, 8, 32]
    cases = [
        _stand_in_case(20, 0.2, [1, 16, 64, 256], "like a small CPU: the cost grows with the tokens"),
        _stand_in_case(15, 0.01, [1, 64, 256], "like a small model on a GPU: a fixed cost per pass dominates"),
        Case(f"{llm.model.config.name} on {llm.model.device.type} ({str(llm.model.dtype).removeprefix('torch.')}), "
             f"lengths {lengths_real}: one positive ratio per length, twice_at consistent with them",
             (llm.model, lengths_real), lambda got: _ratios_and_twice(got, lengths_real) and None),
    ]
    return run_checks("check_prefill_vs_decode", fn, cases)


# --- exercise 4: stop strings ----------------------------------------------------------------------------------------


def engine_finish(tokenizer: Any, prompt_ids: list[int], output_ids: list[int], stop: list[str],
                  max_tokens: int) -> tuple[str, str | None, int | str | None]:
    """What the engine returns for these tokens: each goes through `Sequence.append_token`, which checks EOS, stop
    strings and max_tokens after every token, exactly as `LLM.generate` does."""
    from ..engine.sequence import Sequence
    from ..sampling import SamplingParams

    seq = Sequence("check", prompt_ids, SamplingParams(max_tokens=max_tokens, temperature=0.0, stop=stop), tokenizer)
    for token in output_ids:
        seq.append_token(token)
        if seq.is_finished:
            break
    return seq.text, seq.finish_reason, seq.stop_reason


def check_stop_strings(fn: Callable[[Any, list[int], list[str], int], tuple], llm: Any) -> bool:
    """`fn(tokenizer, output_ids, stop, max_tokens)` -> (text, finish_reason, stop_reason) that the engine returns
    when the greedy answer `output_ids` (ending with EOS) is generated with `SamplingParams(stop=stop,
    max_tokens=max_tokens)`. The reference is the engine's own `Sequence.append_token`."""
    model, tok = llm.model, llm.tokenizer
    runs = {q: greedy_run(model, tok, q, 40) for q in (JAPAN, SUM)}
    scenarios = [
        (JAPAN, ["Tokyo"], 40, "a stop string in the answer"),
        (JAPAN, ["is", "Japan"], 40, "two stop strings: the first to appear wins, not the first in the list"),
        (JAPAN, ["al of"], 40, "a stop string across two tokens"),
        (JAPAN, ["xyz"], 40, "a stop string that never appears"),
        (JAPAN, ["Tokyo"], 4, "max_tokens comes first"),
        (SUM, ["4", "."], 40, "another answer"),
        (SUM, ["answer"], 2, "a stop string in the last token max_tokens allows"),
        (SUM, ["xyz"], 8, "no stop string, cut by max_tokens"),
    ]
    cases = []
    for question, stop, max_tokens, what in scenarios:
        run = runs[question]
        want = engine_finish(tok, run.prompt_ids, run.output_ids, stop, max_tokens)

        def verify(got, want=want, stop=stop):
            assert isinstance(got, (tuple, list)) and len(got) == 3, \
                f"return (text, finish_reason, stop_reason), got {got!r}"
            text, reason, stop_reason = got
            if isinstance(stop_reason, torch.Tensor):
                stop_reason = stop_reason.item()
            if (text, reason, stop_reason) == want:
                return
            hints = []
            if reason == want[1] == "stop" and stop_reason is None and isinstance(want[2], int):
                hints.append(f"when EOS ends the answer, stop_reason is the EOS token id ({want[2]})")
            if isinstance(want[2], str) and stop_reason != want[2]:
                hints.append("check the stop strings after every token, and cut at the first one that appears")
            if isinstance(text, str) and any(text.startswith(want[0] + s) for s in stop):
                hints.append("the stop string itself is not part of the text")
            if reason == "length" and want[1] == "stop":
                hints.append("a stop string or EOS in the last token still gives 'stop': check them before the length")
            raise AssertionError(f"the engine returns {want!r}, you returned {(text, reason, stop_reason)!r}"
                                 + (f"; hint: {hints[0]}" if hints else ""))

        cases.append(Case(f"{question!r}, stop={stop}, max_tokens={max_tokens}: {what}",
                          (tok, list(run.output_ids), list(stop), max_tokens), verify))
    return run_checks("check_stop_strings", fn, cases)
