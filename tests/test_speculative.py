"""Speculative decoding in the engine: greedy output unchanged, sampled output seeded, drafts in a batch, under
preemption and with accel; the counts it reports; batch invariance at batch sizes 1, 3 and 16."""
from __future__ import annotations

import pytest

from course_lib import LLM, SamplingParams

TEXT = "The KV cache keeps the keys and values of the tokens seen so far, so each step computes only the new one."
PROMPTS = [  # chat turns; half ask for text the prompt already holds, where drafts are accepted
    f"Repeat this sentence exactly: {TEXT}",
    "Count from one to twenty in words, separated by commas.",
    f"Copy the following text, then say how many words it has.\n\n{TEXT}",
    "def add(a, b):\n    return a + b\n\nWrite the same function again, named plus.",
    "What is the capital of France?",
    "用一句话介绍北京。",  # "Introduce Beijing in one sentence."
    "Write a haiku about the sea.",
    "List three colours of the rainbow.",
]
GREEDY = SamplingParams(max_tokens=24, temperature=0)
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
DRAFT = {"method": "draft_model", "num_speculative_tokens": 3}


def chat_ids(llm: LLM) -> list[list[int]]:
    return [llm.tokenizer.encode_chat([{"role": "user", "content": p}], add_generation_prompt=True) for p in PROMPTS]


def greedy_tokens(llm: LLM, prompts, batch: int) -> list[list[int]]:
    outs = []
    for i in range(0, len(prompts), batch):
        outs += [o.outputs[0].token_ids for o in llm.generate(prompts[i:i + batch], GREEDY)]
    return outs


@pytest.fixture(scope="module")
def reference():
    llm = LLM()
    prompts = chat_ids(llm)
    return prompts, greedy_tokens(llm, prompts, batch=8)


@pytest.mark.parametrize("accel", [False, True], ids=["reference", "accel"])
@pytest.mark.parametrize("method", [NGRAM, DRAFT], ids=["ngram", "draft_int4"])
def test_greedy_output_is_plain_greedy_token_for_token(reference, method, accel):
    prompts, expected = reference
    llm = LLM(accel=accel, speculative_config=method)
    for batch in (1, 8):
        assert greedy_tokens(llm, prompts, batch) == expected, f"batch {batch}"
    stats = llm.engine.stats
    assert stats.spec_num_drafts > 0 and 0 < stats.spec_num_accepted_tokens <= stats.spec_num_draft_tokens
    assert llm.engine.block_manager.num_used_blocks == 0  # every block back, rejected drafts' included
    if method is NGRAM:  # prompt lookup earns its keep on the copying prompts
        assert stats.spec_mean_accepted_length > 1.5


def test_request_metrics_count_drafts_and_acceptance(reference):
    prompts, expected = reference
    llm = LLM(speculative_config=NGRAM)
    out = llm.generate(prompts[0], GREEDY)[0]
    m = out.metrics
    assert out.outputs[0].token_ids == expected[0]
    assert m.num_drafts > 0 and m.num_draft_tokens <= 4 * m.num_drafts
    assert m.acceptance_rate == m.num_accepted_tokens / m.num_draft_tokens
    assert m.mean_accepted_length == 1 + m.num_accepted_tokens / m.num_drafts
    # every step emitted its accepted drafts and one token of the model's own, except where max_tokens cut it
    assert m.num_drafts + m.num_accepted_tokens >= len(out.outputs[0].token_ids) - 1 - m.num_drafts


def test_drafts_survive_preemption_and_a_tight_token_budget(reference):
    prompts, expected = reference
    llm = LLM(speculative_config=NGRAM, kv_cache_memory=24 * 46080 * 16, max_num_batched_tokens=64)
    assert greedy_tokens(llm, prompts, batch=8) == expected
    assert llm.engine.stats.preemptions > 0 and llm.engine.stats.spec_num_drafts > 0
    assert llm.engine.block_manager.num_used_blocks == 0


def test_sampled_requests_are_reproducible_with_a_seed():
    llm = LLM(speculative_config=DRAFT)
    params = SamplingParams(max_tokens=20, temperature=0.8, top_p=0.95, seed=7)
    a = llm.generate(PROMPTS[:3], params)
    b = llm.generate(PROMPTS[:3], params)
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]
    assert llm.engine.stats.spec_num_accepted_tokens > 0


def test_bad_configs_are_named_before_the_model_loads():
    with pytest.raises(ValueError, match="method"):
        LLM(speculative_config={"method": "eagle", "num_speculative_tokens": 2})
    with pytest.raises(TypeError, match="speculative_config"):
        LLM(speculative_config="ngram")
    with pytest.raises(ValueError, match="batch_invariant"):
        LLM(accel=True, batch_invariant=True)


def test_the_server_reports_drafts_and_acceptance_on_metrics():
    import httpx

    from course_lib.serve import BackgroundServer, create_app
    from course_lib.serve.watch import parse_metrics

    llm = LLM(speculative_config=NGRAM)
    with BackgroundServer(create_app(llm, "spec")) as server:
        r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
            "model": "spec", "max_tokens": 24, "temperature": 0,
            "messages": [{"role": "user", "content": PROMPTS[0]}]})
        assert r.status_code == 200
        values = parse_metrics(httpx.get(server.url + "/metrics").text)
    stats = llm.engine.stats
    assert values["spec_decode_num_drafts_total"] == stats.spec_num_drafts > 0
    assert values["spec_decode_num_draft_tokens_total"] == stats.spec_num_draft_tokens
    assert values["spec_decode_num_accepted_tokens_total"] == stats.spec_num_accepted_tokens > 0
