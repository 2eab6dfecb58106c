"""Checkers of notebook 05: each passes a reference solution and fails a plausible mistake and an unattempted stub."""
from __future__ import annotations

import pytest
import torch

from course_lib.exercises import check_decode_ceiling, check_prefill_intensity, check_prefill_ridge
from course_lib.profiling import prefill_cost


def _bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _weights_read(config) -> int:
    """Parameters a step reads: all but an untied input embedding table (only looked-up rows)."""
    return config.num_parameters() - (0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size)


def ceiling(config, dtype, bandwidth, context_len=0, batch=1):
    kv = config.kv_bytes_per_token(dtype) * (context_len + 1) * batch  # the cache read, the new K, V written
    return batch * bandwidth / (_weights_read(config) * _bytes(dtype) + kv)


def ceiling_without_kv(config, dtype, bandwidth, context_len=0, batch=1):
    return batch * bandwidth / (_weights_read(config) * _bytes(dtype))


def ceiling_per_sequence(config, dtype, bandwidth, context_len=0, batch=1):
    return ceiling(config, dtype, bandwidth, context_len, batch) / batch


def intensity(config, num_tokens, dtype, attention=True):
    n, h, L = num_tokens, config.hidden_size, config.num_layers
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    linear = h * q + 2 * h * kv + q * h + 3 * h * config.intermediate_size  # weights of the 7 matmuls of a block
    pairs = n * (n + 1) // 2  # causal (query, key) pairs per head
    flops = 2 * n * L * linear + 2 * h * config.vocab_size  # lm_head on the last position
    if attention:
        flops += L * 2 * (2 * config.num_heads * config.head_dim * pairs)  # QK^T and AV
    return flops / (_weights_read(config) * _bytes(dtype) + config.kv_bytes_per_token(dtype) * n)


def ridge_tokens(config, dtype, peak_flops, bandwidth):
    for n in range(1, config.max_position_embeddings + 1):
        if prefill_cost(config, n, dtype=dtype, logits_tokens=1).intensity >= peak_flops / bandwidth:
            return n
    return None


def ridge_tokens_weights_only(config, dtype, peak_flops, bandwidth):
    """The back-of-envelope answer n = ridge x bytes / 2, which ignores activations and attention."""
    return int(peak_flops / bandwidth * _bytes(dtype) / 2)


def stub(*args):
    raise NotImplementedError


@pytest.mark.parametrize("check,solution,wrong", [
    (check_decode_ceiling, ceiling, ceiling_without_kv),
    (check_decode_ceiling, ceiling, ceiling_per_sequence),
    (check_prefill_intensity, intensity, lambda c, n, d: intensity(c, n, d, attention=False)),
    (check_prefill_ridge, ridge_tokens, ridge_tokens_weights_only),
])
def test_checker_passes_solution_fails_mistake(check, solution, wrong, capsys):
    assert check(solution) is True
    assert check(wrong) is False
    out = capsys.readouterr().out
    assert "✗" in out and ("hint" in out or "look" in out)  # the failure tells the learner what to fix


@pytest.mark.parametrize("check", [check_decode_ceiling, check_prefill_intensity, check_prefill_ridge])
def test_stub_is_not_attempted(check, capsys):
    assert check(stub) is False
    assert "not attempted" in capsys.readouterr().out


def test_wrong_return_type_is_reported(capsys):
    assert check_prefill_ridge(lambda *a: 12.5) is False
    assert "int" in capsys.readouterr().out
