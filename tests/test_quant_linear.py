"""QuantLinear and quantize_model on random layers and a tiny random Transformer."""
from __future__ import annotations

import math
import warnings
from unittest import mock

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from course_lib.config import ModelConfig
from course_lib.dtypes import onednn_has_kernels
from course_lib.model import Transformer
from course_lib.quant import QuantLinear, quantize_model
from course_lib.quant.linear import INT4_DEQUANTIZE_ROWS, INT8_DEQUANTIZE_ROWS, cpu_backend_problem

CASES = [("int8", 128), ("int4", 128), ("int4", 32)]
HAS_CPU_OPS = cpu_backend_problem("int4", 576, 192, 128) is None and cpu_backend_problem("int8", 576, 192, 0) is None


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
def test_torch_backend_equals_dequantize_then_linear(method, group_size, bias):
    lin = _linear(576, 192, bias)  # 576 = 4.5 groups of 128: the padded case
    q = QuantLinear.from_linear(lin, method, group_size, backend="torch")
    x = torch.randn(2, 5, 576)  # [batch, seq, in]
    ref = F.linear(x, q.dequantize(), lin.bias)
    y = q(x)
    assert y.shape == (2, 5, 192) and y.dtype == x.dtype
    assert _rel(y, ref) < 1e-4
    # and it is still the layer it replaced, up to quantization error
    assert _rel(y, lin(x)) < (0.02 if method == "int8" else 0.15)


@pytest.mark.skipif(not HAS_CPU_OPS, reason="this torch lacks the packed CPU kernels")
@pytest.mark.parametrize("method,group_size", CASES)
def test_cpu_backend_matches_the_reference(method, group_size):
    """PyTorch's packed CPU kernels compute in bfloat16: equal to the reference within bf16 rounding."""
    lin = _linear(576, 192, bias=True, seed=1)
    fast = QuantLinear.from_linear(lin, method, group_size, backend="cpu")
    ref_layer = QuantLinear.from_linear(lin, method, group_size, backend="torch")
    # the same weights, read back from the CPU layout; scales (and zeros) are stored in bfloat16 there
    w_fast, w_ref = fast.dequantize(), ref_layer.dequantize()  # [out, in]
    row_peak = w_ref.abs().amax(dim=1, keepdim=True)
    assert ((w_fast - w_ref).abs() <= row_peak * 2**-7).all()  # a wrong code would be off by a step, >= peak / 15
    x = torch.randn(7, 576)
    y = fast(x)
    assert y.dtype == torch.float32 and y.shape == (7, 192)
    assert _rel(y, F.linear(x, fast.dequantize(), lin.bias)) < 1e-2
    assert _rel(fast(x.bfloat16()), F.linear(x, fast.dequantize(), lin.bias)) < 1e-2


@pytest.mark.skipif(not HAS_CPU_OPS, reason="this torch lacks the packed CPU kernels")
def test_cpu_int4_codes_read_back_exactly():
    lin = _linear(640, 64, bias=False, seed=2)
    fast = QuantLinear.from_linear(lin, "int4", 64, backend="cpu")
    ref = QuantLinear.from_linear(lin, "int4", 64, backend="torch")
    from course_lib.quant.int4 import unpack_int4

    assert torch.equal(fast._cpu_int4_codes(), unpack_int4(ref.qweight).float())


@pytest.mark.skipif(not (HAS_CPU_OPS and onednn_has_kernels(torch.bfloat16)),
                    reason="the packed CPU kernels or oneDNN's bfloat16 matmuls are missing here")
@pytest.mark.parametrize("method,in_features", [("int8", 64), ("int4", 40)])  # 40: padded to 64, groups of 32
def test_cpu_many_rows_take_a_bfloat16_matmul(method, in_features):
    """From the threshold up (INT8: INT8_DEQUANTIZE_ROWS rows; INT4: INT4_DEQUANTIZE_ROWS per padded input) the
    layer multiplies in bf16 (INT8: its codes cast, the scale after; INT4: its weight dequantized by the op),
    below it calls the op; both give the reference within bfloat16 rounding. Never while compiling."""
    lin = _linear(in_features, 48, bias=True, seed=3)
    fast = QuantLinear.from_linear(lin, method, 32, backend="cpu")
    padded = fast.padded_in_features
    threshold = INT8_DEQUANTIZE_ROWS if method == "int8" else math.ceil(INT4_DEQUANTIZE_ROWS * padded)
    assert fast.dequantizes_for(threshold) and not fast.dequantizes_for(threshold - 1)
    with mock.patch("torch.compiler.is_compiling", return_value=True):  # one graph: no branch on the rows
        assert not fast.dequantizes_for(10**6)
    for rows, many in [(threshold, True), (threshold - 1, False)]:
        x = torch.randn(rows, in_features)
        xb = F.pad(x.bfloat16(), (0, padded - in_features))
        if method == "int8":
            path = F.linear(xb, fast.qweight.bfloat16()) * fast.scales if many else \
                torch._weight_int8pack_mm(xb, fast.qweight, fast.scales)
        else:
            path = xb @ fast._cpu_int4_weight_t() if many else \
                torch._weight_int4pack_mm_for_cpu(xb, fast.qweight, fast.group_size, fast.scale_zero)
        y = fast(x)
        assert torch.equal(y, path.float() + lin.bias.detach())  # the path named above, exactly
        assert _rel(y, F.linear(x, fast.dequantize(), lin.bias)) < 1e-2


