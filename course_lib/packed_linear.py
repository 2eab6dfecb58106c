"""Linear layers whose weights are laid out once for the CPU's kernels, and `pack_linears`, which picks them.

    model = use_fast_path(load_model(...))   # course_lib.fast_path: the fused blocks
    pack_linears(model)                      # CPU: weights laid out once for oneDNN or AMX (bf16), MKL or oneDNN (f32)

`F.linear` lets the BLAS library re-lay-out the weight inside every call; for the few rows of a decode
step that costs as much as the product. `pack_linears` only changes which CPU kernel computes each linear
layer: `PackedLinear` (bfloat16, float16), `OneRowLinear` (bfloat16, compiled), `AmxLinear` (bfloat16 on
a CPU with AMX), `SgemmPackedLinear` (float32 on Intel CPUs), `PackedLinear` (float32 elsewhere) and
`FewRowsLinear` (float32, compiled) give the same products as `F.linear`, up to rounding
(`tests/test_packed_linear.py`, `tests/test_amx_linear.py`). The C++ sources beside this file hold the kernels,
each built on first use (`course_lib.cpp_build`); where one cannot be built the layer keeps PyTorch's path.
A layer packed for this CPU cannot be converted to another dtype or moved to another device (`.to()`
raises): load the model again as wanted, and pack last.
"""
from __future__ import annotations

import functools
import weakref
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from .cpp_build import cpu_vendor, load_cpu_extension, register_fake
from .dtypes import onednn_has_kernels
from .model import Transformer


GEMV_SOURCE = Path(__file__).with_name("gemv_cpu.cpp")


@functools.cache
def gemv_kernel():
    """The C++ one-row bfloat16 kernel (`gemv_cpu.cpp`), built on first use; None where it cannot be built
    or the CPU has no AVX512-BF16 (there it was no faster than oneDNN: 26.1 vs 27.5 ms as portable code).
    Loading it also defines the operator `course_lib::gemv` ([1, in] -> [1, out]) that compiled graphs call."""
    kernel = load_cpu_extension("gemv_cpu", GEMV_SOURCE)
    if kernel is not None:
        register_fake("gemv", lambda x, weight: x.new_empty((1, weight.shape[0])))
    return kernel if kernel is not None and kernel.supported else None


def one_row_kernel_pays() -> bool:
    """True where bfloat16 one-row steps go through `gemv_kernel` rather than oneDNN: it runs here, and the
    CPU is Intel's. On a 2-core AMD EPYC (Zen 5) it streamed a decode step's weights (the default model's
    layers and lm_head, each from memory) at 16 GB/s, oneDNN's packed weights at 29 (16.9 vs 9.2 ms)."""
    return gemv_kernel() is not None and cpu_vendor() == "GenuineIntel"


def one_row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear of one row ([..., in] holding one row) through the C++ kernel. Eager calls it directly;
    a compiled graph calls the operator `course_lib::gemv`, which the kernel's source registers in C++."""
    gemv = torch.ops.course_lib.gemv if torch.compiler.is_compiling() else gemv_kernel().gemv
    y = gemv(x.reshape(1, -1), weight).view(*x.shape[:-1], weight.shape[0])
    return y if bias is None else y + bias


def keep_packed(module: nn.Module, fn, dtype: torch.dtype) -> nn.Module:
    """`_apply` of a layer packed for this CPU: `fn` (what `.to()`, `.half()`, `.cuda()` apply to each tensor)
    may not change its dtype or device, as its kernels read this layout only; a conversion that changes
    neither has nothing to do."""
    probe = fn(torch.empty(0, dtype=dtype))
    if probe.dtype != dtype or probe.device.type != "cpu":
        raise RuntimeError(f"{type(module).__name__} holds its weight laid out for this CPU's kernels "
                           f"(course_lib.packed_linear), in {dtype}: it cannot become {probe.dtype} on "
                           f"{probe.device}. Load the model again in the dtype and on the device wanted, "
                           "and pack last.")
    return module


ONEDNN_SOURCE = Path(__file__).with_name("onednn_linear_cpu.cpp")


