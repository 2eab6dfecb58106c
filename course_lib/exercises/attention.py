"""Checkers for chapter 03, attention (注意力): KV bytes per token, attention weights, a decode step, a layer.

Each one tests the learner's function against the engine or PyTorch on inputs the chapter does not use:

    check_kv_bytes_for_shape(kv_cache_bytes_per_token)   # vs course_lib.profiling.memory.kv_bytes_per_token
    check_attention_weights(attention_weights)           # vs torch's scaled_dot_product_attention
    check_decode_attention(decode_attention)             # vs course_lib.attention.causal_attention
    check_layer_attention(layer_attention, model)        # vs a forward hook on model.layers[i].self_attn
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch.nn.functional as F

from ..attention import causal_attention
from ..config import ModelConfig
from ..profiling.memory import kv_bytes_per_token
from ..tolerance import relative_difference
from .check import Case, run_checks, seeded_randn


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    """`seeded_randn` in float32, times `scale`."""
    return seeded_randn(*shape, seed=seed, dtype=torch.float32) * scale


def _as_tensor(result: object, shape: tuple[int, ...], what: str) -> torch.Tensor:
    assert isinstance(result, torch.Tensor), f"return {what} as a torch.Tensor, got {type(result).__name__}"
    assert tuple(result.shape) == shape, f"{what} must have shape {list(shape)}, got {list(result.shape)}"
    assert result.is_floating_point(), f"{what} must be floating point, got {result.dtype}"
    return result.detach().float().cpu()


def _closest_hint(got: torch.Tensor, variants: dict[str, torch.Tensor], tol: float) -> str:
    """The hint of the first wrong variant the learner's result equals (within `tol` of its size), or ''."""
    for hint, value in variants.items():
        if value.shape == got.shape and torch.isfinite(value).all() and relative_difference(got, value) <= tol:
            return f"; hint: {hint}"
    return ""


# --- exercise 1: KV-cache bytes per token from the shape ---------------------------------------------------------

KV_SHAPES = [  # (name, layers, KV heads, head_dim, dtype)
    ("SmolLM2-135M as MQA (1 KV head)", 30, 1, 64, torch.bfloat16),
    ("Llama-3-70B (GQA, 8 KV heads)", 80, 8, 128, torch.bfloat16),
    ("Llama-2-7B (MHA, 32 KV heads)", 32, 32, 128, torch.float16),
    ("Qwen2.5-7B (GQA, 4 KV heads)", 28, 4, 128, torch.float32),
    ("Llama-3-8B with an FP8 cache", 32, 8, 128, torch.float8_e4m3fn),
]


