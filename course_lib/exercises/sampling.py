"""Checkers for chapter 04, the forward pass and sampling (前向传播与采样).

Each one runs the learner's function on logits the chapter never shows (seeded random ones, of several
vocabulary sizes, peaked and flat, with ties) and compares it with the engine's own filters
(`course_lib.sampling`), `transformers`' logits processors, or the engine's stop rules (`Sequence`).

    check_highest_temperature(highest_temperature)      # exercise 1
    check_greedy_equivalents(greedy_equivalents)        # exercise 2
    check_tokens_kept(tokens_kept)                      # exercise 3
    check_stop_conditions(apply_stop_conditions, tok)   # exercise 4
    check_top_p_from_the_top(top_p_from_the_top)        # exercise 5
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from ..engine.sequence import Sequence
from ..sampling import SamplingParams, processed_logits, top_k_filter, top_p_filter
from ..tokenizer import Tokenizer
from .check import Case, run_checks


def _logits(vocab: int, scale: float, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Seeded normal logits [vocab]: scale 0.01 is nearly flat, scale 5 is peaked."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(vocab, generator=gen, dtype=torch.float64) * scale).to(dtype)


def _tensor(result: Any, what: str, like: torch.Tensor) -> torch.Tensor:
    assert isinstance(result, torch.Tensor), f"return {what} as a torch.Tensor, got {type(result).__name__}"
    assert result.shape == like.shape, f"return {what} of shape {tuple(like.shape)}, got {tuple(result.shape)}"
    return result


def _number(result: Any, what: str) -> float:
    if isinstance(result, torch.Tensor) and result.numel() == 1:
        result = result.item()
    assert isinstance(result, (int, float)) and not isinstance(result, bool), \
        f"return {what} as a number, got {type(result).__name__}"
    return float(result)


# --- exercise 1: the highest temperature at which the top token keeps more than p ------------------------------


def top_probability(logits: torch.Tensor, temperature: float) -> float:
    """Probability of the most likely token after dividing the logits by `temperature` (float64)."""
    return (logits.double() / temperature).softmax(-1).max().item()


def highest_temperature_reference(logits: torch.Tensor, p: float) -> float:
    """The temperature T* at which softmax(logits / T*).max() == p, by bisection on log T.

    The top token's probability falls as T rises (from 1 as T -> 0 to 1/vocab as T -> inf), so every
    T < T* keeps it above p and T* is the highest such temperature. Needs one largest logit and 1/vocab < p < 1.
    """
    lo, hi = math.log(1e-6), math.log(1e6)
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if top_probability(logits, math.exp(mid)) > p else (lo, mid)
    return math.exp((lo + hi) / 2)


def _temperature_case(vocab: int, scale: float, seed: int, p: float, rtol: float = 0.01) -> Case:
    logits = _logits(vocab, scale, seed)
    want = highest_temperature_reference(logits, p)

    def verify(result: Any) -> None:
        got = _number(result, "the temperature")
        assert got > 0 and math.isfinite(got), f"got {got}: the temperature is a positive, finite number"
        if abs(got - want) <= rtol * want:
            return
        at = top_probability(logits, got)
        if abs(1 / got - want) <= rtol * want:
            hint = "divide the logits by T (softmax(logits / T)), do not multiply"
        elif at <= p:
            hint = f"too hot: at T = {got:.4g} the top token has {at:.2%}, not more than {p:.0%}"
        else:
            hint = (f"you can go hotter: at T = {got:.4g} the top token still has {at:.2%}; search finer "
                    f"(bisection finds where it crosses {p:.0%} to any precision)")
        raise AssertionError(f"got T = {got:.4g}, expected {want:.4g} (within {rtol:.0%}); {hint}")

    return Case(f"vocab {vocab}, logits ~ N(0, {scale}²), p = {p}: T = {want:.4g}", (logits.clone(), p), verify)


def check_highest_temperature(fn: Callable[[torch.Tensor, float], float]) -> bool:
    """`fn(logits, p)` -> the highest temperature at which the top token keeps more than probability p.

    Checked within 1% on float64 logits [vocab] with one largest value, for 1/vocab < p < 1.
    """
    cases = [
        _temperature_case(50, 1.0, 1, 0.5),
        _temperature_case(1000, 3.0, 2, 0.9),
        _temperature_case(49152, 2.0, 3, 0.2),
        _temperature_case(8, 0.5, 4, 0.3),
    ]
    return run_checks("check_highest_temperature", fn, cases)


# --- exercise 2: settings that sample greedily at temperature 1 ---------------------------------------------------

def _near_tie(vocab: int, seed: int, gap: float) -> torch.Tensor:
    """Normal logits whose two largest differ by `gap` only."""
    logits = _logits(vocab, 2.0, seed, torch.float32)
    top2 = logits.topk(2).indices
    logits[top2[1]] = logits[top2[0]] - gap
    return logits


GREEDY_LOGITS = {  # the distributions each setting must reduce to its argmax
    "peaked (vocab 1,000, N(0, 5²))": _logits(1000, 5.0, 11, torch.float32),
    "almost flat (vocab 5,000, N(0, 0.01²))": _logits(5000, 0.01, 12, torch.float32),
    "two top tokens 0.001 apart (vocab 49,152)": _near_tie(49152, 13, 1e-3),
}


def _greedy_case(name: str, logits: torch.Tensor) -> Case:
    top = logits.argmax().item()

    def verify(result: Any) -> None:
        assert isinstance(result, (list, tuple)) and len(result) >= 3 and \
            all(isinstance(s, SamplingParams) for s in result), \
            "return a list of (at least) three SamplingParams"
        knobs = []
        for s in result:
            assert not s.greedy, (f"{s.temperature=} is greedy by definition (below SAMPLING_EPS); leave the "
                                  f"temperature at 1 and let a filter do the work")
            on = [k for k, off in (("top_k", s.top_k <= 0), ("top_p", s.top_p >= 1), ("min_p", s.min_p <= 0))
                  if not off]
            knobs.extend(on)
            kept = torch.isfinite(processed_logits(logits, s)).nonzero().flatten().tolist()
            assert kept == [top], (f"SamplingParams(temperature={s.temperature:g}, top_k={s.top_k}, top_p={s.top_p:g}, "
                                   f"min_p={s.min_p:g}) keeps {len(kept)} tokens here, not just the argmax"
                                   + ("; a temperature drops no token, it only sharpens: with two logits 0.001 apart, "
                                      "T = 0.001 still leaves the second e^-1 = 0.37 times as likely as the first"
                                      if not on else ""))
        missing = {"top_k", "top_p", "min_p"} - set(knobs)
        assert not missing, f"use each of top_k, top_p and min_p in one setting; missing: {sorted(missing)}"

    return Case(f"{name}: only the argmax is left", (), verify)


def check_greedy_equivalents(fn: Callable[[], list[SamplingParams]]) -> bool:
    """`fn()` -> SamplingParams (temperature not 0) with top_k, top_p, min_p that leave only the argmax.

    Each setting runs through the engine's `processed_logits` on a peaked, a flat and a near-tied
    distribution; exactly the most likely token must survive.
    """
    cases = [_greedy_case(name, logits) for name, logits in GREEDY_LOGITS.items()]
    return run_checks("check_greedy_equivalents", fn, cases)


# --- exercise 3: how many tokens top-k then top-p keep -----------------------------------------------------------


def tokens_kept_reference(logits: torch.Tensor, top_k: int, top_p: float) -> int:
    """The engine's count: top_k_filter, then top_p_filter on what is left (renormalised), then count."""
    return int(torch.isfinite(top_p_filter(top_k_filter(logits, top_k), top_p)).sum())


