"""Speed for particular machines, kept apart from the reference engine: `LLM(accel=True)`.

The reference engine (`course_lib.model`, `attention.paged`, `sampling`, `engine/`) is pure PyTorch and is what
the chapters read. Everything here exists only to run the same numbers faster on a given machine:

    plan.py            `plan_for(device, dtype)`: what this machine supports, decided once (`Plan`)
    build.py           builds `csrc/` (C++: fused_ops, linear, attention, module) once per machine
    fused_model.py     the fused twin of the model: q/k/v and gate/up as one matmul each, one-pass elementwise ops
    fused_ops.py       RMSNorm, residual add, RoPE and SiLU*up through the C++ kernels
    w4a8.py            INT4 layers through the W4A8 kernel: Q4_1 weights times int8 activations, integer dots
    linear.py          `PackedLinear`: a weight packed once for oneDNN, and as panels for the rows of a decode step
    quant_linear.py    quantized layers through oneDNN's packed INT8/INT4 ops (CPU) or `triton_quant.py` (CUDA)
    attention.py       `PagedAttention` with the C++ (CPU) or Triton (CUDA) kernel
    triton_paged.py    the Triton decode-attention kernel, long contexts split across programs (flash-decoding)
    triton_targets.py  the Triton kernels compiled for a T4, A100, L4 and H100 with no GPU here (a test checks them)
    triton_quant.py    the Triton kernels of quantized layers: dequantize inside the matmul
    cpp_decode.py      the decode step's layers in one C++ call: the eager step's kernels, no Python between them
    compiled_decode.py the decode step through `torch.compile` (`compile_decode=True`)
    cuda_graphs.py     decode steps as CUDA graphs, one per batch-size bucket (`cuda_graphs`, CUDA's default)

`accelerate` is the one door from the engine: it makes the plan from `LLM`'s options (`accel`, `compile_decode`,
`enforce_eager`) and `Accelerator.apply`, the one place a plan touches a model, applies it; the engine's model
runner then asks the accelerator for its attention backend and its decode graph (CUDA graphs, or compiled).
`python -m course_lib.accel` prints the plan for this machine; `python -m course_lib.accel build` builds the
kernels ahead of time.
"""
from __future__ import annotations

import dataclasses

import torch

from ..attention.paged import PagedAttention, PagedAttentionMetadata, PagedKVCache
from ..model import Transformer
from .plan import Plan, check_triton_dtype, plan_for

__all__ = ["Accelerator", "Plan", "accelerate", "plan_for"]


def accelerate(model: Transformer, config, draft: Transformer | None = None) -> "Accelerator":
    """The plan `config` (the engine's `EngineConfig`) asks for: this machine's with `accel=True`, or the `Plan`
    given, with `compile_decode` added and CUDA graphs off under `enforce_eager`; applied to `model`, and to the
    speculative `draft` model's quantized layers."""
    check_triton_dtype(model.device, model.dtype)
    if config.accel is True:
        plan = plan_for(model.device, model.dtype, config.compile_decode, config.enforce_eager)
    else:
        plan = dataclasses.replace(config.accel, compile_decode=config.accel.compile_decode or config.compile_decode,
                                   cuda_graphs=config.accel.cuda_graphs and not config.enforce_eager)
    return Accelerator.apply(model, plan, config.quantization, config.group_size, config.max_num_seqs,
                             config.max_model_len, draft)