@functools.cache
def onednn_kernel():
    """The table of packed oneDNN weights that compiled graphs name by number (`onednn_linear_cpu.cpp`),
    built on first use; None where it cannot be built. Loading it also defines the operator
    `course_lib::onednn_linear(x [m, in], handle, out_features, panels=None, panel_rows=0) -> [m, out]`
    (with panels, calls of 1 to `panel_rows` rows go through them: `PackedLinear(panels=True)`)."""
    kernel = load_cpu_extension("onednn_linear", ONEDNN_SOURCE)
    if kernel is not None:
        register_fake("onednn_linear", lambda x, handle, out_features, panels=None, panel_rows=0:
                      x.new_empty((x.shape[0], out_features)))
    return kernel


# PackedLinear layers with panels send calls of up to this many rows to them. On a 2-core AMD EPYC, against
# oneDNN: float32 1.1-1.7x faster from 1 to 64 rows, level at 96-128 (`onednn_linear_cpu.cpp`); bfloat16
# 1.1-1.9x (`gemv_cpu.cpp`)
ONEDNN_PANEL_ROWS = 64


class PackedLinear(nn.Module):
    """An `nn.Linear` whose weight oneDNN has re-laid-out once for the CPU's matrix units (AMX, AVX-512).

    The same product as `F.linear` (bit-identical in bfloat16 on the machines measured here), with
    no re-layout of the weight inside every call. Measured with torch 2.13 on a 2-core Xeon with AMX,
    all 30 layers of the default model in bfloat16: 17.5 -> 13.6 ms for 1 row, 18.6 -> 11.6 ms for
    16 rows, 25.6 -> 15.8 ms for 64 rows. float32 takes it where MKL is slow (`float32_kernel`).
    The packed weight is an opaque oneDNN tensor: it cannot be saved, moved to another device or
    read back, so pack last (after fusing and quantizing), for serving only. A compiled graph cannot
    take it as an input either: with `for_graph=True`, `onednn_kernel`'s table keeps the weight under a
    number (`handle`) while this layer lives, and a graph calls the operator `course_lib::onednn_linear`
    with it (eager layers skip the table, and the kernel's build on first use).
    `keep_weight=True` keeps the plain weight as well, and one-row calls (a decode step of one
    sequence) go through the C++ kernel of `gemv_kernel`, which streams it faster than oneDNN does.
    `panels=True` (float32 or bfloat16, where `panel_kernel` has a kernel for the dtype and the outputs come
    in blocks of 16) keeps the weight as panels as well, and calls of 1 to `ONEDNN_PANEL_ROWS` rows (decode
    steps) go through them, eager or compiled: faster than oneDNN there, for twice the weight memory.
    """

    def __init__(self, linear: nn.Linear, keep_weight: bool = False, for_graph: bool = False, panels: bool = False):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach()
        packed = torch.ops.mkldnn._reorder_linear_weight(w, None)  # [out, in], opaque
        self.register_buffer("packed_weight", packed, persistent=False)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())
        # the plain weight too, for one-row calls through the C++ kernel (twice the memory)
        self.register_buffer("weight", w if keep_weight else None, persistent=False)
        fits = panels and self.out_features % 16 == 0 and self.in_features % 2 == 0
        panel = panel_kernel(w.dtype) if fits else None
        self.register_buffer("panels", None if panel is None else panel.pack_panels(w), persistent=False)
        self.handle = None  # for a compiled graph: the packed weight's number in onednn_kernel's table
        if for_graph:
            kernel = onednn_kernel()
            if kernel is None:
                raise RuntimeError("PackedLinear(for_graph=True) needs onednn_linear_cpu.cpp, which did not build")
            self.handle = kernel.keep(packed)  # the same tensor: no copy
            weakref.finalize(self, kernel.release, self.handle)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight is not None and x.numel() == x.shape[-1]:
            return one_row_linear(x, self.weight, self.bias)
        compiling, rows = torch.compiler.is_compiling(), x.numel() // self.in_features
        if not compiling and (self.panels is None or rows > ONEDNN_PANEL_ROWS):
            return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")
        x2 = x.reshape(rows, self.in_features)
        if not compiling:  # eager, with panels, a few rows
            y = panel_kernel(x2.dtype).by_panels(x2, self.panels)
        elif self.handle is None:
            raise RuntimeError("a compiled graph calls a PackedLinear by handle: build it with for_graph=True")
        else:  # the operator chooses between oneDNN and the panels as the step runs
            y = torch.ops.course_lib.onednn_linear(x2, self.handle, self.out_features, self.panels, ONEDNN_PANEL_ROWS)
        y = y if self.bias is None else y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def _apply(self, fn, recurse=True):
        return keep_packed(self, fn, self.packed_weight.dtype)


