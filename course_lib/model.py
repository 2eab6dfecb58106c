"""The engine's own Llama-family decoder (Llama incl. Llama 3 RoPE scaling, Mistral, Qwen2, SmolLM).

    ids -> embedding -> N x [RMSNorm -> attention(RoPE, GQA, KV) -> + -> RMSNorm -> SwiGLU MLP -> +]
        -> RMSNorm -> lm_head -> logits

The model does not own a KV cache: `forward` takes an attention backend `kv` (`course_lib.attention`) that
stores keys/values and attends; with `kv=None` it is a plain full causal forward.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import AttentionBackend, causal_attention
from .config import ModelConfig


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, computed in float32 as Llama does."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Rotation speed of each pair of dimensions: theta^(-2i/d), with Llama 3 scaling if configured."""
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    s = config.rope_scaling
    if s and s.get("rope_type", s.get("type")) == "llama3":
        # Llama 3.1: slow down low frequencies by `factor`, keep high ones, blend in between.
        factor, low, high = s["factor"], s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
        old_ctx = s["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_ctx / low, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
        inv_freq = torch.where(is_medium, blended, scaled)
    elif s and s.get("rope_type", s.get("type")) == "linear":
        inv_freq = inv_freq / s["factor"]
    elif s:
        raise ValueError(f"unsupported rope_scaling {s!r}; the engine supports 'llama3' and 'linear'")
    return inv_freq


class RotaryEmbedding(nn.Module):
    """cos/sin tables for the positions of this forward pass (RoPE, Su et al. 2021)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(config), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].float() * self.inv_freq  # [batch, seq, head_dim/2]
        emb = torch.cat([freqs, freqs], dim=-1)  # [batch, seq, head_dim]
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each (i, i + d/2) pair of x [batch, seq, heads, head_dim] by its position's angle, in Hugging
    Face's `rotate_half` form: x cos + [-x2, x1] sin, for the two halves x1, x2 of each head."""
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # [batch, seq, 1, head_dim]
    x1, x2 = x.chunk(2, dim=-1)  # [batch, seq, heads, head_dim / 2] each
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    """Grouped-query attention: num_heads query heads share num_kv_heads key/value heads."""

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        h, q, kv = config.hidden_size, config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        self.q_proj = nn.Linear(h, q, bias=config.attention_bias)
        self.k_proj = nn.Linear(h, kv, bias=config.attention_bias)
        self.v_proj = nn.Linear(h, kv, bias=config.attention_bias)
        self.o_proj = nn.Linear(q, h, bias=False)

    def forward(self, x, cos, sin, kv: AttentionBackend | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.project_qkv(x)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = causal_attention(q, k, v) if kv is None else kv.attend(self.layer_idx, q, k, v)
        return self.o_proj(out.reshape(B, T, self.num_heads * self.head_dim))

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [batch, seq, hidden] -> q [batch, seq, heads, head_dim], k and v [batch, seq, kv_heads, head_dim]."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(B, T, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(B, T, self.num_kv_heads, self.head_dim)
        return q, k, v


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """One pre-norm decoder block: attention then MLP, each added to the residual stream."""

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, kv: AttentionBackend | None = None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv)
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    """Decoder-only transformer. Parameter names follow Hugging Face's Llama (minus the `model.` prefix)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None,
                kv: AttentionBackend | None = None, last_only: bool = False,
                logits_index: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids [batch, seq] -> logits [batch, seq, vocab]. positions [batch, seq] default to where the
        backend's cache left off (0 without one). The lm_head is the biggest matmul of a small model, so callers
        that need only some positions ask for them: `last_only` keeps the last one, `logits_index` picks any."""
        B, T = input_ids.shape
        if positions is None:
            start = kv.seq_len if kv is not None else 0
            positions = torch.arange(start, start + T, device=input_ids.device).expand(B, T)
        x = self.embed_tokens(input_ids)  # [batch, seq, hidden]
        cos, sin = self.rotary(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, kv)
        if kv is not None:
            kv.advance(T)
        if last_only:
            x = x[:, -1:]
        elif logits_index is not None:
            x = x[:, logits_index]
        return self.lm_head(self.norm(x))  # [batch, seq, vocab]
