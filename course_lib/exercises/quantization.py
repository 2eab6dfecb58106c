"""Checkers for chapter 08 (quantization): INT8 per channel, a Q4_1 block from bytes, bytes at a bit width.

    check_int8_per_channel(fn)          fn(W [out, in] float) -> (codes [out, in] int8, scales [out])
    check_decode_q4_1_block(fn)         fn(block: 20 bytes) -> the 32 weights it holds, float32
    check_quantized_linear_bytes(fn)    fn(config, method, group_size, scale_bytes) -> bytes of the linear layers

Each compares with what `course_lib.quant` computes (the engine's own quantizers, decoders and
`QuantLinear` buffers) on small tensors and real blocks of the default model's GGUF file.
"""
from __future__ import annotations

import copy
import struct
from functools import lru_cache
from typing import Callable

import numpy as np
import torch

from ..config import ModelConfig
from ..tolerance import OP_RTOL, relative_difference
from .check import Case, run_checks

# ---------------------------------------------------------------- INT8, one scale per output channel


def _int8_cases(weight: torch.Tensor | None) -> list[Case]:
    from ..quant.int8 import dequantize_int8, quantize_int8

    g = torch.Generator().manual_seed(0)
    plain = torch.randn(64, 96, generator=g) * 0.05  # [out, in]
    outlier = plain.clone()
    outlier[5, 7] = 3.0  # one large weight: only row 5's step may grow
    zero_row = plain.clone()
    zero_row[3] = 0.0

    def unpack(result) -> tuple[torch.Tensor, torch.Tensor]:
        assert isinstance(result, tuple) and len(result) == 2, "return a pair (codes, scales)"
        codes, scales = result
        codes, scales = torch.as_tensor(codes), torch.as_tensor(scales)
        return codes, scales

    def same_as_engine(w: torch.Tensor) -> Callable:
        def verify(result) -> None:
            codes, scales = unpack(result)
            ref_codes, ref_scales = quantize_int8(w)
            assert scales.shape == ref_scales.shape, (
                f"scales has shape {tuple(scales.shape)}; per-channel INT8 has one scale per output channel "
                f"(row of W), shape {tuple(ref_scales.shape)}")
            assert codes.shape == w.shape, f"codes has shape {tuple(codes.shape)}, expected W's {tuple(w.shape)}"
            assert codes.dtype == torch.int8, f"codes are {codes.dtype}; store them as torch.int8 (1 byte each)"
            assert torch.isfinite(scales.float()).all(), "some scales are NaN or inf"
            if not torch.allclose(scales.float(), ref_scales, rtol=1e-6, atol=1e-12):
                if torch.all(scales == scales.flatten()[0]) and not torch.all(ref_scales == ref_scales[0]):
                    raise AssertionError("all rows share one scale (per tensor); per channel, row n has its own "
                                         "scale max|W[n, :]| / 127")
                n = int((scales.float() - ref_scales).abs().argmax())
                raise AssertionError(f"scale of row {n} is {scales[n].item():.6g}, max|W[{n}, :]| / 127 is "
                                     f"{ref_scales[n].item():.6g}")
            off = (codes.int() - ref_codes.int()).abs()
            assert off.max() <= 1, (f"{int((off > 1).sum())} codes are more than 1 away from round(W / scale); "
                                    "did you clamp to [-127, 127] and divide by the row's own scale?")
            assert (off > 0).float().mean() <= 1e-3, (
                f"{int((off > 0).sum())} codes differ from round(W / scale) by 1: round to nearest, not floor/trunc")
        return verify

    def within_half_step(result) -> None:
        codes, scales = unpack(result)
        err = (dequantize_int8(codes.to(torch.int8), scales.float()) - plain).abs().amax(dim=1)  # [out]
        worst = (err / (scales.float() / 2)).max().item()
        assert worst <= 1 + 1e-5, (f"a row's largest error is {worst:.2f} half-steps; round to nearest keeps "
                                   "every weight within scale / 2 of its code * scale")

    def outlier_stays_in_its_row(result) -> None:
        codes, scales = unpack(result)
        same_as_engine(outlier)(result)
        others = torch.cat([scales[:5], scales[6:]]).float()
        assert others.max() < 0.1 * scales[5].float(), "an outlier in row 5 changed the other rows' scales"

    def zero_row_is_zero(result) -> None:
        codes, scales = unpack(result)
        assert torch.isfinite(scales.float()).all(), "a row of zeros gave a NaN/inf scale"
        assert codes.dtype == torch.int8 and (codes[3] == 0).all(), (
            "a row of zeros must get codes 0 (0 / 0 is NaN: guard the division, e.g. scale.clamp(min=tiny))")
        same_as_engine(zero_row)(result)

    cases = [
        Case("random 64x96 weight: codes and scales equal course_lib.quant.int8.quantize_int8", (plain,),
             same_as_engine(plain)),
        Case("every weight within half a step (scale / 2) of its dequantized value", (plain,), within_half_step),
        Case("one outlier weight coarsens only its own row (per channel, not per tensor)", (outlier,),
             outlier_stays_in_its_row),
        Case("a row of zeros: codes 0, no NaN", (zero_row,), zero_row_is_zero),
    ]
    if weight is not None:
        w = weight.detach().float().cpu()
        cases.append(Case(f"the real weight {tuple(w.shape)}: equal to quantize_int8", (w,), same_as_engine(w)))
    return cases


