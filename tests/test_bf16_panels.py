"""The bfloat16 panel kernel of `gemv_cpu.cpp` (decode steps of a few rows on CPUs with AVX512-BF16 not made by
Intel), alone and inside `PackedLinear`, against oneDNN and float32 products."""
from __future__ import annotations

import copy

import pytest
import torch
from torch.profiler import profile

from course_lib import packed_linear
from course_lib.cpp_build import load_cpu_extension
from course_lib.fast_path import use_fast_path
from course_lib.packed_linear import (GEMV_SOURCE, ONEDNN_PANEL_ROWS, PackedLinear, can_pack, gemv_kernel,
                                      onednn_kernel, pack_linears, panel_kernel)
from course_lib.profiling.memory import weight_bytes

pytestmark = [pytest.mark.needs_cpp, pytest.mark.usefixtures("fresh_dynamo"),  # see conftest.py
              pytest.mark.skipif(not can_pack("cpu", torch.bfloat16), reason="this CPU's oneDNN has no bfloat16 kernels")]


@pytest.fixture
def kernel():
    """gemv_cpu.cpp, which must build where a toolchain is; skip where the CPU has no AVX512-BF16."""
    assert load_cpu_extension("gemv_cpu", GEMV_SOURCE) is not None
    if gemv_kernel() is None:
        pytest.skip("this CPU has no AVX512-BF16: no bfloat16 panel kernel")
    return gemv_kernel()


def reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.float() @ w.float().T


