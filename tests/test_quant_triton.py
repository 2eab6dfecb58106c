"""Triton INT8/INT4 kernels vs the PyTorch path (dequantize, then F.linear).

The comparison runs this file as a script in a subprocess with TRITON_INTERPRET=1: triton decides
when a kernel is decorated whether to interpret it, and the pytest process may have imported
triton (and these kernels) already.
"""
from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from course_lib.accel.quant_linear import TritonQuantLinear
from course_lib.quant import QuantLinear

# (method, group_size, in_features, out_features, x shape prefix): rows 1, 3, 16 (decode: split K) and 40
# (prefill: one slice) on SmolLM2's 576x576 and its 1536->576 down projection; 576 = 4.5 groups of 128 and
# 200 = 3.125 groups of 64 (the kernel must stop at the real width); 72 outputs = 2.25 column tiles; groups of 8 (tl.dot needs 16: the multiply-and-sum path)
# and 48 (three 16-wide steps a group); a [2, 8] prefix is 16 rows.
CASES = [
    ("int4", 128, 576, 576, (1,)),
    ("int4", 128, 576, 576, (40,)),
    ("int8", 0, 576, 576, (3,)),
    ("int8", 0, 1536, 576, (1,)),
    ("int4", 128, 1536, 576, (16,)),
    ("int8", 0, 1536, 576, (40,)),
    ("int8", 0, 200, 72, (2, 8)),
    ("int8", 0, 200, 72, (40,)),
    ("int4", 64, 200, 72, (1,)),
    ("int4", 64, 200, 72, (3,)),
    ("int4", 64, 200, 72, (40,)),
    ("int4", 8, 96, 40, (1,)),
    ("int4", 8, 96, 40, (40,)),
    ("int4", 48, 96, 40, (3,)),
]
DEFAULT_LAYERS = [(576, 576), (960, 576), (3072, 576), (576, 1536)]  # (out, in): o, fused qkv, gate/up, down


def _layers(method: str, group_size: int, k: int, n: int, seed: int) -> tuple[QuantLinear, QuantLinear]:
    torch.manual_seed(seed)
    lin = nn.Linear(k, n, bias=seed % 2 == 0)
    ref = QuantLinear.from_linear(lin, method, group_size or 128)
    tri = TritonQuantLinear.from_quant(QuantLinear.from_linear(lin, method, group_size or 128))  # the same layout
    return ref, tri


def check_triton_against_torch(device: str, dtype: torch.dtype = torch.float32, rtol: float = 1e-4) -> float:
    """Worst relative error of the Triton path against the PyTorch path; raises past `rtol`."""
    from course_lib.accel.triton_quant import plan_launch

    splits = {plan_launch(math.prod(prefix), k, n, g).split_k for _, g, k, n, prefix in CASES}
    assert min(splits) == 1 and max(splits) > 1, f"the cases must run both kernels' paths, got splits {splits}"
    worst = 0.0
    for seed, (method, g, k, n, prefix) in enumerate(CASES):
        ref, tri = (m.to(device) for m in _layers(method, g, k, n, seed))
        x = torch.randn(*prefix, k, device=device).to(dtype)
        want = ref(x.float())
        got = tri(x)
        assert got.dtype == dtype and got.shape == (*prefix, n)
        rel = ((got.float() - want).abs().max() / want.abs().max()).item()
        assert rel <= rtol, f"{method} g={g} {k}->{n} x{prefix} {dtype}: relative error {rel:.2e} > {rtol}"
        worst = max(worst, rel)
    return worst