def check_int8_per_channel(fn: Callable, weight: torch.Tensor | None = None) -> bool:
    """fn(W [out, in]) -> (codes int8 [out, in], scales [out]); `weight`: also check on this real matrix."""
    return run_checks("int8_per_channel", fn, _int8_cases(weight))


# ---------------------------------------------------------------- Q4_1 block from bytes


@lru_cache(maxsize=1)
def _real_q4_1_blocks() -> list[tuple[str, bytes]]:
    """(description, 20 bytes) of real Q4_1 blocks from the default model's GGUF file (memory-mapped, no model load)."""
    from ..gguf_file import open_gguf
    from ..loading import default_gguf_path

    tensors = [t for t in open_gguf(default_gguf_path()).tensors if t.tensor_type.name == "Q4_1"]
    rng = np.random.default_rng(0)
    out = []
    for t in [tensors[0]] + [tensors[i] for i in rng.choice(len(tensors), 7, replace=False)]:
        flat = np.asarray(t.data).reshape(-1, 20)  # [n_blocks, 20] uint8
        for j in [0] + rng.choice(len(flat), 7, replace=False).tolist():
            out.append((f"{t.name} block {j}", bytes(flat[j])))
    return out


def _q4_1_wrong_answers(block: bytes) -> dict[str, torch.Tensor]:
    """What common slips produce, to say which one a wrong answer looks like."""
    d, m = struct.unpack("<ee", block[:4])
    qs = torch.tensor(list(block[4:]), dtype=torch.int32)  # [16]
    low, high = (qs & 0x0F).float(), (qs >> 4).float()
    paired = torch.stack([low, high], dim=1).flatten()  # element 2i low, 2i+1 high
    halves = torch.cat([low, high])
    return {
        "you put the two nibbles of a byte next to each other (w[2i], w[2i+1]); in GGUF, byte i holds w[i] "
        "(low nibble) and w[i + 16] (high nibble)": d * paired + m,
        "you read the high nibble first: the LOW nibble of byte i is w[i], the high one is w[i + 16]":
            d * torch.cat([high, low]) + m,
        "you swapped d and m: bytes 0-1 are the scale d, bytes 2-3 the minimum m": m * halves + d,
        "you left out the minimum m: w = d * code + m": d * halves,
        "you subtracted 8 from the codes (that is Q4_0); Q4_1 codes are 0..15 and the offset is m":
            d * (halves - 8) + m,
    }


def _q4_1_verify(block: bytes) -> Callable:
    from ..quant.gguf_blocks import dequantize_q4_1

    def verify(result) -> None:
        got = torch.as_tensor(np.asarray(result, dtype=np.float32) if not torch.is_tensor(result) else result)
        assert got.numel() == 32, f"a Q4_1 block holds 32 weights; you returned {got.numel()} values"
        got = got.float().flatten()
        want = dequantize_q4_1(block)  # [32]
        if relative_difference(got, want) <= OP_RTOL[torch.float32]:
            return
        for hint, wrong in _q4_1_wrong_answers(block).items():
            if relative_difference(got, wrong.float()) <= 1e-5:
                raise AssertionError(hint)
        if relative_difference(got, want) <= 1e-3:
            raise AssertionError("close but not exact: convert d and m to float32 before multiplying "
                                 "(float16 arithmetic rounds every product)")
        i = int((got - want).abs().argmax())
        raise AssertionError(f"w[{i}] is {got[i].item():.6g}, dequantize_q4_1 gives {want[i].item():.6g}")

    return verify


