"""Bad arguments are refused at the door with an error naming the parameter, the value and what is allowed."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models

import course_lib
from course_lib import SamplingParams
from course_lib.sampling import Sampler, processed_logits


@pytest.mark.parametrize("field,value,error,allowed", [
    ("seed", "7", TypeError, "None or an integer"), ("seed", 1.5, TypeError, "None or an integer"),
    ("seed", True, TypeError, "None or an integer"), ("seed", 2**64, ValueError, r"\[-2\*\*63, 2\*\*64\)"),
    ("seed", -2**63 - 1, ValueError, r"\[-2\*\*63, 2\*\*64\)"),
    ("top_k", 2.5, TypeError, "an integer: -1 or 0"), ("top_k", "3", TypeError, "an integer: -1 or 0"),
    ("temperature", "hot", TypeError, "a finite number >= 0"), ("temperature", float("nan"), ValueError, "finite"),
    ("temperature", float("inf"), ValueError, "finite"), ("repetition_penalty", float("inf"), ValueError, "finite"),
    ("top_p", "0.9", TypeError, r"a number in \(0, 1\]"), ("min_p", None, TypeError, r"a number in \[0, 1\]"),
    ("stop_token_ids", 5, TypeError, "a list of integer token ids >= 0"),
    ("stop_token_ids", [-1], ValueError, "a list of integer token ids >= 0"),
    ("stop_token_ids", ["a"], TypeError, "a list of integer token ids >= 0"),
    ("stop", [""], ValueError, "a list of non-empty strings"), ("stop", 3, TypeError, "a list of non-empty strings"),
    ("stop", ["a", 3], TypeError, "a list of non-empty strings"),
    ("ignore_eos", "yes", TypeError, "True or False"), ("skip_special_tokens", None, TypeError, "True or False"),
    ("max_tokens", True, TypeError, "an integer >= 1"), ("max_tokens", 2.0, TypeError, "an integer >= 1"),
    ("n", True, TypeError, "1"),
    ("logit_bias", [(5, 1.0)], TypeError, "None or a dict of token id"), ("logit_bias", {"a": 1}, TypeError, "a dict"),
    ("logit_bias", {1.5: 1}, TypeError, "a dict"), ("logit_bias", {True: 1}, TypeError, "a dict"),
    ("logit_bias", {5: "1"}, TypeError, "a dict"), ("logit_bias", {-1: 1}, ValueError, "an integer >= 0"),
    ("logit_bias", {"-3": 1}, ValueError, "an integer >= 0"), ("logit_bias", {5: 100.5}, ValueError, r"\[-100, 100\]"),
    ("logit_bias", {5: float("nan")}, ValueError, r"\[-100, 100\]"),
])
def test_bad_sampling_params_raise_with_field_value_and_allowed(field, value, error, allowed):
    match = f"SamplingParams.{field} must be .*{allowed}.*, got {re.escape(repr(value))}$"
    with pytest.raises(error, match=match) as e:
        SamplingParams(**{field: value})
    assert e.value.param == field  # the bare field name, what a server reports as OpenAI's `param`


@pytest.mark.parametrize("options,param", [
    ({"max_num_seqs": 0}, "max_num_seqs"), ({"block_size": "16"}, "block_size"),
    ({"kv_cache_memory": 1.5}, "kv_cache_memory"), ({"enable_prefix_caching": 1}, "enable_prefix_caching"),
])
def test_bad_engine_options_name_their_field(options, param):
    from course_lib.engine.llm_engine import EngineConfig

    with pytest.raises((TypeError, ValueError), match=f"EngineConfig.{param} must be") as e:
        EngineConfig(**options)
    assert e.value.param == param


def test_check_request_errors_name_their_field(tiny, tokenizer):
    model = tiny()
    engine, vocab = course_lib.LLM.from_model(model, tokenizer, kv_cache_memory=1 << 20).engine, model.config.vocab_size
    cases = [([1, 2], SamplingParams(stop_token_ids=[vocab]), "stop_token_ids"),
             ([1, 2], SamplingParams(logit_bias={3: 1.0, vocab: -1.0}), "logit_bias"),
             ([vocab], SamplingParams(), "prompt"), ([], SamplingParams(), "prompt"),
             ([1] * engine.max_model_len, SamplingParams(), "prompt"), (3.5, SamplingParams(), "prompt")]
    for prompt, params, param in cases:
        with pytest.raises((TypeError, ValueError)) as e:
            engine.check_request(prompt, params)
        assert e.value.param == param, (prompt, str(e.value))


def test_numpy_numbers_are_accepted_and_stored_as_python_numbers():
    p = SamplingParams(max_tokens=np.int64(5), temperature=np.float32(0.5), top_k=np.int32(3), top_p=np.float64(0.9),
                       min_p=np.float16(0.0), seed=np.uint64(2**64 - 1), stop=("a", "b"), stop_token_ids=(np.int64(2),))
    assert (p.max_tokens, p.top_k, p.seed, p.stop_token_ids, p.stop) == (5, 3, 2**64 - 1, [2], ["a", "b"])
    assert [type(v) for v in (p.max_tokens, p.top_k, p.seed, p.stop_token_ids[0])] == [int] * 4
    assert [type(v) for v in (p.temperature, p.top_p, p.min_p)] == [float] * 3
    torch.Generator().manual_seed(p.seed)  # the top of the allowed range is one torch takes


@pytest.mark.parametrize("temperature", [1e-40, 1e-6])
def test_tiny_temperature_is_greedy(temperature):
    assert SamplingParams(temperature=temperature).greedy


def test_logit_bias_keys_from_json_strings_become_ids():
    p = SamplingParams(logit_bias={"5": 1, np.int64(7): np.float32(-2.5), 9: 100, "+11": -100})
    assert p.logit_bias == {5: 1.0, 7: -2.5, 9: 100.0, 11: -100.0}
    assert all(type(k) is int and type(v) is float for k, v in p.logit_bias.items())
    assert SamplingParams().logit_bias is None


def test_tiny_temperature_picks_the_argmax_not_nan():
    logits = torch.randn(1, 1000, generator=torch.Generator().manual_seed(0)) * 10
    logits[0, 0], logits[0, 617] = logits.min() - 1, logits.max() + 1  # the argmax is 617, token 0 the least likely
    params = SamplingParams(temperature=1e-40, top_k=50, top_p=0.9, seed=3)
    out = processed_logits(logits[0], params)
    assert torch.isfinite(out).all() and out.argmax().item() == 617
    assert Sampler()(logits, [params], [[]], ["r0"]) == [617]


@pytest.mark.parametrize("content", [None, 5, ["hi"]])
def test_chat_content_must_be_a_string(tokenizer, content):
    with pytest.raises(TypeError, match=rf"messages\[1\]\['content'\] must be a str, got {type(content).__name__}"):
        tokenizer.apply_chat_template([{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": content}])


def test_chat_role_must_be_known(tokenizer):
    with pytest.raises(ValueError, match=r"messages\[0\]\['role'\] must be one of system, user, assistant, tool, "
                                         r"got 'robot'"):
        tokenizer.apply_chat_template([{"role": "robot", "content": "beep"}])


@pytest.mark.parametrize("messages", ["hi", {"role": "user", "content": "hi"}, None])
def test_chat_messages_must_be_a_list(tokenizer, messages):
    with pytest.raises(TypeError, match=f"messages must be a list .* got {type(messages).__name__}"):
        tokenizer.apply_chat_template(messages)


def test_model_config_that_is_not_json_names_the_file(tmp_path):
    (tmp_path / "config.json").write_text("not json")
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / "config.json")) + " is not valid JSON") as e:
        course_lib.load_model(str(tmp_path))
    assert e.value.__cause__ is not None
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="must hold a JSON object"):
        course_lib.load_model(str(tmp_path))


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json", "config.json"])
def test_tokenizer_files_that_are_not_json_name_the_file(tmp_path, name):
    HFTokenizer(models.WordLevel({"a": 0}, unk_token="a")).save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / name).write_text("not json")
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / name)) + " is not valid JSON"):
        course_lib.load_tokenizer(str(tmp_path))
