"""Every chapter's engines hold what the chapter sends them, on the GPU model too.

On CUDA with a network, chapters 05, 07, 08 and 09 load SmolLM2-1.7B-Instruct (`course_lib.chapter.GPU_MODEL`): 8.5x
the KV bytes per token of the default model. A budget written in bytes for the small model refuses the big one's
prompts (chapter 07's old `KV_MEMORY = 128 MiB` held 682 tokens of it, and the chapter sent 4,096). This test reads
each chapter's own constants from its code cells, evaluated with the GPU model's published config on a T4 (the
smallest card learners use) and no weights, sizes the engines as `LLMEngine` does (`kv_pool`), and checks that each
request fits, and that no chapter on the chapter's model states a KV budget as a bare number of bytes.
"""
from __future__ import annotations

import ast
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from IPython.core.inputtransformer2 import TransformerManager

from course_lib.attention.paged import PagedKVCache
from course_lib.chapter import GPU_MODEL, ChapterSetup
from course_lib.config import ModelConfig
from course_lib.engine.kv_budget import kv_pool
from course_lib.engine.llm_engine import EngineConfig
from course_lib.loading import load_tokenizer
from course_lib.profiling.loadtest import synthetic_prompt_ids

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"

# config.json of HuggingFaceTB/SmolLM2-1.7B-Instruct and of SmolLM2-135M-Instruct (the fields the engine reads)
GPU_CONFIG = ModelConfig.from_hf({
    "architectures": ["LlamaForCausalLM"], "vocab_size": 49152, "hidden_size": 2048, "intermediate_size": 8192,
    "num_hidden_layers": 24, "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 8192,
    "rope_theta": 130000, "rms_norm_eps": 1e-5, "tie_word_embeddings": True}, "SmolLM2-1.7B-Instruct")
DEFAULT_CONFIG = ModelConfig.from_hf({
    "architectures": ["LlamaForCausalLM"], "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
    "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 8192,
    "rope_theta": 100000, "rms_norm_eps": 1e-5, "tie_word_embeddings": True}, "SmolLM2-135M-Instruct")
T4_BYTES = 15_360 * 2**20  # what nvidia-smi reports for a Tesla T4
CONTEXT_BYTES = 2**30  # the CUDA context, cuBLAS workspaces and activations, held back from the card


@dataclass
class Contract:
    """What a chapter sends: per engine (options as code over the chapter's names), the requests' lengths in tokens.

    `together`: the requests one engine holds at once (their KV must fit side by side), each a prompt + output.
    `models`: the weights the chapter holds on the card at once, as dtypes (what the KV cache cannot have).
    """

    chapter_model: bool  # loads setup.model (the GPU model on CUDA); else always the default model
    engines: dict[str, tuple[str, list[str]]]  # name: (EngineConfig options, requests held together)
    models: list[torch.dtype] = field(default_factory=lambda: [torch.float16])
    contexts: list[str] = field(default_factory=list)  # contexts measured outside an engine (their own cache)


CONTRACTS = {
    "05": Contract(True, {"llm": ("dict(enable_prefix_caching=False)", ["max(lengths) + 8"])},
                   contexts=["max(contexts)", "CONTEXT"]),
    "06": Contract(False, {"llm": ("dict()", ["len(prompt_ids) + N_NEW", "MAX_LEN"])}),
    "07": Contract(True, {"chats": ("dict(kv_cache_memory=KV_MEMORY)",
                                    [f"len(tok.encode(prompts[{i}])) + 24" for i in range(16)]),
                          "long prompt": ("dict(kv_cache_memory=KV_MEMORY, max_num_batched_tokens=CHUNK)",
                                          ["len(long_prompt) + 4"]
                                          + [f"len(tok.encode(chatters[{i}])) + 24" for i in range(3)])}),
    "08": Contract(True, {"llm": ("dict()", ["128 + 48"]), "llm_q": ("dict()", ["128 + 48"])},
                   models=[torch.float16, torch.float32, torch.float16]),
    "09": Contract(True, {"llm": ("dict()", ["max(lengths) + 8", "512 + 1"] + ["64 + 16"] * 8)}),
    "10": Contract(False, {"llm": ("dict(kv_cache_memory=256 * 2**20)", ["4096"] + ["64 + 24"] * 8)}),
    "12": Contract(False, {"llm": ("dict()", ["64 + 40"] * 16)}),
}


def notebook(chapter: str) -> dict:
    (path,) = NOTEBOOKS.glob(f"{chapter}_*.ipynb")
    return json.loads(path.read_text(encoding="utf-8"))


def code_statements(nb: dict):
    """The top-level statements of every code cell, in order (IPython's `!cmd` lines as the Python it runs)."""
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            yield from ast.parse(TransformerManager().transform_cell("".join(cell["source"]))).body


