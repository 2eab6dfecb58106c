"""accel's quantized layers: `OneDNNQuantLinear` (PyTorch's packed CPU ops) against the pure `QuantLinear`, and
`use_quant_kernels`, which swaps them in."""
from __future__ import annotations

import math
import warnings
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from course_lib.accel.linear import onednn_has_kernels
from course_lib.accel.quant_linear import (INT4_DEQUANTIZE_ROWS, INT8_DEQUANTIZE_ROWS, OneDNNQuantLinear,
                                           onednn_problem, use_quant_kernels)
from course_lib.config import ModelConfig
from course_lib.model import Transformer
from course_lib.quant import QuantLinear, quantize_model
from course_lib.quant.int4 import unpack_int4
from tests.test_quant_linear import CASES, _linear, _rel, check_dtype_conversions

HAS_CPU_OPS = onednn_problem("int4", 576, 192, 128) is None and onednn_problem("int8", 576, 192, None) is None
needs_ops = pytest.mark.skipif(not HAS_CPU_OPS, reason="this torch lacks the packed CPU kernels")


def onednn(lin, method: str, group_size: int = 128) -> OneDNNQuantLinear:
    return OneDNNQuantLinear.from_quant(QuantLinear.from_linear(lin, method, group_size))


@needs_ops
@pytest.mark.parametrize("method,group_size", CASES)
def test_onednn_layer_matches_the_reference(method, group_size):
    """PyTorch's packed CPU kernels compute in bfloat16: equal to the reference within bf16 rounding."""
    lin = _linear(576, 192, bias=True, seed=1)
    fast, ref_layer = onednn(lin, method, group_size), QuantLinear.from_linear(lin, method, group_size)
    # the same weights, read back from the CPU layout; scales (and zeros) are stored in bfloat16 there
    w_fast, w_ref = fast.dequantize(), ref_layer.dequantize()  # [out, in]
    row_peak = w_ref.abs().amax(dim=1, keepdim=True)
    assert ((w_fast - w_ref).abs() <= row_peak * 2**-7).all()  # a wrong code would be off by a step, >= peak / 15
    x = torch.randn(7, 576)
    y = fast(x)
    assert y.dtype == torch.float32 and y.shape == (7, 192)
    assert _rel(y, F.linear(x, fast.dequantize(), lin.bias)) < 1e-2
    assert _rel(fast(x.bfloat16()), F.linear(x, fast.dequantize(), lin.bias)) < 1e-2


@needs_ops
def test_int4_codes_read_back_exactly():
    lin = _linear(640, 64, bias=False, seed=2)
    assert torch.equal(onednn(lin, "int4", 64)._int4_codes(),
                       unpack_int4(QuantLinear.from_linear(lin, "int4", 64).qweight).float())


@pytest.mark.skipif(not (HAS_CPU_OPS and onednn_has_kernels(torch.bfloat16)),
                    reason="the packed CPU kernels or oneDNN's bfloat16 matmuls are missing here")
@pytest.mark.parametrize("method,in_features", [("int8", 64), ("int4", 40)])  # 40: padded to 64, groups of 32
def test_many_rows_take_a_bfloat16_matmul(method, in_features):
    """From the threshold up (INT8: INT8_DEQUANTIZE_ROWS rows; INT4: INT4_DEQUANTIZE_ROWS per padded input) the
    layer multiplies in bf16 (INT8: its codes cast, the scale after; INT4: its weight dequantized by the op),
    below it calls the op; both give the reference within bfloat16 rounding. Never while compiling."""
    lin = _linear(in_features, 48, bias=True, seed=3)
    fast = onednn(lin, method, 32)
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
            path = xb @ fast._int4_weight_t() if many else \
                torch._weight_int4pack_mm_for_cpu(xb, fast.qweight, fast.group_size, fast.scale_zero)
        y = fast(x)
        assert torch.equal(y, path.float() + lin.bias.detach())  # the path named above, exactly
        assert _rel(y, F.linear(x, fast.dequantize(), lin.bias)) < 1e-2


@needs_ops
@pytest.mark.parametrize("method", ["int8", "int4"])
def test_dtype_conversions_keep_the_packed_weight(method):
    """`model.half()` after quantizing converted the scales too: the op then failed ("expected scalar type
    BFloat16 but found Half"). The codes and scales stay as they are; the bias and x's dtype follow."""
    check_dtype_conversions(onednn(_linear(64, 48, bias=True, seed=7), method, 32))


@pytest.mark.cuda
def test_a_onednn_layer_does_not_move_to_the_gpu():
    q = onednn(_linear(64, 48, bias=True, seed=7), "int8")
    with pytest.raises(RuntimeError, match="Quantize the model again on cuda"):
        q.cuda()


def test_the_ops_refuse_shapes_they_cannot_take():
    with pytest.raises(ValueError, match="in_features % 16"):
        onednn(_linear(40, 48, bias=False), "int8")
    with pytest.raises(ValueError, match="group_size in"):
        onednn(_linear(96, 64, False), "int4", group_size=48)


def test_use_quant_kernels_warns_when_it_falls_back():
    cfg = ModelConfig(vocab_size=64, hidden_size=40, intermediate_size=72, num_layers=1, num_heads=4, num_kv_heads=2)
    model = quantize_model(Transformer(cfg).eval(), "int8")  # 40-wide: the int8 CPU kernel cannot take it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        use_quant_kernels(model, "onednn")
    assert any("slower PyTorch path" in str(w.message) for w in caught)
    assert type(model.layers[0].self_attn.q_proj) is QuantLinear