SGEMM_SOURCE = Path(__file__).with_name("sgemm_packed_cpu.cpp")


@functools.cache
def sgemm_kernel():
    """MKL's packed float32 GEMM and its panel kernel for a few rows (`sgemm_packed_cpu.cpp`), built on first use;
    None where it cannot be built or this torch does not export MKL's functions. Loading it also defines the
    operator `course_lib::sgemm_linear(x [m, in], packed, panels, out_features) -> [m, out]` that compiled
    graphs call."""
    if not torch.backends.mkl.is_available():
        return None
    kernel = load_cpu_extension("sgemm_packed", SGEMM_SOURCE)
    if kernel is not None:
        register_fake("sgemm_linear", lambda x, packed, panels, out_features: x.new_empty((x.shape[0], out_features)))
    return kernel


def has_panel_kernel() -> bool:
    """True where `sgemm_kernel` builds with its AVX-512 panel kernel."""
    return sgemm_kernel() is not None and sgemm_kernel().has_panels


def panel_kernel(dtype: torch.dtype):
    """The kernel whose `pack_panels` and `by_panels` compute a few rows of a `dtype` layer through its weight
    cut into panels of 16 outputs: `sgemm_kernel` in float32 (AVX-512), `gemv_kernel` in bfloat16
    (AVX512-BF16); None where this CPU has neither for `dtype`."""
    if dtype == torch.float32:
        return sgemm_kernel() if has_panel_kernel() else None
    return gemv_kernel() if dtype == torch.bfloat16 else None


class SgemmPackedLinear(nn.Module):
    """A float32 `nn.Linear` whose weight MKL has packed once (`cblas_sgemm_pack`), for CPU steps: called
    directly in eager steps, as the operator `course_lib::sgemm_linear` in a compiled graph.

    The same product as `F.linear` (within float32 rounding, ~1e-6), without F.linear's re-layout of the
    weight inside every call: all linear layers of the default model, 16 rows 74 -> 43 ms, 64 rows
    109 -> 78 ms (more in `sgemm_packed_cpu.cpp`). The packed weight replaces the plain one, as in
    `PackedLinear`: opaque, not saved, not movable; pack last.
    Where the CPU has AVX-512 and the outputs come in blocks of 16, the layer also holds the weight as
    `panels` (the same size again), and calls of 1 to `sgemm_kernel().panel_rows` rows (decode steps) go
    through them: 1.1-1.4x faster than MKL's packed GEMM there (figures in `sgemm_packed_cpu.cpp`).
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        kernel = sgemm_kernel()
        # A plain attribute, not a buffer: MKL reserves 2-9x the weight's size but fills only about the weight's.
        self.packed_weight = kernel.pack(linear.weight.detach())
        # The weight's shape with no storage (meta), so `weight_bytes` counts the memory the packed one uses.
        self.register_buffer("weight_shape", torch.empty_like(linear.weight, device="meta"), persistent=False)
        fits = has_panel_kernel() and self.out_features % 16 == 0
        panels = kernel.pack_panels(linear.weight.detach()) if fits else None
        self.register_buffer("panels", panels, persistent=False)  # [out/16, in, 16], or None
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        linear = torch.ops.course_lib.sgemm_linear if torch.compiler.is_compiling() else sgemm_kernel().linear
        y = linear(x.reshape(-1, self.in_features), self.packed_weight, self.panels, self.out_features)
        y = y if self.bias is None else y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def _apply(self, fn, recurse=True):
        return keep_packed(self, fn, torch.float32)


class FewRowsLinear(nn.Linear):
    """An `nn.Linear` that computes 8 to 48 rows as W @ x^T: the same product, another MKL kernel.

    For float32 on the CPU. MKL's kernel for x @ W^T is slow for a few rows; for W @ x^T it is not.
    Measured with torch 2.13 on a 2-core Xeon, all 30 layers of the default model: 16 rows 68 -> 42 ms,
    32 rows 91 -> 55 ms; 1 row 27 -> 25 ms, but 2 and 4 rows 31 -> 41 and 43 -> 48 ms, and 64 rows level,
    so eager steps outside 8-48 rows keep `F.linear`. A compiled step cannot branch on its number of
    rows without a graph per branch, so there it always takes W @ x^T (its batches are the many-row kind).
    (`model.project_to_vocab` does the same for the vocabulary head, at any number of rows.)
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if not torch.compiler.is_compiling() and not 8 <= rows <= 48:
            return F.linear(x, self.weight, self.bias)
        y = (self.weight @ x.reshape(rows, -1).T).T.contiguous()  # [rows, out], laid out as F.linear's (faster after)
        y = y if self.bias is None else y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


