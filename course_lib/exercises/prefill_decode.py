"""Checkers for notebook 05 (prefill and decode): a decode step's tokens/s ceiling, a prefill's intensity, the ridge.

Every reference value comes from `course_lib.profiling.flops` (the counts the roofline chapter plots), on
configs the notebook does not use, so a function that only works for SmolLM2 does not pass.

    check_decode_ceiling(decode_tokens_per_s_ceiling)
    check_prefill_intensity(prefill_intensity)
    check_prefill_ridge(prefill_tokens_at_ridge)
"""
from __future__ import annotations

from typing import Callable

import torch

from ..config import ModelConfig
from ..profiling.flops import prefill_cost, step_bytes, step_flops
from .check import Case, run_checks

# Shapes of real models (weights not needed): a tied small one, a GQA one with a huge vocabulary, an 8B one.
SMOLLM2_135M = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                           num_kv_heads=3, tie_word_embeddings=True, max_position_embeddings=8192,
                           name="SmolLM2-135M")
QWEN25_05B = ModelConfig(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14,
                         num_kv_heads=2, tie_word_embeddings=True, max_position_embeddings=32768,
                         name="Qwen2.5-0.5B (no biases)")
LLAMA3_8B = ModelConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                        num_kv_heads=8, tie_word_embeddings=False, max_position_embeddings=8192, name="Llama-3-8B")
SHORT_SMOLLM2 = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                            num_kv_heads=3, tie_word_embeddings=True, max_position_embeddings=512,
                            name="SmolLM2-135M cut to 512 positions")

# Datasheet figures (dense bf16/fp16 FLOP/s, memory bandwidth in bytes/s).
H100 = (989e12, 3.35e12)
T4 = (65e12, 320e9)
CPU_LIKE = (150e9, 20e9)


def _close(got: float, want: float, rtol: float) -> bool:
    return abs(got - want) <= rtol * abs(want)


def _number(result: object, what: str) -> float:
    assert isinstance(result, (int, float)) and not isinstance(result, bool), \
        f"return {what} as a number (int or float), got {type(result).__name__}"
    return float(result)


# --- exercise 1: the bandwidth ceiling of decode ------------------------------------------------------------------


def _ceiling_case(config: ModelConfig, dtype: torch.dtype, bandwidth: float, context_len: int, batch: int,
                  rtol: float = 0.02) -> Case:
    moved = step_bytes(config, batch=batch, new_tokens=1, context_len=context_len, dtype=dtype)
    total = sum(moved.values())
    want = batch * bandwidth / total
    size = torch.empty((), dtype=dtype).element_size()
    variants = {
        f"a step makes {batch} tokens (one per sequence) and reads the weights once for all of them":
            [want / batch, want * batch],
        "count the KV cache too: each step reads kv_bytes_per_token x context_len x batch":
            [batch * bandwidth / (total - moved["kv_read"] - moved["kv_write"])],
        f"{str(dtype).removeprefix('torch.')} takes {size} bytes per value": [want * 2, want / 2],
        "this model's input embedding is not tied to lm_head: only the rows of the batch's tokens are read, "
        "not the whole table": [batch * bandwidth / (total + config.vocab_size * config.hidden_size * size)],
    }

    def verify(result: object) -> None:
        got = _number(result, "tokens/s")
        if _close(got, want, rtol):
            return
        hints = [h for h, vs in variants.items() if any(_close(got, v, 0.03) for v in vs)]
        raise AssertionError(f"got {got:,.1f} tokens/s, expected {want:,.1f} (within {rtol:.0%}; "
                             f"{total / 1e9:,.3f} GB per step)" + (f"; hint: {hints[0]}" if hints else ""))

    name = str(dtype).removeprefix("torch.")
    return Case(f"{config.name} {name}, {bandwidth / 1e9:,.0f} GB/s, context {context_len}, batch {batch}",
                (config, dtype, bandwidth, context_len, batch), verify)


def check_decode_ceiling(fn: Callable[[ModelConfig, torch.dtype, float, int, int], float]) -> bool:
    """`fn(config, dtype, bandwidth, context_len, batch)` -> the tokens/s a decode step allows at that bandwidth.

    Checked against `bytes per step = sum(step_bytes(...))` (weights, KV read and written, activations) within 2%.
    """
    cases = [
        _ceiling_case(SMOLLM2_135M, torch.float32, CPU_LIKE[1], 0, 1),
        _ceiling_case(LLAMA3_8B, torch.bfloat16, H100[1], 0, 1),
        _ceiling_case(LLAMA3_8B, torch.bfloat16, H100[1], 8192, 1),
        _ceiling_case(QWEN25_05B, torch.float16, T4[1], 4096, 16),
    ]
    return run_checks("check_decode_ceiling", fn, cases)


# --- exercise 2: the arithmetic intensity of a prefill ------------------------------------------------------------


def _intensity_parts(config: ModelConfig, n: int, dtype: torch.dtype) -> tuple[int, int]:
    flops = sum(step_flops(config, batch=1, new_tokens=n, context_len=0, logits_tokens=1).values())
    moved = step_bytes(config, batch=1, new_tokens=n, context_len=0, dtype=dtype, logits_tokens=1)
    return flops, moved["weights"] + moved["kv_write"]