def check_row_kernel_against_torch(device: str) -> float:
    """The row kernel (what a T4 runs for 1-16 rows, chosen by faking compute capability 7.5) against dequantize
    and matmul: INT8 and INT4 in groups of 32 and 128, 1-4 rows, on SmolLM2's width 576 (4.5 groups of 128) and
    320 (2.5): the kernel must stop at the real width."""
    from course_lib.quant import int4, int8
    from course_lib.accel.triton_quant import int4_linear, int8_linear
    from course_lib.tolerance import assert_close

    worst = 0.0
    torch.manual_seed(0)
    for k, n in ((576, 72), (320, 40)):
        w = torch.randn(n, k)
        codes, scales = (t.to(device) for t in int8.quantize_int8(w))
        grouped = {g: tuple(t.to(device) for t in int4.quantize_int4(w, g)) for g in (32, 128)}
        for rows in (1, 2, 3, 4):
            x = torch.randn(rows, k, device=device)
            want = F.linear(x, int8.dequantize_int8(codes, scales))
            worst = max(worst, assert_close(int8_linear(x, codes, scales, capability=(7, 5)), want, 1e-5,
                                            f"int8 row kernel, {rows} rows, {k}->{n}"))
            for g, (p, s, m) in grouped.items():
                want = F.linear(x, int4.dequantize_int4(p, s, m, k))
                got = int4_linear(x, p, s, m, k, capability=(7, 5))
                worst = max(worst, assert_close(got, want, 1e-5, f"int4 g{g} row kernel, {rows} rows, {k}->{n}"))
        x = torch.randn(2, k, device=device).half()  # float16, as a T4 runs: rounded once, at the store
        want = F.linear(x.float(), int8.dequantize_int8(codes, scales))
        assert_close(int8_linear(x, codes, scales, capability=(7, 5)).float(), want, 2e-3, "int8 row kernel fp16")
    return worst


def check_wrapper_rejects_bad_inputs(device: str) -> None:
    from course_lib.quant import int4, int8
    from course_lib.accel.triton_quant import int4_linear, int8_linear

    codes, scales = int8.quantize_int8(torch.randn(32, 64))
    codes, scales = codes.to(device), scales.to(device)
    with pytest.raises(TypeError, match="float16, bfloat16 or float32"):
        int8_linear(torch.ones(2, 64, dtype=torch.int32, device=device), codes, scales)
    with pytest.raises(ValueError, match="expects 64"):
        int8_linear(torch.randn(2, 63, device=device), codes, scales)
    with pytest.raises(ValueError, match="scales"):
        int8_linear(torch.randn(2, 64, device=device), codes, scales[:5])
    packed, s, m = (t.to(device) for t in int4.quantize_int4(torch.randn(32, 64), 32))
    with pytest.raises(TypeError, match="uint8"):
        int4_linear(torch.randn(2, 64, device=device), packed.to(torch.int8), s, m, 64)
    with pytest.raises(ValueError, match="do not fit"):
        int4_linear(torch.randn(2, 64, device=device), packed, s[:, :1].expand(32, 3), m, 64)


def test_decode_grid_fills_the_gpu():
    pytest.importorskip("triton")
    from course_lib.accel.triton_quant import plan_launch

    for g in (0, 128):  # INT8, INT4
        one_row = plan_launch(1, 576, 576, g)
        assert one_row.split_k > 1 and one_row.programs >= 32, one_row  # 64-column tiles alone give 9 programs
    for out, k in DEFAULT_LAYERS:
        for g in (0, 32, 128):
            for rows in (1, 3, 16):
                plan = plan_launch(rows, k, out, g)
                assert plan.programs >= 64, f"{rows} rows, {out}x{k}, group {g}: {plan}"


@pytest.mark.parametrize("rows", [17, 40, 64, 512])
def test_prefill_keeps_one_k_slice(rows):
    pytest.importorskip("triton")
    from course_lib.accel.triton_quant import plan_launch

    for out, k in DEFAULT_LAYERS:
        plan = plan_launch(rows, k, out, 128)
        assert plan.split_k == 1 and plan.grid[2] == 1 and plan.k_per_split >= k, plan