def _kept_case(name: str, logits: torch.Tensor, top_k: int, top_p: float) -> Case:
    want = tokens_kept_reference(logits, top_k, top_p)
    nucleus_alone = tokens_kept_reference(logits, 0, top_p)
    k_alone = tokens_kept_reference(logits, top_k, 1.0)

    def verify(result: Any) -> None:
        got = _number(result, "the number of tokens")
        assert got == int(got), f"return a whole number of tokens, got {got}"
        if got == want:
            return
        hint = ""
        if top_k > 0 and got == min(k_alone, nucleus_alone):
            hint = ("; top-p runs on what top-k left, renormalised: the top-k tokens' probabilities are "
                    "divided by their sum before the nucleus is measured")
        elif top_k > 0 and got == top_k and k_alone != top_k:
            hint = f"; logits tied with the k-th one are all kept (top_k_filter keeps logits >= the k-th: {k_alone})"
        elif got == want - 1:
            hint = "; keep the token that makes the total reach top_p, too"
        elif top_k <= 0 and got == 0:
            hint = "; top_k = 0 means off"
        raise AssertionError(f"got {int(got)}, the engine keeps {want}{hint}")

    return Case(f"{name}, top_k={top_k}, top_p={top_p}: {want} kept", (logits.clone(), top_k, top_p), verify)


