"""The one-pass C++ elementwise ops (`course_lib.accel.fused_ops`) against the PyTorch expressions they replace."""
import pytest
import torch
import torch.nn.functional as F

from course_lib import tolerance
from course_lib.accel import fused_ops
from course_lib.model import RMSNorm, apply_rope

DTYPES = [torch.float32, torch.bfloat16]


def close(actual, expected, dtype):
    """float32: summation order only; bfloat16: the same roundings, so rarely a bf16 step (or two) apart."""
    if dtype == torch.float32:
        tolerance.assert_close(actual, expected, 1e-5)
    else:
        tolerance.assert_close(actual.float(), expected.float(), 2 ** -6)
        assert (actual != expected).float().mean() < 0.01  # nearly all bit-identical


@pytest.fixture(scope="module")
def ops():
    from course_lib.accel.build import build

    return build().module


@pytest.mark.needs_cpp
def test_the_kernel_builds_here(ops):
    assert ops is not None
    assert fused_ops.usable(ops, torch.zeros(2)) is ops
    assert fused_ops.usable(ops, torch.zeros(2, dtype=torch.long)) is None
    assert fused_ops.usable(ops, torch.zeros(2, dtype=torch.float64)) is None
    assert fused_ops.usable(None, torch.zeros(2)) is None


@pytest.mark.needs_cpp
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 7, 300])
def test_rms_norm_and_add_rms_norm(ops, dtype, rows):
    g = torch.Generator().manual_seed(rows)
    x, y = (torch.randn(1, rows, 576, generator=g).to(dtype) * 3 for _ in range(2))
    w = (torch.rand(576, generator=g) + 0.5).to(dtype)
    close(fused_ops.rms_norm(x, w, 1e-5, ops), fused_ops.reference_rms_norm(x, w, 1e-5), dtype)
    s, h = fused_ops.add_rms_norm(x, y, w, 1e-5, ops)
    assert torch.equal(s, x + y)  # one rounding, the same one
    close(h, fused_ops.reference_rms_norm(x + y, w, 1e-5), dtype)


@pytest.mark.needs_cpp
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_rotates_q_and_k_heads_in_place_and_leaves_v(ops, dtype):
    heads, kv_heads, head_dim, T = 9, 3, 64, 40
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(1, T, (heads + 2 * kv_heads) * head_dim, generator=g).to(dtype)
    angles = torch.rand(1, T, head_dim // 2, generator=g) * 50
    cos, sin = (f(torch.cat([angles, angles], -1)).to(dtype) for f in (torch.cos, torch.sin))
    expected = qkv.view(1, T, -1, head_dim).clone()
    expected[:, :, :heads + kv_heads] = apply_rope(expected[:, :, :heads + kv_heads], cos, sin)
    out = fused_ops.rope_qk_(qkv, cos, sin, heads, kv_heads, head_dim, ops)
    assert out.data_ptr() == qkv.data_ptr()
    tolerance.assert_close(out.view_as(expected), expected, 1e-6 if dtype == torch.float32 else 0)  # bf16: bit-identical
    assert torch.equal(out.view_as(expected)[:, :, heads + kv_heads:], expected[:, :, heads + kv_heads:])


@pytest.mark.needs_cpp
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul(ops, dtype):
    gate_up = (torch.randn(1, 33, 2 * 1536, generator=torch.Generator().manual_seed(1)) * 4).to(dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    close(fused_ops.silu_mul(gate_up, ops), F.silu(gate) * up, dtype)


def test_fallbacks_compute_the_same_expressions():
    """Without the kernels (ops=None: not built, or on a GPU), each op runs its PyTorch expression."""
    x = torch.randn(2, 5, 64)
    norm = RMSNorm(64, eps=1e-6)  # the readable model's six-op RMSNorm
    torch.nn.init.uniform_(norm.weight, 0.5, 1.5)
    with torch.no_grad():
        torch.testing.assert_close(fused_ops.rms_norm(x, norm.weight, 1e-6), norm(x))
        s, h = fused_ops.add_rms_norm(x, x, norm.weight, 1e-6)
        assert torch.equal(s, x + x)
        torch.testing.assert_close(h, norm(x + x))
    gate_up = torch.randn(3, 8)
    assert torch.equal(fused_ops.silu_mul(gate_up), F.silu(gate_up[:, :4]) * gate_up[:, 4:])
    qkv = torch.randn(1, 5, 4 * 8)
    cos, sin = torch.rand(1, 5, 8), torch.rand(1, 5, 8)
    heads = qkv.view(1, 5, 4, 8).clone()
    expected = torch.cat([apply_rope(heads[:, :, :3], cos, sin), heads[:, :, 3:]], dim=2)
    assert torch.equal(fused_ops.rope_qk_(qkv, cos, sin, 2, 1, 8).view(1, 5, 4, 8), expected)
