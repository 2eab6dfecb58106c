"""Checkers of notebook 00: each passes a reference solution and fails plausible mistakes and an unattempted stub."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from course_lib import SamplingParams, StreamingDetokenizer
from course_lib.exercises import check_cached_tokens, check_greedy_chat, check_prefill_vs_decode, check_stop_strings
from course_lib.exercises.welcome import JAPAN, SUM, StandInModel, engine_finish, greedy_run
from course_lib.kv_cache import KVCache
from course_lib.profiling import measure


# --- exercise 1 -------------------------------------------------------------------------------------------------------
def greedy_chat(model, tokenizer, messages, max_tokens, extra_token=False, eos_last=True):
    ids = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    cache = KVCache(model.config, len(ids) + max_tokens + 1, device=model.device, dtype=model.dtype)
    x = torch.tensor([ids], device=model.device)
    out = []
    with torch.inference_mode():
        while True:
            out.append(int(model(x, kv=cache)[0, -1].argmax()))  # no last_only: must not change the tokens
            ended = out[-1] in tokenizer.eos_token_ids
            if (ended and eos_last) or len(out) >= max_tokens + extra_token:
                break
            x = torch.tensor([[out[-1]]], device=model.device)
    reason = "stop" if out[-1] in tokenizer.eos_token_ids else "length"
    if not eos_last and len(out) >= max_tokens:
        reason = "length"  # the length checked before EOS
    return reason, out[-1]


def greedy_chat_length_first(model, tokenizer, messages, max_tokens):
    """Checks max_tokens before EOS: calls an answer that ends exactly at max_tokens 'length'."""
    reason, last = greedy_chat(model, tokenizer, messages, max_tokens)
    out = greedy_run(model, tokenizer, messages[0]["content"], max_tokens)
    return ("length" if len(out.output_ids) >= max_tokens else reason), last


def greedy_chat_one_too_many(model, tokenizer, messages, max_tokens):
    return greedy_chat(model, tokenizer, messages, max_tokens, extra_token=True)


# --- exercise 2 -------------------------------------------------------------------------------------------------------
def cached_tokens(prompt_len, output_len, ended_with_eos):
    return prompt_len + output_len - 1


def cached_tokens_all(prompt_len, output_len, ended_with_eos):
    return prompt_len + output_len


def cached_tokens_eos_only(prompt_len, output_len, ended_with_eos):
    return prompt_len + output_len - 1 if ended_with_eos else prompt_len + output_len


# --- exercise 3 -------------------------------------------------------------------------------------------------------
def prefill_vs_decode(model, lengths, decode_steps=1, invert=False):
    ratios = []
    for n in lengths:
        ids = torch.randint(0, model.config.vocab_size, (1, n + 1), device=model.device)

        @torch.inference_mode()
        def prefill():
            model(ids[:, :n], kv=KVCache(model.config, n, device=model.device, dtype=model.dtype), last_only=True)

        cache = KVCache(model.config, n + 1, device=model.device, dtype=model.dtype)

        @torch.inference_mode()
        def decode():
            cache.seq_len = n
            model(ids[:, n:], kv=cache)

        p = measure(prefill, repeats=3, warmup=1, device=model.device).median
        d = measure(decode, repeats=3, warmup=1, device=model.device).median * decode_steps
        ratios.append(d / p if invert else p / d)
    return ratios, next((n for n, r in zip(lengths, ratios) if r >= 2), None)


def prefill_vs_n_decodes(model, lengths):
    """n decode steps over one prefill: the "x longer" of the chapter's table, not the ratio asked."""
    ratios = []
    for n in lengths:
        r, _ = prefill_vs_decode(model, [n], decode_steps=n, invert=True)
        ratios.append(r[0])
    return ratios, next((n for n, r in zip(lengths, ratios) if r >= 2), None)


def prefill_vs_decode_last_below(model, lengths):
    ratios, _ = prefill_vs_decode(model, lengths)
    below = [n for n, r in zip(lengths, ratios) if r < 2]
    return ratios, below[-1] if below else None


# --- exercise 4 -------------------------------------------------------------------------------------------------------
def finish_with_stop(tokenizer, output_ids, stop, max_tokens, per_token=True, eos_reason=True):
    detok, text = StreamingDetokenizer(tokenizer), ""
    for k, token in enumerate(output_ids, start=1):
        if token in tokenizer.eos_token_ids:
            return text, "stop", token if eos_reason else None
        text += detok.add(token)
        if per_token:
            hits = [(text.find(s), s) for s in stop if s in text]
            if hits:
                at, s = min(hits)
                return text[:at], "stop", s
        if k >= max_tokens:
            break
    if not per_token:  # only at the end, first stop string of the list
        for s in stop:
            if s in text:
                return text[:text.find(s)], "stop", s
    return text, "length", None


