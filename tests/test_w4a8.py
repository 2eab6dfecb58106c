"""W4A8 (Q4_1 weights x int8 activations): the PyTorch reference (`course_lib/quant/w4a8.py`) against its definition,
and the C++ kernel (`accel/csrc/linear.cpp`) against the reference, bit for bit, on every instruction-set path this
CPU runs. Both are integer dot products plus float operations in one fixed order (no fused multiply-add), so the
bits agree exactly, not up to a tolerance."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import torch

from course_lib.quant import gguf_blocks
from course_lib.quant.w4a8 import W4A8Linear, block_dots, q4_1_weight, quantize_activations, w4a8_linear

# (rows, out, in): odd sizes, a ragged last block and panel, one output, and the default model's widths
SHAPES = [(1, 16, 32), (1, 576, 576), (2, 960, 576), (3, 40, 70), (4, 1, 31), (5, 33, 1536), (13, 100, 200)]


def case(rows: int, out: int, inp: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + rows * 1000 + out + inp)
    x = torch.randn(rows, inp, generator=g) * torch.rand(rows, 1, generator=g) * 8  # [rows, in], rows of any scale
    x[:, :min(32, inp) // 2] *= 50  # an outlier run: its block gets a coarse step, the others keep theirs
    if rows > 2:
        x[1] = 0  # a zero row: every block's step is 0
    return x, torch.randn(out, inp, generator=g) * 0.05  # x, W [out, in]


def test_weights_are_the_gguf_q4_1_blocks():
    x, w = case(1, 24, 96)
    codes, dw, mw = q4_1_weight(w)
    blocks = gguf_blocks.quantize_q4_1(w)  # [24 * 3, 20]: ggml's bytes
    rebuilt = (codes.float().view(24, 3, 32) * dw[..., None] + mw[..., None]).view(24, 96)
    assert torch.equal(rebuilt, gguf_blocks.dequantize_q4_1(blocks, shape=(24, 96)))
    assert torch.equal(dw.half().float(), dw) and torch.equal(mw.half().float(), mw)  # float16 values


def test_activations_round_to_their_block_step():
    x, _ = case(3, 1, 70)
    q, dx, sx = quantize_activations(x)
    assert q.shape == (3, 96) and dx.shape == sx.shape == (3, 3)
    assert q.abs().max() <= 127 and torch.equal(q[:, 70:], torch.zeros(3, 26, dtype=torch.int8))
    padded = torch.nn.functional.pad(x, (0, 26)).view(3, 3, 32)
    back = q.float().view(3, 3, 32) * dx[..., None]
    assert torch.all((back - padded).abs() <= dx[..., None] / 2 * (1 + 1e-6))  # half a step at most
    assert torch.equal(sx, dx * q.float().view(3, 3, 32).sum(-1)) and torch.all(dx[1] == 0)


def test_block_dots_are_exact_integers():
    q = torch.randint(-127, 128, (3, 64), dtype=torch.int8)
    codes = torch.randint(0, 16, (5, 64), dtype=torch.uint8)
    want = (q.long().view(3, 1, 2, 32) * codes.long().view(1, 5, 2, 32)).sum(-1)  # [3, 5, 2]
    assert torch.equal(block_dots(q, codes).long(), want)


@pytest.mark.parametrize("rows, out, inp", SHAPES)
def test_reference_is_the_product_with_the_rounded_operands(rows, out, inp):
    """The reference multiplies exactly the Q4_1 weight by the 8-bit activations: its only other error is float32
    summation (a few ulps of the sum of magnitudes)."""
    x, w = case(rows, out, inp)
    codes, dw, mw = q4_1_weight(w)
    q, dx, _ = quantize_activations(x)
    w_q = (codes.double().view(out, -1, 32) * dw[..., None].double() + mw[..., None].double()).flatten(1)
    x_q = (q.double().view(rows, -1, 32) * dx[..., None].double()).flatten(1)
    exact = x_q @ w_q.T  # [rows, out] in float64
    bound = 1e-5 * (x_q.abs() @ w_q.abs().T) + 1e-30
    assert torch.all((w4a8_linear(x, codes, dw, mw).double() - exact).abs() <= bound)


@pytest.fixture(scope="module")
def ops():
    from course_lib.accel.build import build, missing_tools

    if missing_tools():
        pytest.skip("no C++ compiler or ninja here: the W4A8 kernel is not built")
    built = build()
    if built.module is None:
        pytest.skip(f"the C++ kernels did not build: {built.problem}")
    return built.module


PATHS = ["scalar", "avx2", "avxvnni", "avx512vnni"]  # every path the kernel has, narrowest first


@pytest.mark.needs_cpp
@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("rows, out, inp", SHAPES)
def test_kernel_equals_the_reference_bit_for_bit(ops, isa, rows, out, inp):
    from course_lib.accel.w4a8 import pack_w4a8

    if isa not in ops.w4a8_paths():
        pytest.skip(f"this CPU or build has no {isa} path")
    x, w = case(rows, out, inp)
    codes, dw, mw = q4_1_weight(w)
    packed = pack_w4a8(codes, dw, mw)
    assert torch.equal(ops.w4a8_linear(x, packed, out, isa), w4a8_linear(x, codes, dw, mw))
    xb = x.bfloat16()  # bfloat16 rows (the INT4 engine's): quantized from the same float32 values, rounded at the end
    assert torch.equal(ops.w4a8_linear(xb, packed, out, isa), w4a8_linear(xb, codes, dw, mw).bfloat16())


@pytest.mark.needs_cpp
def test_paths_are_listed_and_checked(ops):
    assert ops.w4a8_paths()[0] == "scalar"
    x, w = case(1, 16, 32)
    from course_lib.accel.w4a8 import pack_w4a8

    packed = pack_w4a8(*q4_1_weight(w))
    with pytest.raises(RuntimeError, match="unknown path"):
        ops.w4a8_linear(x, packed, 16, "sse9")
    with pytest.raises(RuntimeError, match="features"):
        ops.w4a8_linear(torch.randn(1, 64), packed, 16)


@pytest.mark.needs_cpp
def test_the_environment_variable_forces_a_path(ops):
    """COURSE_LIB_W4A8_ISA is read by the kernel: an unknown name there fails every call that names no path."""
    code = ("import torch; from course_lib.accel.build import build\n"
            "from course_lib.accel.w4a8 import pack_w4a8\nfrom course_lib.quant.w4a8 import q4_1_weight\n"
            "p = pack_w4a8(*q4_1_weight(torch.randn(16, 32)))\n"
            "print(build().module.w4a8_linear(torch.randn(1, 32), p, 16).shape)\n")
    env = {**os.environ, "COURSE_LIB_W4A8_ISA": "scalar"}
    assert "[1, 16]" in subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                       check=True).stdout
    env["COURSE_LIB_W4A8_ISA"] = "sse9"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.returncode != 0 and "unknown path 'sse9'" in run.stderr


@pytest.mark.needs_cpp
def test_the_layer_takes_the_kernel_for_few_rows_and_its_fallback_for_more(ops):
    from course_lib.accel.w4a8 import W4A8PackedLinear

    linear = torch.nn.Linear(70, 40, bias=True)
    layer, reference = W4A8PackedLinear(linear, ops, max_rows=4), W4A8Linear(linear)
    few, many = torch.randn(2, 3, 70), torch.randn(5, 70)  # 6 rows: more than max_rows
    assert torch.equal(layer(few[:, :2]), reference(few[:, :2]))  # 4 rows
    assert torch.equal(layer(few), layer.fallback(few)) and torch.equal(layer(many), layer.fallback(many))
    assert layer(few.bfloat16()[0]).dtype == torch.bfloat16


@pytest.mark.needs_cpp
def test_the_plan_swaps_int4_layers_and_keeps_the_others(tokenizer, tiny):
    from course_lib import LLM, SamplingParams
    from course_lib.accel import plan_for
    from course_lib.accel.w4a8 import W4A8PackedLinear

    plan = dataclasses.replace(plan_for("cpu", torch.float32), w4a8_rows=8, w4a8_path="scalar")
    llm = LLM.from_model(tiny().float(), tokenizer, quantization="int4", accel=plan)
    from course_lib.quant.linear import QuantLinear

    w4a8 = [m for m in llm.model.modules() if isinstance(m, W4A8PackedLinear)]
    assert w4a8 and all(isinstance(m.fallback, QuantLinear) for m in w4a8)  # the INT4 layers kept for more rows
    assert type(llm.model.lm_head).__name__ != "W4A8PackedLinear" and "W4A8 kernel" in plan.describe()
    assert all(m.max_rows == 8 for m in llm.model.modules() if isinstance(m, W4A8PackedLinear))
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))[0]
    assert len(out.outputs[0].token_ids) == 6


@pytest.mark.needs_cpp
def test_w4a8_rows_are_measured_once_and_remeasured_only_when_quiet(ops, monkeypatch, tmp_path):
    from course_lib.accel import build as build_module
    from course_lib.accel import plan as plan_module

    monkeypatch.setattr(build_module, "build_directory", lambda: tmp_path)
    calls, load = [], [3.0]
    monkeypatch.setattr(plan_module, "measure_w4a8_rows", lambda ops: calls.append(1) or 8)
    monkeypatch.setattr(plan_module, "load_per_core", lambda: load[0])
    problems = []
    assert plan_module.w4a8_rows(ops, problems) == 8 and plan_module.w4a8_rows(ops, problems) == 8
    assert len(calls) == 1 and "busy" in problems[0]  # under load: kept, said so, not measured again while busy
    load[0] = 0.2
    assert plan_module.w4a8_rows(ops, []) == 8 and plan_module.w4a8_rows(ops, []) == 8
    assert len(calls) == 2  # measured once more on the quiet machine, then kept