def check_tokens_kept(fn: Callable[[torch.Tensor, int, float], int]) -> bool:
    """`fn(logits, top_k, top_p)` -> how many tokens the engine's top-k, then top-p, leave (float64 logits)."""
    tied = (_logits(2000, 2.0, 23) * 2).round() / 2  # logits on a 0.5 grid: many ties
    cases = [
        _kept_case("broad (vocab 49,152)", _logits(49152, 1.5, 21), 50, 0.9),
        _kept_case("broad (vocab 49,152)", _logits(49152, 1.5, 21), 0, 0.9),
        _kept_case("peaked (vocab 1,000)", _logits(1000, 6.0, 22), 40, 0.8),
        _kept_case("ties on a 0.5 grid (vocab 2,000)", tied, 7, 1.0),
        _kept_case("ties on a 0.5 grid (vocab 2,000)", tied, 300, 0.5),
    ]
    return run_checks("check_tokens_kept", fn, cases)


# --- exercise 4: the engine's stop rules, applied to a stream of tokens ------------------------------------------


def engine_stop(tokenizer: Tokenizer, output_ids: list[int], params: SamplingParams) -> tuple:
    """What the engine returns for a model that would produce `output_ids`: feed them to a `Sequence`.

    Returns (token_ids, text, finish_reason, stop_reason); finish_reason None if the stream ran out first.
    """
    seq = Sequence("check", [], params, tokenizer)
    for token in output_ids:
        seq.append_token(token)
        if seq.is_finished:
            break
    return list(seq.output_token_ids), seq.text, seq.finish_reason, seq.stop_reason


def _stop_case(tokenizer: Tokenizer, name: str, output_ids: list[int], params: SamplingParams) -> Case:
    want = engine_stop(tokenizer, output_ids, params)
    assert want[2] is not None, f"checker bug: {name} does not stop"
    ids, text, reason, stop = want

    def verify(result: Any) -> None:
        assert isinstance(result, (tuple, list)) and len(result) == 4, \
            "return a tuple (token_ids, text, finish_reason, stop_reason)"
        got_ids, got_text, got_reason, got_stop = result
        got_ids = list(got_ids)
        hint = ""
        if got_reason != reason or got_stop != stop:
            if reason == "stop" and isinstance(stop, str) and got_reason == "length":
                hint = "; a stop string that completes on the last allowed token still counts as a stop"
            raise AssertionError(f"finish_reason={got_reason!r}, stop_reason={got_stop!r}; the engine gives "
                                 f"{reason!r}, {stop!r}{hint}")
        if got_ids != ids:
            if len(got_ids) == len(ids) - 1:
                hint = "; the token that ends the request (EOS, a stop id, or the one completing a stop string) " \
                       "stays in token_ids"
            raise AssertionError(f"{len(got_ids)} token ids, the engine keeps {len(ids)}{hint}")
        if got_text != text:
            if isinstance(stop, str) and got_text.startswith(text) and stop in got_text:
                hint = "; cut the text where the stop string starts (the stop string is not in the text)"
            elif got_text.rstrip("\ufffd") == text:
                hint = "; drop a trailing half character (U+FFFD): the engine only emits complete characters"
            elif got_text.startswith(text):
                hint = "; the EOS token (or a stop id) is not part of the text"
            raise AssertionError(f"text {got_text[-30:]!r} (last 30 characters), the engine's ends in "
                                 f"{text[-30:]!r}{hint}")

    return Case(f"{name}: {reason!r}, stop_reason={stop!r}, {len(ids)} tokens",
                (tokenizer, list(output_ids), params), verify)


def check_stop_conditions(fn: Callable[[Tokenizer, list[int], SamplingParams], tuple], tokenizer: Tokenizer) -> bool:
    """`fn(tokenizer, output_ids, params)` -> (token_ids, text, finish_reason, stop_reason) as the engine stops.

    `output_ids` are the tokens a model would produce if nothing stopped it; the result must equal what
    `Sequence.append_token` (the engine's stop rules) makes of them: EOS or a stop id, a stop string
    (cut from the text), or max_tokens.
    """
    eos = tokenizer.eos_token_id
    story = tokenizer.encode("The fox ran into the woods. It was late, and the moon was up. Then it slept.")
    zh = tokenizer.encode("北京是中国的首都，也是一座历史悠久的城市。")
    newline = tokenizer.encode("\n")[0]
    dotted = story.index(tokenizer.encode(".")[0]) + 1  # tokens up to and including the first full stop
    cases = [
        _stop_case(tokenizer, "English, stop at '.'", story, SamplingParams(max_tokens=40, stop=["."])),
        _stop_case(tokenizer, "stop string across two tokens", story,
                   SamplingParams(max_tokens=40, stop=["late, and"])),
        _stop_case(tokenizer, "EOS before any stop string", story[:5] + [eos] + story[5:],
                   SamplingParams(max_tokens=40, stop=["moon"])),
        _stop_case(tokenizer, "max_tokens first", story, SamplingParams(max_tokens=6, stop=["moon"])),
        _stop_case(tokenizer, "the stop string completes on the last allowed token", story,
                   SamplingParams(max_tokens=dotted, stop=["."])),
        _stop_case(tokenizer, "a stop token id", story[:4] + [newline] + story[4:],
                   SamplingParams(max_tokens=40, stop_token_ids=[newline])),
        _stop_case(tokenizer, "Chinese, max_tokens cuts a character in half", zh,
                   SamplingParams(max_tokens=next(n for n in range(1, len(zh))
                                                  if tokenizer.decode(zh[:n]).endswith("\ufffd")))),
        _stop_case(tokenizer, "Chinese, stop at '首都'", zh, SamplingParams(max_tokens=40, stop=["首都"])),
    ]
    return run_checks("check_stop_conditions", fn, cases)