def test_bf16_panels_are_the_weight_in_pairs_of_inputs_by_16_outputs(kernel):
    w = torch.arange(32 * 6, dtype=torch.bfloat16).view(32, 6)  # small integers: exact in bfloat16
    panels = kernel.pack_panels(w)
    assert panels.shape == (2, 3, 16, 2)  # [n/16, k/2, 16, 2]
    assert panels[1, 2, 5, 1] == w[16 + 5, 2 * 2 + 1] and panels[0, 0, 15, 0] == w[15, 0]
    assert panel_kernel(torch.bfloat16) is kernel and panel_kernel(torch.float16) is None
    with pytest.raises(RuntimeError, match="n % 16 == 0 and k even"):
        kernel.pack_panels(torch.zeros(20, 4, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="n % 16 == 0 and k even"):
        kernel.pack_panels(torch.zeros(16, 5, dtype=torch.bfloat16))


@pytest.mark.parametrize("n, k", [(96, 576), (80, 64), (16, 2), (48, 1536)])  # 6, 5 (4 a task + 1 alone), 1, 3 panels
def test_bf16_by_panels_at_any_rows_matches_float_products(kernel, n, k):
    torch.manual_seed(0)
    w = torch.randn(n, k, dtype=torch.bfloat16)
    panels = kernel.pack_panels(w)
    for rows in [0, 1, 3, 4, 5, 12, 13, 25, 64, 100]:  # 4 panels a task up to 4 rows, then blocks of up to 12 rows
        x = torch.randn(rows, k, dtype=torch.bfloat16)
        got, want = kernel.by_panels(x, panels), reference(x, w)
        assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
        # float sums rounded once to bfloat16: within a bfloat16 step of the float32 product
        torch.testing.assert_close(got.float(), want, rtol=2 ** -8, atol=1e-3 * k ** 0.5)
    x = torch.randn(4, 2 * k, dtype=torch.bfloat16)[:, ::2]  # a strided x is made contiguous
    torch.testing.assert_close(kernel.by_panels(x, panels).float(), reference(x, w), rtol=2 ** -8, atol=1e-2)
    with pytest.raises(RuntimeError, match="panels"):
        kernel.by_panels(torch.randn(3, k + 2, dtype=torch.bfloat16), panels)  # k does not match
    with pytest.raises(RuntimeError, match="bfloat16 x"):
        kernel.by_panels(torch.randn(3, k), panels)


def calls(prof, name: str) -> int:
    return sum(e.count for e in prof.key_averages() if e.key == name)


def test_bf16_packed_linear_sends_a_few_rows_to_the_panels_eager_and_compiled(kernel, monkeypatch):
    """bfloat16 sums rounded once agree between oneDNN and the panels far more often than not, so the outputs
    alone cannot show which path ran: the eager path is spied on, the compiled one profiled."""
    assert onednn_kernel() is not None
    torch.manual_seed(0)
    linear = torch.nn.Linear(576, 96, bias=False).to(torch.bfloat16)
    packed, plain = PackedLinear(linear, for_graph=True, panels=True), PackedLinear(linear)
    assert weight_bytes(packed) == weight_bytes(linear) + linear.weight.nbytes  # the panels: the weight again
    f = torch.compile(packed, dynamic=True, fullgraph=True)  # one graph; the operator chooses as it runs
    eager_panels = []

    class Spy:
        pack_panels = staticmethod(kernel.pack_panels)

        @staticmethod
        def by_panels(x, panels):
            eager_panels.append(x.shape[0])
            return kernel.by_panels(x, panels)

    monkeypatch.setattr(packed_linear, "panel_kernel", lambda dtype: Spy)
    limit = ONEDNN_PANEL_ROWS
    with torch.inference_mode():
        for rows in [1, 2, 5, limit, limit + 1, 300]:
            x = torch.randn(rows, 576, dtype=torch.bfloat16)
            want = kernel.by_panels(x, packed.panels) if rows <= limit else plain(x)
            eager_panels.clear()
            assert torch.equal(packed(x), want), rows
            assert eager_panels == ([rows] if rows <= limit else []), rows
            with profile() as prof:
                got = f(x)
            assert torch.equal(got, want), rows
            assert calls(prof, "course_lib::bf16_by_panels") == (rows <= limit), rows
            assert calls(prof, "mkldnn::_linear_pointwise") == (rows > limit), rows
            torch.testing.assert_close(want.float(), reference(x, linear.weight), rtol=2 ** -8, atol=1e-2)
        assert packed(torch.randn(3, 4, 576, dtype=torch.bfloat16)).shape == (3, 4, 96)


@pytest.mark.parametrize("vendor, panels", [("AuthenticAMD", True), ("GenuineIntel", False)])
def test_pack_linears_gives_bfloat16_layers_panels_where_the_one_row_kernel_does_not_pay(
        kernel, monkeypatch, tiny, vendor, panels):
    monkeypatch.setattr(packed_linear, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(packed_linear, "amx_kernel", lambda: None)  # AMX CPUs take AmxLinear instead
    model = use_fast_path(tiny()).to(torch.bfloat16)
    ids = torch.randint(0, 97, (3, 5))
    want = model(ids)
    plain_bytes = weight_bytes(model)
    for opaque in (True, False):
        packed = pack_linears(copy.deepcopy(model), opaque=opaque)
        layers = [m for m in packed.modules() if isinstance(m, PackedLinear)]
        if not panels and not opaque:
            assert not layers  # Intel, for a graph: OneRowLinear (tests/test_packed_linear.py)
            continue
        assert len(layers) == 4 * 3 + 1
        fits = [m for m in layers if m.out_features % 16 == 0 and m.in_features % 2 == 0]  # not the lm_head (97)
        assert len(fits) >= 4 * 3 and all((m.panels is not None) == (panels and m in fits) for m in layers)
        extra = sum(m.panels.nbytes for m in layers if m.panels is not None)
        assert extra == (sum(m.in_features * m.out_features * 2 for m in fits) if panels else 0)  # bf16 bytes
        assert weight_bytes(packed) >= plain_bytes + extra
        with torch.inference_mode():
            got = packed(ids) if opaque else torch.compile(packed, dynamic=True, fullgraph=True)(ids)
            torch.testing.assert_close(got, want, rtol=1.6e-2, atol=2e-2)
            one = packed(ids[:, :1])  # 3 rows: the panels
            torch.testing.assert_close(one, want[:, :1], rtol=1.6e-2, atol=2e-2)