def _counting_block() -> bytes:
    """d = 0.5, m = -1, codes 0, 1, ..., 15 in the low nibbles and 15, ..., 0 in the high ones."""
    qs = bytes(i | ((15 - i) << 4) for i in range(16))
    return struct.pack("<ee", 0.5, -1.0) + qs


def check_decode_q4_1_block(fn: Callable) -> bool:
    """fn(block: bytes of length 20) -> 32 float32 weights, checked against `dequantize_q4_1`."""
    from ..quant.gguf_blocks import quantize_q4_1

    real = _real_q4_1_blocks()
    made = bytes(quantize_q4_1(torch.linspace(0.2, 1.7, 32) ** 2)[0].numpy())  # all-positive weights: m > 0
    cases = [
        Case("a hand-made block (d=0.5, m=-1, codes 0..15 low, 15..0 high)", (_counting_block(),),
             _q4_1_verify(_counting_block())),
        Case(f"the first block of {real[0][0].split(' ')[0]} from the model's GGUF file", (real[0][1],),
             _q4_1_verify(real[0][1])),
        Case("a block made by quantize_q4_1 from positive weights (m > 0)", (made,), _q4_1_verify(made)),
    ]
    rest = real[1:]

    def all_real(results) -> None:  # one decoded block per block of `rest`
        for (name, block), got in zip(rest, results):
            try:
                _q4_1_verify(block)(got)
            except AssertionError as e:
                raise AssertionError(f"{name}: {e}") from None

    cases.append(Case(f"{len(rest)} more real blocks from 8 tensors of the file", ([b for _, b in rest],),
                      all_real))

    def one_or_many(block_or_blocks):  # the last case hands over a list: decode each block of it
        if isinstance(block_or_blocks, list):
            return [fn(b) for b in block_or_blocks]
        return fn(block_or_blocks)

    return run_checks("decode_q4_1_block", one_or_many, cases)


# ---------------------------------------------------------------- bytes of the linear layers at a bit width


def _layer_shapes(config: ModelConfig) -> list[tuple[int, int]]:
    """(out_features, in_features) of one block's seven linear layers: q, k, v, o, gate, up, down."""
    h, i = config.hidden_size, config.intermediate_size
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    return [(q, h), (kv, h), (kv, h), (h, q), (i, h), (i, h), (h, i)]


def _engine_bytes(config: ModelConfig, method: str, group_size: int) -> int:
    """Bytes of the linear layers as the engine stores them: one QuantLinear per distinct shape, times its count."""
    from ..evaluation import linear_weight_bytes
    from ..quant import QuantLinear

    g = torch.Generator().manual_seed(0)
    total = 0
    shapes = _layer_shapes(config)
    for shape in set(shapes):
        linear = torch.nn.Linear(shape[1], shape[0], bias=False)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(shape, generator=g))
        layer = linear if method == "float32" else QuantLinear.from_linear(linear, method, group_size)
        total += shapes.count(shape) * linear_weight_bytes(torch.nn.ModuleList([layer]))
    return total * config.num_layers


