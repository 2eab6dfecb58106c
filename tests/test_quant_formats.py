"""Quantization formats: INT8/INT4 round-trip bounds and layout, GGUF block decoders bit-exact vs `gguf`."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from course_lib.quant import gguf_blocks, int4, int8


def _weights(out_features: int, in_features: int, seed: int = 0) -> torch.Tensor:
    """Rows of very different magnitudes, a few outliers, one all-zero row: what real layers look like."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out_features, in_features, generator=g) * torch.logspace(-3, 1, out_features)[:, None]
    w[1, 5] = 40.0
    w[2] = 0.0
    return w


def test_int8_error_at_most_half_a_step():
    w = _weights(96, 576)
    codes, scales = int8.quantize_int8(w)
    assert codes.dtype == torch.int8 and codes.shape == (96, 576) and scales.shape == (96,)
    assert codes.min() >= -127 and codes.max() <= 127
    back = int8.dequantize_int8(codes, scales)
    err = (back - w).abs()
    bound = scales[:, None] / 2 * (1 + 1e-6) + 1e-12  # float32 rounding of q * scale
    assert (err <= bound).all(), f"worst excess {(err - bound).max().item():.3e}"
    assert torch.equal(back[2], torch.zeros(576))  # zero row: exact zeros, no NaN
    peak = codes.abs().amax(dim=1)
    assert (peak[scales > 0] == 127).all()  # the largest weight of each row uses the full range


def test_int8_rejects_bad_shapes():
    with pytest.raises(ValueError, match="2-D"):
        int8.quantize_int8(torch.randn(4))
    codes, scales = int8.quantize_int8(torch.randn(4, 8))
    with pytest.raises(ValueError, match="scales"):
        int8.dequantize_int8(codes, scales[:3])


def test_int4_pack_layout():
    codes = torch.tensor([[1, 2, 3, 4], [15, 0, 0, 15]])
    packed = int4.pack_int4(codes)
    assert packed.tolist() == [[0x21, 0x43], [0x0F, 0xF0]]  # low nibble = even column
    assert torch.equal(int4.unpack_int4(packed), codes.to(torch.uint8))


@pytest.mark.parametrize("in_features,group_size", [(576, 128), (576, 32), (1536, 128), (100, 64), (10, 32)])
def test_int4_error_within_half_a_step(in_features, group_size):
    w = _weights(48, in_features, seed=in_features)
    packed, scales, mins = int4.quantize_int4(w, group_size)
    padded = int4.padded_in_features(in_features, group_size)
    groups = padded // group_size
    assert packed.dtype == torch.uint8 and packed.shape == (48, padded // 2)
    assert scales.shape == mins.shape == (48, groups)
    back = int4.dequantize_int4(packed, scales, mins, in_features)
    assert back.shape == w.shape
    step = scales.repeat_interleave(group_size, dim=1)[:, :in_features]  # [out, in]: each element's step
    err = (back - w).abs()
    bound = step / 2 * (1 + 1e-5) + 1e-6 * w.abs()  # float32 rounding of q * scale + min
    assert (err <= bound).all(), f"worst excess {(err - bound).max().item():.3e}"
    assert torch.equal(back[2], torch.zeros(in_features))


def test_int4_padding_does_not_widen_the_last_group():
    """576 = 4.5 groups of 128: the last group's step comes from its 64 real values only."""
    w = _weights(16, 576, seed=3).abs() + 1.0  # all positive: zero padding would stretch the range down to 0
    _, scales, mins = int4.quantize_int4(w, 128)
    last = w[:, 512:]
    torch.testing.assert_close(mins[:, -1], last.amin(dim=1), rtol=0, atol=0)
    torch.testing.assert_close(scales[:, -1], (last.amax(dim=1) - last.amin(dim=1)) / 15)


def test_int4_rejects_bad_arguments():
    with pytest.raises(ValueError, match="even"):
        int4.quantize_int4(torch.randn(4, 8), group_size=7)
    packed, scales, mins = int4.quantize_int4(torch.randn(4, 64), group_size=32)
    with pytest.raises(ValueError, match="do not fit"):
        int4.dequantize_int4(packed, scales[:, :1].expand(4, 3), mins[:, :1].expand(4, 3), 64)


# --- GGUF block formats ------------------------------------------------------------------------

def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@pytest.fixture(scope="module")
def gguf_reader(gguf_path):
    import gguf

    return gguf.GGUFReader(gguf_path)


def test_gguf_decoders_bit_exact_on_the_default_model(gguf_reader):
    from gguf.quants import dequantize

    seen = {}
    for t in gguf_reader.tensors:
        fmt = t.tensor_type.name
        if fmt not in gguf_blocks.DEQUANTIZERS or seen.get(fmt, 0) >= 8:  # 8 tensors per format is plenty
            continue
        seen[fmt] = seen.get(fmt, 0) + 1
        ref = dequantize(t.data, t.tensor_type)  # [rows, cols] float32
        got = gguf_blocks.dequantize(t.data, fmt, ref.shape).numpy()
        assert np.array_equal(_bits(got), _bits(ref)), f"{t.name} ({fmt}) differs from gguf's decoding"
    assert seen.get("Q4_1", 0) == 8 and seen.get("Q8_0", 0) == 1  # the default model: Q4_1 layers, Q8_0 embedding


@pytest.mark.parametrize("fmt", ["Q4_0", "Q4_1", "Q8_0"])
def test_gguf_codecs_match_gguf_on_synthetic_data(fmt):
    """Q4_0 is not in the default model: quantize data with gguf, decode with ours; our quantizer, byte for byte."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    rng = np.random.default_rng(0)
    x = (rng.standard_normal((64, 256)) * rng.uniform(1e-3, 5, (64, 1))).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero block
    x[1, :32] = -3.0  # a constant block
    raw = quantize(x, GGMLQuantizationType[fmt])  # [64, 8 * type_size] uint8
    got = gguf_blocks.dequantize(raw, fmt, x.shape).numpy()
    assert np.array_equal(_bits(got), _bits(dequantize(raw, GGMLQuantizationType[fmt])))
    ours = getattr(gguf_blocks, f"quantize_{fmt.lower()}")(x).numpy().reshape(raw.shape)
    assert np.array_equal(ours, raw), f"{(ours != raw).sum()} bytes differ"
    blocks, decoded = x.reshape(-1, 32), got.reshape(-1, 32)  # sanity: each block is near its data
    span = np.abs(blocks).max(axis=1) if fmt != "Q4_1" else np.ptp(blocks, axis=1)
    steps = {"Q8_0": 127, "Q4_0": 8, "Q4_1": 15}[fmt]
    # half a step, plus float16 rounding of the scale; Q4_0 clips +max to code 7: up to one step
    allowed = {"Q8_0": 0.6, "Q4_0": 1.05, "Q4_1": 0.6}[fmt]
    assert (np.abs(decoded - blocks).max(axis=1) <= span / steps * allowed + 1e-6).all()


def test_gguf_rejects_a_partial_block():
    with pytest.raises(ValueError, match="whole number"):
        gguf_blocks.dequantize_q8_0(b"\x00" * 33)
    with pytest.raises(ValueError, match="unsupported"):
        gguf_blocks.dequantize(b"\x00" * 34, "Q5_K")
