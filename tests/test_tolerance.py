"""course_lib.tolerance: differences judged against the size of the values, not as bare absolute numbers."""
from __future__ import annotations

import pytest
import torch

from course_lib import tolerance


def test_a_rounding_of_a_large_output_passes_where_an_absolute_bound_failed():
    """Chapter 13 on an Intel Xeon: 1.83e-4 apart on outputs up to 945.2, float32's own rounding (1.6 eps)."""
    want = torch.tensor([945.2, -3.0, 0.5])
    got = want + torch.tensor([1.83e-4, 0.0, 0.0])
    rel = tolerance.assert_close(got, want, tolerance.OP_RTOL[torch.float32])
    assert rel == pytest.approx(1.83e-4 / 945.2, rel=1e-2) and rel < 2 * tolerance.eps(torch.float32)
    assert (got - want).abs().max() > 1e-4  # what the old absolute check rejected


def test_the_same_relative_difference_is_judged_the_same_at_any_scale():
    want = torch.linspace(-1, 1, 11, dtype=torch.float64)
    for scale in (1e-3, 1.0, 1e3):
        assert tolerance.relative_difference(scale * (want + 1e-6), scale * want) == pytest.approx(1e-6)


def test_a_real_difference_fails_and_says_how_large():
    want = torch.ones(4)
    with pytest.raises(AssertionError, match=r"logits: max \|difference\| / max \|value\| = 1.00e-02"):
        tolerance.assert_close(want * 1.01, want, 1e-4, "logits")
    with pytest.raises(AssertionError, match="over the tolerance"):
        tolerance.assert_close(torch.tensor([float("nan"), 1.0]), want[:2], 1.0)  # NaN never passes
    with pytest.raises(AssertionError, match="shapes differ"):
        tolerance.assert_close(torch.ones(3), want, 1.0)


def test_zeros_and_empty_tensors():
    assert tolerance.relative_difference(torch.zeros(3), torch.zeros(3)) == 0.0
    assert tolerance.relative_difference(torch.full((3,), 1e-9), torch.zeros(3)) == pytest.approx(1e-9)
    assert tolerance.relative_difference(torch.empty(0, 4), torch.empty(0, 4)) == 0.0


def test_the_tables_follow_the_dtypes_spacing():
    """Every dtype's tolerance is above its own rounding, and a whole model's is looser than one operation's."""
    for dtype, rtol in tolerance.OP_RTOL.items():
        assert rtol >= tolerance.eps(dtype) / 2
    for dtype, rtol in tolerance.MODEL_RTOL.items():
        assert rtol > tolerance.OP_RTOL[dtype]
    assert tolerance.OP_RTOL[torch.float32] == 1.3e-6  # torch.testing.assert_close's default for float32