def stop_at_end(tokenizer, output_ids, stop, max_tokens):
    return finish_with_stop(tokenizer, output_ids, stop, max_tokens, per_token=False)


def stop_reason_none_on_eos(tokenizer, output_ids, stop, max_tokens):
    return finish_with_stop(tokenizer, output_ids, stop, max_tokens, eos_reason=False)


def stub(*args):
    raise NotImplementedError


@pytest.mark.parametrize("check,solution,wrongs", [
    (check_greedy_chat, greedy_chat, [(greedy_chat_length_first, "EOS wins"),
                                      (greedy_chat_one_too_many, "one token too many")]),
    (check_cached_tokens, cached_tokens, [(cached_tokens_all, "never fed back"),
                                          (cached_tokens_eos_only, "never fed back")]),
    (check_stop_strings, finish_with_stop, [(stop_at_end, "after every token"),
                                            (stop_reason_none_on_eos, "the EOS token id")]),
], ids=["greedy_chat", "cached_tokens", "stop_strings"])
def test_checker_passes_solution_fails_mistakes(check, solution, wrongs, llm, capsys):
    assert check(solution, llm) is True
    for wrong, explanation in wrongs:
        assert check(wrong, llm) is False
        out = capsys.readouterr().out
        assert "✗" in out and explanation in out  # the failure tells the learner what to fix


def test_prefill_vs_decode_checker(llm, capsys):
    """On the real model, then on a stand-in "llm" (fast) for the mistakes: the stand-in cases catch them."""
    assert check_prefill_vs_decode(prefill_vs_decode, llm) is True
    fast = SimpleNamespace(model=StandInModel(0.001, 0.0))
    for wrong, explanation in [(lambda m, ls: prefill_vs_decode(m, ls, invert=True), "inverted"),
                               (prefill_vs_n_decodes, "ONE decode step"), (prefill_vs_decode_last_below, "twice_at")]:
        assert check_prefill_vs_decode(wrong, fast) is False
        out = capsys.readouterr().out
        assert "✗ stand-in" in out and explanation in out


@pytest.mark.parametrize("check", [check_greedy_chat, check_cached_tokens, check_prefill_vs_decode,
                                   check_stop_strings])
def test_stub_is_not_attempted(check, llm, capsys):
    assert check(stub, llm) is False
    assert "not attempted" in capsys.readouterr().out


def test_hard_coded_answers_fail(llm):
    assert check_greedy_chat(lambda *a: ("stop", 2), llm) is False
    assert check_cached_tokens(lambda *a: 44, llm) is False
    fast = SimpleNamespace(model=StandInModel(0.001, 0))
    assert check_prefill_vs_decode(lambda m, ls: ([1.0] * len(ls), None), fast) is False
    assert check_stop_strings(lambda *a: ("The capital of Japan is ", "stop", "Tokyo"), llm) is False


def test_odd_return_values_fail_without_raising(llm, capsys):
    fast = SimpleNamespace(model=StandInModel(0.001, 0))
    assert check_prefill_vs_decode(lambda m, ls: ("fast", None), fast) is False
    assert check_stop_strings(lambda *a: None, llm) is False
    assert "✗" in capsys.readouterr().out


@pytest.mark.parametrize("question,stop,max_tokens", [(JAPAN, ["is", "Japan"], 40), (JAPAN, ["xyz"], 40),
                                                      (SUM, ["answer"], 2), (JAPAN, ["Tokyo"], 4)])
def test_stop_reference_is_what_the_engine_returns(llm, question, stop, max_tokens):
    """The checker's reference (Sequence.append_token over the loop's tokens) equals LLM.chat with those params."""
    run = greedy_run(llm.model, llm.tokenizer, question, 40)
    out = llm.chat([{"role": "user", "content": question}],
                   SamplingParams(max_tokens=max_tokens, temperature=0.0, stop=stop))[0].outputs[0]
    want = engine_finish(llm.tokenizer, run.prompt_ids, run.output_ids, stop, max_tokens)
    assert (out.text, out.finish_reason, out.stop_reason) == want
