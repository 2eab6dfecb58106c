"""How much did a change (quantization, a lower precision) cost? Quality, memory and speed of a model.

    texts = evaluation_texts()                           # {"en": ..., "zh": ...}, offline and fixed
    ids = tokenizer.encode(texts["en"])[:512]
    ref, q = score_text(model, ids), score_text(quantized, ids)
    ref.perplexity, q.perplexity, agreement(ref, q)      # exp(mean NLL); top-1 next-token agreement
    ref, q = (score_text(m, ids, keep_logprobs=True) for m in (model, quantized))
    kl_divergence(ref, q)                                # mean KL(P_model || P_quantized), nats per token
    linear_weight_bytes(quantized) / linear_weight_bytes(model)
    decode_tokens_per_second(quantized, ids[:16])
    steps = step_timings({"float32": model, "int4": quantized})  # decode and prefill steps, timed in interleaved rounds
    paired_speedup(steps, "float32", "int4", "decode")  # int4 over float32, round by round

Perplexity is exp of the mean negative log-likelihood of each next token given the ones before
it: lower means the text surprised the model less. Top-1 agreement is teacher-forced: both models
read the same text and we count the positions where their most likely next token is the same.
KL divergence compares the whole next-token distributions at each position,
KL(P || Q) = sum_v P(v) (log P(v) - log Q(v)): 0 only when they are identical, and unlike
perplexity it cannot improve by luck (llama.cpp's `llama-perplexity --kl-divergence` reports it too).
"""
from __future__ import annotations

import heapq
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

import torch
import torch.nn as nn
import torch.nn.functional as F

from .generate import generate_tokens

if TYPE_CHECKING:  # for the annotation only; imported where used
    from .profiling.roofline import RooflinePoint

ZH_SAMPLE = Path(__file__).parent / "data" / "zh_sample.txt"


def evaluation_texts() -> dict[str, str]:
    """Two fixed texts that need no download.

    "en": `heapq.__about__`, François Pinard's essay on heaps and tournaments that ships in
          Python's standard library (unchanged for decades, so the same on every Python 3).
    "zh": `course_lib/data/zh_sample.txt`, paragraphs on LLM inference written for this repo (CC0).
    """
    en = " ".join(heapq.__about__.split())  # one line of prose: the essay's line breaks are layout only
    zh = ZH_SAMPLE.read_text(encoding="utf-8").strip()
    return {"en": en, "zh": zh}


@dataclass
class TextScore:
    """What one model made of one text: mean NLL and its argmax next token at each scored position."""

    nll: float  # mean negative log-likelihood per predicted token, in nats
    num_tokens: int  # positions scored: len(ids) - 1
    predictions: torch.Tensor  # [num_tokens] the model's most likely next token at each position
    logprobs: torch.Tensor | None = None  # [num_tokens, vocab] log-softmax at each position (keep_logprobs=True)

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll)


@torch.inference_mode()
def score_text(model: nn.Module, token_ids: list[int] | torch.Tensor, window: int = 512,
               stride: int | None = None, keep_logprobs: bool = False) -> TextScore:
    """Score every next token of `token_ids` (all but the first) with forwards of at most `window` tokens.

    Each forward scores the next `stride` tokens, reading the up to `window` tokens before them.
    stride = window (the default) cuts the text into chunks: cheapest, but a chunk's first
    tokens have little context. A smaller stride slides the window: every scored token sees at
    least window - stride tokens before it (or the whole text before it, near the start).
    keep_logprobs: also keep every position's log-probabilities (float32 on the CPU, num_tokens x
    vocab x 4 bytes: 25 MB for 128 tokens of a 49k vocabulary), which `kl_divergence` needs.
    """
    ids = torch.as_tensor(token_ids, dtype=torch.long).flatten()
    n = ids.numel()
    stride = stride or window
    if n < 2 or not 0 < stride <= window:
        raise ValueError(f"need at least 2 tokens and 0 < stride <= window, got {n} tokens, "
                         f"window {window}, stride {stride}")
    device = next(model.parameters()).device
    nll_sum, preds, logprobs = 0.0, [], []
    for first in range(1, n, stride):  # this forward scores target positions first .. last-1
        last = min(first + stride, n)
        begin = max(0, last - 1 - window)  # inputs ids[begin : last-1]; logits at position p predict p + 1
        logits = model(ids[begin : last - 1][None].to(device))[0].float()  # [last-1-begin, vocab]
        logits = logits[first - 1 - begin :]  # [last-first, vocab]
        nll_sum += F.cross_entropy(logits, ids[first:last].to(device), reduction="sum").item()
        preds.append(logits.argmax(dim=-1).cpu())
        if keep_logprobs:
            logprobs.append(F.log_softmax(logits, dim=-1).cpu())  # [last-first, vocab]
    return TextScore(nll_sum / (n - 1), n - 1, torch.cat(preds), torch.cat(logprobs) if keep_logprobs else None)


