"""Well-known models as their Hugging Face `config.json` sizes, and `load_config` for any model.

Only the fields the planner reads are copied (sizes, tying, context window), with the values of
each model's own `config.json` on the Hugging Face Hub.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from ..config import ModelConfig
from ..loading import DEFAULT_MODEL_NAME, read_json_object
from .names import lookup

PRESETS: dict[str, dict[str, Any]] = {
    "SmolLM2-135M-Instruct": {  # HuggingFaceTB/SmolLM2-135M-Instruct: the course's default model
        "architectures": ["LlamaForCausalLM"], "hidden_size": 576, "intermediate_size": 1536,
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
        "tie_word_embeddings": True, "max_position_embeddings": 8192, "rope_theta": 100000.0,
    },
    "Llama-3-8B": {  # meta-llama/Meta-Llama-3-8B(-Instruct)
        "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
        "tie_word_embeddings": False, "max_position_embeddings": 8192, "rope_theta": 500000.0,
    },
    "Llama-3-70B": {  # meta-llama/Meta-Llama-3-70B(-Instruct)
        "architectures": ["LlamaForCausalLM"], "hidden_size": 8192, "intermediate_size": 28672,
        "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256,
        "tie_word_embeddings": False, "max_position_embeddings": 8192, "rope_theta": 500000.0,
    },
    "Llama-3.1-405B": {  # meta-llama/Llama-3.1-405B(-Instruct): the largest dense Llama
        "architectures": ["LlamaForCausalLM"], "hidden_size": 16384, "intermediate_size": 53248,
        "num_hidden_layers": 126, "num_attention_heads": 128, "num_key_value_heads": 8, "vocab_size": 128256,
        "tie_word_embeddings": False, "max_position_embeddings": 131072, "rope_theta": 500000.0,
    },
    "Qwen2.5-7B": {  # Qwen/Qwen2.5-7B-Instruct
        "architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584, "intermediate_size": 18944,
        "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
        "tie_word_embeddings": False, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
    },
    "Qwen2.5-72B": {  # Qwen/Qwen2.5-72B-Instruct
        "architectures": ["Qwen2ForCausalLM"], "hidden_size": 8192, "intermediate_size": 29568,
        "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 152064,
        "tie_word_embeddings": False, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
    },
    "Mistral-7B": {  # mistralai/Mistral-7B-Instruct-v0.3
        "architectures": ["MistralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32768,
        "tie_word_embeddings": False, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
    },
}

DEFAULT_MODEL = DEFAULT_MODEL_NAME


def load_config(model: ModelConfig | Mapping[str, Any] | str | Path) -> ModelConfig:
    """A `ModelConfig` from itself, a `config.json` dict, a preset name (case-insensitive), or a path to
    a `config.json`, a Hugging Face checkout or a `.gguf` file (only its metadata is read)."""
    if isinstance(model, ModelConfig):
        return model
    if isinstance(model, Mapping):
        return ModelConfig.from_hf(dict(model), name=str(model.get("_name_or_path", "")))
    path = Path(model)
    if path.suffix == ".gguf" and path.is_file():
        from ..gguf_file import read_gguf_config

        return read_gguf_config(path)
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if path.name.endswith(".json") and path.is_file():
        return ModelConfig.from_hf(read_json_object(path), name=path.parent.name)
    name = lookup(str(model), PRESETS, "model", also="or a path to a config.json, a model directory or a .gguf file")
    return ModelConfig.from_hf(PRESETS[name], name=name)

