"""Checkers of chapter 03: each passes a reference solution, fails plausible mistakes, calls a stub not attempted."""
from __future__ import annotations

import math
import time

import pytest
import torch

from course_lib.attention import causal_attention
from course_lib.exercises import (check_attention_weights, check_decode_attention, check_kv_bytes_for_shape,
                                  check_layer_attention)
from course_lib.exercises.attention import sdpa_weights, tiny_model
from course_lib.model import apply_rope


# --- reference solutions and mistakes ------------------------------------------------------------------------------

def kv_bytes(layers, kv_heads, head_dim, dtype):
    return 2 * layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def kv_bytes_k_only(layers, kv_heads, head_dim, dtype):
    return kv_bytes(layers, kv_heads, head_dim, dtype) // 2


def kv_bytes_always_bf16(layers, kv_heads, head_dim, dtype):
    return 2 * layers * kv_heads * head_dim * 2


def weights(q, k, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    T = q.shape[-2]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    return (q @ k.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf")).softmax(-1)


def weights_unscaled(q, k, scale=None):
    return weights(q, k, 1.0)


def weights_no_mask(q, k, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return (q @ k.transpose(-1, -2) * scale).softmax(-1)


def weights_ignore_scale_argument(q, k, scale=None):
    return weights(q, k, None)


def decode(q, k, v, start):
    group = q.shape[0] // k.shape[1]
    k, v = k[:start + 1].repeat_interleave(group, dim=1), v[:start + 1].repeat_interleave(group, dim=1)
    w = torch.einsum("hd,khd->hk", q, k) / math.sqrt(q.shape[-1])  # [heads, keys]
    return torch.einsum("hk,khd->hd", w.softmax(-1), v)


def decode_whole_cache(q, k, v, start):
    return decode(q, k, v, k.shape[0] - 1)


def decode_wrong_head_map(q, k, v, start):
    group = q.shape[0] // k.shape[1]
    k, v = k[:start + 1].repeat(1, group, 1), v[:start + 1].repeat(1, group, 1)  # head h reads KV head h % kv
    w = torch.einsum("hd,khd->hk", q, k) / math.sqrt(q.shape[-1])
    return torch.einsum("hk,khd->hd", w.softmax(-1), v)


def layer_input(model, ids, layer_idx):
    cos, sin = model.rotary(torch.arange(ids.shape[1], device=ids.device)[None], model.dtype)
    x = model.embed_tokens(ids)
    for block in model.layers[:layer_idx]:
        x = block(x, cos, sin)  # attention and MLP, each added to the residual stream
    return x[0], cos, sin


@torch.no_grad()
def attention_by_hand(model, ids, layer_idx, x=None, rope=True):
    cfg, layer = model.config, model.layers[layer_idx]
    att = layer.self_attn
    x_in, cos, sin = layer_input(model, ids, layer_idx)
    x = x_in if x is None else x
    T = x.shape[0]
    xf = x.float()
    h = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps)).to(x.dtype)
    h = h * layer.input_layernorm.weight
    q = (h @ att.q_proj.weight.T).view(1, T, cfg.num_heads, cfg.head_dim)
    k = (h @ att.k_proj.weight.T).view(1, T, cfg.num_kv_heads, cfg.head_dim)
    v = (h @ att.v_proj.weight.T).view(1, T, cfg.num_kv_heads, cfg.head_dim)
    if rope:
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    out = causal_attention(q, k, v)[0]  # [seq, heads, head_dim]
    return out.reshape(T, -1) @ att.o_proj.weight.T


def attention_on_embeddings(model, ids, layer_idx):
    return attention_by_hand(model, ids, layer_idx, x=model.embed_tokens(ids)[0])


def attention_without_rope(model, ids, layer_idx):
    return attention_by_hand(model, ids, layer_idx, rope=False)


def stub(*args):
    raise NotImplementedError


# --- tests ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("check,solution,wrong", [
    (check_kv_bytes_for_shape, kv_bytes, kv_bytes_k_only),
    (check_kv_bytes_for_shape, kv_bytes, kv_bytes_always_bf16),
    (check_attention_weights, weights, weights_unscaled),
    (check_attention_weights, weights, weights_no_mask),
    (check_attention_weights, weights, weights_ignore_scale_argument),
    (check_decode_attention, decode, decode_whole_cache),
    (check_decode_attention, decode, decode_wrong_head_map),
    (check_layer_attention, attention_by_hand, attention_on_embeddings),
    (check_layer_attention, attention_by_hand, attention_without_rope),
])
def test_checker_passes_solution_fails_mistake(check, solution, wrong, capsys):
    assert check(solution) is True
    assert check(wrong) is False
    out = capsys.readouterr().out
    assert "✗" in out and "hint" in out  # the failure tells the learner what to fix