def perplexity(model: nn.Module, token_ids: list[int] | torch.Tensor, window: int = 512,
               stride: int | None = None) -> float:
    """exp(mean next-token NLL) of `model` on `token_ids` (see `score_text`)."""
    return score_text(model, token_ids, window, stride).perplexity


def agreement(a: TextScore, b: TextScore) -> float:
    """Fraction of positions where two scores of the same text predict the same next token."""
    if a.predictions.shape != b.predictions.shape:
        raise ValueError(f"scores of different texts: {a.num_tokens} vs {b.num_tokens} positions")
    return (a.predictions == b.predictions).float().mean().item()


def kl_per_token(reference: TextScore, other: TextScore) -> torch.Tensor:
    """KL(P_reference || P_other) in nats at each scored position: [num_tokens] float32.

    Both scores must come from `score_text(..., keep_logprobs=True)` on the same text.
    """
    if reference.logprobs is None or other.logprobs is None:
        raise ValueError("kl_per_token needs log-probabilities: score both texts with score_text(..., keep_logprobs=True)")
    if reference.logprobs.shape != other.logprobs.shape:
        raise ValueError(f"scores of different texts or vocabularies: {tuple(reference.logprobs.shape)} vs "
                         f"{tuple(other.logprobs.shape)}")
    p_log, q_log = reference.logprobs.double(), other.logprobs.double()  # [num_tokens, vocab]
    return (p_log.exp() * (p_log - q_log)).sum(dim=-1).clamp(min=0).float()  # [num_tokens]


def kl_divergence(reference: TextScore, other: TextScore) -> float:
    """Mean over positions of KL(P_reference || P_other), in nats: how far `other`'s next-token
    distributions are from the reference's (0 = identical)."""
    return kl_per_token(reference, other).mean().item()


def top1_agreement(model_a: nn.Module, model_b: nn.Module, token_ids: list[int] | torch.Tensor,
                   window: int = 512) -> float:
    """Teacher-forced top-1 agreement of two models' greedy next tokens on `token_ids`."""
    return agreement(score_text(model_a, token_ids, window), score_text(model_b, token_ids, window))


def _tensor_bytes(tensors, seen: set[int]) -> int:
    total = 0
    for t in tensors:
        if t is not None and t.data_ptr() not in seen:  # tied weights count once
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def linear_weight_bytes(model: nn.Module, include_lm_head: bool = False) -> int:
    """Bytes held by the model's linear layers (nn.Linear and QuantLinear: weights, codes, scales, biases).

    lm_head is left out unless asked for, as `quantize_model` leaves it out: in SmolLM2 it is the
    token embedding, shared, and no quantization method here changes it.
    """
    from .quant import QuantLinear

    seen, total = set(), 0
    for name, m in model.named_modules():
        if not isinstance(m, (nn.Linear, QuantLinear)) or (name.split(".")[-1] == "lm_head" and not include_lm_head):
            continue
        total += _tensor_bytes(list(m.parameters(recurse=False)) + list(m.buffers(recurse=False)), seen)
    return total


