"""`ModelConfig`: the handful of numbers that define a Llama-family decoder.

Built from a Hugging Face `config.json` (`from_hf`) or from GGUF metadata
(`loading.gguf_file`). Every module of the engine reads its sizes from here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .dtypes import resolve_dtype

# Architectures the engine implements. All are the same decoder block; they differ
# in q/k/v bias (Qwen2) and in defaults, not in structure.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}


@dataclass
class ModelConfig:
    """Sizes and constants of a Llama-family decoder-only transformer."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int | None = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # Llama 3: {"rope_type": "llama3", "factor": ..., ...}
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 has biases on q, k, v
    architecture: str = "llama"
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    name: str = ""
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_heads
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"ModelConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )

    @property
    def gqa_group(self) -> int:
        """How many query heads share one key/value head."""
        return self.num_heads // self.num_kv_heads

    @property
    def eos_token_ids(self) -> list[int]:
        if self.eos_token_id is None:
            return []
        return [self.eos_token_id] if isinstance(self.eos_token_id, int) else list(self.eos_token_id)

    def num_parameters(self) -> int:
        """Parameter count computed from the sizes (embeddings counted once if tied)."""
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h + (q + 2 * kv if self.attention_bias else 0)
        per_layer = attn + 3 * h * i + 2 * h
        head = 0 if self.tie_word_embeddings else v * h
        return v * h + self.num_layers * per_layer + h + head

    def kv_bytes_per_token(self, dtype: torch.dtype | str = torch.float32) -> int:
        """2 (K and V) x layers x KV heads x head_dim x bytes per value."""
        itemsize = torch.empty((), dtype=resolve_dtype(dtype)).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * itemsize

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], name: str = "") -> "ModelConfig":
        """Build from the dict of a Hugging Face `config.json`."""
        archs = cfg.get("architectures") or []
        arch = next((SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            arch = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2"}.get(cfg.get("model_type", ""))
        if arch is None:
            raise ValueError(
                f"unsupported architecture {archs or cfg.get('model_type')!r} in {name or 'config'}; "
                f"the engine supports {sorted(SUPPORTED_ARCHITECTURES)}"
            )
        rope_scaling = cfg.get("rope_scaling")
        rope_theta = cfg.get("rope_theta")
        rope_params = cfg.get("rope_parameters")  # transformers >= 5 folds theta and scaling into one dict
        if isinstance(rope_params, dict):
            rope_theta = rope_params.get("rope_theta", rope_theta)
            if rope_params.get("rope_type", "default") != "default":
                rope_scaling = rope_params
        if rope_scaling is not None and rope_scaling.get("rope_type", rope_scaling.get("type")) in (None, "default"):
            rope_scaling = None
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=cfg["num_attention_heads"],
            num_kv_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
            head_dim=cfg.get("head_dim"),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6 if arch == "qwen2" else 1e-5),
            rope_theta=rope_theta or 10000.0,
            rope_scaling=rope_scaling,
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            attention_bias=cfg.get("attention_bias", arch == "qwen2"),
            architecture=arch,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=cfg.get("eos_token_id"),
            name=name,
        )
