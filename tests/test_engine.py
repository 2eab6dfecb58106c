"""The serving engine: batching equals one-at-a-time, preemption and chunked prefill, no leaked blocks, prefix caching."""
from __future__ import annotations

import pytest

from course_lib import SamplingParams
from course_lib.attention.paged import PagedKVCache
from course_lib.engine.llm_engine import EngineConfig, LLMEngine

QUESTIONS = [
    "What is the capital of France?", "Write a haiku about GPUs.", "你好，请介绍一下你自己。", "List three colors.",
    "Explain the KV cache in one sentence.", "What is 12 times 12?", "Translate 'good morning' into Chinese.",
    "Why is the sky blue? Answer briefly, in a way a ten year old child would understand.", "Name a fruit.",
    "Give me a tip for writing clean Python code, and explain why it helps other readers of the code.",
    "什么是大语言模型的预填充阶段？", "Count from one to five.", "Who wrote Hamlet?", "Say hello in French.",
    "Describe a cat in five words.", "What does a tokenizer do in a language model pipeline?",
]
GREEDY = SamplingParams(max_tokens=12, temperature=0)


def run_all(engine, prompts, params=GREEDY):
    ids = [engine.add_request(p, params) for p in prompts]
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    return [done[i].outputs[0].token_ids for i in ids]


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]


@pytest.fixture(scope="module")
def one_at_a_time(model, tokenizer, prompts):
    engine = LLMEngine(model, tokenizer, EngineConfig(kv_cache_memory=64 * 2**20))
    return [run_all(engine, [p])[0] for p in prompts]


def assert_all_blocks_free(engine):
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and bm.num_used_blocks == 0
    assert all(b.ref_count == 0 for b in bm.blocks)
    assert not engine.scheduler.running and not engine.scheduler.waiting and not engine.requests


def test_batched_equals_one_at_a_time(model, tokenizer, prompts, one_at_a_time):
    engine = LLMEngine(model, tokenizer, EngineConfig(kv_cache_memory=64 * 2**20))
    assert len({len(tokenizer.encode(p)) for p in prompts}) > 8  # prompts of many lengths
    assert run_all(engine, prompts) == one_at_a_time
    assert max(engine.stats.batch_sizes) == len(prompts)  # they really ran together
    assert_all_blocks_free(engine)


def test_preemption_and_chunked_prefill_keep_outputs_identical(model, tokenizer, prompts, one_at_a_time):
    block_bytes = PagedKVCache.bytes_per_block(model.config, 16)
    config = EngineConfig(kv_cache_memory=14 * block_bytes, max_num_batched_tokens=40, enable_prefix_caching=False)
    engine = LLMEngine(model, tokenizer, config)
    assert engine.block_manager.num_blocks == 14  # far fewer than 16 prompts of 2-5 blocks need
    assert run_all(engine, prompts) == one_at_a_time
    assert engine.stats.preemptions > 0, "the budget was meant to force preemption"
    assert engine.stats.partial_prefills > 0, "the token budget was meant to force chunked prefill"
    assert max(engine.stats.batch_tokens) <= 40
    assert_all_blocks_free(engine)


def test_abort_returns_blocks_at_once(model, tokenizer, prompts):
    engine = LLMEngine(model, tokenizer, EngineConfig(kv_cache_memory=16 * 2**20))
    ids = [engine.add_request(p, SamplingParams(max_tokens=50, temperature=0)) for p in prompts[:6]]
    engine.step()
    engine.step()
    assert engine.block_manager.num_used_blocks > 0
    engine.abort_request(ids[0])
    engine.abort_request(ids[1])
    assert len(engine.scheduler.running) == 4
    for rid in ids[2:]:
        engine.abort_request(rid)
    assert_all_blocks_free(engine)


def test_prefix_cache_skips_shared_prefix(model, tokenizer):
    system = ("You are a patient teacher of machine learning. You explain inference of large language "
              "models with short, precise sentences and small examples. You know tokenization, attention, "
              "the KV cache, batching, scheduling, quantization and profiling, and you always say which "
              "of these a question is about before you answer it. Always answer in English.")
    conv = lambda q: tokenizer.apply_chat_template([{"role": "system", "content": system},  # noqa: E731
                                                    {"role": "user", "content": q}])
    first, second = conv("What is prefill?"), conv("What is decode?")
    shared = len(tokenizer.encode(system))
    assert shared >= 64
    cold = LLMEngine(model, tokenizer, EngineConfig(kv_cache_memory=16 * 2**20, enable_prefix_caching=False))
    expected = run_all(cold, [second])[0]
    engine = LLMEngine(model, tokenizer, EngineConfig(kv_cache_memory=16 * 2**20))
    run_all(engine, [first])
    before = engine.stats.prefill_tokens
    assert run_all(engine, [second])[0] == expected  # identical output with reused KV blocks
    computed = engine.stats.prefill_tokens - before
    prompt_len = len(tokenizer.encode(second))
    assert computed <= prompt_len - 64  # at least 64 shared prompt tokens were not recomputed
    assert engine.block_manager.prefix_cache_hits >= 64 and engine.stats.prefix_cache_hit_rate > 0
    assert_all_blocks_free(engine)


def test_engine_rejects_bad_input(model, tokenizer):
    engine = LLMEngine(model, tokenizer, EngineConfig(kv_cache_memory=16 * 2**20))
    with pytest.raises(ValueError, match="context window"):
        engine.add_request([5] * (engine.max_model_len + 1))
    with pytest.raises(TypeError, match="prompt must be"):
        engine.add_request(3.14)
    with pytest.raises(ValueError, match="max_num_seqs"):
        LLMEngine(model, tokenizer, EngineConfig(kv_cache_memory=16 * 2**20, max_num_seqs=0))
    assert_all_blocks_free(engine)


def test_llm_stream_abandoned_early_frees_blocks(llm):
    gen = llm.stream("Once upon a time", SamplingParams(max_tokens=100, temperature=0))
    next(gen)
    gen.close()
    assert_all_blocks_free(llm.engine)