def _intensity_case(config: ModelConfig, n: int, dtype: torch.dtype, rtol: float = 0.01) -> Case:
    flops, moved = _intensity_parts(config, n, dtype)
    want = flops / moved
    ops = step_flops(config, batch=1, new_tokens=n, context_len=0, logits_tokens=1)
    size = torch.empty((), dtype=dtype).element_size()
    variants = {
        "no attention scores: add QK^T and AV, 2 x heads x head_dim FLOPs per (query, key) pair each, "
        "n(n+1)/2 causal pairs per head per layer": (flops - ops["attn_qk"] - ops["attn_av"]) / moved,
        "the lm_head runs on the last position only (the engine samples one token)":
            (flops + 2 * (n - 1) * config.hidden_size * config.vocab_size) / moved,
        "count the K and V written: kv_bytes_per_token x n": flops / (moved - config.kv_bytes_per_token(dtype) * n),
        f"{str(dtype).removeprefix('torch.')} takes {size} bytes per value": want * 2,
    }

    def verify(result: object) -> None:
        got = _number(result, "FLOP/byte")
        if _close(got, want, rtol):
            return
        hints = [h for h, v in variants.items() if _close(got, v, 0.005)] or [h for h, v in variants.items()
                                                                                if _close(got, v, 0.03)]
        raise AssertionError(f"got {got:.2f} FLOP/byte, expected {want:.2f} ({flops / 1e9:,.1f} GFLOP over "
                             f"{moved / 1e6:,.1f} MB)" + (f"; hint: {hints[0]}" if hints else ""))

    return Case(f"{config.name} {str(dtype).removeprefix('torch.')}, prefill of {n} token{'s' * (n != 1)}",
                (config, n, dtype), verify)


def check_prefill_intensity(fn: Callable[[ModelConfig, int, torch.dtype], float]) -> bool:
    """`fn(config, num_tokens, dtype)` -> FLOPs / bytes of a prefill, bytes = weights read + new K, V written.

    FLOPs as `step_flops` counts them (every matmul, attention scores, the lm_head on the last position);
    checked within 1%.
    """
    cases = [
        _intensity_case(SMOLLM2_135M, 1, torch.float32),
        _intensity_case(SMOLLM2_135M, 512, torch.float32),
        _intensity_case(LLAMA3_8B, 2048, torch.bfloat16),
        _intensity_case(QWEN25_05B, 8192, torch.bfloat16),
    ]
    return run_checks("check_prefill_intensity", fn, cases)


# --- exercise 3: the ridge point in prompt tokens -----------------------------------------------------------------


def prefill_ridge_reference(config: ModelConfig, dtype: torch.dtype, peak_flops: float,
                            bandwidth: float) -> int | None:
    """Smallest n <= max_position_embeddings with prefill_cost(n).intensity >= peak / bandwidth (bisection), else None.

    Intensity grows with n (FLOPs grow at least as fast as bytes), so bisection finds the first n.
    """
    ridge = peak_flops / bandwidth
    at = lambda n: prefill_cost(config, n, dtype=dtype, logits_tokens=1).intensity  # noqa: E731
    lo, hi = 1, config.max_position_embeddings
    if at(hi) < ridge:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if at(mid) < ridge else (lo, mid)
    return lo


def _ridge_case(config: ModelConfig, dtype: torch.dtype, machine: tuple[float, float], name: str) -> Case:
    peak, bw = machine
    want = prefill_ridge_reference(config, dtype, peak, bw)
    ridge = peak / bw

    def verify(result: object) -> None:
        if want is None:
            assert result is None, (f"no prompt up to {config.max_position_embeddings} tokens reaches the ridge "
                                    f"({ridge:.0f} FLOP/byte): return None, got {result!r}")
            return
        assert isinstance(result, int) and not isinstance(result, bool), \
            f"return the prompt length as an int, got {result!r}"
        if result == want:
            return
        at = prefill_cost(config, result, dtype=dtype, logits_tokens=1).intensity if result >= 1 else float("nan")
        side = "already compute-bound: look lower" if at >= ridge else "still memory-bound: look higher"
        raise AssertionError(f"got {result}: at {result} tokens the intensity is {at:.1f} FLOP/byte "
                             f"against a ridge of {ridge:.1f} ({side}); use prefill_cost(config, n, dtype=dtype, "
                             f"logits_tokens=1).intensity and return the first n that reaches the ridge")

    return Case(f"{config.name} {str(dtype).removeprefix('torch.')} on {name} (ridge {ridge:.0f} FLOP/byte)",
                (config, dtype, peak, bw), verify)


def check_prefill_ridge(fn: Callable[[ModelConfig, torch.dtype, float, float], int | None]) -> bool:
    """`fn(config, dtype, peak_flops, bandwidth)` -> the shortest prompt whose prefill is compute-bound, or None."""
    cases = [
        _ridge_case(SMOLLM2_135M, torch.float32, CPU_LIKE, "a CPU (150 GFLOP/s, 20 GB/s)"),
        _ridge_case(LLAMA3_8B, torch.bfloat16, H100, "an H100"),
        _ridge_case(LLAMA3_8B, torch.float16, T4, "a T4"),
        _ridge_case(SHORT_SMOLLM2, torch.bfloat16, H100, "an H100"),
    ]
    return run_checks("check_prefill_ridge", fn, cases)