@pytest.mark.parametrize("group_size", [0, 2, 8, 32, 48, 128, 256])
def test_plan_tiles_cover_the_layer_once(group_size):
    pytest.importorskip("triton")
    from course_lib.accel.triton_quant import plan_launch

    for rows in (1, 5, 16, 17, 100):
        for k in (group_size or 16, 200, 576, 1536, 4000):
            for out in (8, 72, 576, 3072):
                p = plan_launch(rows, k, out, group_size)
                assert p.grid == (-(-rows // p.block_m), -(-out // p.block_n), p.split_k), p
                assert p.split_k * p.k_per_split >= k > (p.split_k - 1) * p.k_per_split, p  # no empty slice
                assert p.k_per_split % p.block_k == 0 and p.block_k & (p.block_k - 1) == 0, p
                if group_size:  # whole groups a slice, no K step across two groups
                    assert p.k_per_split % group_size == 0 and group_size % p.block_k == 0, p
                assert p.block_k >= 16 or group_size % (2 * p.block_k), p  # small only when the group forces it


def test_kernel_choice_by_capability_and_rows():
    """tl.dot uses tensor cores from 8.0; below (a T4, a V100) few rows take the row kernel, many cuBLAS."""
    pytest.importorskip("triton")
    from course_lib.accel.triton_quant import SPLIT_K_MAX_ROWS, choose_kernel

    for cap in ((8, 0), (8, 6), (8, 9), (9, 0), (10, 0)):
        assert {choose_kernel(cap, r) for r in (1, 4, 16, 17, 512)} == {"tile"}, cap
    for cap in ((7, 5), (7, 0)):
        assert [choose_kernel(cap, r) for r in (1, 4, SPLIT_K_MAX_ROWS)] == ["rows"] * 3
        assert [choose_kernel(cap, r) for r in (SPLIT_K_MAX_ROWS + 1, 512)] == ["dequantize"] * 2
    with pytest.raises(ValueError, match="at least one row"):
        choose_kernel((7, 5), 0)


def test_t4_prompt_dequantizes_to_cublas(monkeypatch):
    """Many rows on a 7.5 card: no Triton launch, the dequantized weight through F.linear (cuBLAS on a GPU)."""
    pytest.importorskip("triton")
    from course_lib.accel import triton_quant
    from course_lib.quant import int4, int8

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the wrapper accepts CPU tensors; no kernel may run
    for name in ("_int8_linear_kernel", "_int4_linear_kernel", "_rows_linear_kernel"):
        monkeypatch.setattr(triton_quant, name, None)  # a launch would fail: None[grid]
    w, x = torch.randn(40, 96), torch.randn(3, 17, 96)  # 51 rows
    codes, scales = int8.quantize_int8(w)
    got = triton_quant.int8_linear(x, codes, scales, capability=(7, 5))
    assert torch.equal(got, F.linear(x, int8.dequantize_int8(codes, scales)))
    p, s, m = int4.quantize_int4(w, 32)
    got = triton_quant.int4_linear(x, p, s, m, 96, capability=(7, 5))
    assert torch.equal(got, F.linear(x, int4.dequantize_int4(p, s, m, 96)))


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 16])
def test_row_plan_pads_rows_to_a_power_of_two_only(rows):
    pytest.importorskip("triton")
    from course_lib.accel.triton_quant import ROWS_TILE, plan_launch

    for g in (0, 32, 128):
        p = plan_launch(rows, 576, 576, g, kernel="rows")
        assert rows <= p.block_m < 2 * rows or p.block_m == 1, p
        assert p.block_m * p.block_n * p.block_k <= ROWS_TILE and p.programs >= 64, p


def test_triton_kernels_match_torch_interpreted(run_triton_interpreted):
    assert "triton max rel err" in run_triton_interpreted(__file__)


def test_triton_wrapper_refuses_cpu_tensors_without_the_interpreter(monkeypatch):
    pytest.importorskip("triton")
    from course_lib.quant import int8
    from course_lib.accel.triton_quant import int8_linear

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    codes, scales = int8.quantize_int8(torch.randn(32, 64))
    with pytest.raises(RuntimeError, match="CUDA tensors"):
        int8_linear(torch.randn(2, 64), codes, scales)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_triton_kernels_match_torch_cuda():
    pytest.importorskip("triton")
    check_triton_against_torch("cuda")
    if torch.cuda.get_device_capability()[0] >= 8:  # a T4 has no bfloat16: LLM refuses it there
        check_triton_against_torch("cuda", torch.bfloat16, rtol=2e-2)
    check_row_kernel_against_torch("cuda")
    check_wrapper_rejects_bad_inputs("cuda")


if __name__ == "__main__":  # run by the test above with TRITON_INTERPRET=1
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    err = check_triton_against_torch("cpu")
    # float16, not bfloat16: triton 3.9's interpreter computes tl.dot on bfloat16 blocks wrongly
    # (numpy has no bfloat16), so bfloat16 is checked on CUDA only
    err_half = check_triton_against_torch("cpu", torch.float16, rtol=2e-3)
    err_rows = check_row_kernel_against_torch("cpu")
    check_wrapper_rejects_bad_inputs("cpu")
    print(f"triton max rel err: float32 {err:.2e}, float16 {err_half:.2e}, row kernel (sm75) {err_rows:.2e}")
