"""Tensor parallelism (course_lib.parallel): two CPU processes over gloo give the single-process model's logits
and greedy tokens, a killed worker is an error within seconds, and the byte counts match the formulas."""
from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time

import pytest
import torch

from course_lib import LLM, SamplingParams, tolerance
from course_lib.attention.paged import PagedKVCache
from course_lib.config import ModelConfig
from course_lib.engine.config import EngineConfig
from course_lib.model import Transformer
from course_lib.parallel import (TensorParallelWorkers, comm_per_token, plan_shard, rank_config,
                                 rank_weight_bytes)
from course_lib.quant import QuantLinear, quantize_model

SMOLLM2 = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                      num_kv_heads=3, tie_word_embeddings=True)


def small(num_kv_heads: int = 2, tie: bool = False, vocab: int = 1001, seed: int = 0) -> Transformer:
    """A random float32 model with 4 query heads; a vocabulary that 2 ranks split unevenly (padding)."""
    cfg = ModelConfig(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                      num_kv_heads=num_kv_heads, tie_word_embeddings=tie, max_position_embeddings=256)
    torch.manual_seed(seed)
    model = Transformer(cfg)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return model.eval()


def test_head_split_plan():
    """SmolLM2's 9 query / 3 KV heads: tp=3 splits 3/1, tp=9 replicates KV heads, tp=2 is refused by name."""
    with pytest.raises(ValueError, match=r"tensor_parallel_size 2 .* 9 query heads \(3 KV heads\)"):
        plan_shard(SMOLLM2, 0, 2)
    for rank in range(3):
        s = plan_shard(SMOLLM2, rank, 3)
        assert s.q_heads == range(3 * rank, 3 * rank + 3) and s.kv_heads == range(rank, rank + 1)
    with pytest.raises(ValueError, match="tensor_parallel_size 9 does not divide intermediate_size 1536"):
        plan_shard(SMOLLM2, 0, 9)
    # fewer KV heads than ranks (tp=9): query head r uses KV head r // 3, so rank r keeps a copy of that one
    wider = dataclasses.replace(SMOLLM2, intermediate_size=1152)
    assert [plan_shard(wider, r, 9).kv_heads for r in range(9)] == [range(r // 3, r // 3 + 1) for r in range(9)]
    cfg = rank_config(plan_shard(SMOLLM2, 1, 3))
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size) == (3, 1, 64, 512)
    # each rank's KV cache holds a third of the KV heads: a third of the bytes per token
    assert 3 * cfg.kv_bytes_per_token(torch.float32) == SMOLLM2.kv_bytes_per_token(torch.float32)


@pytest.mark.parametrize("num_kv_heads,tie", [(2, False), (1, True)], ids=["kv-split", "kv-replicated-tied"])
def test_two_ranks_give_single_process_logits(num_kv_heads, tie):
    """Sharded over 2 gloo processes: logits as the whole model's, up to rounding; bytes match the formulas."""
    model = small(num_kv_heads, tie)
    full = model.config
    ids = torch.randint(0, full.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want = model(ids)
    workers = TensorParallelWorkers(model, EngineConfig(tensor_parallel_size=2))
    try:
        assert model.config.num_heads == 2 and model.config.num_kv_heads == max(num_kv_heads // 2, 1)
        with torch.inference_mode():
            got = model(ids)
        tolerance.assert_close(got, want, tolerance.MODEL_RTOL[torch.float32], "2 ranks' logits")
        formula = comm_per_token(full, 2, torch.float32)
        assert model.comm.all_reduces == formula.all_reduces == 2 * full.num_layers + 1
        assert model.comm.all_reduce_bytes == formula.all_reduce_bytes * ids.numel()
        assert model.comm.all_gather_bytes == formula.all_gather_bytes * ids.numel()
        expected = rank_weight_bytes(full, 2, torch.float32)
        assert workers.weight_bytes == {0: expected, 1: expected}  # each rank measured in its own process
    finally:
        workers.close()


def engine_options(model_config: ModelConfig, tp: int, blocks: int) -> dict:
    """A KV cache of `blocks` blocks of 4 on each rank (the budget is per rank, as vLLM's)."""
    per_rank = rank_config(plan_shard(model_config, 0, tp)) if tp > 1 else model_config
    return dict(block_size=4, enable_prefix_caching=False,
                kv_cache_memory=blocks * PagedKVCache.bytes_per_block(per_rank, 4, torch.float32))


def test_llm_two_ranks_greedy_tokens_identical_with_preemption(tokenizer):
    """8 prompts through LLM.from_model(tensor_parallel_size=2), preempting: the single-process tokens; the
    all-reduce/all-gather bytes the engine's steps moved, and each rank's KV bytes, match the formulas."""
    prompts = [list(range(100 + 37 * i, 100 + 37 * i + 3 + 4 * i)) for i in range(8)]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    ref = LLM.from_model(small(), tokenizer, **engine_options(small().config, 1, 24))
    want = [o.outputs[0].token_ids for o in ref.generate(prompts, params)]
    assert ref.engine.stats.preemptions > 0
    full = small().config
    with LLM.from_model(small(), tokenizer, tensor_parallel_size=2, **engine_options(full, 2, 24)) as llm:
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        stats, cache, comm = llm.engine.stats, llm.engine.kv_cache, llm.model.comm
        assert stats.preemptions > 0
        assert got == want
        formula = comm_per_token(full, 2, torch.float32)
        tokens_run = stats.prefill_tokens + stats.decode_tokens  # recomputed prompts included
        assert comm.all_reduce_bytes == formula.all_reduce_bytes * tokens_run
        assert comm.all_gather_bytes == formula.all_gather_bytes * sum(len(t) for t in got)  # one row per sample
        assert cache.num_blocks == 24
        assert cache.nbytes == 24 * 4 * llm.model.config.kv_bytes_per_token(torch.float32)
        assert 2 * cache.nbytes == 24 * 4 * full.kv_bytes_per_token(torch.float32)


def test_killed_worker_is_an_error_within_seconds(tokenizer):
    """A worker killed between steps, or in the middle of a generate: a RuntimeError naming it, fast."""
    params = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)
    for mid_generate in (False, True):
        llm = LLM.from_model(small(), tokenizer, tensor_parallel_size=2)
        worker = llm.workers.procs[0]
        try:
            if mid_generate:
                llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2, temperature=0))  # it runs before the kill
                threading.Timer(0.3, os.kill, (worker.pid, signal.SIGKILL)).start()
            else:
                os.kill(worker.pid, signal.SIGKILL)
            t = time.perf_counter()
            with pytest.raises(RuntimeError, match=f"tp-rank1 \\(pid {worker.pid}\\) exited"):
                llm.generate([[1, 2, 3], [4, 5]], params)
            assert time.perf_counter() - t < 5
            assert llm.engine.block_manager.num_used_blocks == 0  # the engine aborted the step's requests
        finally:
            llm.close()
    with LLM.from_model(small(), tokenizer, tensor_parallel_size=2) as llm:  # the process group was released
        assert len(llm.generate([[1, 2]], SamplingParams(max_tokens=3))[0].outputs[0].token_ids) == 3


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_quantized_shards(method):
    """Quantized after sharding: every rank quantizes its slices (fewer bytes), and the logits move from the float
    ones about as much as the single-process quantized model's do (row-parallel scales see half the inputs)."""
    model = small(2, tie=True)
    full = model.config
    ids = torch.arange(10, 30)[None]
    with torch.inference_mode():
        want = model(ids)
        single = (quantize_model(small(2, tie=True), method, group_size=32)(ids) - want).abs().max().item()
    float_bytes = rank_weight_bytes(full, 2, torch.float32)
    workers = TensorParallelWorkers(model, EngineConfig(tensor_parallel_size=2, quantization=method, group_size=32))
    try:
        assert isinstance(model.layers[0].self_attn.q_proj, QuantLinear)
        assert isinstance(model.layers[0].self_attn.o_proj.linear, QuantLinear)  # inside the row-parallel wrapper
        assert all(b < float_bytes for b in workers.weight_bytes.values())
        with torch.inference_mode():
            got = model(ids)
        err = (got - want).abs().max().item()
        assert 0 < err < 2 * single
    finally:
        workers.close()


def test_refusals_before_any_process_starts(tokenizer):
    with pytest.raises(ValueError, match="does not divide the model's 4 query heads"):
        LLM.from_model(small(), tokenizer, tensor_parallel_size=3)
    with pytest.raises(ValueError, match="accel"):
        LLM.from_model(small(), tokenizer, tensor_parallel_size=2, accel=True)
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        LLM.from_model(small(), tokenizer, tensor_parallel_size=0)