class OneRowLinear(nn.Linear):
    """A bfloat16 `nn.Linear` for a model `torch.compile` will trace: one row through the C++
    kernel of `gemv_kernel` (an operator in the graph), more rows through F.linear, whose weights
    Inductor packs for oneDNN itself (`freezing`). The compiled decode step of one sequence has a
    graph of its own, so there the branch is fixed when it is traced."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() != x.shape[-1]:
            return F.linear(x, self.weight, self.bias)
        return one_row_linear(x, self.weight, self.bias)


AMX_SOURCE = Path(__file__).with_name("amx_linear_cpu.cpp")
AMX_MAX_ROWS = 256  # eager calls with more rows (prefill chunks) take F.linear: faster there (amx_linear_cpu.cpp)


@functools.cache
def amx_kernel():
    """The C++ AMX kernel for a few bfloat16 rows (`amx_linear_cpu.cpp`), built on first use; None where
    it cannot be built, or the CPU has no AMX, or Linux does not grant its tile registers. Loading it also
    defines the operator `course_lib::amx_linear(x [m, in], amx_weight) -> [m, out]` for compiled graphs."""
    kernel = load_cpu_extension("amx_linear", AMX_SOURCE)
    if kernel is None:
        return None
    register_fake("amx_linear", lambda x, amx_weight: x.new_empty((x.shape[0], amx_weight.shape[0] * 16)))
    return kernel if kernel.enable() else None


class AmxLinear(nn.Linear):
    """A bfloat16 `nn.Linear` for a CPU with AMX: one row through the one-row kernel (`gemv_kernel`), 2 to
    `AMX_MAX_ROWS` rows through AMX tiles, more (a prefill chunk) through F.linear; a compiled graph
    (a decode step) always takes the tiles for more than one row. `convert` adds the weight laid out
    as tiles (`amx_weight`, the same size) beside the plain one. Decode steps of 16 sequences read
    the weights ~1.5x faster than through oneDNN (figures in `amx_linear_cpu.cpp`)."""

    @classmethod
    def fits(cls, linear: nn.Linear) -> bool:
        """The kernel's shapes: outputs in blocks of 16, inputs in blocks of 32."""
        return linear.out_features % 16 == 0 and linear.in_features % 32 == 0

    @classmethod
    def convert(cls, linear: nn.Linear) -> "AmxLinear":
        """Turn `linear` (bfloat16, `fits`) into an AmxLinear in place; returns it."""
        linear.__class__ = cls
        linear.register_buffer("amx_weight", amx_kernel().pack(linear.weight.detach()), persistent=False)
        linear.one_row = one_row_kernel_pays()
        return linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.one_row and x.numel() == x.shape[-1]:
            return one_row_linear(x, self.weight, self.bias)
        compiling = torch.compiler.is_compiling()
        if not compiling and x.numel() > AMX_MAX_ROWS * x.shape[-1]:
            return F.linear(x, self.weight, self.bias)
        amx = torch.ops.course_lib.amx_linear if compiling else amx_kernel().linear  # graph: the operator
        y = amx(x.reshape(-1, self.in_features), self.amx_weight).view(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def _apply(self, fn, recurse=True):
        return keep_packed(self, fn, self.weight.dtype)


def can_pack(device: torch.device | str, dtype: torch.dtype) -> bool:
    """True where `PackedLinear` pays: half-precision weights on a CPU whose oneDNN has bf16/fp16 kernels."""
    return torch.device(device).type == "cpu" and onednn_has_kernels(dtype)


def float32_kernel(opaque: bool = True) -> str:
    """Which kernel `pack_linears` gives float32 layers on this CPU: "mkl" (`SgemmPackedLinear`) on an
    Intel CPU, "onednn" (`PackedLinear`) on others, where MKL takes slower code (figures in
    `onednn_linear_cpu.cpp`: 1.8x at one row, 2.3-2.5x at 16 to 512 rows), "few_rows" (`FewRowsLinear`) where
    neither builds. For a model `torch.compile` will trace (not `opaque`), oneDNN needs its operator."""
    onednn = torch.backends.mkldnn.is_available() and (opaque or onednn_kernel() is not None)
    if onednn and cpu_vendor() != "GenuineIntel":
        return "onednn"
    return "mkl" if sgemm_kernel() is not None else "few_rows"


def pack_linears(model: Transformer, opaque: bool = True) -> Transformer:
    """Give every plain `nn.Linear` of `model` the CPU's faster kernels, in place; returns the model.

    Half precision where `can_pack` holds: each becomes a `PackedLinear`, the lm_head included (a
    tied lm_head gets its own packed copy of the embedding matrix: 57 MB for the default model in
    bfloat16). In bfloat16, where the C++ one-row kernel pays (`one_row_kernel_pays`), each also keeps its
    plain weight for one-row calls: decode of one sequence ~1.2x faster eager, for twice the weight
    memory (326 -> 538 MB for the default model).
    Not `opaque` (a model `torch.compile` will trace, which cannot take packed weights as inputs): where
    the one-row kernel pays, the weights stay plain and every bfloat16 layer becomes a `OneRowLinear`,
    the lm_head included (its one row through the kernel: 3.3 against 5.7 ms for W @ x^T over the default
    model's 49k rows); elsewhere each is still a `PackedLinear`, which a graph calls through its handle
    (a 2-core AMD EPYC, compiled bfloat16 decode of 1, 16 and 64 sequences: 1.40x, 1.39x and 1.17x the
    tok/s of leaving the layers plain for Inductor to pack for oneDNN itself, `freezing`). Where the one-row
    kernel does not pay but builds (AVX512-BF16 on a CPU not made by Intel), each `PackedLinear` also holds
    its weight as bfloat16 panels for decode steps of up to `ONEDNN_PANEL_ROWS` rows (twice the weight memory).
    On a CPU with AMX, every bfloat16 layer whose shape the tiles fit becomes an `AmxLinear` instead,
    `opaque` or not (plain weight plus the same again as tiles; the lm_head included).
    float32, on an Intel CPU: each layer becomes a `SgemmPackedLinear` where MKL's packed GEMM builds,
    `opaque` or not (a graph calls it as an operator), the lm_head included (a tied one gets its own
    packed copy, 113 MB for the default model; 64 rows 38 -> 22 ms against `project_to_vocab`'s W @ x^T),
    each with its weight as panels as well for decode steps of a few rows (twice the weight memory).
    On other CPUs each becomes a `PackedLinear` instead, the lm_head included (`float32_kernel`), with
    panels for decode steps of up to `ONEDNN_PANEL_ROWS` rows where it can (twice the weight memory). Where
    neither builds, each layer but the lm_head (which `project_to_vocab` computes as W @ x^T) becomes
    a `FewRowsLinear`. Other dtypes and devices, and quantized layers, are left as they are.
    """
    if model.device.type != "cpu":
        return model
    plain = [(name, m) for name, m in model.named_modules() if type(m) is nn.Linear]
    if model.dtype == torch.float32:
        kernel = float32_kernel(opaque)
        for name, module in plain:
            if kernel == "onednn":
                model.set_submodule(name, PackedLinear(module, for_graph=not opaque, panels=True))
            elif kernel == "mkl":
                model.set_submodule(name, SgemmPackedLinear(module))
            elif module is not model.lm_head:
                module.__class__ = FewRowsLinear
    elif can_pack(model.device, model.dtype):
        one_row = model.dtype == torch.bfloat16 and one_row_kernel_pays()
        amx = model.dtype == torch.bfloat16 and amx_kernel() is not None
        for name, module in plain:
            if amx and AmxLinear.fits(module):
                AmxLinear.convert(module)
            elif opaque or (not one_row and onednn_kernel() is not None):  # a graph calls onednn_linear
                model.set_submodule(name, PackedLinear(module, keep_weight=one_row, for_graph=not opaque,
                                                       panels=not one_row))
            elif one_row:
                module.__class__ = OneRowLinear
    return model
