"""The `Sampler`'s batched pass: every row's filters at once, each row with its own knobs.

The same chain as `processed_logits`, on logits [num_seqs, vocab] with each knob a column [num_seqs, 1]:

    logit bias -> repetition penalty -> temperature -> top-k + top-p (one sort) -> min-p -> sample or argmax

A batch of 64 requests is a handful of kernels instead of 64 x 6 small ones. Top-k and top-p share one
ascending sort, as vLLM's and FlashInfer's samplers do: top-k keeps the values >= the k-th largest, top-p
drops the least likely prefix whose mass stays <= 1 - p. A knob that is off takes a value that changes
nothing (k = vocab, 1 - p = -1, min_p = 0, penalty = 1, temperature = 1), so greedy rows ride along and take
the argmax. Each row gives bit for bit the logits `processed_logits` gives it alone.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .host_copy import to_device_at_once

NEG_INF = float("-inf")


@dataclass
class BatchKnobs:
    """Per-row sampling parameters as device tensors, built once per step by `BatchKnobs.build`."""

    temperature: torch.Tensor  # [num_seqs, 1] float32; 1 for greedy rows
    top_k: torch.Tensor  # [num_seqs, 1] int64; vocab when off
    tail: torch.Tensor  # [num_seqs, 1] float32: 1 - top_p; -1 when off (no cumulative mass is <= -1)
    min_p: torch.Tensor  # [num_seqs, 1] float32; 0 when off
    penalty: torch.Tensor  # [num_seqs, 1] float32; 1 when off
    greedy: torch.Tensor  # [num_seqs] bool
    bias_index: torch.Tensor  # [2, num_biases] int64: (row, token) of each logit bias
    bias_value: torch.Tensor  # [num_biases] float32
    seen_index: torch.Tensor  # [2, num_seen] int64: (row, token) of each token a penalised row has seen
    uses: frozenset[str]  # the passes some row needs: "temperature", "min_p"
    max_k: int  # the most tokens a row's top-k/top-p can keep (vocab for top-p alone); 0 when no row filters
    greedy_rows: list[bool]  # the same as `greedy`, on the host

    @classmethod
    def build(cls, params: list, histories: list[list[int]], vocab_size: int,
              device: torch.device | str) -> "BatchKnobs":
        """From each row's `SamplingParams` and prompt + output ids, in one host->device copy (of float32s)."""
        rows, bias_rows, bias_tokens, bias_values, seen_rows, seen_tokens = [], [], [], [], [], []
        for i, (p, hist) in enumerate(zip(params, histories)):
            k = p.top_k if 0 < p.top_k < vocab_size and not p.greedy else vocab_size
            tail = 1 - p.top_p if p.top_p < 1.0 and not p.greedy else -1.0  # 1 - p in float64, as top_p_filter
            rows.append([1.0 if p.greedy else p.temperature, k, tail, 0.0 if p.greedy else p.min_p,
                         p.repetition_penalty, float(p.greedy)])
            for token, value in (p.logit_bias or {}).items():
                bias_rows.append(i), bias_tokens.append(token), bias_values.append(value)
            if p.repetition_penalty != 1.0:
                seen = sorted(set(hist))
                seen_rows += [i] * len(seen)
                seen_tokens += seen
        as_float = lambda x: torch.tensor(x, dtype=torch.float32)  # noqa: E731  (ids < 2**24 are exact)
        floats, values, bias_index, seen_index = to_device_at_once(  # one copy for the whole batch
            [as_float(rows).view(len(rows), 6), as_float(bias_values),
             as_float([bias_rows, bias_tokens]).view(2, -1), as_float([seen_rows, seen_tokens]).view(2, -1)], device)
        uses = {name for name, on in [
            ("temperature", any(not p.greedy and p.temperature != 1.0 for p in params)),
            ("min_p", any(r[3] > 0 for r in rows))] if on}
        max_k = max((r[1] for r in rows if r[1] < vocab_size or r[2] >= 0), default=0)
        return cls(temperature=floats[:, 0:1], top_k=floats[:, 1:2].long(), tail=floats[:, 2:3],
                   min_p=floats[:, 3:4], penalty=floats[:, 4:5], greedy=floats[:, 5] > 0.5,
                   bias_index=bias_index.long(), bias_value=values, seen_index=seen_index.long(),
                   uses=frozenset(uses), max_k=int(max_k),
                   greedy_rows=[p.greedy for p in params])