@pytest.mark.parametrize("backend", ["torch", pytest.param("cpu", marks=pytest.mark.skipif(
    not HAS_CPU_OPS, reason="the packed CPU kernels are missing here"))])
@pytest.mark.parametrize("method", ["int8", "int4"])
def test_dtype_conversions_keep_the_quantized_weight(method, backend):
    """`model.half()` after quantizing converted the scales too: the "cpu" op then failed ("expected scalar type
    BFloat16 but found Half"). The codes and scales stay as they are; the bias and x's dtype follow."""
    lin = _linear(64, 48, bias=True, seed=7)
    q = QuantLinear.from_linear(lin, method, 32, backend=backend)
    stored = {n: b.clone() for n, b in q.named_buffers() if n != "bias"}
    names = [n for n, _ in q.named_buffers()]
    x = torch.randn(5, 64)
    want = F.linear(x.double(), q.dequantize(torch.float64), lin.bias.detach().double())
    for dtype in (torch.float64, torch.float16, torch.bfloat16, torch.float32):
        assert q.to(dtype) is q and q.bias.dtype == dtype
        assert [n for n, _ in q.named_buffers()] == names  # in their order: state_dict's keys stay put
        kept = {n: b for n, b in q.named_buffers() if n != "bias"}
        assert all(torch.equal(b, stored[n]) and b.dtype == stored[n].dtype for n, b in kept.items())
        y = q(x.to(dtype))
        assert y.dtype == dtype and _rel(y.double(), want) < 2e-2, dtype


@pytest.mark.cuda
def test_a_cpu_layer_does_not_move_to_the_gpu():
    q = QuantLinear.from_linear(_linear(64, 48, bias=True, seed=7), "int8", backend="cpu")
    with pytest.raises(RuntimeError, match="Quantize the model again on cuda"):
        q.cuda()


def test_backend_choice_and_errors():
    lin = _linear(40, 48, bias=False)  # 40 inputs: too narrow for the int8 CPU kernel
    with pytest.raises(ValueError, match="in_features % 16"):
        QuantLinear.from_linear(lin, "int8", backend="cpu")
    with pytest.raises(ValueError, match="group_size in"):
        QuantLinear.from_linear(_linear(96, 64, False), "int4", group_size=48, backend="cpu")
    assert QuantLinear.from_linear(lin, "int8", backend="auto").backend == "torch"
    with pytest.raises(ValueError, match="method"):
        QuantLinear.from_linear(lin, "int3")
    q = QuantLinear.from_linear(lin, "int4", 32, backend="torch")
    with pytest.raises(ValueError, match="expects 40"):
        q(torch.randn(3, 41))


def test_state_dict_round_trip():
    lin = _linear(576, 64, bias=True, seed=3)
    for backend in ("torch", "cpu") if HAS_CPU_OPS else ("torch",):
        q = QuantLinear.from_linear(lin, "int4", 128, backend=backend)
        fresh = QuantLinear(576, 64, "int4", 128, bias=True, backend=backend)
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
    out = quantize_model(model, method, group_size=group_size, backend="torch")
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
    model = quantize_model(_tiny_model(), "int8", backend="torch", include_lm_head=True)
    assert isinstance(model.lm_head, QuantLinear)
    assert isinstance(model.embed_tokens, nn.Embedding)
    with pytest.raises(ValueError, match="method"):
        quantize_model(_tiny_model(), "fp8")


def test_quantize_model_auto_warns_when_it_falls_back():
    cfg = ModelConfig(vocab_size=64, hidden_size=40, intermediate_size=72, num_layers=1, num_heads=4, num_kv_heads=2)
    model = Transformer(cfg).eval()  # 40-wide: the int8 CPU kernel cannot take it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quantize_model(model, "int8")
    assert any("slower 'torch' backend" in str(w.message) for w in caught)
    assert model.layers[0].self_attn.q_proj.backend == "torch"


def test_quantized_copy_leaves_the_float_model_and_shares_the_rest():
    from course_lib.quant import quantized_copy

    cfg = ModelConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                      num_kv_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    q = quantized_copy(model, "int8", backend="torch")
    assert not any(isinstance(m, QuantLinear) for m in model.modules())  # the original keeps nn.Linear
    assert sum(isinstance(m, QuantLinear) for m in q.modules()) == 7 * cfg.num_layers
    assert q.embed_tokens.weight is model.embed_tokens.weight  # shared, not copied
    assert q.layers[0].input_layernorm.weight is model.layers[0].input_layernorm.weight
