"""QuantLinear and quantize_model on random layers and a tiny random Transformer."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from course_lib.config import ModelConfig
from course_lib.model import Transformer
from course_lib.quant import QuantLinear, quantize_model

CASES = [("int8", 128), ("int4", 128), ("int4", 32)]


def _linear(in_features: int, out_features: int, bias: bool, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    lin = nn.Linear(in_features, out_features, bias=bias)
    with torch.no_grad():
        lin.weight.mul_(torch.logspace(-1, 1, out_features)[:, None])  # rows of different scales
    return lin


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


@pytest.mark.parametrize("method,group_size", CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_quant_linear_equals_dequantize_then_linear(method, group_size, bias):
    lin = _linear(576, 192, bias)  # 576 = 4.5 groups of 128: the padded case
    q = QuantLinear.from_linear(lin, method, group_size)
    x = torch.randn(2, 5, 576)  # [batch, seq, in]
    ref = F.linear(x, q.dequantize(), lin.bias)
    y = q(x)
    assert y.shape == (2, 5, 192) and y.dtype == x.dtype
    assert _rel(y, ref) < 1e-4
    # and it is still the layer it replaced, up to quantization error
    assert _rel(y, lin(x)) < (0.02 if method == "int8" else 0.15)


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_dtype_conversions_keep_the_quantized_weight(method):
    """`model.half()` after quantizing keeps the codes and scales as they are; the bias and x's dtype follow."""
    check_dtype_conversions(QuantLinear.from_linear(_linear(64, 48, bias=True, seed=7), method, 32))


def check_dtype_conversions(q: QuantLinear) -> None:
    """Convert `q` to each float dtype: its stored buffers (in their order) stay, its output follows x's dtype."""
    stored = {n: b.clone() for n, b in q.named_buffers() if n != "bias"}
    names = [n for n, _ in q.named_buffers()]
    x = torch.randn(5, q.in_features)
    want = F.linear(x.double(), q.dequantize(torch.float64), q.bias.detach().double())
    for dtype in (torch.float64, torch.float16, torch.bfloat16, torch.float32):
        assert q.to(dtype) is q and q.bias.dtype == dtype
        assert [n for n, _ in q.named_buffers()] == names  # in their order: state_dict's keys stay put
        kept = {n: b for n, b in q.named_buffers() if n != "bias"}
        assert all(torch.equal(b, stored[n]) and b.dtype == stored[n].dtype for n, b in kept.items())
        y = q(x.to(dtype))
        assert y.dtype == dtype and _rel(y.double(), want) < 2e-2, dtype


def test_errors():
    lin = _linear(40, 48, bias=False)
    with pytest.raises(ValueError, match="method"):
        QuantLinear.from_linear(lin, "int3")
    q = QuantLinear.from_linear(lin, "int4", 32)
    with pytest.raises(ValueError, match="expects 40"):
        q(torch.randn(3, 41))


def test_state_dict_round_trip():
    q = QuantLinear.from_linear(_linear(576, 64, bias=True, seed=3), "int4", 128)
    fresh = QuantLinear(576, 64, "int4", 128, bias=True)
    fresh.load_state_dict(q.state_dict())
    x = torch.randn(3, 576)
    assert torch.equal(fresh(x), q(x))


def _tiny_model() -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                      num_kv_heads=2, tie_word_embeddings=True)
    return Transformer(cfg).eval()


@pytest.mark.parametrize("method,group_size", [("int8", 128), ("int4", 32)])
def test_quantize_model_swaps_linears_in_place(method, group_size):
    model = _tiny_model()
    ids = torch.randint(0, 256, (1, 12))
    with torch.no_grad():
        ref = model(ids)
    embed = model.embed_tokens.weight
    out = quantize_model(model, method, group_size=group_size)
    assert out is model
    names = {n for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    assert len(names) == 2 * 7 and "lm_head" not in names  # q, k, v, o, gate, up, down per layer
    assert not any(type(m) is nn.Linear and n != "lm_head" for n, m in model.named_modules())
    assert model.embed_tokens.weight is embed and model.lm_head.weight is embed  # still tied, untouched
    with torch.no_grad():
        got = model(ids)
    assert got.shape == ref.shape and torch.isfinite(got).all()
    assert _rel(got, ref) < (0.05 if method == "int8" else 0.3)


def test_quantize_model_lm_head_is_explicit():
    model = quantize_model(_tiny_model(), "int8", include_lm_head=True)
    assert isinstance(model.lm_head, QuantLinear)
    assert isinstance(model.embed_tokens, nn.Embedding)
    with pytest.raises(ValueError, match="method"):
        quantize_model(_tiny_model(), "fp8")


def test_quantized_copy_leaves_the_float_model_and_shares_the_rest():
    from course_lib.quant import quantized_copy

    cfg = ModelConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                      num_kv_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    q = quantized_copy(model, "int8")
    assert not any(isinstance(m, QuantLinear) for m in model.modules())  # the original keeps nn.Linear
    assert sum(isinstance(m, QuantLinear) for m in q.modules()) == 7 * cfg.num_layers
    assert q.embed_tokens.weight is model.embed_tokens.weight  # shared, not copied
    assert q.layers[0].input_layernorm.weight is model.layers[0].input_layernorm.weight