def processed_logits_batch(logits: torch.Tensor, knobs: BatchKnobs) -> torch.Tensor:
    """`processed_logits` for every row of logits [num_seqs, vocab] at once, in float32."""
    logits = logits.float()
    if knobs.bias_value.numel():
        logits = logits.index_put(tuple(knobs.bias_index), knobs.bias_value, accumulate=True)
    if knobs.seen_index.numel():
        seen = torch.zeros_like(logits, dtype=torch.bool)  # [num_seqs, vocab]
        seen[tuple(knobs.seen_index)] = True
        pen = knobs.penalty
        logits = torch.where(seen, torch.where(logits > 0, logits / pen, logits * pen), logits)
    if "temperature" in knobs.uses:
        logits = logits / knobs.temperature
    if knobs.max_k:
        logits = top_k_top_p_batch(logits, knobs.top_k, knobs.tail, knobs.max_k)
    if "min_p" in knobs.uses:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < knobs.min_p * probs.max(-1, keepdim=True).values, NEG_INF)
    return logits


def top_k_top_p_batch(logits: torch.Tensor, top_k: torch.Tensor, tail: torch.Tensor, max_k: int) -> torch.Tensor:
    """Top-k then top-p on logits [num_seqs, vocab] with one (partial) sort. top_k, tail (= 1 - top_p):
    [num_seqs, 1]. Only the `max_k` largest of each row are sorted: no row keeps more (a row with top-p
    but no top-k makes max_k the vocab size, a full sort); rows with neither knob have k = vocab and keep all.
    """
    vocab = logits.shape[-1]
    top, order = logits.topk(max_k, dim=-1)  # [num_seqs, max_k], largest first
    ascending, order = top.flip(-1), order.flip(-1)
    kth = top.gather(-1, top_k.clamp(max=max_k) - 1).masked_fill(top_k >= vocab, NEG_INF)  # [num_seqs, 1]
    below_k = ascending < kth
    tail_mass = ascending.masked_fill(below_k, NEG_INF).softmax(-1).cumsum(-1)  # this token and all less likely
    drop = below_k | (tail_mass <= tail)
    drop[:, -1] = False  # always keep the most likely token
    return logits.masked_fill((logits < kth).scatter_(-1, order, drop), NEG_INF)


def sample_batch(logits: torch.Tensor, knobs: BatchKnobs,
                 generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row of logits [num_seqs, vocab] -> [num_seqs] int64, on the device.

    Sampled rows race argmax(p_i / E_i); a row with a generator draws its E from it (as `sample_from_probs`
    would for that row alone), the others share one draw. Greedy rows take the argmax.
    """
    logits = processed_logits_batch(logits, knobs)
    greedy = logits.max(-1).indices  # [num_seqs]: the first of tied maxima, as the greedy Sampler
    if all(knobs.greedy_rows):
        return greedy
    probs = logits.softmax(-1)  # [num_seqs, vocab]
    shared = any(g is None and not greedy_row for g, greedy_row in zip(generators, knobs.greedy_rows))
    noise = torch.empty_like(probs).exponential_(1.0) if shared else torch.ones_like(probs)  # E ~ Exp(1)
    for i, g in enumerate(generators):
        if g is not None:  # the very draw `sample_from_probs(probs[i], g)` makes
            noise[i] = torch.empty_like(probs[i]).exponential_(1.0, generator=g)
    return torch.where(knobs.greedy, greedy, (probs / noise).argmax(-1))
