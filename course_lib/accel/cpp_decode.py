"""A decode step whose layers run as one C++ call (`DecodeLayers` in `csrc/module.cpp`): the eager step's kernels,
without Python between them.

An eager decode step of the default model makes about 300 calls from Python into C++ (30 layers of RMSNorm,
q/k/v, RoPE, the K/V store, attention, the output projection, residual add and norm, gate/up, SiLU*up, down),
each paying Python's and PyTorch's dispatch. For one sequence on a CPU that costs as much as the matmuls. Here
Python embeds the tokens and computes RoPE's angles, one C++ call runs every layer, and Python applies the last
norm and the lm_head: the same kernels in the same order, so the same logits as the eager step bit for bit
(`tests/test_cpp_decode.py`). Unlike `compile_decode`, nothing is compiled: it is ready as soon as the model is.

    step(input_ids [n], positions [n], block_tables, slot_mapping [n]) -> logits [n, vocab], K/V stored
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..attention.paged import PagedKVCache
from ..host_copy import staged
from ..model import Transformer
from .fused_model import FusedBlock
from .linear import PackedLinear
from .w4a8 import W4A8PackedLinear


class CppDecodeStep:
    """Decode-only steps of up to `max_rows` sequences through `DecodeLayers`; the model runner's decode graph.

    Build it with `for_model`, which says None where a layer has no C++ twin (say, an INT8 layer)."""

    def __init__(self, model: Transformer, layers, max_rows: int):
        self.model, self.layers, self.max_rows = model, layers, max_rows
        self.steps = 0  # decode steps run through the C++ layers

    @classmethod
    def for_model(cls, model: Transformer, kv_cache: PagedKVCache, ops) -> "CppDecodeStep | None":
        """The C++ layers of `model` (fused, on the CPU, every linear layer a `PackedLinear` or a
        `W4A8PackedLinear`, norms and cache in the model's dtype), or None where one of these does not hold."""
        cfg, dtype = model.config, model.dtype
        blocks = list(model.layers)
        if model.device.type != "cpu" or not all(type(b) is FusedBlock and b.ops is not None for b in blocks):
            return None
        if kv_cache.k_cache.dtype != dtype or not kv_cache.k_cache.is_contiguous():
            return None
        layers = ops.DecodeLayers(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps)
        max_rows = []
        for i, block in enumerate(blocks):
            norms = (block.input_layernorm.weight, block.post_attention_layernorm.weight)
            linears = (block.self_attn.qkv_proj, block.self_attn.o_proj, block.mlp.gate_up_proj, block.mlp.down_proj)
            made = [_decode_linear(ops, linear, dtype) for linear in linears]
            if None in made or any(w.dtype != dtype for w in norms):
                return None
            max_rows += [rows for _, rows in made]
            layers.add(*norms, kv_cache.k_cache[i], kv_cache.v_cache[i], *(linear for linear, _ in made))
        return cls(model, layers, min(max_rows))

    def takes(self, num_seqs: int) -> bool:
        """Whether a decode-only step of `num_seqs` sequences runs here (more: the eager step)."""
        return num_seqs <= self.max_rows

    @torch.inference_mode()
    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, block_tables: list[list[int]],
                 slot_mapping: torch.Tensor) -> torch.Tensor:
        """input_ids, positions, slot_mapping [n]; block_tables: each sequence's blocks. Stores the new K/V and
        returns logits [n, vocab]."""
        model = self.model
        x = model.embed_tokens(input_ids)  # [n, hidden]
        cos, sin = model.rotary(positions[None], x.dtype)  # [1, n, head_dim] each
        width = max(map(len, block_tables))
        tables = staged([t + [0] * (width - len(t)) for t in block_tables], torch.int32, x.device)  # [n, blocks]
        x = self.layers.run(x, cos[0], sin[0], tables, (positions + 1).to(torch.int32), slot_mapping)
        self.steps += 1
        return model.lm_head(model.norm(x))  # [n, vocab]


def _decode_linear(ops, linear: nn.Module, dtype: torch.dtype):
    """(`linear` as the C++ loop calls it, the most rows it serves there), or None if it has no C++ twin (the W4A8
    kernel takes float32 and bfloat16 activations: a float16 model's W4A8 layers run their fallback)."""
    if type(linear) is W4A8PackedLinear and dtype in (torch.float32, torch.bfloat16):
        return ops.DecodeLinear(linear.packed, None, linear.bias, linear.out_features, 0, linear.isa, True), \
            linear.max_rows
    if type(linear) is PackedLinear:
        return ops.DecodeLinear(linear.packed_weight, linear.panels, linear.bias, linear.out_features,
                                linear.panel_rows, "", False), 1 << 30
    return None