def check_kv_bytes_for_shape(fn: Callable[[int, int, int, torch.dtype], int]) -> bool:
    """`fn(layers, kv_heads, head_dim, dtype)` -> KV-cache bytes of one token, an int.

    Checked against `course_lib.profiling.memory.kv_bytes_per_token` on five real shapes and dtypes.
    """
    cases = []
    for name, layers, kv_heads, head_dim, dtype in KV_SHAPES:
        config = ModelConfig(vocab_size=1, hidden_size=kv_heads * head_dim, intermediate_size=1, num_layers=layers,
                             num_heads=kv_heads, num_kv_heads=kv_heads, head_dim=head_dim)
        want = kv_bytes_per_token(config, dtype)
        size = torch.empty((), dtype=dtype).element_size()
        hints = [
            (want // 2, "that is K or V alone: the cache keeps both, a factor 2"),
            (want // size, f"multiply by the bytes per value: {_dtype_name(dtype)} takes {size} "
                           f"(torch.empty((), dtype=dtype).element_size())"),
            (want // size * 4, f"that is float32's 4 bytes; {_dtype_name(dtype)} takes {size}"),
            (want // layers, "count every layer: each one caches its own K and V"),
        ]

        def verify(got, want=want, hints=hints):
            assert isinstance(got, int) and not isinstance(got, bool), \
                f"return an int (a number of bytes), got {type(got).__name__}"
            hint = " or ".join(h for value, h in hints if value == got != want)
            assert got == want, f"got {got:,} bytes, expected {want:,}" + (f"; hint: {hint}" if hint else "")

        cases.append(Case(f"{name}, {layers} layers x {kv_heads} x {head_dim}, {_dtype_name(dtype)}: "
                          f"{want:,} bytes/token", (layers, kv_heads, head_dim, dtype), verify))
    return run_checks("check_kv_bytes_for_shape", fn, cases)


# --- exercise 2: causal attention weights, with a scale ----------------------------------------------------------


def sdpa_weights(q: torch.Tensor, k: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Causal attention weights [heads, T, T] from torch's fused SDPA: with V = identity, output = weights."""
    eye = torch.eye(k.shape[-2]).expand(k.shape[0], -1, -1)  # [heads, T, T]
    return F.scaled_dot_product_attention(q, k, eye, is_causal=True, scale=scale)


def _weights_case(heads: int, T: int, d: int, scale: float | None, seed: int) -> Case:
    q, k = _randn(heads, T, d, seed=seed), _randn(heads, T, d, seed=seed + 1)
    want = sdpa_weights(q, k, scale)
    used = d ** -0.5 if scale is None else scale
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    scores = q @ k.transpose(-1, -2)  # [heads, T, T], unscaled
    variants = {
        "scale the scores before the softmax (scale=None means 1/sqrt(d))":
            scores.masked_fill(~mask, float("-inf")).softmax(-1),
        "the default scale is 1/sqrt(d), not 1/d": (scores / d).masked_fill(~mask, float("-inf")).softmax(-1),
        "apply the causal mask: query i may look at keys 0..i only (set the others to -inf before the softmax)":
            (scores * used).softmax(-1),
        "the mask is the wrong way round: keep the lower triangle (torch.tril), key j <= query i":
            (scores * used).masked_fill(~mask.T, float("-inf")).softmax(-1),
        "softmax over the keys (the last dim): each row of weights sums to 1":
            (scores * used).masked_fill(~mask, float("-inf")).softmax(-2),
    }
    if scale is not None:
        variants["use the `scale` argument when one is given; only scale=None means 1/sqrt(d)"] = \
            (scores * d ** -0.5).masked_fill(~mask, float("-inf")).softmax(-1)
    v = _randn(heads, T, d, seed=seed + 2)
    want_out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)

    def verify(result):
        got = _as_tensor(result, (heads, T, T), "the weights")
        rel = relative_difference(got, want)
        if rel <= 1e-5:
            out_rel = relative_difference(got @ v, want_out)
            assert out_rel <= 1e-4, f"weights @ v differs from torch's SDPA by {out_rel:.1e} of its largest value"
            return
        raise AssertionError(f"max |your weights - SDPA's| / max |SDPA's| = {rel:.2e} (tolerance 1e-05)"
                             + _closest_hint(got, variants, 1e-4))

    what = "scale=None (1/sqrt(d))" if scale is None else f"scale={scale:g}"
    return Case(f"{heads} heads, {T} tokens, d={d}, {what}", (q.clone(), k.clone(), scale), verify)


def check_attention_weights(fn: Callable[[torch.Tensor, torch.Tensor, float | None], torch.Tensor]) -> bool:
    """`fn(q, k, scale)` -> causal attention weights [heads, T, T] for q, k [heads, T, d].

    softmax(scale * q k^T + causal mask) over the keys, scale=None meaning 1/sqrt(d); checked against torch's
    `scaled_dot_product_attention` within 1e-5 of the largest weight (float32 random tensors, four shapes and scales).
    """
    cases = [
        _weights_case(2, 5, 16, None, seed=10),
        _weights_case(4, 9, 64, None, seed=20),
        _weights_case(3, 7, 8, 1.0, seed=30),
        _weights_case(1, 12, 32, 0.05, seed=40),
    ]
    return run_checks("check_attention_weights", fn, cases)


# --- exercise 3: one decode step over a KV cache -----------------------------------------------------------------


def _decode_case(heads: int, kv_heads: int, d: int, slots: int, start: int, seed: int) -> Case:
    q = _randn(heads, d, seed=seed)  # [heads, d]: the new token's query, at position `start`
    k, v = _randn(slots, kv_heads, d, seed=seed + 1), _randn(slots, kv_heads, d, seed=seed + 2)
    k[start + 1:] = _randn(slots - start - 1, kv_heads, d, seed=seed + 3, scale=30.0)  # unused slots: garbage
    v[start + 1:] = 1e3
    want = causal_attention(q[None, None], k[None], v[None], start=start)[0, 0]  # [heads, d]
    group = heads // kv_heads

    def attend(kk, vv, qq=q, scale=d ** -0.5, head_map=lambda h: h // group):
        out = []
        for h in range(heads):
            w = (kk[:, head_map(h)] @ qq[h] * scale).softmax(-1)  # [keys]
            out.append(w @ vv[:, head_map(h)])
        return torch.stack(out)  # [heads, d]

    variants = {
        f"attend to keys 0..start only: slots after `start` ({slots - start - 1} here) are empty, not keys":
            attend(k, v),
        "include the new token's own key: position `start` sees keys 0..start (start + 1 keys)":
            attend(k[:start], v[:start]) if start > 0 else torch.full_like(want, float("nan")),
        f"query head h reads KV head h // (heads // kv_heads) = h // {group}, not h % kv_heads":
            attend(k[:start + 1], v[:start + 1], head_map=lambda h: h % kv_heads),
        "scale the scores by 1/sqrt(head_dim)": attend(k[:start + 1], v[:start + 1], scale=1.0),
    }

    def verify(result):
        got = _as_tensor(result, (heads, d), "the output")
        rel = relative_difference(got, want)
        assert rel <= 1e-4, (f"max |yours - causal_attention(..., start={start})| / its largest value = {rel:.2e} "
                             "(tolerance 1e-04)" + _closest_hint(got, variants, 1e-3))

    kind = "MQA" if kv_heads == 1 else "MHA" if kv_heads == heads else "GQA"
    return Case(f"{kind} {heads}/{kv_heads} heads, d={d}: query at position {start}, cache of {slots} slots",
                (q.clone(), k.clone(), v.clone(), start), verify)


def check_decode_attention(fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]) -> bool:
    """`fn(q, k_cache, v_cache, start)` -> [heads, d]: one decode step's attention.

    q [heads, d] is the new token's query, at position `start`; k_cache, v_cache [slots, kv_heads, d] hold the
    keys and values of positions 0..start (the new token's included) and garbage after. Checked within 1e-4 of the
    largest output against `causal_attention(q[None, None], k[None], v[None], start=start)`, which for a full cache
    equals the last row of a prefill's attention.
    """
    cases = [
        _decode_case(9, 3, 64, 20, 19, seed=100),  # a full cache: the last row of a prefill
        _decode_case(4, 1, 16, 32, 10, seed=200),
        _decode_case(6, 6, 8, 8, 0, seed=300),  # the first token sees only itself
        _decode_case(8, 2, 32, 50, 37, seed=400),
    ]
    return run_checks("check_decode_attention", fn, cases)


# --- exercise 4: attention of any layer, by hand -----------------------------------------------------------------

# Relative tolerance on max |yours - engine| / max |engine|, by the model's dtype: the engine and a by-hand
# version round differently (16-bit matmuls in other shapes, RMSNorm in float32 or not).
LAYER_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 1e-2}


@functools.lru_cache(maxsize=None)
def tiny_model(hidden: int, heads: int, kv_heads: int, head_dim: int, layers: int = 3, seed: int = 0):
    """A small random Llama-family model (float32, CPU). Its norm weights are random too, so skipping one shows."""
    from ..model import Transformer

    config = ModelConfig(vocab_size=97, hidden_size=hidden, intermediate_size=2 * hidden, num_layers=layers,
                         num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, max_position_embeddings=256,
                         rope_theta=500.0, name=f"tiny random model ({layers} layers, {heads}/{kv_heads} heads "
                                                 f"of {head_dim})")
    with torch.random.fork_rng(devices=[]):  # the default init draws from the global RNG: leave it as it was
        model = Transformer(config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
            else:  # [out, in] matrices and the embedding table: unit-scale outputs
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    return model.eval().requires_grad_(False)


@torch.inference_mode()
def engine_layer_attention(model, ids: torch.Tensor, layer_idx: int) -> dict[str, torch.Tensor]:
    """What `model.layers[layer_idx].self_attn` returns in a plain forward ([seq, hidden]), and wrong variants."""
    captured = {}
    layer = model.layers[layer_idx]
    hooks = [layer.self_attn.register_forward_hook(lambda m, args, out: captured.update(out=out[0])),
             layer.register_forward_pre_hook(lambda m, args: captured.update(x=args[0], cos=args[1], sin=args[2])),
             layer.register_forward_hook(lambda m, args, out: captured.update(block=out[0]))]
    try:
        model(ids)
    finally:
        for h in hooks:
            h.remove()
    x, cos, sin = captured["x"], captured["cos"], captured["sin"]
    emb = model.embed_tokens(ids)
    no_rope = (torch.ones_like(cos), torch.zeros_like(sin))
    variants = {
        "the input of layer i is the output of blocks 0..i-1 (attention AND MLP, added to the residual stream), "
        "not the embeddings": layer.self_attn(layer.input_layernorm(emb), cos, sin)[0],
        "apply the layer's input RMSNorm (with its weight) before the projections":
            layer.self_attn(x, cos, sin)[0],
        "rotate q and k with RoPE (model.rotary, apply_rope) before the scores":
            layer.self_attn(layer.input_layernorm(x), *no_rope)[0],
        "return the attention's output (after o_proj), not the block's output": captured["block"][0],
        "return the attention's output alone: the residual add (x + attention) comes after it":
            (x + captured["out"][None])[0],
    }
    return {"want": captured["out"], **variants}


def _layer_case(model, ids: torch.Tensor, layer_idx: int, label: str) -> Case:
    results = engine_layer_attention(model, ids, layer_idx)
    want = results.pop("want").float().cpu()
    rtol = LAYER_TOLERANCE[model.dtype]
    T, hidden = ids.shape[1], model.config.hidden_size
    variants = {hint: v.float().cpu() for hint, v in results.items()}

    def verify(result):
        if isinstance(result, torch.Tensor) and result.dim() == 3 and result.shape[0] == 1:
            result = result[0]  # [1, seq, hidden] is fine too
        got = _as_tensor(result, (T, hidden), "the attention output")
        rel = relative_difference(got, want)
        if rel <= rtol:
            return
        near = {h: v for h, v in variants.items() if relative_difference(got, v) <= max(rtol, 1e-3)}
        hint = f"; hint: {next(iter(near))}" if near else ""
        raise AssertionError(f"max |yours - engine| / max |engine| = {rel:.1e} (tolerance {rtol:.0e} in "
                             f"{_dtype_name(model.dtype)}){hint}")

    return Case(f"{label}, layer {layer_idx}, {T} tokens ({_dtype_name(model.dtype)}, {model.device.type})",
                (model, ids, layer_idx), verify)


def check_layer_attention(fn: Callable[[Any, torch.Tensor, int], torch.Tensor], model: Any = None) -> bool:
    """`fn(model, ids, layer_idx)` -> what `model.layers[layer_idx].self_attn` returns for `ids` [1, seq], as
    [seq, hidden] (batch dim dropped; [1, seq, hidden] is accepted).

    Checked against a forward hook on two tiny random models (GQA and MQA, a head_dim that is not
    hidden / heads) and, when given, on `model` (in its own device and dtype, with the tolerance of
    `LAYER_TOLERANCE` for that dtype), at layers other than 0 and token ids the chapter does not use.
    """
    gqa, mqa = tiny_model(48, 6, 2, 8), tiny_model(32, 4, 1, 16, seed=1)
    cases = [
        _layer_case(gqa, torch.tensor([[5, 17, 3, 88, 42, 17, 3, 60]]), 1, gqa.config.name),
        _layer_case(mqa, torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]), 2, mqa.config.name),
    ]
    if model is not None:
        ids = (1000 + 37 * torch.arange(15, device=model.device))[None] % model.config.vocab_size  # [1, 15]
        name = getattr(model.config, "name", "") or "the chapter's model"
        deeper = min(7, model.config.num_layers - 1)
        cases += [_layer_case(model, ids, 1, name), _layer_case(model, ids[:, :9], deeper, name)]
    return run_checks("check_layer_attention", fn, cases)
