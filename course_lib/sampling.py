"""From logits to the next token: `SamplingParams` (vLLM's names) and the `Sampler`.

Order of operations, as in Hugging Face's `generate` (with OpenAI's logit bias first, as vLLM does):
    logit bias -> repetition penalty -> temperature -> top-k -> top-p -> min-p -> sample (or argmax if greedy)
Each step is a small pure function on logits so the notebooks can show them one at a time; the `Sampler`
runs the same chain on all rows at once (`course_lib.sampling_batch`).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import torch

from .checks import Integral, Real, invalid, number
from .host_copy import staged
from .sampling_batch import BatchKnobs, sample_batch

SAMPLING_EPS = 1e-5  # temperatures below this are greedy, as in vLLM: logits / 1e-40 overflow to inf, softmax to NaN


@dataclass
class SamplingParams:
    """How to pick tokens and when to stop. A value of the wrong type raises a TypeError, one out of range a
    ValueError, naming the field and what it allows; numpy numbers are stored as int/float, `stop` as a list."""

    max_tokens: int = 16
    temperature: float = 1.0  # 0 (anything below SAMPLING_EPS) = greedy
    top_k: int = 0  # 0 or -1 = off
    top_p: float = 1.0  # keep the smallest set of tokens whose probability reaches top_p
    min_p: float = 0.0  # drop tokens less likely than min_p x the most likely one
    repetition_penalty: float = 1.0  # > 1 discourages tokens already in the prompt or output
    seed: int | None = None  # per-request seed: the same seed gives the same tokens
    stop: list[str] | str | None = None  # stop strings (not included in the output text)
    stop_token_ids: list[int] = field(default_factory=list)  # the engine checks that they are < vocab size
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    n: int = 1
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit; +-100 all but forces / bans it

    def __post_init__(self) -> None:
        checks = [  # field, type, test, what is allowed
            ("max_tokens", Integral, lambda v: v >= 1, "an integer >= 1"),
            ("temperature", Real, lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0 (0 means greedy)"),
            ("top_p", Real, lambda v: 0 < v <= 1, "a number in (0, 1]"),
            ("top_k", Integral, lambda v: v >= -1, "an integer: -1 or 0 (off), or >= 1"),
            ("min_p", Real, lambda v: 0 <= v <= 1, "a number in [0, 1]"),
            ("repetition_penalty", Real, lambda v: math.isfinite(v) and v > 0, "a finite number > 0 (1 = off)"),
            ("n", Integral, lambda v: v == 1, "1 (one completion per prompt)"),
        ]
        for name, kind, ok, allowed in checks:
            setattr(self, name, number(f"SamplingParams.{name}", getattr(self, name), kind, ok, allowed))
        if self.seed is not None:  # the range torch.Generator.manual_seed accepts
            self.seed = number("SamplingParams.seed", self.seed, Integral, lambda v: -2**63 <= v < 2**64,
                                "None or an integer in [-2**63, 2**64)")
        for name in ("ignore_eos", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise invalid(TypeError, f"SamplingParams.{name}", "True or False", getattr(self, name))

        stop = [] if self.stop is None else [self.stop] if isinstance(self.stop, str) else self.stop
        self.stop = checked_list("stop", stop, str, bool, "None, a string, or a list of non-empty strings", self.stop)
        self.stop_token_ids = [int(i) for i in checked_list("stop_token_ids", self.stop_token_ids, Integral,
                                                            lambda i: i >= 0, "a list of integer token ids >= 0")]
        self.logit_bias = checked_logit_bias(self.logit_bias)

    @property
    def greedy(self) -> bool:
        """Argmax instead of sampling: temperature 0, or below SAMPLING_EPS, where dividing by it overflows."""
        return self.temperature < SAMPLING_EPS


def checked_list(name: str, items, kind: type, ok, allowed: str, given=None) -> list:
    """`items` as a list of `kind` (never a bool) each passing `ok`, or a TypeError/ValueError naming the field."""
    given = items if given is None else given
    if not isinstance(items, (list, tuple)) or any(isinstance(x, bool) or not isinstance(x, kind) for x in items):
        raise invalid(TypeError, f"SamplingParams.{name}", allowed, given)
    if not all(ok(x) for x in items):
        raise invalid(ValueError, f"SamplingParams.{name}", allowed, given)
    return list(items)


def checked_logit_bias(bias) -> dict[int, float] | None:
    """`bias` as {token id: float}, or a TypeError/ValueError naming SamplingParams.logit_bias. Keys are ids >= 0,
    or strings of one (JSON's keys); values are finite numbers in [-100, 100], as OpenAI allows."""
    name, allowed = "SamplingParams.logit_bias", "None or a dict of token id (an integer >= 0) -> number in [-100, 100]"
    if bias is None:
        return None
    if not isinstance(bias, dict):
        raise invalid(TypeError, name, allowed, bias)
    checked = {}
    for key, value in bias.items():
        token = int(key) if isinstance(key, str) and re.fullmatch(r"[+-]?[0-9]+", key) else key
        if isinstance(token, bool) or not isinstance(token, Integral) or isinstance(value, bool) \
                or not isinstance(value, Real):
            raise invalid(TypeError, name, allowed, {key: value})
        if token < 0 or not (math.isfinite(value) and -100 <= value <= 100):
            raise invalid(ValueError, name, allowed, {key: value})
        checked[int(token)] = float(value)
    return checked


def apply_logit_bias(logits: torch.Tensor, bias: dict[int, float] | None) -> torch.Tensor:
    """OpenAI's logit_bias: add bias[token] to that token's logit in [..., vocab]."""
    if not bias:
        return logits
    ids = staged(list(bias), torch.long, logits.device)  # [n]
    values = staged(list(bias.values()), logits.dtype, logits.device)  # [n]
    return logits.index_add(-1, ids, values.expand(*logits.shape[:-1], len(bias)))


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL's penalty: for tokens already seen, divide a positive logit by `penalty`, multiply a negative one."""
    if penalty == 1.0 or seen.numel() == 0:
        return logits
    logits = logits.clone()
    picked = logits[..., seen]
    logits[..., seen] = torch.where(picked > 0, picked / penalty, picked * penalty)
    return logits


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits, set the rest to -inf."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus sampling: keep the most likely tokens until their total probability reaches p. Computed from the
    unlikely end, as transformers does: drop tokens whose cumulative mass from the least likely stays <= 1 - p
    (a float32 running sum from the top loses the last token or two to rounding over a 49k vocabulary)."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=False, dim=-1)
    tail_mass = sorted_logits.softmax(-1).cumsum(-1)  # mass of this token and all less likely ones
    drop = tail_mass <= 1 - p
    drop[..., -1] = False  # always keep the most likely token
    return logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Drop tokens whose probability is below min_p x the top token's probability."""
    if min_p <= 0:
        return logits
    probs = logits.softmax(-1)
    return logits.masked_fill(probs < min_p * probs.max(-1, keepdim=True).values, float("-inf"))


def processed_logits(logits: torch.Tensor, params: SamplingParams, seen: torch.Tensor | None = None) -> torch.Tensor:
    """All filters of `params` applied to the logits of one sequence [vocab], in float32."""
    logits = apply_logit_bias(logits.float(), params.logit_bias)
    if seen is not None:
        logits = apply_repetition_penalty(logits, seen, params.repetition_penalty)
    if params.greedy:
        return logits
    logits = logits / params.temperature
    logits = top_k_filter(logits, params.top_k)
    logits = top_p_filter(logits, params.top_p)
    return min_p_filter(logits, params.min_p)


def sample_from_probs(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw from probs [..., vocab] by the exponential race: argmax(p_i / E_i), E_i ~ Exp(1). It picks token i
    with probability p_i, like torch.multinomial, but with no CPU<->GPU sync inside."""
    noise = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return (probs / noise).argmax(-1)


class Sampler:
    """Picks one token per sequence from logits [num_seqs, vocab], each with its own params."""

    def __init__(self):
        self._generators: dict[str, torch.Generator] = {}

    def generator_for(self, request_id: str, params: SamplingParams, device: torch.device) -> torch.Generator | None:
        """A per-request RNG when the request has a seed (created once, then carried along)."""
        if params.seed is None or params.greedy:
            return None
        if request_id not in self._generators:
            self._generators[request_id] = torch.Generator(device=device).manual_seed(params.seed)
        return self._generators[request_id]

    def release(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def __call__(self, logits: torch.Tensor, params: list[SamplingParams], histories: list[list[int]],
                 request_ids: list[str]) -> list[int]:
        """logits [num_seqs, vocab]; histories: prompt + output ids of each sequence (for the penalty). All rows
        in one batched pass (`course_lib.sampling_batch`); the `.tolist()` at the end is the only device sync."""
        if all(p.greedy and p.repetition_penalty == 1.0 and not p.logit_bias for p in params):
            return logits.max(-1).indices.tolist()  # a greedy batch: the first of tied maxima (NaN counts as largest)
        knobs = BatchKnobs.build(params, histories, logits.shape[-1], logits.device)
        generators = [self.generator_for(rid, p, logits.device) for p, rid in zip(params, request_ids)]
        return sample_batch(logits, knobs, generators).tolist()