@torch.inference_mode()
def greedy_generate(model: nn.Module, prompt_ids: list[int], max_new_tokens: int,
                    stop_ids: set[int] | None = None) -> list[int]:
    """Greedy decoding with a contiguous KV cache: the bare loop of `course_lib.generate`, no sampler."""
    return _greedy(model, prompt_ids, max_new_tokens, stop_ids)[0]


def _greedy(model: nn.Module, prompt_ids: list[int], max_new_tokens: int,
            stop_ids: set[int] | None = None) -> tuple[list[int], list[float]]:
    """(new tokens, seconds of each decode step) for a greedy continuation of `prompt_ids`."""
    out, stamps = [], [time.perf_counter()]
    argmax = lambda logits: logits[0].argmax().item()  # noqa: E731  (.item() syncs: honest timing)
    for token in generate_tokens(model, prompt_ids, argmax, max_new_tokens):
        stamps.append(time.perf_counter())
        out.append(token)
        if stop_ids and token in stop_ids:
            break
    return out, [b - a for a, b in zip(stamps[1:], stamps[2:])]  # the first interval is the prefill


@torch.inference_mode()
def decode_tokens_per_second(model: nn.Module, prompt_ids: list[int], new_tokens: int = 32) -> float:
    """Greedy decode speed after the prefill: 1 / the median time of a decode step.

    The median, not the mean: on a shared machine a few steps that wait for a CPU would
    otherwise decide the number.
    """
    if new_tokens < 2:
        raise ValueError(f"new_tokens must be >= 2 to time at least one decode step, got {new_tokens}")
    _, step_seconds = _greedy(model, prompt_ids, new_tokens)
    return 1.0 / statistics.median(step_seconds)


def step_timings(models: Mapping[str, nn.Module], context_len: int = 64, prefill_tokens: int = 128,
                 rounds: int = 5, decode_repeats: int = 3) -> dict[str, dict[str, RooflinePoint]]:
    """Time a decode step and a prefill of every model, in interleaved rounds.

    Each round runs every model in turn (`decode_repeats` decode steps after `context_len` cached
    tokens, then one `prefill_tokens` prefill), so a burst of load on a shared machine slows all
    models alike instead of the one that happened to be running: their ratios stay meaningful.
    Returns {label: {"decode": point, "prefill": point}}, each point's Timing holding every sample.
    """
    from .profiling.roofline import RooflinePoint, measure_decode, measure_prefill
    from .profiling.timer import Timing

    samples = {label: {"decode": [], "prefill": []} for label in models}
    points: dict[str, dict[str, RooflinePoint]] = {}
    for r in range(rounds):
        for label, model in models.items():
            warm = 1 if r == 0 else 0  # one-off costs (allocation, kernel compilation) stay out of the samples
            dec = measure_decode(model, context_len, repeats=decode_repeats, warmup=warm)
            pre = measure_prefill(model, prefill_tokens, repeats=1, warmup=warm)
            samples[label]["decode"] += dec.timing.all
            samples[label]["prefill"] += pre.timing.all
            points[label] = {"decode": dec, "prefill": pre}
    return {label: {kind: RooflinePoint(p.name, p.cost, Timing.from_samples(samples[label][kind]))
                    for kind, p in points[label].items()} for label in models}


def paired_speedup(steps: Mapping[str, Mapping[str, RooflinePoint]], base: str, other: str, kind: str) -> float:
    """How many times faster `other`'s `kind` ("decode" or "prefill") step ran than `base`'s, from
    `step_timings`: the median over the rounds of base's sample over other's, each pair timed a second
    apart. A burst of load slows both sides of a pair, where it could slow one format's best sample only."""
    a, b = steps[base][kind].timing.all, steps[other][kind].timing.all
    return statistics.median(x / y for x, y in zip(a, b, strict=True))
