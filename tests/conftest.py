"""Shared fixtures: the default model, its transformers twin (the reference), tiny random models."""
from __future__ import annotations

import os

import pytest
import torch

from course_lib.accel.build import missing_tools

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Property tests (hypothesis): a fixed set of examples by default, so CI is repeatable;
# HYPOTHESIS_PROFILE=explore searches ten times as many, with a new seed each run.
from hypothesis import settings  # noqa: E402

settings.register_profile("repeatable", max_examples=300, derandomize=True, database=None)
settings.register_profile("explore", max_examples=3000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


def pytest_collection_modifyitems(config, items):
    skips = {"cuda": None if torch.cuda.is_available() else pytest.mark.skip(reason="needs a CUDA GPU"),
             "needs_cpp": pytest.mark.skip(reason="no C++ compiler or ninja here") if missing_tools() else None}
    for item in items:
        for marker, skip in skips.items():
            if skip is not None and marker in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def gguf_path():
    from course_lib.loading import default_gguf_path

    return default_gguf_path()


@pytest.fixture(scope="session")
def model():
    """The engine's SmolLM2-135M-Instruct, float32, CPU. Shared: tests must not modify it."""
    import course_lib

    return course_lib.load_model(device="cpu")


@pytest.fixture(scope="session")
def tokenizer():
    import course_lib

    return course_lib.load_tokenizer()


@pytest.fixture(scope="session")
def hf_model(gguf_path):
    """transformers' own reading of the same GGUF file: the reference."""
    from course_lib.loading import load_reference_model

    return load_reference_model(torch.float32)


@pytest.fixture(scope="session")
def hf_tokenizer(gguf_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)


@pytest.fixture(scope="session")
def llm():
    from course_lib import LLM

    return LLM(device="cpu")


@pytest.fixture
def tiny():
    """A builder of a 3-layer float64 model with random weights, in eval mode: `tiny(attention_bias=False)`."""
    from course_lib.config import ModelConfig
    from course_lib.model import Transformer

    def build(attention_bias: bool = False) -> Transformer:
        cfg = ModelConfig(vocab_size=97, hidden_size=48, intermediate_size=80, num_layers=3, num_heads=6,
                          num_kv_heads=2, attention_bias=attention_bias, tie_word_embeddings=False,
                          max_position_embeddings=128)
        torch.manual_seed(0)
        model = Transformer(cfg).double()
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.2)
        return model.eval()

    return build


def save_random_hf_model(path, arch: str, **overrides):
    """A small random-weight transformers model of a real architecture, saved as safetensors."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    base = dict(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)
    base.update(overrides)
    cfg_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[arch]
    torch.manual_seed(0)
    hf = model_cls(cfg_cls(**base)).eval()
    with torch.no_grad():  # random but not tiny: make every parameter matter, norms and biases too
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    hf.save_pretrained(path, safe_serialization=True)
    return hf


@pytest.fixture(scope="session")
def llama3_dir(tmp_path_factory):
    """Llama with Llama 3.1 RoPE scaling and untied embeddings."""
    path = tmp_path_factory.mktemp("llama3")
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64}
    hf = save_random_hf_model(path, "llama", rope_scaling=rope, rope_theta=500000.0, tie_word_embeddings=False)
    return path, hf


@pytest.fixture(scope="session")
def qwen2_dir(tmp_path_factory):
    """Qwen2: q/k/v biases, tied embeddings."""
    path = tmp_path_factory.mktemp("qwen2")
    hf = save_random_hf_model(path, "qwen2", tie_word_embeddings=True, rope_theta=1000000.0)
    return path, hf


@pytest.fixture
def run_triton_interpreted():
    """Run a test module as a script with TRITON_INTERPRET=1 (Triton reads it once, at import) and
    return its stdout; the script compares its kernels with the PyTorch twins and exits non-zero on a mismatch."""
    import subprocess
    import sys

    pytest.importorskip("triton")

    def run(path: str) -> str:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # `tests.` imports resolve from here
        env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.run([sys.executable, path], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    return run


@pytest.fixture
def fresh_dynamo():
    """Forget what torch.compile traced before this test. Tests that compile a new `PackedLinear` each
    recompile the same code object (its `forward`); across a module those recompiles pass Dynamo's limit
    of 8, and a `fullgraph=True` compile then fails for that reason instead of the one under test."""
    torch._dynamo.reset()
    yield
