"""The quantized default model still generates: its greedy tokens against float32's on a 32-token answer.

Two fractions per method, printed (`pytest -s`) and recorded as test properties:
  teacher-forced: the quantized model reads the prompt and float32's answer; at how many of the
                  32 positions is its most likely next token float32's token? (errors do not compound)
  free-running:   the quantized model answers on its own; at how many positions does its answer
                  equal float32's? One early near-tie that flips sends the rest elsewhere, so this
                  is reported (for INT8), and only its first tokens are asserted.
The default model is a Q4_1 GGUF: blocks of 32 weights on a 16-level grid. INT4 with groups of 32
lands on the same grid and is nearly lossless; groups of 128 merge four grids into one and lose
much more, so its bound is lower.
"""
from __future__ import annotations

import copy

import pytest
import torch

from course_lib.evaluation import greedy_generate
from course_lib.quant import QuantLinear, quantize_model

PROMPT = "Explain the KV cache in one sentence."
NEW_TOKENS = 32
# method, group size, min teacher-forced agreement
CASES = [("int8", 128, 0.9), ("int4", 32, 0.9), ("int4", 128, 0.5)]


def quantized_copy(model, method: str, group_size: int):
    """A quantized model that shares the float model's tensors: the session fixture is left as it was."""
    shallow = copy.deepcopy(model, memo={id(t): t for t in list(model.parameters()) + list(model.buffers())})
    return quantize_model(shallow, method, group_size=group_size)  # swaps modules of the copy only


@pytest.fixture(scope="module")
def quantized():
    """quantized(model, method, group_size), built once per module and method."""
    cache = {}

    def get(model, method: str, group_size: int):
        if (method, group_size) not in cache:
            cache[(method, group_size)] = quantized_copy(model, method, group_size)
        return cache[(method, group_size)]

    return get


@pytest.fixture(scope="module")
def float_answer(model, tokenizer):
    prompt = tokenizer.encode_chat([{"role": "user", "content": PROMPT}])
    return prompt, greedy_generate(model, prompt, NEW_TOKENS)


@pytest.mark.parametrize("method,group_size,min_agreement", CASES)
def test_quantized_model_predicts_float32s_answer(model, quantized, float_answer, method, group_size, min_agreement,
                                                  record_property):
    """Teacher-forced: one forward over prompt + float32's answer."""
    prompt, ref = float_answer
    assert len(ref) == NEW_TOKENS
    qmodel = quantized(model, method, group_size)
    assert sum(isinstance(m, QuantLinear) for m in qmodel.modules()) == 7 * model.config.num_layers
    assert not any(isinstance(m, QuantLinear) for m in model.modules())  # the shared float model is untouched
    with torch.inference_mode():
        logits = qmodel(torch.tensor([prompt + ref]))[0]  # [prompt + 32, vocab]
    predicted = logits[len(prompt) - 1 : -1].argmax(-1)  # [32]: the next token at each answer position
    agreement = (predicted == torch.tensor(ref)).float().mean().item()
    record_property("teacher_forced_agreement", agreement)
    print(f"\n{method} g{group_size}: teacher-forced agreement with float32 {agreement:.3f}")
    assert agreement >= min_agreement


def test_int8_model_generates_float32s_answer(model, quantized, float_answer, record_property):
    """Free-running: the INT8 model answers on its own, 32 greedy tokens."""
    prompt, ref = float_answer
    answer = greedy_generate(quantized(model, "int8", 128), prompt, NEW_TOKENS)
    assert len(answer) == NEW_TOKENS
    same = sum(a == b for a, b in zip(answer, ref)) / NEW_TOKENS
    prefix = next((i for i, (a, b) in enumerate(zip(answer, ref)) if a != b), NEW_TOKENS)
    record_property("free_running_agreement", same)
    print(f"\nint8 free-running: {same:.3f} of positions equal float32's, the first {prefix} tokens identical")
    assert prefix >= 8


def test_llm_quantization_option_swaps_layers_and_generates():
    from course_lib import LLM, SamplingParams

    llm = LLM(device="cpu", quantization="int4", kv_cache_memory=16 * 2**20)
    layers = [m for m in llm.model.modules() if isinstance(m, QuantLinear)]
    assert len(layers) == 7 * llm.config.num_layers and all(m.group_size == 32 for m in layers)
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                   SamplingParams(max_tokens=12, temperature=0))[0].outputs[0]
    assert "Paris" in out.text
    with pytest.raises(ValueError, match="quantization must be None or one of"):
        LLM(device="cpu", quantization="int3")
