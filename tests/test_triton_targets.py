"""The engine's Triton kernels, compiled on this CPU for a T4, an A100, an L4 and an H100.

No GPU is needed: Triton compiles for a named compute capability and its wheel ships `ptxas`. The launches are
caught from the engine's own wrappers (`course_lib.accel.triton_targets`), so a wrapper that changes its tiles
or dtypes changes what is checked. `pytest -s` prints the table.
"""
from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="Triton is not installed (it ships wheels for Linux only)")


@pytest.fixture(scope="module")
def rows():
    """Compile every launch once for the module (82 compiles, each with a second `ptxas -v`: about 20 s)."""
    from course_lib.accel import triton_targets

    try:
        from triton.backends.nvidia.compiler import get_ptxas

        get_ptxas(80).path
    except Exception as e:  # noqa: BLE001 - any way the NVIDIA backend is missing means the same thing here
        pytest.skip(f"this Triton has no NVIDIA backend with ptxas: {e}")
    rows = triton_targets.table()
    print("\n" + triton_targets.format_table(rows))
    return rows


def test_every_launch_compiles_for_every_card(rows):
    """Thirteen launches in float16 on four cards; the ten that run from compute capability 8.0 also in bfloat16 on
    the three cards that have it (the T4's row kernel runs below 8.0 only, where there is no bfloat16)."""
    from course_lib.accel.triton_targets import CARDS

    kernels = {r["kernel"] for r in rows}
    assert len(kernels) == 13 and len({k for k in kernels if "row kernel" in k}) == 3
    for card in CARDS:
        dtypes = {r["dtype"] for r in rows if r["card"] == card.name}
        assert dtypes == ({"float16", "bfloat16"} if card.capability >= 80 else {"float16"})
        assert len([r for r in rows if r["card"] == card.name]) == 13 + 10 * (card.capability >= 80)


def test_t4_row_kernel_fits_without_spills(rows):
    """The row kernel is what a T4 (7.5) runs for decode: no tl.dot, every value in registers."""
    t4 = [r for r in rows if "row kernel" in r["kernel"] and r["sm"] == 75]
    assert len(t4) == 3
    for r in t4:
        assert not r["dot"] and r["spills"] == 0 and r["registers"] <= 255, r


def test_matmuls_use_tensor_cores_from_sm80(rows):
    """`tl.dot` becomes `mma` from compute capability 8.0; on a T4 (7.5) Triton emits FMAs (Triton PR #5066)."""
    dots = [r for r in rows if r["dot"]]
    assert {r["kernel"].split(",")[0] for r in dots} == {"int8 linear", "int4 linear g32", "int4 linear g128"}
    for r in dots:
        assert bool(r["mma"]) == (r["sm"] >= 80), r


def test_no_register_spills(rows):
    spilled = [(r["kernel"], r["card"], r["dtype"], r["spills"]) for r in rows if r["spills"]]
    assert not spilled, f"bytes spilled to local memory: {spilled}"


def test_shared_memory_fits_each_card(rows):
    """Every kernel that reduces across threads asks for some; the combine of the decode splits reduces nothing
    (a program's threads each own their share of head_dim), so it asks for none."""
    for r in rows:
        least = 0 if r["kernel"] == "decode attention, combine splits" or "row kernel" in r["kernel"] else 1
        assert least <= r["shared"] <= r["shared_limit"], r
