"""Property-based tests of the serving engine (hypothesis), on a tiny random float64 model.

Random workloads: prompt lengths around and across block and chunk boundaries, shared prefixes,
random block sizes, token budgets, sequence limits and KV budgets down to one request's worth;
random interleavings of add / step / abort / streams read in turn / generate calls; threads.
Invariants checked on every example:
  - each request's greedy tokens equal the one-at-a-time loop's (course_lib.generate); an aborted
    request's tokens are a prefix of them; each reader's text deltas add up to its final text
  - no request's output reaches another caller (step() returns only its driver's requests,
    outputs(ids) only ids)
  - every KV block is free and every mailbox closed once the last request is done
  - no step exceeds max_num_batched_tokens tokens or max_num_seqs sequences
float64 keeps the packed (paged) and the one-sequence (contiguous) forward passes equal to ~1e-15,
so a near-tie of two logits cannot flip a greedy token between them.
Examples per test: 300 (tests/conftest.py's hypothesis profile; HYPOTHESIS_PROFILE=explore for more).
"""
from __future__ import annotations

import threading
from contextlib import closing

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from course_lib import SamplingParams
from course_lib.attention.paged import PagedKVCache
from course_lib.config import ModelConfig
from course_lib.engine.llm_engine import EngineConfig, LLMEngine
from course_lib.engine.sequence import Sequence
from course_lib.generate import generate_stream
from course_lib.model import Transformer

VOCAB = 512
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

tokens = st.integers(3, VOCAB - 1)  # ids 0-2 are the tokenizer's specials; EOS (2) may still be generated


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                         num_kv_heads=2, max_position_embeddings=1024, tie_word_embeddings=False)
    return Transformer(config).to(torch.float64).eval()


@pytest.fixture(scope="module")
def reference(tiny, tokenizer):
    """(prompt, max_tokens) -> (token ids, text) of the one-at-a-time loop, with the engine's stop rules."""
    memo = {}

    def run(prompt: list[int], max_tokens: int) -> tuple[list[int], str]:
        key = (tuple(prompt), max_tokens)
        if key not in memo:
            seq = Sequence("ref", prompt, SamplingParams(max_tokens=max_tokens, temperature=0), tokenizer)
            text = "".join(generate_stream(tiny, seq))
            memo[key] = (seq.output_token_ids, text)
        return memo[key]

    return run


