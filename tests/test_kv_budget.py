"""The default KV budget: max_num_seqs x max_model_len, capped (512 MiB on the CPU, half of free CUDA memory)."""
from __future__ import annotations

import pytest
import torch

from course_lib.attention.paged import PagedKVCache
from course_lib.config import ModelConfig
from course_lib.engine.kv_budget import (CPU_KV_CACHE_BYTES, GPU_KV_CACHE_MAX_FRACTION, default_kv_cache_memory,
                                         kv_pool)
from course_lib.engine.llm_engine import EngineConfig, LLMEngine
from course_lib.model import Transformer

# SmolLM2-135M's shape: 30 layers x 3 KV heads x 64, a context of 8,192 tokens
SMOLLM2 = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                      num_kv_heads=3, max_position_embeddings=8192)


def small_model(max_position_embeddings: int = 256) -> Transformer:
    cfg = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                      num_kv_heads=2, max_position_embeddings=max_position_embeddings)
    return Transformer(cfg).eval()


@pytest.mark.parametrize("max_num_seqs, max_model_len, block_size", [(4, 100, 16), (3, 64, 16), (2, 33, 8), (1, 1, 4)])
def test_blocks_follow_seats_times_length(max_num_seqs, max_model_len, block_size):
    model = small_model()
    engine = LLMEngine(model, None, EngineConfig(block_size=block_size, max_num_seqs=max_num_seqs,
                                                 max_model_len=max_model_len))
    blocks_per_seq = -(-max_model_len // block_size)
    assert engine.kv_cache.num_blocks == max_num_seqs * blocks_per_seq
    assert engine.max_model_len == max_model_len


def test_default_length_is_the_models_context():
    model = small_model(max_position_embeddings=96)
    engine = LLMEngine(model, None, EngineConfig(max_num_seqs=5))
    assert engine.kv_cache.num_blocks == 5 * 6  # 96 tokens = 6 blocks of 16
    assert engine.max_model_len == 96


def test_cpu_default_is_no_larger_than_before():
    budget = default_kv_cache_memory(SMOLLM2, 64, None, 16, "cpu", torch.float32)
    assert budget == CPU_KV_CACHE_BYTES  # 64 x 8,192 tokens would be 24 GB
    small = default_kv_cache_memory(SMOLLM2, 2, 512, 16, "cpu", torch.float32)
    assert small == 2 * 512 * SMOLLM2.kv_bytes_per_token(torch.float32) < CPU_KV_CACHE_BYTES


def test_cuda_default_is_capped_by_free_memory():
    free = 3 * 2**30
    seen = []

    def fake_free(device):
        seen.append(device)
        return free

    per_token = SMOLLM2.kv_bytes_per_token(torch.float16)
    budget = default_kv_cache_memory(SMOLLM2, 64, None, 16, "cuda:0", torch.float16, free_memory=fake_free)
    assert budget == int(GPU_KV_CACHE_MAX_FRACTION * free) < 64 * 8192 * per_token
    assert seen == [torch.device("cuda:0")]
    # room to spare: exactly what the seats can use, not a share of the card
    plenty = lambda device: 80 * 2**30  # noqa: E731
    assert default_kv_cache_memory(SMOLLM2, 8, 2048, 16, "cuda", torch.float16, plenty) == 8 * 2048 * per_token


def test_one_sequence_that_cannot_fit_is_a_clear_error():
    tiny_free = lambda device: 50 * 2**20  # noqa: E731
    with pytest.raises(ValueError, match=r"max_model_len=8192 .*lower max_model_len or pass kv_cache_memory="):
        default_kv_cache_memory(SMOLLM2, 1, 8192, 16, "cuda", torch.float16, tiny_free)
    # a bigger model on the CPU: one full 8,192-token sequence over the 512 MiB cap
    big = ModelConfig(vocab_size=1000, hidden_size=4096, intermediate_size=8, num_layers=32, num_heads=32,
                      num_kv_heads=8, max_position_embeddings=8192)
    with pytest.raises(ValueError, match="CPU_KV_CACHE_BYTES"):
        default_kv_cache_memory(big, 1, 8192, 16, "cpu", torch.float32)
    # the model's own context, not asked for, shrinks to what the cache holds instead
    budget = default_kv_cache_memory(big, 1, None, 16, "cpu", torch.float32)
    assert budget == CPU_KV_CACHE_BYTES
    assert budget // PagedKVCache.bytes_per_block(big, 16) * 16 < 8192


def test_explicit_budget_is_unchanged():
    model = small_model()
    per_block = PagedKVCache.bytes_per_block(model.config, 16)
    engine = LLMEngine(model, None, EngineConfig(kv_cache_memory=7 * per_block, max_num_seqs=64))
    assert engine.kv_cache.num_blocks == 7
    assert engine.max_model_len == 7 * 16


def test_explicit_budget_in_whole_blocks():
    model = small_model()
    per_block = PagedKVCache.bytes_per_block(model.config, 4)
    assert kv_pool(model.config, EngineConfig(kv_cache_memory=10 * per_block + 7, block_size=4), "cpu",
                   torch.float32)[0] == 10
    with pytest.raises(ValueError, match="CUDA"):
        kv_pool(model.config, EngineConfig(kv_cache_memory=0.5), "cpu", torch.float32)
    with pytest.raises(ValueError, match="holds no KV block"):
        kv_pool(model.config, EngineConfig(kv_cache_memory=per_block - 1, block_size=4), "cpu", torch.float32)