@pytest.mark.parametrize("check", [check_kv_bytes_for_shape, check_attention_weights, check_decode_attention,
                                   check_layer_attention])
def test_stub_is_not_attempted(check, capsys):
    assert check(stub) is False
    assert "not attempted" in capsys.readouterr().out


def test_hard_coded_answers_fail(capsys):
    assert check_kv_bytes_for_shape(lambda *a: 7680) is False  # SmolLM2 as MQA in bf16, for every shape
    assert check_decode_attention(lambda q, k, v, start: torch.zeros_like(q)) is False
    assert "✗" in capsys.readouterr().out


def test_wrong_types_and_shapes_are_reported(capsys):
    assert check_kv_bytes_for_shape(lambda *a: float(kv_bytes(*a))) is False
    assert check_attention_weights(lambda q, k, scale=None: weights(q, k, scale)[0]) is False
    out = capsys.readouterr().out
    assert "return an int" in out and "shape" in out


def test_sdpa_weights_are_softmax_of_scaled_scores():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(3, 6, 16, generator=g), torch.randn(3, 6, 16, generator=g)
    torch.testing.assert_close(sdpa_weights(q, k), weights(q, k))
    torch.testing.assert_close(sdpa_weights(q, k, 0.3), weights(q, k, 0.3))


def test_decode_of_a_full_cache_is_the_last_row_of_a_prefill():
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(1, 10, 6, 8, generator=g), torch.randn(1, 10, 2, 8, generator=g), \
        torch.randn(1, 10, 2, 8, generator=g)
    torch.testing.assert_close(decode(q[0, -1], k[0], v[0], 9), causal_attention(q, k, v)[0, -1])


def test_layer_checker_on_the_real_model(model, capsys):
    assert check_layer_attention(attention_by_hand, model) is True
    assert check_layer_attention(attention_on_embeddings, model) is False
    assert "embeddings" in capsys.readouterr().out


def test_layer_checker_in_bfloat16_uses_the_loose_tolerance(capsys):
    tiny = tiny_model(48, 6, 2, 8)
    bf16 = tiny_model.__wrapped__(48, 6, 2, 8).to(torch.bfloat16)
    assert check_layer_attention(attention_by_hand, bf16) is True
    assert "bfloat16" in capsys.readouterr().out
    assert tiny.dtype == torch.float32  # the cached float32 model is untouched


def test_checkers_leave_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    tiny_model.cache_clear()
    check_layer_attention(attention_by_hand)
    check_attention_weights(weights)
    torch.testing.assert_close(torch.rand(3), expected)


def test_checkers_are_fast(model):
    for check, fn, extra in [(check_kv_bytes_for_shape, kv_bytes, ()), (check_attention_weights, weights, ()),
                             (check_decode_attention, decode, ()),
                             (check_layer_attention, attention_by_hand, (model,))]:
        t0 = time.perf_counter()
        check(fn, *extra)
        assert time.perf_counter() - t0 < 5, check.__name__
