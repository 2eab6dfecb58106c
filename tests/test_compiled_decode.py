"""The compiled decode step against the eager paged path: same attention, same logits, same greedy tokens."""
from __future__ import annotations

import time

import pytest
import torch

from course_lib.attention.paged import (
    PagedAttention,
    PagedAttentionMetadata,
    PagedKVCache,
    paged_decode_attention,
    shuffled_block_tables,
    store_kvcache,
)
from course_lib.config import ModelConfig
from course_lib.engine.llm_engine import EngineConfig, LLMEngine
from course_lib.dtypes import onednn_has_kernels
from course_lib.engine.compiled_decode import CompiledDecodeStep, decode_attention, decode_step
from course_lib.fast_path import use_fast_path
from course_lib.model import Transformer
from course_lib.quant import QuantLinear, quantize_model
from course_lib.sampling import SamplingParams


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.bfloat16, 2e-2)])
def test_decode_attention_matches_paged_decode_attention(dtype, tol):
    torch.manual_seed(0)
    num_blocks, block_size, kv_heads, heads, head_dim = 40, 4, 2, 6, 8
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    cached = [0, 3, 4, 13]  # empty cache, inside a block, a full block, several blocks
    tables = shuffled_block_tables([c + 1 for c in cached], block_size, num_blocks)  # room for the new token
    width = max(map(len, tables)) + 1  # one extra padding column, as the compiled step may add
    padded = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    q = torch.randn(len(cached), heads, head_dim, dtype=dtype)
    k_new, v_new = torch.randn(2, len(cached), kv_heads, head_dim, dtype=dtype)
    got = decode_attention(q, k_new, v_new, k_cache, v_cache, padded, torch.tensor(cached))
    # The eager path: store first, then attend over cached + 1 tokens.
    slots = torch.tensor([t[c // block_size] * block_size + c % block_size for t, c in zip(tables, cached)])
    store_kvcache(k_new, v_new, k_cache, v_cache, slots)
    minus_one = torch.tensor([t + [-1] * (width - len(t)) for t in tables], dtype=torch.int32)
    want = paged_decode_attention(q, k_cache, v_cache, minus_one, torch.tensor(cached) + 1)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def tiny_model(dtype=torch.float32) -> Transformer:
    """Random weights over the default tokenizer's vocabulary (so the engine can detokenize), two layers."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                      num_kv_heads=2, tie_word_embeddings=True, name="tiny")
    model = Transformer(cfg).to(dtype).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.5)  # spread-out logits: greedy ties would make the comparison luck
    return model


@pytest.mark.parametrize("use_cpp", [False, pytest.param(True, marks=pytest.mark.needs_cpp)])
def test_uncompiled_decode_step_matches_paged_forward(use_cpp):
    """The function that gets compiled, run eagerly, gives the engine's eager logits and K/V."""
    model = use_fast_path(tiny_model(torch.float64))
    cache = PagedKVCache(model.config, num_blocks=16, block_size=4, dtype=torch.float64)
    torch.manual_seed(1)
    cache.k_cache.normal_()
    cache.v_cache.normal_()
    ids, positions = torch.tensor([5, 17, 300]), torch.tensor([0, 5, 9])  # tokens cached before each
    tables = torch.tensor([[3, 0, 0], [1, 7, 0], [2, 9, 11]])
    logits, new_k, new_v = decode_step(model, cache, ids, positions, tables, positions.to(torch.int32), use_cpp)

    eager_cache = PagedKVCache(model.config, num_blocks=16, block_size=4, dtype=torch.float64)
    eager_cache.k_cache.copy_(cache.k_cache)
    eager_cache.v_cache.copy_(cache.v_cache)
    meta = PagedAttentionMetadata.build([[3], [1, 7], [2, 9, 11]], [1, 6, 10], [1, 1, 1], block_size=4)
    want = model(ids[None], positions[None], kv=PagedAttention(eager_cache, meta))[0]
    torch.testing.assert_close(logits, want, rtol=1e-10, atol=1e-10)
    slots = meta.slot_mapping
    torch.testing.assert_close(new_k, eager_cache.k_cache.view(2, -1, 2, 16)[:, slots])
    torch.testing.assert_close(new_v, eager_cache.v_cache.view(2, -1, 2, 16)[:, slots])


@pytest.mark.parametrize("cpp", [False, pytest.param(True, marks=pytest.mark.needs_cpp)])
def test_compiled_engine_greedy_equals_eager_engine(tokenizer, cpp):
    """torch.compile for real (a tiny model: ~1 minute on 2 cores): the same greedy tokens, the cache
    left as eager leaves it, and the compile time reported."""
    model = use_fast_path(tiny_model())
    prompts = [[1, 2, 3, 4, 5], [400, 401], list(range(1000, 1031)), [7]]  # contexts cross several blocks
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (12, 40, 9, 25)]

    def run(compile_decode: bool):
        engine = LLMEngine(model, tokenizer, EngineConfig(block_size=4, kv_cache_memory=4 * 2**20,
                                                          enable_prefix_caching=False,
                                                          compile_decode=compile_decode,
                                                          cpp_decode_attention=cpp))
        ids = engine.add_requests(prompts, params)
        outs = {o.request_id: o for o in engine.outputs(ids) if o.finished}
        return engine, [outs[i].outputs[0].token_ids for i in ids]

    eager_engine, want = run(False)
    t = time.perf_counter()
    engine, got = run(True)
    assert engine.stats.compile_seconds > 0 and engine.stats.compile_seconds <= time.perf_counter() - t
    assert eager_engine.stats.compile_seconds == 0
    assert [len(g) for g in got] == [12, 40, 9, 25]
    assert got == want
    # Without the C++ kernel only one-sequence steps are compiled: the longest request's steps alone.
    # With it, every decode step (all prompts prefill in the first step; 39 more give 40 tokens).
    step = engine.model_runner.compiled_decode
    assert step.steps == (39 if cpp else 40 - 25)
    assert step.warm  # every step fitted a graph of warmup(): only the guards that tell them apart were checked
    assert engine.block_manager.num_used_blocks == 0
    if cpp:  # tensors made outside inference mode fit no graph: the step checks every guard again, and compiles
        logits = step(torch.tensor([5, 6]), torch.tensor([3, 1]), [[0], [1]], torch.tensor([3, 5]))
        assert logits.shape == (2, model.config.vocab_size) and not step.warm


@pytest.mark.needs_cpp
@pytest.mark.skipif(not onednn_has_kernels(torch.bfloat16), reason="INT8 layers take the op at any rows here")
def test_compiled_step_has_int8_layers_choose_their_product_in_the_graph():
    """Its graphs call `course_lib::int8_linear` (tests/test_quant_linear.py): made ready before any tracing."""
    model = quantize_model(use_fast_path(tiny_model()), "int8", backend="cpu")
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    assert layers and not any(m.graph_op for m in layers)
    CompiledDecodeStep(model, PagedKVCache(model.config, num_blocks=4, block_size=4))
    assert all(m.graph_op for m in layers)


@pytest.mark.parametrize("option", ["compile_decode", "cpp_decode_attention"])
def test_engine_speed_options_checked(option):
    with pytest.raises(TypeError, match=option):
        EngineConfig(**{option: "yes"})
