"""LLM.generate / chat / stream: stopping, seeded sampling, metrics, and clear errors for bad input."""
from __future__ import annotations

import pytest
import torch

from course_lib import SamplingParams
from course_lib.sampling import Sampler, min_p_filter, top_k_filter, top_p_filter, apply_repetition_penalty, sample_from_probs

CHAT = [{"role": "user", "content": "Write a short poem about the sea."}]


def test_seeded_sampling_is_reproducible(llm):
    p = SamplingParams(max_tokens=24, temperature=0.9, top_p=0.95, top_k=50, seed=1234, ignore_eos=True)
    a = llm.chat(CHAT, p)[0].outputs[0].token_ids
    b = llm.chat(CHAT, p)[0].outputs[0].token_ids
    c = llm.chat(CHAT, SamplingParams(**{**p.__dict__, "seed": 99}))[0].outputs[0].token_ids
    assert a == b and len(a) == 24
    assert a != c  # another seed, another sample


def test_finish_reasons_and_metrics(llm):
    out = llm.generate("The capital of France is", SamplingParams(max_tokens=5, temperature=0))[0]
    assert out.outputs[0].finish_reason == "length" and len(out.outputs[0].token_ids) == 5
    m = out.metrics
    assert 0 < m.ttft <= m.e2e_latency and m.tpot > 0 and m.queue_time >= 0
    eos = llm.chat([{"role": "user", "content": "Say hi."}], SamplingParams(max_tokens=200, temperature=0))[0]
    assert eos.outputs[0].finish_reason == "stop" and eos.outputs[0].token_ids[-1] == 2


def test_stop_string_cuts_the_text(llm):
    p = SamplingParams(max_tokens=60, temperature=0, stop=["."])
    out = llm.generate("The KV cache is", p)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == "."
    assert "." not in out.text and len(out.text) > 0


def test_stream_joins_to_the_generated_text(llm):
    p = SamplingParams(max_tokens=30, temperature=0)
    prompt = llm.tokenizer.apply_chat_template([{"role": "user", "content": "用一句话介绍北京。"}])
    deltas = list(llm.stream(prompt, p))
    assert "".join(deltas) == llm.generate(prompt, p)[0].outputs[0].text
    assert not any("\ufffd" in d for d in deltas)


def test_outputs_keep_the_input_order(llm):
    prompts = ["One, two, three,", "A B C D", "The sky is"]
    outs = llm.generate(prompts, SamplingParams(max_tokens=4, temperature=0))
    assert [o.prompt for o in outs] == prompts
    assert [o.prompt_token_ids for o in outs] == [llm.tokenizer.encode(p) for p in prompts]


@pytest.mark.parametrize("field,value,allowed", [
    ("temperature", -0.5, ">= 0"), ("top_p", 0.0, r"in \(0, 1\]"), ("top_p", 1.5, r"in \(0, 1\]"),
    ("max_tokens", 0, ">= 1"), ("top_k", -3, "-1 or 0"), ("min_p", 2.0, r"in \[0, 1\]"),
    ("repetition_penalty", 0.0, "> 0"),
])
def test_bad_sampling_params_name_field_and_range(field, value, allowed):
    with pytest.raises(ValueError, match=f"{field} must be .*{allowed}"):
        SamplingParams(**{field: value})


def test_prompt_longer_than_context_is_rejected(llm):
    with pytest.raises(ValueError, match="context window"):
        llm.generate([[1] * (llm.max_model_len + 5)])
    with pytest.raises(ValueError, match="empty"):
        llm.generate([[]])


def test_filters_on_a_known_distribution():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    keep = lambda x: torch.isfinite(x).nonzero().flatten().tolist()  # noqa: E731
    assert keep(top_k_filter(logits, 2)) == [0, 1]
    assert keep(top_p_filter(logits, 0.8)) == [0, 1]  # 0.5 + 0.3 reaches 0.8
    assert keep(top_p_filter(logits, 0.81)) == [0, 1, 2]
    assert keep(min_p_filter(logits, 0.2)) == [0, 1, 2]  # 0.15 >= 0.2 * 0.5, 0.05 is not
    pen = apply_repetition_penalty(torch.tensor([2.0, -2.0, 1.0]), torch.tensor([0, 1]), 2.0)
    assert pen.tolist() == [1.0, -4.0, 1.0]


def test_exponential_race_samples_the_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1]).expand(20000, 3)
    draws = sample_from_probs(probs, torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=3).float() / len(draws)
    assert torch.allclose(freq, torch.tensor([0.6, 0.3, 0.1]), atol=0.02)


def test_top_p_matches_transformers_on_real_logits(model, tokenizer):
    from transformers.generation.logits_process import TopPLogitsWarper

    ids = torch.tensor([tokenizer.encode("Once upon a time, there was a")])
    with torch.no_grad():
        logits = model(ids)[:, -1]  # [1, vocab]
    for p in (0.3, 0.5, 0.76, 0.9, 0.95):
        ours = torch.isfinite(top_p_filter(logits, p))
        ref = torch.isfinite(TopPLogitsWarper(p)(ids, logits.clone()))
        assert torch.equal(ours, ref), p


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_batch_takes_the_first_of_tied_maxima(dtype):
    """The greedy batch path (one max over all rows) picks what argmax picks, ties included."""
    logits = (torch.randn(8, 500, generator=torch.Generator().manual_seed(0)) * 2).round().to(dtype)
    logits[3, [7, 40, 41]] = logits[3].max() + 1  # a three-way tie: token 7 wins
    greedy = [SamplingParams(temperature=0)] * 8
    got = Sampler()(logits, greedy, [[]] * 8, [f"r{i}" for i in range(8)])
    assert got == logits.argmax(-1).tolist() and got[3] == 7
    mixed = greedy[:7] + [SamplingParams(temperature=0, repetition_penalty=1.0 + 1e-9)]  # per-row path
    assert Sampler()(logits, mixed, [[]] * 8, [f"r{i}" for i in range(8)]) == got