# --- exercise 5: top-p summed from the most likely token down ---------------------------------------------------


def _top_p_case(name: str, logits: torch.Tensor, p: float) -> Case:
    from transformers.generation.logits_process import TopPLogitsWarper

    ours = top_p_filter(logits, p)
    theirs = TopPLogitsWarper(p)(None, logits[None].clone())[0] if p < 1 else logits
    want = int(torch.isfinite(ours).sum())
    assert int(torch.isfinite(theirs).sum()) == want, f"checker bug: engine and transformers differ on {name}"
    probs = logits.softmax(-1)
    sorted_probs = probs.sort(descending=True).values
    margin = (sorted_probs.cumsum(-1) - p).abs().min().item()
    assert p >= 1 or margin > 1e-9, f"checker bug: p={p} falls on a token boundary in {name}"
    ties = want < logits.numel() and sorted_probs[want - 1] == sorted_probs[want]

    def verify(result: Any) -> None:
        assert torch.equal(logits, original), "do not change the logits in place (use masked_fill, not masked_fill_)"
        out = _tensor(result, "the filtered logits", logits)
        assert out.dtype == logits.dtype, f"keep the dtype ({logits.dtype}), got {out.dtype}"
        kept = torch.isfinite(out)
        assert torch.equal(out[kept], logits[kept]), "the logits of kept tokens must stay as they were"
        assert (out[~kept] == float("-inf")).all(), "set the dropped tokens' logits to -inf"
        n = int(kept.sum())
        mass = probs[kept].sum().item()
        if n != want:
            if n < want and mass < p:
                hint = f"the kept tokens hold {mass:.4f} < p = {p}: keep the token that makes the total reach p"
            elif n > want:
                hint = (f"the kept tokens hold {mass:.4f}; a smaller set reaches p = {p} (keep a token while "
                        f"the mass *before* it is < p)")
            else:
                hint = "sort by probability, most likely first"
            raise AssertionError(f"kept {n} tokens, top_p_filter and TopPLogitsWarper keep {want}: {hint}")
        if not (probs[kept].min() >= probs[~kept].max() if n < logits.numel() else True):
            raise AssertionError("a dropped token is more likely than a kept one: map the sorted positions back "
                                 "to the token ids (scatter with the sort's indices)")
        if not ties:
            assert torch.equal(kept, torch.isfinite(ours)), "the same number of tokens, but not the same ones"

    original = logits.clone()
    detail = " (ties at the cut: any of the tied tokens may be kept)" if ties else ""
    return Case(f"{name}, p = {p}: {want} kept{detail}", (logits, p), verify)


def check_top_p_from_the_top(fn: Callable[[torch.Tensor, float], torch.Tensor]) -> bool:
    """`fn(logits, p)` -> logits with -inf outside the nucleus, computed from the most likely token down.

    Compared in float64 (where the order of the sum no longer matters) with the engine's `top_p_filter` and
    `transformers`' `TopPLogitsWarper`, on random logits, logits with many ties, and logits already cut by top-k.
    """
    tied = (_logits(3000, 2.0, 33) * 2).round() / 2
    cut = top_k_filter(_logits(49152, 1.5, 34), 100)  # 100 finite logits, the rest -inf
    cases = [
        _top_p_case("broad (vocab 49,152)", _logits(49152, 1.5, 31), 0.9),
        _top_p_case("peaked (vocab 1,000)", _logits(1000, 6.0, 32), 0.5),
        _top_p_case("ties on a 0.5 grid (vocab 3,000)", tied, 0.7),
        _top_p_case("after top-k = 100 (vocab 49,152)", cut, 0.95),
        _top_p_case("tiny p (vocab 1,000)", _logits(1000, 1.0, 35), 1e-6),
        _top_p_case("p = 1 (vocab 1,000)", _logits(1000, 1.0, 36), 1.0),
    ]
    return run_checks("check_top_p_from_the_top", fn, cases)