def chapter_namespace(chapter: str, nb: dict, config: ModelConfig, tok) -> dict:
    """The chapter's constants as they come out on a T4 with `config`: each top-level assignment that can be
    evaluated from what the chapter defined before it (loading, generating and timing cannot and are skipped)."""
    model = SimpleNamespace(config=config, device=torch.device("cuda"), dtype=torch.float16)
    setup = ChapterSetup(torch.device("cuda"), torch.float16, 1, "Tesla T4",
                         GPU_MODEL if CONTRACTS[chapter].chapter_model else None)
    ns = {"setup": setup, "model": model, "cfg": config, "tok": tok, "torch": torch, "np": np, "math": math,
          "PagedKVCache": PagedKVCache, "synthetic_prompt_ids": synthetic_prompt_ids, "on_gpu": True,
          "ceilings": SimpleNamespace(ridge_point=989e12 / 3.35e12)}  # an H100's, the highest ridge of the cards
    fixed = set(ns)
    for stmt in code_statements(nb):
        if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
            continue
        target = stmt.targets[0]  # a name, or names unpacked from a tuple (A, B = 1, 2)
        names = [target] if isinstance(target, ast.Name) else getattr(target, "elts", [None])
        if not all(isinstance(n, ast.Name) for n in names) or any(n.id in fixed for n in names):
            continue  # the stand-ins above are what the chapter's loading would have made
        try:
            value = eval(compile(ast.Expression(stmt.value), chapter, "eval"), dict(ns))
            values = [value] if isinstance(target, ast.Name) else list(value)
        except Exception:  # needs something this test does not build (a loaded model, a measurement)
            continue
        ns.update((n.id, v) for n, v in zip(names, values))
    return ns


def free_on_card(config: ModelConfig, dtypes: list[torch.dtype]) -> int:
    weights = sum(config.num_parameters() * torch.empty((), dtype=d).element_size() for d in dtypes)
    return T4_BYTES - CONTEXT_BYTES - weights


def sizing_problems(chapter: str, nb: dict, tok) -> list[str]:
    """What does not fit when `nb` (chapter `chapter`) runs on a T4 with its model: one sentence per problem."""
    contract = CONTRACTS[chapter]
    config = GPU_CONFIG if contract.chapter_model else DEFAULT_CONFIG
    ns = chapter_namespace(chapter, nb, config, tok)
    free = free_on_card(config, contract.models)
    if free <= 0:
        return [f"chapter {chapter}'s models do not fit a T4"]
    problems = []
    for name, (options, requests) in contract.engines.items():
        engine = EngineConfig(**eval(options, dict(ns)))
        try:
            blocks, max_model_len = kv_pool(config, engine, "cuda", torch.float16, free_memory=lambda _: free)
        except ValueError as error:
            problems.append(f"chapter {chapter}'s {name}: {error}")
            continue
        lengths = [eval(r, dict(ns)) for r in requests]
        held = sum(-(-n // engine.block_size) for n in lengths)
        print(f"chapter {chapter} {name}: {blocks * engine.block_size:,} tokens of KV "
              f"({config.kv_bytes_per_token(torch.float16):,} bytes each), max_model_len {max_model_len:,}; "
              f"requests {lengths}")
        if max(lengths) >= max_model_len:
            problems.append(f"chapter {chapter}'s {name}: a {max(lengths):,}-token request is refused "
                            f"(max_model_len {max_model_len:,})")
        if held > blocks:
            problems.append(f"chapter {chapter}'s {name}: {held} blocks held together, the pool has {blocks}")
    problems += [f"chapter {chapter}: a context of {n:,} is past the model's {config.max_position_embeddings:,}"
                 for n in (eval(e, dict(ns)) for e in contract.contexts) if n > config.max_position_embeddings]
    return problems + [f"chapter {chapter}: kv_cache_memory={e} is bytes that fit one model only"
                       for e in literal_budgets(nb) if contract.chapter_model]


def literal_budgets(nb: dict) -> list[str]:
    """Each `kv_cache_memory=` in a chapter's code that is a bare number of bytes (evaluates with no names)."""
    found = []
    for stmt in code_statements(nb):
        for node in ast.walk(stmt):
            if isinstance(node, ast.keyword) and node.arg == "kv_cache_memory":
                found.append(node.value)
            if isinstance(node, ast.Dict):  # {"kv_cache_memory": ...} passed on as options
                found += [v for k, v in zip(node.keys, node.values)
                          if isinstance(k, ast.Constant) and k.value == "kv_cache_memory"]
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id.startswith("KV_MEMORY")
                                                    for t in node.targets):
                found.append(node.value)
    literal = []
    for expr in map(ast.unparse, found):
        try:
            eval(expr, {"__builtins__": {}})
            literal.append(expr)
        except Exception:
            pass
    return literal


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()  # the default model's: SmolLM2-1.7B uses the same tokenizer


@pytest.mark.parametrize("chapter", sorted(CONTRACTS))
def test_every_request_fits_its_engine(chapter, tok):
    assert sizing_problems(chapter, notebook(chapter), tok) == []


def test_the_old_chapter_07_is_caught(tok):
    """Chapter 07 as it was before its budget followed the model: 128 MiB is 682 tokens of the GPU model (a
    672-token window), and section 4 sends a 4,096-token prompt."""
    nb = notebook("07")
    old = {"cells": [{"cell_type": "code", "source": "KV_MEMORY = 128 * 2**20  # 128 MiB per engine"}] + nb["cells"]}
    old["cells"] = [  # today's budget in tokens left out, everything else as it is
                    dict(c, source="".join(c["source"]).replace("KV_MEMORY = KV_TOKENS", "KV_MEMORY_NOW = KV_TOKENS"))
                    if c["cell_type"] == "code" else c for c in old["cells"]]
    problems = sizing_problems("07", old, tok)
    assert any("4,100-token request is refused (max_model_len 672)" in p for p in problems), problems
    assert any("kv_cache_memory" in p or "128 * 2 ** 20" in p for p in problems), problems
