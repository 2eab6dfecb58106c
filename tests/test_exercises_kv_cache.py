"""Chapter 06 checkers: True on a reference solution, False on plausible wrong answers and on an untouched stub."""
import torch

from course_lib.exercises import check_kv_bytes_per_token, check_kv_waste, check_prefix_hit_tokens
from course_lib.exercises.kv_cache import KV_CONFIGS, engine_kv_bytes_per_token, engine_prefix_hit_tokens


def stub(*args):
    raise NotImplementedError


def kv_bytes_per_token(config, dtype):
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return 2 * config["num_hidden_layers"] * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def kv_waste(lengths, block_size, max_model_len):
    return sum(max_model_len - n for n in lengths), sum(-(-n // block_size) * block_size - n for n in lengths)


def prefix_hit_tokens(first, second, block_size):
    common = 0
    while common < min(len(first), len(second)) and first[common] == second[common]:
        common += 1
    return block_size * min(common // block_size, len(first) // block_size, (len(second) - 1) // block_size)


def test_reference_solutions_pass(capsys):
    assert check_kv_bytes_per_token(kv_bytes_per_token)
    assert check_kv_waste(kv_waste)
    assert check_prefix_hit_tokens(prefix_hit_tokens)
    assert "✗" not in capsys.readouterr().out


def test_stubs_are_not_attempted(capsys):
    for check in (check_kv_bytes_per_token, check_kv_waste, check_prefix_hit_tokens):
        assert check(stub) is False
        assert "not attempted" in capsys.readouterr().out


def test_kv_bytes_wrong_answers_fail_with_a_hint(capsys):
    def all_heads(config, dtype):  # forgets GQA
        return kv_bytes_per_token({k: v for k, v in config.items() if k != "num_key_value_heads"}, dtype)

    def k_only(config, dtype):  # forgets V
        return kv_bytes_per_token(config, dtype) // 2

    def no_head_dim(config, dtype):  # ignores the config's head_dim
        return kv_bytes_per_token({k: v for k, v in config.items() if k != "head_dim"}, dtype)

    assert not check_kv_bytes_per_token(all_heads)
    assert "GQA" in capsys.readouterr().out
    assert not check_kv_bytes_per_token(k_only)
    assert "factor 2" in capsys.readouterr().out
    assert not check_kv_bytes_per_token(no_head_dim)
    assert "head_dim" in capsys.readouterr().out
    assert not check_kv_bytes_per_token(lambda c, d: float(kv_bytes_per_token(c, d)))  # must be an int


def test_kv_waste_wrong_answers_fail(capsys):
    assert not check_kv_waste(lambda l, b, m: (kv_waste(l, b, m)[0], sum((n // b + 1) * b - n for n in l)))
    assert "ceil" in capsys.readouterr().out
    assert not check_kv_waste(lambda l, b, m: (sum(m - n for n in l) / (m * len(l)), kv_waste(l, b, m)[1]))
    assert not check_kv_waste(lambda l, b, m: kv_waste(l, b, m)[::-1])


def test_prefix_hit_wrong_answers_fail(capsys):
    def common_prefix(first, second, block_size):  # token-level, no blocks
        n = 0
        while n < min(len(first), len(second)) and first[n] == second[n]:
            n += 1
        return n

    def forgets_last_token(first, second, block_size):
        return common_prefix(first, second, block_size) // block_size * block_size

    assert not check_prefix_hit_tokens(common_prefix)
    assert "whole blocks" in capsys.readouterr().out
    assert not check_prefix_hit_tokens(forgets_last_token)
    assert "last token" in capsys.readouterr().out


def test_reference_values_come_from_the_engine():
    assert engine_kv_bytes_per_token(KV_CONFIGS["Llama-3-8B"], torch.bfloat16) == 128 * 1024
    assert engine_kv_bytes_per_token(KV_CONFIGS["Llama-2-7B"], torch.float16) == 512 * 1024
    assert engine_prefix_hit_tokens(list(range(12)), list(range(12)), 4) == 8  # the last token is computed
    assert engine_prefix_hit_tokens(list(range(10)), list(range(10)) + [99], 4) == 8
