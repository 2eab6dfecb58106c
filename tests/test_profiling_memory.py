"""Memory accounting: the KV formula against what the cache allocates, weights, the calculator."""
import dataclasses

import pytest
import torch

from course_lib.config import ModelConfig
from course_lib.kv_cache import KVCache
from course_lib.model import Transformer
from course_lib.profiling import (activation_bytes, breakdown_frame, kv_bytes_per_token, kv_cache_bytes,
                                  kv_cache_report, memory_breakdown, process_memory, weight_bytes)
from course_lib.profiling.memory import as_model_config

SMALL = ModelConfig(vocab_size=320, hidden_size=64, intermediate_size=160, num_layers=3, num_heads=4, num_kv_heads=2)
LLAMA_8B = {  # Llama-3.1-8B config.json, the fields that matter
    "architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("batch,max_len", [(1, 7), (3, 64)])
def test_kv_formula_equals_cache_allocation(dtype, batch, max_len):
    cache = KVCache(SMALL, max_len, batch=batch, dtype=dtype)
    assert kv_cache_bytes(SMALL, max_len, batch, dtype) == cache.nbytes
    assert kv_bytes_per_token(SMALL, dtype) == SMALL.kv_bytes_per_token(dtype)


def test_llama_8b_calculator():
    assert kv_bytes_per_token(LLAMA_8B, "bfloat16") == 2 * 32 * 8 * 128 * 2 == 128 * 1024
    r = kv_cache_report(LLAMA_8B, num_users=32, context_len=8192, dtype="bfloat16")
    assert r["kv_cache_gib"] == 32.0  # 128 KiB x 262,144 tokens
    assert 14.9 < r["weights_gib"] < 15.0  # 8.03 B parameters x 2 bytes
    assert r["total_gib"] == pytest.approx(r["kv_cache_gib"] + r["weights_gib"])


def test_weight_bytes_counts_tied_embeddings_once():
    tied = dataclasses.replace(SMALL, tie_word_embeddings=True)
    for cfg in (SMALL, tied):
        model = Transformer(cfg)
        buffers = sum(b.nbytes for b in model.buffers())
        assert weight_bytes(model) == cfg.num_parameters() * 4 + buffers
    assert weight_bytes(Transformer(SMALL).to(torch.bfloat16)) < weight_bytes(Transformer(SMALL))


def test_memory_breakdown_with_cache():
    model = Transformer(SMALL)
    cache = KVCache(SMALL, 100, batch=2)
    b = memory_breakdown(model, num_tokens=10, batch=2, kv_cache=cache)
    assert b["weights"] == weight_bytes(model)
    assert b["kv_cache"] == cache.nbytes and b["kv_in_use"] == cache.nbytes // 10
    assert b["total"] == b["weights"] + b["kv_cache"] + b["activations"]
    frame = breakdown_frame(b)
    assert frame.loc["total", "share"] == pytest.approx(1.0)
    from_config = memory_breakdown(LLAMA_8B, num_tokens=8192, batch=32, dtype="bfloat16")
    assert from_config["kv_cache"] == 32 * 2 ** 30


def test_prefill_activations_count_logits_of_the_last_position_only():
    # a prefill samples from the last position: logits for every prompt token would be a training forward
    cfg = as_model_config({"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                           "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152})
    engine = memory_breakdown(cfg, num_tokens=1024)["activations"]
    assert engine == 1024 * (2 * 576 + 3 * 1536) * 4  # the MLP's working set: 22.5 MiB, not 1024 x vocab
    assert memory_breakdown(cfg, num_tokens=1024, logits_tokens=None)["activations"] == 1024 * 49152 * 4


def test_activation_estimate_grows_with_tokens():
    a1, a2 = activation_bytes(SMALL, 16), activation_bytes(SMALL, 32)
    assert a2 == 2 * a1
    # small vocab: the MLP's working set (2h + 3I per token) is the peak
    assert a1 == 16 * (2 * 64 + 3 * 160) * 4
    assert activation_bytes(SMALL, 16, logits_tokens=1) <= a1


def test_process_memory_reports_rss():
    m = process_memory("cpu")
    assert m["cpu_rss"] > 10 * 2 ** 20


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_process_memory_cuda_counters():
    x = torch.empty(2 ** 20, device="cuda")
    m = process_memory("cuda")
    assert m["cuda_allocated"] >= x.nbytes and m["cuda_max_allocated"] >= m["cuda_allocated"]


def test_peak_memory_counts_what_is_alive_at_once():
    from course_lib.profiling.memory import PeakMemory

    x = torch.ones(1024)  # created outside: not counted
    with PeakMemory() as pm:
        a = x * 2  # 4 KiB
        b = a.view(32, 32)  # a view: no new memory
        a.add_(1)  # in place: no new memory
        c = torch.empty(2048)  # 8 KiB: 12 KiB alive
        del a, b, c
        d = torch.empty(512)  # 2 KiB after 12 KiB were freed
    assert pm.peak == 12 * 1024 and pm.live == 2 * 1024
    del d
