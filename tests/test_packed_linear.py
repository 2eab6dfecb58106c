"""`course_lib.accel.linear`: oneDNN's packed weights and the panel kernel against F.linear and the unpacked model."""
from __future__ import annotations

import copy
import dataclasses
import gc

import pytest
import torch

from course_lib import LLM, SamplingParams, tolerance
from course_lib.accel import plan_for
from course_lib.accel.fused_model import fuse_model
from course_lib.accel.linear import PackedLinear, pack_linears
from course_lib.accel.linear import onednn_has_kernels
from course_lib.profiling.memory import weight_bytes
from course_lib.profiling.roofline import weights_read

pytestmark = [pytest.mark.usefixtures("fresh_dynamo"),  # see conftest.py
              pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")]
DTYPES = [torch.float32] + ([torch.bfloat16] if onednn_has_kernels(torch.bfloat16) else [])


@pytest.fixture(scope="module")
def ops():
    """The built extension; a machine with a toolchain must build it."""
    from course_lib.accel.build import build, missing_tools

    if missing_tools():
        pytest.skip("no C++ compiler or ninja here")
    assert build().module is not None, build().problem
    return build().module


def close(got, want, dtype):
    rtol = 1e-5 if dtype == torch.float32 else 2e-2  # float32: summation order; bfloat16: rounding
    tolerance.assert_close(got.float(), want.float(), rtol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_linear(dtype, bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 96, bias=bias).to(dtype)
    packed = PackedLinear(linear)
    assert packed.panels is None and packed.handle is None and weight_bytes(packed) == weight_bytes(linear)
    for shape in [(1, 64), (16, 64), (2, 5, 64), (0, 64), (300, 64)]:  # a row, a batch, [batch, seq, hidden], none
        x = torch.randn(shape, dtype=dtype)
        close(packed(x), linear(x), dtype)
    assert "packed_weight" not in packed.state_dict()  # opaque: never saved


def panel_width(ops, dtype) -> int:
    return ops.panel_width[str(dtype).removeprefix("torch.")]


@pytest.mark.parametrize("dtype", DTYPES)
def test_panels_lay_out_the_weight_by_blocks_of_outputs(ops, dtype):
    width = panel_width(ops, dtype)
    if not width:
        pytest.skip(f"no {dtype} panel kernel on this CPU")
    w = torch.arange(2 * width * 4, dtype=torch.float32).view(2 * width, 4).to(dtype)  # [out, in]
    panels = ops.pack_panels(w)
    if dtype == torch.float32:  # [n/W, k, W]: for each input, W outputs side by side
        assert panels.shape == (2, 4, width) and panels[1, 2, 5] == w[width + 5, 2]
    else:  # [n/16, k/2, 16, 2]: for each pair of inputs, 16 outputs side by side
        assert panels.shape == (2, 2, 16, 2) and panels[1, 1, 5, 0] == w[16 + 5, 2] and panels[0, 0, 3, 1] == w[3, 1]
    with pytest.raises(RuntimeError, match="multiple"):
        ops.pack_panels(torch.zeros(width + 1, 4, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, k", [(96, 576), (80, 64), (16, 2), (48, 1536)])  # several panels, a last one alone
def test_by_panels_at_any_rows_matches_the_product(ops, dtype, n, k):
    if not panel_width(ops, dtype) or n % panel_width(ops, dtype):
        pytest.skip(f"no {dtype} panels of this width here")
    torch.manual_seed(0)
    w = torch.randn(n, k).to(dtype)
    panels = ops.pack_panels(w)
    for rows in [0, 1, 4, 5, 12, 13, 64, 100]:  # 13 rows: blocks of 7 and 6
        x = torch.randn(rows, k).to(dtype)
        got = ops.by_panels(x, panels)
        assert got.dtype == dtype and got.shape == (rows, n)
        close(got, x.float() @ w.float().T, dtype)
    x = torch.randn(k, 6).to(dtype).T  # not contiguous
    close(ops.by_panels(x, panels), x.float() @ w.float().T, dtype)
    with pytest.raises(RuntimeError, match="features"):
        ops.by_panels(torch.randn(3, k + 2).to(dtype), panels)


class Spy:
    """The extension, with every `by_panels` call counted."""

    def __init__(self, ops):
        self.ops, self.calls = ops, 0

    def __getattr__(self, name):
        return getattr(self.ops, name)

    def by_panels(self, x, panels):
        self.calls += 1
        return self.ops.by_panels(x, panels)


@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_linear_sends_up_to_panel_rows_to_the_panels_eager(ops, dtype):
    if not panel_width(ops, dtype):
        pytest.skip(f"no {dtype} panel kernel on this CPU")
    torch.manual_seed(0)
    linear = torch.nn.Linear(576, 96).to(dtype)
    spy = Spy(ops)
    packed = PackedLinear(linear, spy, panel_rows=8)
    assert packed.panel_rows == 8 and weight_bytes(packed) == weight_bytes(linear) + linear.weight.nbytes
    for rows, through_panels in [(1, 1), (8, 1), (9, 0), (300, 0), (0, 0)]:
        before = spy.calls
        x = torch.randn(rows, 576).to(dtype)
        close(packed(x), linear(x), dtype)
        assert spy.calls - before == through_panels, rows
    assert packed(torch.randn(2, 3, 576).to(dtype)).shape == (2, 3, 96)  # 6 rows, a batch dimension kept


def test_compiled_packed_linear_calls_the_operator_which_chooses_by_rows(ops):
    """One dynamic graph: the operator sends 1 to panel_rows rows to the panels and more to oneDNN as the step
    runs. The panels are doubled after packing, so the result tells which one ran on any CPU (the two paths'
    rounding alone cannot: on some CPUs oneDNN's one-row product sums in the panels' order)."""
    if not panel_width(ops, torch.float32):
        pytest.skip("no float32 panel kernel here")
    torch.manual_seed(0)
    linear = torch.nn.Linear(576, 96)
    packed, plain = PackedLinear(linear, ops, panel_rows=8, for_graph=True), PackedLinear(linear)
    packed.panels.mul_(2)  # the panels now hold 2W; oneDNN's packed copy still holds W
    f = torch.compile(packed, dynamic=True, fullgraph=True)
    with torch.inference_mode():
        for rows in [1, 2, 8, 9, 300]:
            x = torch.randn(rows, 576)
            panels, onednn = ops.by_panels(x, packed.panels) + linear.bias, plain(x)
            torch.testing.assert_close(panels - linear.bias, 2 * (onednn - linear.bias))  # far apart: 2W against W
            want = panels if rows <= 8 else onednn
            assert torch.equal(packed(x), want) and torch.equal(f(x), want), rows


def test_the_handle_table_keeps_a_weight_as_long_as_its_layer(ops):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 96)
    gc.collect()  # a layer an earlier test left for the collector would otherwise leave the table mid-test
    kept = ops.kept()
    eager = PackedLinear(linear, ops)  # eager only: no handle, nothing in the table
    assert eager.handle is None and ops.kept() == kept
    other = PackedLinear(linear, ops, for_graph=True)
    assert ops.kept() == kept + 1
    handle = other.handle
    x = torch.randn(3, 64)
    torch.testing.assert_close(torch.ops.course_lib.onednn_linear(x, handle, 96) + linear.bias, linear(x))
    del other
    gc.collect()
    assert ops.kept() == kept  # a freed layer's weight leaves the table
    with pytest.raises(RuntimeError, match="freed"):
        torch.ops.course_lib.onednn_linear(x, handle, 96)
    with pytest.raises(Exception, match="for_graph=True"):  # an eager-only layer refuses to be traced
        with torch.inference_mode():
            torch.compile(eager, dynamic=True, fullgraph=True)(x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_packed_model_matches_the_fused_model_and_compiles(ops, tiny, dtype):
    fused = fuse_model(tiny()).to(dtype)
    ids = torch.randint(0, 97, (1, 20))
    want = fused(ids)
    packed = pack_linears(copy.deepcopy(fused), ops, panel_rows=16, for_graph=True)
    assert isinstance(packed.lm_head, PackedLinear) and not any(type(m) is torch.nn.Linear for m in packed.modules())
    assert sum(isinstance(m, PackedLinear) for m in packed.modules()) == 4 * 3 + 1
    close(packed(ids), want, dtype)
    compiled = torch.compile(packed, dynamic=True, fullgraph=True)
    with torch.inference_mode():
        close(compiled(ids), want, dtype)
        close(compiled(ids[:, :7]), want[:, :7], dtype)


def test_a_packed_tied_lm_head_holds_a_copy_and_a_step_reads_one_table(ops, tiny):
    model = fuse_model(tiny()).float()
    model.lm_head.weight = model.embed_tokens.weight  # tied, as SmolLM2's
    table = model.embed_tokens.weight.numel() * 4
    held, read = weight_bytes(model), weights_read(model)
    assert read == held  # the head multiplies by the table itself
    pack_linears(model, ops, panel_rows=16)
    panels = sum(m.panels.nbytes for m in model.modules() if getattr(m, "panels", None) is not None)
    assert panels > 0 and weight_bytes(model) == held + table + panels  # the packed head is a copy, with panels
    assert weights_read(model) == read  # a step reads the copy (or its panels) and gathers rows of the table


def test_a_packed_layer_refuses_another_dtype_or_device_and_keeps_working(tiny):
    layer = PackedLinear(torch.nn.Linear(64, 32))
    x = torch.randn(3, 64)
    want = layer(x)
    for convert in (lambda m: m.to(torch.float16), lambda m: m.to("meta"), lambda m: m.double()):
        with pytest.raises(RuntimeError, match="PackedLinear holds its weight .* pack last"):
            convert(layer)
    assert layer.to(torch.float32) is layer and layer.cpu() is layer  # nothing to convert: left as it is
    torch.testing.assert_close(layer(x), want, rtol=0, atol=0)
    model = pack_linears(fuse_model(tiny()).float())
    with pytest.raises(RuntimeError, match="Load the model again"):
        model.to(torch.bfloat16)


def test_float32_engine_batch_of_few_rows_keeps_greedy_tokens(llm, ops):
    """Ten decode rows a step go through the panels (a plan of 16 rows) and give the reference's tokens."""
    plan = dataclasses.replace(plan_for("cpu", torch.float32), panel_rows=16)
    fast = LLM(device="cpu", accel=plan)
    assert isinstance(fast.model.layers[0].mlp.down_proj, PackedLinear) and fast.model.lm_head.panel_rows == 16
    prompts = [f"Count from {i}: {i}," for i in range(10)]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert [o.outputs[0].token_ids for o in fast.generate(prompts, params)] == want
