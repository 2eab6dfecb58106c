"""Regressions of issue 9 on the real model: long prompts, threads, interleaved streams, requests that are
not the caller's, tiny temperatures, bad input refused whole at the door, the prefix-cache metric."""
from __future__ import annotations

import itertools
import threading

import pytest
import torch

from course_lib import SamplingParams
from course_lib.engine.llm import LLM
from course_lib.engine.llm_engine import EngineConfig, LLMEngine
from course_lib.generate import generate_tokens

QUESTIONS = ["What is the capital of France?", "Write a haiku about GPUs.", "你好，请介绍一下你自己。",
             "List three colors."]
GREEDY = SamplingParams(max_tokens=16, temperature=0)


def simple_loop(model, ids, n):
    """The one-sequence reference: contiguous KV cache, greedy, one token per step."""
    return list(generate_tokens(model, ids, lambda logits: int(logits.argmax()), n))


def assert_engine_clean(engine):
    bm = engine.block_manager
    assert bm.num_used_blocks == 0 and all(b.ref_count == 0 for b in bm.blocks)
    assert not engine.requests and not engine.has_unfinished_requests() and not engine.router._boxes


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]


@pytest.fixture(scope="module")
def expected(llm, prompts):
    """Each prompt's greedy text, served alone."""
    return [llm.generate(p, GREEDY)[0].outputs[0].text for p in prompts]


def test_prompt_longer_than_one_chunk_runs(llm, model):
    prompt = [100 + i % 500 for i in range(1100)]  # > max_num_batched_tokens (1024): a step of chunks alone
    out = llm.generate([prompt], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))[0]
    assert out.outputs[0].token_ids == simple_loop(model, prompt, 4)
    assert_engine_clean(llm.engine)


def test_token_budget_smaller_than_the_prompt(model, tokenizer):
    engine = LLMEngine(model, tokenizer, EngineConfig(max_num_batched_tokens=4, kv_cache_memory=16 * 2**20))
    rid = engine.add_request("The capital of France is", SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    final = {}
    while engine.has_unfinished_requests():
        final.update((o.request_id, o) for o in engine.step() if o.finished)
    assert final[rid].outputs[0].token_ids == simple_loop(model, tokenizer.encode("The capital of France is"), 6)
    assert engine.stats.partial_prefills >= 1 and max(engine.stats.batch_tokens) <= 4


def test_threads_sharing_one_llm_each_get_their_own_text(llm, prompts, expected):
    for _ in range(3):
        got, errors = {}, []

        def run(i):
            try:
                got[i] = llm.generate(prompts[i], GREEDY)[0].outputs[0].text
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not errors, errors
        assert [got[i] for i in range(len(prompts))] == expected
    assert_engine_clean(llm.engine)


def test_interleaved_streams_each_get_their_own_text(llm, prompts, expected):
    streams = [llm.stream(p, GREEDY) for p in prompts[:2]]
    texts = ["", ""]
    for pair in itertools.zip_longest(*streams):  # read in turn: one delta of A, one of B, ...
        for i, delta in enumerate(pair):
            texts[i] += delta or ""
    assert texts == expected[:2]
    assert_engine_clean(llm.engine)


def test_generate_leaves_other_callers_requests_alone(llm, prompts, expected):
    stream = llm.stream(prompts[0], GREEDY)
    first = next(stream)  # suspended mid-way ...
    assert llm.generate(prompts[1], GREEDY)[0].outputs[0].text == expected[1]  # ... while generate runs
    assert first + "".join(stream) == expected[0]  # resumed: nothing lost

    rid = llm.engine.add_request(prompts[2], GREEDY)  # a request of a driver of step()
    assert llm.generate(prompts[3], GREEDY)[0].outputs[0].text == expected[3]
    final = {}
    while llm.engine.has_unfinished_requests():  # generate finished it: step() still hands it over
        final.update((o.request_id, o) for o in llm.engine.step() if o.finished)
    assert final[rid].outputs[0].text == expected[2]
    assert_engine_clean(llm.engine)


def test_tiny_temperature_is_greedy(llm, prompts, expected):
    out = llm.generate(prompts[0], SamplingParams(max_tokens=16, temperature=1e-40, seed=0))[0]
    assert out.outputs[0].text == expected[0]


@pytest.mark.parametrize("bad,error,match", [
    ([5, 100_000], ValueError, r"token ids .*\[0, 49152\).*100000"),
    ([5, -1], ValueError, r"\[0, 49152\).*-1"),
    ([5, 2.5], TypeError, "integers"),
    (None, TypeError, "prompt must be"),
])
def test_a_bad_prompt_refuses_the_whole_batch(llm, prompts, bad, error, match):
    steps = llm.engine.stats.steps
    with pytest.raises(error, match=match):
        llm.generate([prompts[0], bad, prompts[1]], GREEDY)
    assert llm.engine.stats.steps == steps  # no work done, none lost: nothing ran
    assert_engine_clean(llm.engine)


def test_bad_input_is_named_at_the_door(llm, model, tokenizer):
    engine = llm.engine
    with pytest.raises(ValueError, match=r"stop_token_ids .*\[0, 49152\)"):
        llm.generate("Hi", SamplingParams(stop_token_ids=[60_000]))
    with pytest.raises(TypeError, match="SamplingParams"):
        llm.generate("Hi", {"temperature": 0})
    with pytest.raises(ValueError, match=r"\[0, 49152\)"):
        llm.stream([10**6])  # raised at the call, before the first next()
    with pytest.raises(ValueError, match="role"):
        llm.chat([{"role": "robot", "content": "hi"}])
    with pytest.raises(TypeError, match="content"):
        llm.chat([{"role": "user", "content": None}])
    with pytest.raises(ValueError, match="messages"):
        llm.chat([])
    with pytest.raises(ValueError, match="block_size must be an integer >= 1, got 0"):
        LLMEngine(model, tokenizer, EngineConfig(block_size=0))
    with pytest.raises(TypeError, match="max_num_batched_tokens"):
        EngineConfig(max_num_batched_tokens="1024")
    with pytest.raises(ValueError, match="kv_cache_memory"):
        EngineConfig(kv_cache_memory=1.5)
    assert_engine_clean(engine)


def test_engine_options_are_checked_before_the_model_loads(monkeypatch):
    import course_lib.engine.llm as llm_module

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(llm_module, "load_model", no_load)
    with pytest.raises(TypeError, match="unknown engine option 'blok_size'; did you mean 'block_size'"):
        LLM(blok_size=16)
    with pytest.raises(TypeError, match="block_size"):
        LLM(block_size="16")
    with pytest.raises(ValueError, match="quantization"):
        LLM(quantization="int3")
    with pytest.raises(ValueError, match="CUDA" if not torch.cuda.is_available() else "device"):
        LLM(device="cuda" if not torch.cuda.is_available() else "gpu")


def test_final_output_reports_prefix_cache_hits(llm, tokenizer):
    system = "You are a helpful assistant who answers in one short sentence. " * 4
    conv = lambda q: tokenizer.apply_chat_template([{"role": "system", "content": system},  # noqa: E731
                                                    {"role": "user", "content": q}])
    llm.generate(conv("What is prefill?"), GREEDY)
    out = llm.generate(conv("What is decode?"), GREEDY)[0]
    assert out.finished and out.num_cached_tokens >= 32  # the shared system prompt's full blocks
    assert out.num_cached_tokens % llm.engine.block_manager.block_size == 0
