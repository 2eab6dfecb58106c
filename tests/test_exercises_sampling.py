"""Checkers of chapter 04: each passes a reference solution and fails plausible mistakes and an unattempted stub."""
from __future__ import annotations

import math

import pytest
import torch

from course_lib import SamplingParams
from course_lib.exercises import (check_greedy_equivalents, check_highest_temperature, check_stop_conditions,
                                  check_tokens_kept, check_top_p_from_the_top)


def stub(*args):
    raise NotImplementedError


# --- exercise 1 ---------------------------------------------------------------------------------------------------

def _top(logits, t, scale=True):
    return (logits.double() / t if scale else logits.double() * t).softmax(-1).max().item()


def highest_temperature(logits, p):
    lo, hi = math.log(1e-4), math.log(1e4)  # bisection on log T: the top probability falls as T rises
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _top(logits, math.exp(mid)) > p else (lo, mid)
    return math.exp(lo)


def temperature_on_a_grid(logits, p):
    """The first edition's answer: temperatures 0.05, 0.10, ... 5.00."""
    return max((t / 20 for t in range(1, 101) if _top(logits, t / 20) > p), default=0.05)


def temperature_multiplied(logits, p):
    lo, hi = math.log(1e-4), math.log(1e4)
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if _top(logits, math.exp(mid), scale=False) > p else (mid, hi)
    return math.exp(lo)


# --- exercise 2 ---------------------------------------------------------------------------------------------------

def greedy_equivalents():
    return [SamplingParams(top_k=1), SamplingParams(top_p=1e-9), SamplingParams(min_p=1.0)]


def greedy_top_p_too_big():
    return [SamplingParams(top_k=1), SamplingParams(top_p=0.1), SamplingParams(min_p=1.0)]


def greedy_min_p_below_one():
    return [SamplingParams(top_k=1), SamplingParams(top_p=1e-9), SamplingParams(min_p=0.99)]


def greedy_by_low_temperature():
    return [SamplingParams(top_k=1), SamplingParams(top_p=1e-9), SamplingParams(temperature=1e-3)]


def greedy_by_temperature_zero():
    return [SamplingParams(temperature=0), SamplingParams(top_k=1), SamplingParams(top_p=1e-9),
            SamplingParams(min_p=1.0)]


# --- exercise 3 ---------------------------------------------------------------------------------------------------

def tokens_kept(logits, top_k, top_p, renormalise=True, ties=True, crossing=True):
    kept = logits
    if 0 < top_k < logits.numel():
        values, idx = logits.topk(top_k)
        if ties:  # like top_k_filter: every logit >= the k-th survives
            kept = logits.masked_fill(logits < values[-1], float("-inf"))
        else:
            kept = torch.full_like(logits, float("-inf")).scatter(0, idx, values)
    n_k = int(torch.isfinite(kept).sum())
    if top_p >= 1:
        return n_k
    probs = (kept if renormalise else logits).softmax(-1).sort(descending=True).values
    before = probs.cumsum(-1) - (probs if crossing else 0)  # mass of the more likely tokens
    n = int((before < top_p).sum())
    return n if renormalise else min(n, n_k)


# --- exercise 4 ---------------------------------------------------------------------------------------------------

def apply_stop_conditions(tokenizer, output_ids, params, length_first=False, keep_partial=False, keep_stop=False):
    eos = set() if params.ignore_eos else set(tokenizer.eos_token_ids)
    ids, text = [], ""
    for token in output_ids:
        ids.append(token)
        if token in eos or token in params.stop_token_ids:
            return ids, text, "stop", token
        text = tokenizer.decode(ids, skip_special_tokens=params.skip_special_tokens)
        text = text if keep_partial else text.rstrip("\ufffd")  # half a character is not emitted yet
        if length_first and len(ids) >= params.max_tokens:
            return ids, text, "length", None
        for stop in params.stop:
            at = text.find(stop)
            if at != -1:
                return ids, text if keep_stop else text[:at], "stop", stop
        if len(ids) >= params.max_tokens:
            return ids, text, "length", None
    return ids, text, None, None


# --- exercise 5 ---------------------------------------------------------------------------------------------------

def top_p_from_the_top(logits, p, crossing=True, unsort=True, in_place=False):
    probs = logits.softmax(-1)
    sorted_probs, order = probs.sort(descending=True)
    before = sorted_probs.cumsum(-1) - (sorted_probs if crossing else 0)  # mass of the more likely tokens
    keep_sorted = before < p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted) if unsort else keep_sorted
    return logits.masked_fill_(~keep, float("-inf")) if in_place else logits.masked_fill(~keep, float("-inf"))