def _bytes_slips(config: ModelConfig, method: str, group_size: int, scale_bytes: int) -> list[tuple[str, int]]:
    """(hint, total) for common slips, to name the one a wrong answer looks like."""
    import math

    def total(layer: Callable[[int, int], float]) -> int:
        return int(config.num_layers * sum(layer(o, k) for o, k in _layer_shapes(config)))

    groups = lambda k: math.ceil(k / group_size)  # noqa: E731
    no_pad = ("the codes of a row are padded to a whole number of groups (int4.padded_in_features: 576 inputs "
              "in groups of 128 are stored as 640 columns)")
    if method == "int4":
        return [
            (no_pad, total(lambda o, k: o * k / 2 + o * k / group_size * 2 * scale_bytes)),
            (no_pad, total(lambda o, k: o * k / 2 + o * (k // group_size) * 2 * scale_bytes)),
            (no_pad, total(lambda o, k: o * k / 2 + o * groups(k) * 2 * scale_bytes)),
            ("two 4-bit codes share a byte: count half a byte per code", total(
                lambda o, k: o * groups(k) * group_size + o * groups(k) * 2 * scale_bytes)),
            ("each group stores two numbers, its scale and its min: 2 x scale_bytes per group per row", total(
                lambda o, k: o * groups(k) * group_size / 2 + o * groups(k) * scale_bytes)),
            ("you left out the scales and mins", total(lambda o, k: o * groups(k) * group_size / 2)),
        ]
    if method == "int8":
        return [("you left out the scales (one per output row)", total(lambda o, k: o * k)),
                ("INT8 has one scale per output row, not per input column", total(lambda o, k: o * k + k * scale_bytes))]
    return [("float32 is 4 bytes per weight", total(lambda o, k: 2 * o * k))]


def _bytes_verify(config: ModelConfig, method: str, group_size: int, scale_bytes: int, expected: int) -> Callable:
    def verify(result) -> None:
        assert isinstance(result, (int, np.integer)) or (isinstance(result, float) and result.is_integer()), (
            f"return a whole number of bytes (an int), got {result!r}")
        got = int(result)
        if got == expected:
            return
        for hint, value in _bytes_slips(config, method, group_size, scale_bytes):
            if got == value:
                raise AssertionError(f"{got:,} bytes, expected {expected:,}: {hint}")
        if got > expected and (got - expected) % (config.vocab_size * config.hidden_size) == 0:
            raise AssertionError(f"{got:,} bytes, expected {expected:,}: leave out lm_head (tied to the "
                                 "embedding, not quantized)")
        raise AssertionError(f"{got:,} bytes, the engine stores {expected:,} ({got / expected:.4f}x)")

    return verify


def _tiny_config(hidden: int, intermediate: int, layers: int = 2) -> ModelConfig:
    return ModelConfig(vocab_size=256, hidden_size=hidden, intermediate_size=intermediate, num_layers=layers,
                       num_heads=4, num_kv_heads=2, tie_word_embeddings=True, max_position_embeddings=64)


def _whole_model_bytes(config: ModelConfig, method: str, group_size: int) -> int:
    """linear_weight_bytes of a real tiny Transformer after quantize_model: the engine's own accounting."""
    from ..evaluation import linear_weight_bytes
    from ..model import Transformer
    from ..quant import quantize_model

    torch.manual_seed(0)
    model = Transformer(config).eval()
    if method != "float32":
        model = quantize_model(copy.deepcopy(model), method, group_size=group_size)
    return linear_weight_bytes(model)


SMOLLM2_135M = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                           num_kv_heads=3, tie_word_embeddings=True, name="SmolLM2-135M (sizes only)")


def check_quantized_linear_bytes(fn: Callable, config: ModelConfig | None = None) -> bool:
    """fn(config, method, group_size, scale_bytes) -> bytes of all linear layers but lm_head.

    method "float32" | "int8" | "int4"; scale_bytes: bytes of each stored scale or min (4: `QuantLinear`'s float32).
    """
    big = config or SMOLLM2_135M
    a, padded = _tiny_config(64, 160), _tiny_config(96, 192)
    plans = [  # (description, config, method, group, scale_bytes, whole model?)
        ("float32, a tiny 2-layer model", a, "float32", 32, 4, True),
        ("int8, float32 scales, the tiny model", a, "int8", 32, 4, True),
        ("int4 groups of 32, float32 scale + min, the tiny model", a, "int4", 32, 4, True),
        ("int4 groups of 64 on 96 inputs (padded to 128)", padded, "int4", 64, 4, True),
        (f"int4 groups of 128, {big.name or 'the given config'}", big, "int4", 128, 4, False),
    ]
    cases = []
    for desc, cfg, method, gs, sb, whole in plans:
        expected = (_whole_model_bytes if whole else _engine_bytes)(cfg, method, gs)
        cases.append(Case(desc, (cfg, method, gs, sb), _bytes_verify(cfg, method, gs, sb, expected)))
    return run_checks("quantized_linear_bytes", fn, cases)