# ---- stop strings while streaming: hold back only what may still start a stop string ----------------------------
SENTENCE = "The KV cache stores keys and values for every layer, so the next token only needs the new query."


def stream_sequence(tokenizer, text: str, stop: list[str]):
    """Feed `text`'s tokens to a Sequence one at a time; return its deltas (one per token) and the Sequence."""
    from course_lib.engine.sequence import Sequence

    seq = Sequence("r", [1], SamplingParams(max_tokens=1000, stop=stop, ignore_eos=True), tokenizer)
    deltas = []
    for token_id in tokenizer.encode(text):
        seq.append_token(token_id)
        deltas.append(seq.take_delta())
        if seq.is_finished:
            break
    return deltas, seq


def test_a_long_stop_string_still_streams_token_by_token(tokenizer):
    for stop in ("Q" * 5000, " the new" + "!" * 4992):  # never matches; the second matches 8 characters first
        deltas, seq = stream_sequence(tokenizer, SENTENCE, [stop])
        assert "".join(deltas) + seq.take_delta() == seq.text == SENTENCE
        assert sum(map(bool, deltas)) >= len(deltas) - 3


def test_a_stop_string_split_across_tokens_cuts_exactly_and_never_leaks(tokenizer):
    stop = "ores keys a"  # starts inside " stores", ends inside " and"
    deltas, seq = stream_sequence(tokenizer, SENTENCE, ["zzz", stop])
    assert seq.finish_reason == "stop" and seq.stop_reason == stop
    assert seq.text == "".join(deltas) == "The KV cache st"
    deltas, seq = stream_sequence(tokenizer, SENTENCE, ["keys and vectors"])  # held back, then let go
    assert "".join(deltas) + seq.take_delta() == SENTENCE and "" in deltas


@pytest.mark.parametrize("stop", [["."], ["the"], [" the next", ","], ["layer", "cache"], ["s k"]])
def test_ordinary_stop_strings_cut_as_a_full_search_after_each_token_does(tokenizer, stop):
    ids = tokenizer.encode(SENTENCE)
    texts = (tokenizer.decode(ids[:n]) for n in range(1, len(ids) + 1))
    want = next((text[:text.index(s)], s) for text in texts for s in stop if s in text)
    deltas, seq = stream_sequence(tokenizer, SENTENCE, stop)
    assert (seq.text, seq.stop_reason) == want and "".join(deltas) == seq.text


def test_llm_stream_with_a_long_stop_string(llm):
    p = SamplingParams(max_tokens=20, temperature=0, stop=["Q" * 5000], ignore_eos=True)
    deltas = list(llm.stream("The KV cache is", p))
    assert len(deltas) >= 10 and "".join(deltas) == llm.generate("The KV cache is", p)[0].outputs[0].text


# ---- logit_bias -------------------------------------------------------------------------------------------------
def test_logit_bias_forces_and_bans_tokens_in_greedy_decoding(llm):
    prompt = "The capital of France is"
    greedy = llm.generate(prompt, SamplingParams(max_tokens=8, temperature=0))[0].outputs[0].token_ids
    forced = llm.tokenizer.encode(" banana")[0]
    out = llm.generate(prompt, SamplingParams(max_tokens=4, temperature=0, logit_bias={forced: 100}))[0]
    assert out.outputs[0].token_ids == [forced] * 4
    banned = greedy[0]
    out = llm.generate(prompt, SamplingParams(max_tokens=8, temperature=0, logit_bias={str(banned): -100}))[0]
    assert banned not in out.outputs[0].token_ids and out.outputs[0].token_ids != greedy


def test_logit_bias_in_a_greedy_batch_applies_to_its_own_row_only():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    plain, biased = SamplingParams(temperature=0), SamplingParams(temperature=0, logit_bias={7: 100})
    got = Sampler()(logits, [plain, biased, plain, plain], [[]] * 4, ["a", "b", "c", "d"])
    want = logits.argmax(-1).tolist()
    assert got == want[:1] + [7] + want[2:]
    sampled = SamplingParams(temperature=1.0, seed=0, logit_bias={3: 100})  # the sampling path too
    assert Sampler()(logits[:1], [sampled], [[]], ["e"]) == [3]


@pytest.mark.parametrize("chunk", [1, 3, 4, 9, 20])
def test_chunked_prefill_in_the_generation_loop_gives_the_same_tokens(tiny, chunk):
    """generate_tokens(prefill_chunk=c): the prompt fed c tokens per forward, the last chunk's logits picked from."""
    from course_lib import tolerance
    from course_lib.generate import generate_tokens

    model = tiny(attention_bias=False)  # float64: rounding cannot move a token
    prompt = [(7 * i + 3) % model.config.vocab_size for i in range(9)]
    seen = {}

    def greedy(key):
        def pick(logits):
            seen.setdefault(key, []).append(logits)
            return int(logits.argmax())
        return pick

    whole = list(generate_tokens(model, prompt, greedy("whole"), 6))
    chunked = list(generate_tokens(model, prompt, greedy("chunked"), 6, prefill_chunk=chunk))
    assert chunked == whole and len(whole) == 6
    tolerance.assert_close(torch.cat(seen["chunked"]), torch.cat(seen["whole"]), 1e-12)