class Accelerator:
    """A `Plan` applied to one model, and what the engine's model runner takes from it."""

    def __init__(self, plan: Plan, max_num_seqs: int = 64, max_model_len: int | None = None):
        from .build import build

        self.plan = plan
        self.max_num_seqs, self.max_model_len = max_num_seqs, max_model_len  # the engine's: size the CUDA graphs
        self.ops = build().module if plan.needs_kernels else None  # built already by plan_for: no build here
        self.decode_graph = None  # made by `decode_step`
        if plan.needs_kernels and self.ops is None:
            raise RuntimeError(f"this plan needs the C++ kernels, which did not build: {build().problem}")

    @classmethod
    def apply(cls, model: Transformer, plan: Plan, quantization: str | None = None, group_size: int = 32,
              max_num_seqs: int = 64, max_model_len: int | None = None,
              draft: Transformer | None = None) -> "Accelerator":
        """Change `model` in place as `plan` says: fuse its blocks, then quantize (so the fused matmuls are
        quantized whole) and give the quantized layers their kernels, then pack its remaining linear layers.
        A speculative `draft` model, quantized already, gets the same quantized kernels. Returns the accelerator.

        `max_num_seqs`, `max_model_len`: the engine's limits (None: as long as the model and cache allow),
        which set the CUDA graphs' batch sizes and block-table width."""
        from ..quant import quantize_model
        from .fused_model import fuse_model
        from .linear import pack_linears
        from .quant_linear import use_quant_kernels

        accel = cls(plan, max_num_seqs, max_model_len)
        if plan.fused_blocks:
            fuse_model(model, accel.ops if plan.fused_ops else None)
        if quantization == "int4" and group_size == 32 and plan.w4a8_rows and model.device.type == "cpu":
            from .w4a8 import use_w4a8  # before quantize_model: the W4A8 layers read the float weights

            use_w4a8(model, accel.ops, plan.w4a8_rows)
        if quantization is not None:
            quantize_model(model, quantization, group_size=group_size)
        for m in (model, draft) if draft is not None else (model,):
            use_quant_kernels(m, plan.quant_kernels)
        if plan.packed_linears and model.device.type == "cpu":
            pack_linears(model, accel.ops, plan.panel_rows, for_graph=plan.compile_decode)
        return accel

    def attention(self, kv_cache: PagedKVCache, metadata: PagedAttentionMetadata) -> PagedAttention:
        """The attention backend of one engine step."""
        from .attention import CppPagedAttention, TritonPagedAttention

        if self.plan.attention == "cpp":
            return CppPagedAttention(kv_cache, metadata, self.ops)
        if self.plan.attention == "triton":
            return TritonPagedAttention(kv_cache, metadata)
        return PagedAttention(kv_cache, metadata)

    def stats(self) -> dict[str, float]:
        """What making the decode graph cost at start-up, as `EngineStats` counts it."""
        graph = self.decode_graph
        if graph is None:
            return {}
        from .cuda_graphs import CUDAGraphDecodeStep

        if isinstance(graph, CUDAGraphDecodeStep):
            return {"cuda_graphs": len(graph.graphs), "graph_capture_seconds": graph.capture_seconds}
        return {"compile_seconds": graph.compile_seconds} if hasattr(graph, "compile_seconds") else {}

    def decode_step(self, model: Transformer, kv_cache: PagedKVCache):
        """The decode graph for decode-only batches, made ready now: with `cuda_graphs` one graph per batch
        bucket, captured (seconds); else with `compile_decode` compiled (minutes on a CPU); else with
        `cpp_decode` the layers as one C++ call, where every layer has its C++ twin; else None."""
        self.decode_graph = self._make_decode_step(model, kv_cache)
        return self.decode_graph

    def _make_decode_step(self, model: Transformer, kv_cache: PagedKVCache):
        if self.plan.cuda_graphs:
            from .cuda_graphs import CUDAGraphDecodeStep

            limit = min(model.config.max_position_embeddings, kv_cache.num_blocks * kv_cache.block_size)
            graphs = CUDAGraphDecodeStep(model, kv_cache, self.plan.attention, self.max_num_seqs,
                                         min(limit, self.max_model_len or limit))
            graphs.warmup()
            return graphs
        if self.plan.cpp_decode and not self.plan.compile_decode and self.ops is not None:
            from .cpp_decode import CppDecodeStep

            return CppDecodeStep.for_model(model, kv_cache, self.ops)
        if not self.plan.compile_decode:
            return None
        from .compiled_decode import CompiledDecodeStep

        step = CompiledDecodeStep(model, kv_cache, use_cpp=self.plan.attention == "cpp")
        step.warmup()
        return step
