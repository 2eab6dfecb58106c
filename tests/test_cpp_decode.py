"""The decode step whose layers run as one C++ call (`course_lib.accel.cpp_decode`) against the eager step it
replaces: the same kernels in the same order, so the same logits and the same K/V, bit for bit."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from course_lib import LLM, SamplingParams
from course_lib.accel import Accelerator, plan_for
from course_lib.accel.cpp_decode import CppDecodeStep
from course_lib.accel.linear import onednn_has_kernels
from course_lib.attention.paged import PagedAttentionMetadata, PagedKVCache, slots_for
from course_lib.config import ModelConfig
from course_lib.model import Transformer

pytestmark = pytest.mark.needs_cpp

CASES = [(torch.float32, None), (torch.float32, "int4"), (torch.bfloat16, None), (torch.bfloat16, "int4")]


def small_model(dtype: torch.dtype, bias: bool = False, head_dim: int = 16) -> Transformer:
    """Random weights over the default tokenizer's vocabulary, shapes the panels and the W4A8 kernel take. With
    head_dim 64 the C++ attention kernel's vector form runs, which the threads of an INT4 step share by KV head."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=49152, hidden_size=4 * head_dim, intermediate_size=96, num_layers=2, num_heads=4,
                      num_kv_heads=2, attention_bias=bias, tie_word_embeddings=True, name="small")
    model = Transformer(cfg).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.5)  # spread-out logits: greedy ties would make token comparisons luck
    return model.to(dtype)


def accelerated(dtype: torch.dtype, quantization: str | None, bias: bool = False, head_dim: int = 16):
    """The small model with this machine's plan applied, panels for 1-2 rows (oneDNN for more), W4A8 for 1-4."""
    if dtype == torch.bfloat16 and not onednn_has_kernels(dtype):
        pytest.skip("this CPU's oneDNN has no bfloat16 kernels")
    plan = dataclasses.replace(plan_for("cpu", dtype), panel_rows=2, w4a8_rows=4)
    model = small_model(dtype, bias, head_dim)
    return model, Accelerator.apply(model, plan, quantization)


@pytest.mark.parametrize("dtype,quantization,bias,head_dim", [(*case, False, 16) for case in CASES] + [
    (torch.float32, None, True, 16), (torch.float32, "int4", False, 64), (torch.bfloat16, "int4", False, 64)])
@pytest.mark.parametrize("num_seqs", [1, 3])
@torch.inference_mode()
def test_the_cpp_layers_give_the_eager_steps_logits_and_cache(dtype, quantization, bias, head_dim, num_seqs):
    """One decode step of `num_seqs` sequences at different lengths, through the eager kernels (the model's
    forward with the C++ attention backend) and through `DecodeLayers`, from the same cache: with 3 rows the
    float layers take oneDNN's path, with 1 the panels'; INT4 layers run in one parallel region, with head_dim 64
    its threads sharing the attention by KV head."""
    model, accel = accelerated(dtype, quantization, bias, head_dim)
    block_size = 4
    caches = [PagedKVCache(model.config, num_blocks=24, block_size=block_size, dtype=dtype) for _ in range(2)]
    torch.manual_seed(1)
    caches[0].k_cache.normal_()
    caches[0].v_cache.normal_()
    for c in caches[1:]:
        c.k_cache.copy_(caches[0].k_cache)
        c.v_cache.copy_(caches[0].v_cache)
    ids, positions = [5, 17, 300][:num_seqs], [0, 5, 9][:num_seqs]  # tokens cached before each
    tables = [[3], [1, 7], [2, 9, 11]][:num_seqs]
    slots = [slots_for(t, [p], block_size)[0] for t, p in zip(tables, positions)]

    meta = PagedAttentionMetadata.build(tables, [p + 1 for p in positions], [1] * num_seqs, block_size)
    want = model(torch.tensor([ids]), torch.tensor([positions]), kv=accel.attention(caches[0], meta),
                 logits_index=torch.arange(num_seqs))[0]
    step = CppDecodeStep.for_model(model, caches[1], accel.ops)
    assert step is not None and step.takes(num_seqs)
    got = step(torch.tensor(ids), torch.tensor(positions), tables, torch.tensor(slots))
    assert torch.equal(got, want)
    assert torch.equal(caches[1].k_cache, caches[0].k_cache) and torch.equal(caches[1].v_cache, caches[0].v_cache)


@pytest.mark.parametrize("dtype,quantization", CASES)
def test_the_engine_gives_the_same_tokens_with_and_without(tokenizer, dtype, quantization):
    """Greedy tokens of three requests at once, then of one, with the plan's C++ decode step and without; the
    step is used (batches of up to 4 rows here: W4A8 layers serve that many) and the eager step takes the rest."""
    if dtype == torch.bfloat16 and not onednn_has_kernels(dtype):
        pytest.skip("this CPU's oneDNN has no bfloat16 kernels")
    plan = dataclasses.replace(plan_for("cpu", dtype), panel_rows=2, w4a8_rows=4)
    prompts = ["The capital of France is", "Write a haiku about the KV cache.", "1, 2, 3, 4,", "你好", "Once"]
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    runs = {}
    for cpp in (False, True):
        llm = LLM.from_model(small_model(dtype), tokenizer, accel=dataclasses.replace(plan, cpp_decode=cpp),
                             quantization=quantization)
        graph = llm.engine.model_runner.decode_graph
        assert (type(graph) is CppDecodeStep) == cpp
        runs[cpp] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        runs[cpp].append(llm.generate(prompts[:1], params)[0].outputs[0].token_ids)
        if cpp:
            assert graph.steps >= 9 and graph.max_rows == (4 if quantization else 1 << 30)
    assert runs[True] == runs[False]


@pytest.mark.parametrize("dtype,quantization", [(torch.float32, "int8"), (torch.float16, "int4")])
def test_a_layer_without_a_cpp_twin_keeps_the_eager_step(tokenizer, dtype, quantization):
    """INT8 layers run PyTorch's op from Python, and the W4A8 kernel takes no float16 activations (a float16
    model's INT4 layers run their fallback): no C++ decode step, and the plan's other kernels still apply."""
    llm = LLM.from_model(small_model(dtype), tokenizer, accel=True, quantization=quantization)
    assert llm.accel.plan.cpp_decode and llm.engine.model_runner.decode_graph is None
    assert llm.generate(["Hello"], SamplingParams(max_tokens=3, temperature=0))[0].outputs[0].token_ids


@torch.inference_mode()
def test_a_context_past_its_block_table_is_refused_before_any_layer_runs():
    """The kernels read each sequence's context through its block table: a length the table cannot hold is an
    error, raised before a layer stores anything (the cache stays as it was)."""
    model, accel = accelerated(torch.float32, "int4", head_dim=64)
    cache = PagedKVCache(model.config, num_blocks=8, block_size=4, dtype=torch.float32)
    step = CppDecodeStep.for_model(model, cache, accel.ops)
    with pytest.raises(RuntimeError, match="context_lens"):
        step(torch.tensor([5]), torch.tensor([4]), [[1]], torch.tensor([4]))  # position 4 needs a second block
    assert not cache.k_cache.any() and not cache.v_cache.any()