@st.composite
def workloads(draw):
    """Requests (prompt, max_tokens) and an engine config whose KV cache holds at least the largest one."""
    block_size = draw(st.sampled_from([1, 2, 3, 4, 8, 16]))
    prefix = draw(st.lists(tokens, max_size=40))  # shared by some prompts: prefix-cache hits
    requests = []
    for _ in range(draw(st.integers(1, 6))):
        tail = draw(st.lists(tokens, min_size=1, max_size=40))
        requests.append(((prefix if draw(st.booleans()) else []) + tail, draw(st.integers(1, 10))))
    need = max(-(-(len(p) + m) // block_size) for p, m in requests)  # blocks of the largest request
    num_blocks = draw(st.one_of(st.integers(need, need + 3), st.integers(need, need * len(requests) + 4)))  # tight: preemption
    config = dict(block_size=block_size, num_blocks=num_blocks,
                  max_num_batched_tokens=draw(st.integers(1, 64)), max_num_seqs=draw(st.sampled_from([1, 2, 3, 8])),
                  enable_prefix_caching=draw(st.booleans()))
    return requests, config


def make_engine(model, tokenizer, num_blocks, block_size, **options) -> LLMEngine:
    budget = num_blocks * PagedKVCache.bytes_per_block(model.config, block_size, model.dtype)
    engine = LLMEngine(model, tokenizer, EngineConfig(block_size=block_size, kv_cache_memory=budget, **options))
    assert engine.block_manager.num_blocks == num_blocks
    return engine


def assert_engine_clean(engine: LLMEngine) -> None:
    bm = engine.block_manager
    assert bm.num_used_blocks == 0 and all(b.ref_count == 0 for b in bm.blocks)
    assert not engine.requests and not engine.router._boxes and not engine.has_unfinished_requests()
    assert not engine.scheduler.running and not engine.scheduler.waiting


def assert_step_limits(engine: LLMEngine, config: dict) -> None:
    for name, happened in [("preemption", engine.stats.preemptions), ("chunked prefill", engine.stats.partial_prefills),
                           ("prefix-cache hit", engine.block_manager.prefix_cache_hits)]:
        event(f"{name}: {'yes' if happened else 'no'}")  # shown by --hypothesis-show-statistics
    assert max(engine.stats.batch_tokens, default=0) <= config["max_num_batched_tokens"]
    assert max(engine.stats.batch_sizes, default=0) <= config["max_num_seqs"]


@settings(**SETTINGS)
@given(workload=workloads())
def test_batched_greedy_equals_one_at_a_time(tiny, tokenizer, reference, workload):
    requests, config = workload
    engine = make_engine(tiny, tokenizer, **config)
    ids = {engine.add_request(p, SamplingParams(max_tokens=m, temperature=0)): (p, m) for p, m in requests}
    final, text = {}, dict.fromkeys(ids, "")
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.request_id in ids
            text[out.request_id] += out.delta
            if out.finished:
                final[out.request_id] = out
    for rid, (prompt, max_tokens) in ids.items():
        expected_ids, expected_text = reference(prompt, max_tokens)
        assert final[rid].outputs[0].token_ids == expected_ids
        assert text[rid] == final[rid].outputs[0].text == expected_text
    assert_step_limits(engine, config)
    assert_engine_clean(engine)


OPS = ["add", "open", "read", "step", "abort", "generate"]


@settings(**SETTINGS)
@given(workload=workloads(), ops=st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 7)), max_size=30))
def test_interleaved_callers_each_get_their_own_tokens(tiny, tokenizer, reference, workload, ops):
    """Raw requests driven by step(), streams read in turn, generate calls and aborts, in any order."""
    requests, config = workload
    engine = make_engine(tiny, tokenizer, **config)
    raw: dict[str, tuple] = {}  # request id -> (prompt, max_tokens) of requests driven by step()
    streams: list[dict] = []  # readers of engine.outputs([id])
    seen = {}  # request id -> (latest output, text of all deltas)
    aborted = set()

    def params(m):
        return SamplingParams(max_tokens=m, temperature=0)

    def record(out, owner):
        assert out.request_id in owner  # nobody receives another caller's output
        last, text = seen.get(out.request_id, (None, ""))
        assert last is None or not last.finished
        seen[out.request_id] = (out, text + out.delta)

    def read(stream):
        out = next(stream["it"], None)
        if out is None:
            stream["done"] = True
        else:
            record(out, stream["ids"])

    def drive_step():
        for out in engine.step():
            record(out, raw)

    for op, k in ops:
        prompt, m = requests[k % len(requests)]
        if op == "add":
            raw[engine.add_request(prompt, params(m))] = (prompt, m)
        elif op == "open":
            [rid] = engine.add_requests([prompt], [params(m)])
            streams.append({"ids": {rid: (prompt, m)}, "it": engine.outputs([rid]), "done": False})
        elif op == "read" and streams:
            stream = streams[k % len(streams)]
            if not stream["done"]:
                read(stream)
        elif op == "step":
            drive_step()
        elif op == "abort":
            live = [rid for rid in engine.requests]
            if live:
                engine.abort_request(live[k % len(live)])
                aborted.add(live[k % len(live)])
        elif op == "generate":
            ids = engine.add_requests([prompt], [params(m)])
            owner = {ids[0]: (prompt, m)}
            with closing(engine.outputs(ids)) as outs:
                for out in outs:
                    record(out, owner)
            assert seen[ids[0]][0].finished
            streams.append({"ids": owner, "it": iter(()), "done": True})
    for stream in streams:  # finish every reader, then the step() driver's requests
        while not stream["done"]:
            read(stream)
    while engine.has_unfinished_requests():
        drive_step()

    owners = dict(raw)
    for stream in streams:
        owners.update(stream["ids"])
    for rid, (prompt, max_tokens) in owners.items():
        expected_ids, expected_text = reference(prompt, max_tokens)
        out, text = seen.get(rid, (None, ""))
        if rid in aborted:  # only live requests are aborted: its tokens so far are a prefix
            got = out.outputs[0].token_ids if out else []
            assert got == expected_ids[:len(got)]
            continue
        assert out is not None and out.finished, rid
        assert out.outputs[0].token_ids == expected_ids
        assert text == out.outputs[0].text == expected_text
    assert_step_limits(engine, config)
    assert_engine_clean(engine)


def test_threads_each_get_their_own_tokens(tiny, tokenizer, reference):
    """Four threads share one engine: two call generate, two read streams, all at once."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, VOCAB, (int(n),), generator=g).tolist() for n in torch.randint(1, 60, (16,), generator=g)]
    engine = make_engine(tiny, tokenizer, num_blocks=40, block_size=4, max_num_batched_tokens=16)
    got, errors = {}, []
    greedy = SamplingParams(max_tokens=8, temperature=0)

    def by_generate(first, last):
        ids = engine.add_requests(prompts[first:last], [greedy] * (last - first))
        with closing(engine.outputs(ids)) as outs:
            got.update((first + ids.index(o.request_id), o) for o in outs if o.finished)

    def by_stream(first, last):
        for i in range(first, last):
            [rid] = engine.add_requests([prompts[i]], [greedy])
            with closing(engine.outputs([rid])) as outs:
                got.update((i, o) for o in outs if o.finished)

    def guard(fn, first, last):
        try:
            fn(first, last)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    for _ in range(3):
        got.clear()
        jobs = [(by_generate, 0, 4), (by_generate, 4, 8), (by_stream, 8, 12), (by_stream, 12, 16)]
        threads = [threading.Thread(target=guard, args=job) for job in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not errors, errors
        assert [got[i].outputs[0].token_ids for i in range(16)] == [reference(p, 8)[0] for p in prompts]
        assert_engine_clean(engine)