@pytest.fixture(scope="module")
def check_stops(tokenizer):
    return lambda fn: check_stop_conditions(fn, tokenizer)


MISTAKES = [
    ("temperature", highest_temperature, temperature_on_a_grid),
    ("temperature", highest_temperature, temperature_multiplied),
    ("greedy", greedy_equivalents, greedy_top_p_too_big),
    ("greedy", greedy_equivalents, greedy_min_p_below_one),
    ("greedy", greedy_equivalents, greedy_by_low_temperature),
    ("greedy", greedy_equivalents, greedy_by_temperature_zero),
    ("kept", tokens_kept, lambda lg, k, p: tokens_kept(lg, k, p, renormalise=False)),
    ("kept", tokens_kept, lambda lg, k, p: tokens_kept(lg, k, p, ties=False)),
    ("kept", tokens_kept, lambda lg, k, p: tokens_kept(lg, k, p, crossing=False)),
    ("stops", apply_stop_conditions, lambda *a: apply_stop_conditions(*a, length_first=True)),
    ("stops", apply_stop_conditions, lambda *a: apply_stop_conditions(*a, keep_partial=True)),
    ("stops", apply_stop_conditions, lambda *a: apply_stop_conditions(*a, keep_stop=True)),
    ("top_p", top_p_from_the_top, lambda lg, p: top_p_from_the_top(lg, p, crossing=False)),
    ("top_p", top_p_from_the_top, lambda lg, p: top_p_from_the_top(lg, p, unsort=False)),
    ("top_p", top_p_from_the_top, lambda lg, p: top_p_from_the_top(lg, p, in_place=True)),
]
CHECKS = {"temperature": check_highest_temperature, "greedy": check_greedy_equivalents, "kept": check_tokens_kept,
          "top_p": check_top_p_from_the_top}


@pytest.mark.parametrize("name,solution,wrong", MISTAKES)
def test_checker_passes_solution_fails_mistake(name, solution, wrong, check_stops, capsys):
    check = CHECKS.get(name, check_stops)
    assert check(solution) is True
    capsys.readouterr()
    assert check(wrong) is False
    out = capsys.readouterr().out
    assert "✗" in out


@pytest.mark.parametrize("name", ["temperature", "greedy", "kept", "top_p", "stops"])
def test_stub_is_not_attempted(name, check_stops, capsys):
    check = CHECKS.get(name, check_stops)
    assert check(stub) is False
    assert "not attempted" in capsys.readouterr().out


@pytest.mark.parametrize("wrong,hint", [
    (temperature_multiplied, "divide the logits"),
    (temperature_on_a_grid, "hotter"),
])
def test_temperature_hints(wrong, hint, capsys):
    check_highest_temperature(wrong)
    assert hint in capsys.readouterr().out


@pytest.mark.parametrize("wrong,hint", [
    (greedy_top_p_too_big, "keeps"),
    (greedy_by_low_temperature, "drops no token"),
    (greedy_by_temperature_zero, "greedy by definition"),
])
def test_greedy_hints(wrong, hint, capsys):
    check_greedy_equivalents(wrong)
    assert hint in capsys.readouterr().out


@pytest.mark.parametrize("kwargs,hint", [
    (dict(renormalise=False), "renormalised"),
    (dict(ties=False), "tied"),
    (dict(crossing=False), "reach top_p"),
])
def test_tokens_kept_hints(kwargs, hint, capsys):
    check_tokens_kept(lambda lg, k, p: tokens_kept(lg, k, p, **kwargs))
    assert hint in capsys.readouterr().out


@pytest.mark.parametrize("kwargs,hint", [
    (dict(length_first=True), "last allowed token"),
    (dict(keep_partial=True), "half character"),
    (dict(keep_stop=True), "where the stop string starts"),
])
def test_stop_hints(kwargs, hint, check_stops, capsys):
    check_stops(lambda *a: apply_stop_conditions(*a, **kwargs))
    assert hint in capsys.readouterr().out


@pytest.mark.parametrize("kwargs,hint", [
    (dict(crossing=False), "reach p"),
    (dict(unsort=False), "scatter"),
    (dict(in_place=True), "in place"),
])
def test_top_p_hints(kwargs, hint, capsys):
    check_top_p_from_the_top(lambda lg, p: top_p_from_the_top(lg, p, **kwargs))
    assert hint in capsys.readouterr().out


def test_wrong_return_types_are_reported(capsys):
    assert check_highest_temperature(lambda lg, p: "0.3") is False
    assert check_top_p_from_the_top(lambda lg, p: lg.tolist()) is False
    out = capsys.readouterr().out
    assert "as a number" in out and "torch.Tensor" in out
