"""The compiled decode step (`course_lib.accel.compiled_decode`) against the eager paged path: same attention, same
logits, same greedy tokens."""
from __future__ import annotations

import time

import pytest
import torch

from course_lib import LLM, tolerance
from course_lib.accel.attention import decode_attention_with_new
from course_lib.accel.compiled_decode import Int8GraphLinear, decode_step, use_int8_operator
from course_lib.accel.fused_model import fuse_model
from course_lib.attention.paged import (
    PagedAttention,
    PagedAttentionMetadata,
    PagedKVCache,
    paged_decode_attention,
    store_kvcache,
)
from course_lib.config import ModelConfig
from course_lib.accel import Plan
from course_lib.accel.linear import onednn_has_kernels
from course_lib.accel.quant_linear import INT8_DEQUANTIZE_ROWS, OneDNNQuantLinear, onednn_problem
from course_lib.model import Transformer
from course_lib.quant import QuantLinear
from course_lib.sampling import SamplingParams
from tests.paged_inputs import shuffled_block_tables


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.bfloat16, 2e-2)])
def test_a_new_token_not_yet_stored_equals_storing_it_first(dtype, tol):
    """decode_attention_with_new's k_new/v_new (the compiled step's token, stored after its graph) against storing
    the token, then attending over cached + 1 tokens."""
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
    got = decode_attention_with_new(q, k_cache, v_cache, padded, torch.tensor(cached), k_new, v_new)
    # The eager path: store first, then attend over cached + 1 tokens.
    slots = torch.tensor([t[c // block_size] * block_size + c % block_size for t, c in zip(tables, cached)])
    store_kvcache(k_new, v_new, k_cache, v_cache, slots)
    minus_one = torch.tensor([t + [-1] * (width - len(t)) for t in tables], dtype=torch.int32)
    want = paged_decode_attention(q, k_cache, v_cache, minus_one, torch.tensor(cached) + 1)
    tolerance.assert_close(got, want, tol)


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
    if use_cpp:  # loading the extension defines the operator the step calls
        from course_lib.accel.build import build

        assert build().module is not None
    model = fuse_model(tiny_model(torch.float64))
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
    tolerance.assert_close(logits, want, 1e-10)
    slots = meta.slot_mapping
    torch.testing.assert_close(new_k, eager_cache.k_cache.view(2, -1, 2, 16)[:, slots])
    torch.testing.assert_close(new_v, eager_cache.v_cache.view(2, -1, 2, 16)[:, slots])


@pytest.mark.parametrize("cpp", [False, pytest.param(True, marks=pytest.mark.needs_cpp)])
def test_compiled_engine_greedy_equals_eager_engine(tokenizer, cpp):
    """torch.compile for real (a tiny model: ~1 minute on 2 cores): the same greedy tokens, the cache left as
    eager leaves it, and the compile time reported. cpp: `accel=True` (packed layers and the C++ kernels in the
    graph); else a plan of nothing but the compiled step: the reference model compiled alone."""
    prompts = [[1, 2, 3, 4, 5], [400, 401], list(range(1000, 1031)), [7]]  # contexts cross several blocks
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (12, 40, 9, 25)]

    def run(compile_decode: bool):
        accel = True if cpp else Plan("cpu", torch.float32, fused_blocks=False)
        llm = LLM.from_model(tiny_model(), tokenizer, accel=accel, compile_decode=compile_decode, block_size=4,
                             kv_cache_memory=4 * 2**20, enable_prefix_caching=False)
        return llm.engine, [o.outputs[0].token_ids for o in llm.generate(prompts, params)]

    eager_engine, want = run(False)
    t = time.perf_counter()
    engine, got = run(True)
    assert engine.stats.compile_seconds > 0 and engine.stats.compile_seconds <= time.perf_counter() - t
    assert eager_engine.stats.compile_seconds == 0
    assert [len(g) for g in got] == [12, 40, 9, 25]
    assert got == want
    # Without the C++ kernel only one-sequence steps are compiled: the longest request's steps alone.
    # With it, every decode step (all prompts prefill in the first step; 39 more give 40 tokens).
    step = engine.model_runner.decode_graph
    assert step.steps == (39 if cpp else 40 - 25)
    assert step.warm  # every step fitted a graph of warmup(): only the guards that tell them apart were checked
    assert engine.block_manager.num_used_blocks == 0
    if cpp:  # tensors made outside inference mode fit no graph: the step checks every guard again, and compiles
        logits = step(torch.tensor([5, 6]), torch.tensor([3, 1]), [[0], [1]], torch.tensor([3, 5]))
        assert logits.shape == (2, 49152) and not step.warm


def int8_layer() -> OneDNNQuantLinear:
    torch.manual_seed(5)
    return OneDNNQuantLinear.from_quant(QuantLinear.from_linear(torch.nn.Linear(64, 48), "int8"))


@pytest.mark.needs_cpp
@pytest.mark.skipif(onednn_problem("int8", 64, 48, None) is not None or not onednn_has_kernels(torch.bfloat16),
                    reason="PyTorch's INT8 op or oneDNN's bfloat16 matmuls are missing here")
def test_compiled_int8_layer_chooses_its_product_by_the_rows_as_it_runs():
    """One compiled graph (dynamic rows) calls `course_lib::int8_linear`, which takes the op below
    INT8_DEQUANTIZE_ROWS rows and the bfloat16 matmul from there: the same bits as eager steps of as many rows."""
    from course_lib.accel.build import build

    assert build().module is not None
    model = torch.nn.Sequential(int8_layer())
    assert use_int8_operator(model) == 1 and type(model[0]) is Int8GraphLinear
    fast = model[0]
    compiled = torch.compile(fast, dynamic=True, fullgraph=True)
    for rows in (2, 3, INT8_DEQUANTIZE_ROWS - 1, INT8_DEQUANTIZE_ROWS, 64):
        x = torch.randn(rows, 64)
        y = compiled(x)
        assert torch.equal(y, fast(x)), rows
        op = torch._weight_int8pack_mm(x.bfloat16(), fast.qweight, fast.scales).float() + fast.bias
        assert torch.equal(y, op) == (rows < INT8_DEQUANTIZE_ROWS), rows  # the products differ: which one ran


def test_compile_decode_option_checked():
    with pytest.raises(TypeError, match="compile_decode"):
        LLM(device="cpu", compile_decode="yes")
    with pytest.raises(ValueError, match="part of accel's plan"):
        LLM(device="cpu", compile_decode=True)
