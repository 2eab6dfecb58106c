"""Decode steps as CUDA graphs per batch bucket (`course_lib.accel.cuda_graphs`). On the CPU `EagerGraph` stands
in for the capture, so everything but the capture itself runs here: buckets, padding, static buffers, the K/V
store after the replay, the engine's eager fallback. The `cuda` tests capture for real."""
from __future__ import annotations

import os

import pytest
import torch

from course_lib import LLM, tolerance
from course_lib.accel import Accelerator, Plan
from course_lib.accel.attention import decode_attention_with_new
from course_lib.accel.cuda_graphs import CUDAGraphDecodeStep, bucket_for, capture_sizes
from course_lib.attention.paged import PagedAttention, PagedAttentionMetadata, PagedKVCache
from course_lib.config import ModelConfig
from course_lib.engine.llm_engine import EngineConfig, LLMEngine
from course_lib.model import Transformer
from course_lib.sampling import SamplingParams
from tests.paged_inputs import random_decode_batch

PROMPTS = [[1, 2, 3, 4, 5], [400, 401], list(range(1000, 1019)), [7], [9, 8, 7, 6]]  # contexts cross blocks
MAX_TOKENS = (12, 30, 9, 20, 5)  # the batch shrinks 5, 4, 3, 2, 1 as requests finish: every bucket pads


def tiny_model(dtype=torch.float32, vocab_size=49152) -> Transformer:
    """Random weights over the default tokenizer's vocabulary (so the engine can detokenize), two layers."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                      num_kv_heads=2, tie_word_embeddings=True, max_position_embeddings=256, name="tiny")
    model = Transformer(cfg).to(dtype).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.5)  # spread-out logits: greedy ties would make the comparison luck
    return model


def graph_plan(device: str = "cpu", **changes) -> Plan:
    return Plan(device, torch.float32, cuda_graphs=True, **changes)


def greedy(llm: LLM) -> list[list[int]]:
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in MAX_TOKENS]
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]


ENGINE = dict(block_size=4, kv_cache_memory=4 * 2**20, enable_prefix_caching=False)


def test_buckets():
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 24]  # the largest bucket holds max_num_seqs
    assert capture_sizes(1) == [1] and capture_sizes(3) == [1, 2, 4]
    assert capture_sizes(10**6)[-1] == 512
    sizes = capture_sizes(20)
    assert [bucket_for(n, sizes) for n in (1, 2, 3, 4, 5, 8, 9, 17, 24)] == [1, 2, 4, 4, 8, 8, 16, 24, 24]
    assert bucket_for(25, sizes) is None


def test_padded_graph_steps_give_the_reference_tokens(tokenizer):
    """Greedy tokens through the graph runner (buckets 1-8, batches of 5 down to 1, so most steps pad) equal the
    reference engine's; the graphs are counted in the engine's stats."""
    want = greedy(LLM.from_model(tiny_model(), tokenizer, **ENGINE))
    llm = LLM.from_model(tiny_model(), tokenizer, accel=graph_plan(), max_num_seqs=8, max_model_len=128, **ENGINE)
    got = greedy(llm)
    assert [len(g) for g in got] == list(MAX_TOKENS)
    assert got == want
    step = llm.engine.model_runner.decode_graph
    assert sorted(step.graphs) == [1, 2, 4, 8] and step.max_blocks == 32  # 128 tokens in blocks of 4
    assert llm.engine.stats.cuda_graphs == 4 and llm.engine.stats.graph_capture_seconds > 0
    assert step.steps == max(MAX_TOKENS) - 1  # every decode step (all prompts prefill in the first)
    assert llm.engine.block_manager.num_used_blocks == 0


@pytest.mark.needs_cpp
def test_graph_steps_with_the_cpp_kernel_give_the_reference_tokens(tokenizer):
    """The same with the C++ attention operator inside the step (its k_new/v_new) and fused blocks."""
    want = greedy(LLM.from_model(tiny_model(), tokenizer, **ENGINE))
    llm = LLM.from_model(tiny_model(), tokenizer, accel=graph_plan(attention="cpp"), max_num_seqs=8, **ENGINE)
    assert greedy(llm) == want
    assert llm.engine.model_runner.decode_graph.steps == max(MAX_TOKENS) - 1


def check_graph_steps(attention: str, dtype: torch.dtype, tol: float, device: str = "cpu") -> None:
    """Steps of 3, 2 and 3 sequences (buckets 4, 2, 4): the same static input and output buffers every time;
    logits and stored K/V as the eager paged forward gives; no other cache slot changes."""
    model = tiny_model(dtype, vocab_size=97).to(device)
    cache = PagedKVCache(model.config, num_blocks=24, block_size=4, dtype=dtype, device=device)
    torch.manual_seed(1)
    cache.k_cache.normal_(), cache.v_cache.normal_()
    step = CUDAGraphDecodeStep(model, cache, attention, max_num_seqs=4, max_model_len=64)
    step.warmup()
    assert sorted(step.graphs) == [1, 2, 4] and step.block_tables.shape == (4, 16)
    buffers = (step.input_ids, step.positions, step.cached_lens, step.block_tables, step.logits, step.new_k, step.new_v)
    pointers = [t.data_ptr() for t in buffers]
    cases = [([5, 17, 60], [0, 5, 9], [[3], [1, 7], [2, 9, 11]]),
             ([8, 9], [2, 13], [[20], [4, 5, 6, 23]]),
             ([11, 12, 13], [1, 6, 10], [[3], [1, 7], [2, 9, 11]])]
    for ids, positions, tables in cases:
        before_k, before_v = cache.k_cache.clone(), cache.v_cache.clone()
        eager = PagedKVCache(model.config, num_blocks=24, block_size=4, dtype=dtype, device=device)
        eager.k_cache.copy_(before_k), eager.v_cache.copy_(before_v)
        meta = PagedAttentionMetadata.build(tables, [p + 1 for p in positions], [1] * len(ids), block_size=4,
                                            device=device)
        ids_t, pos_t = torch.tensor(ids, device=device), torch.tensor(positions, device=device)
        want = model(ids_t[None], pos_t[None], kv=PagedAttention(eager, meta))[0]
        logits = step(ids_t, pos_t, tables, meta.slot_mapping)
        tolerance.assert_close(logits, want, tol, "logits")
        tolerance.assert_close(cache.k_cache, eager.k_cache, tol, "K cache")
        tolerance.assert_close(cache.v_cache, eager.v_cache, tol, "V cache")
        for now, before in ((cache.k_cache, before_k), (cache.v_cache, before_v)):
            changed = (now != before).flatten(3).any(-1).any(0).flatten()  # [blocks * block_size]: slots
            assert changed.nonzero().flatten().tolist() == sorted(meta.slot_mapping.tolist())
        rows = bucket_for(len(ids), step.sizes)
        assert logits.data_ptr() == step.logits.data_ptr()  # rows of the static output
        assert step.cached_lens[len(ids):rows].eq(0).all() and step.input_ids[len(ids):rows].eq(0).all()
    assert [t.data_ptr() for t in buffers] == pointers
    assert step.steps == 3 and step.takes(4) and not step.takes(5)


def test_static_buffers_are_reused_and_padding_writes_no_kv():
    check_graph_steps("torch", torch.float64, 1e-10)


def test_steps_larger_than_the_largest_bucket_run_eager(tokenizer):
    """Graphs up to 2 sequences under an engine that runs up to 8: steps of 3-5 go the eager way, same tokens."""
    want = greedy(LLM.from_model(tiny_model(), tokenizer, **ENGINE))
    model = tiny_model()
    accel = Accelerator.apply(model, graph_plan(), max_num_seqs=2)
    engine = LLMEngine(model, tokenizer, EngineConfig(max_num_seqs=8, **ENGINE), accel)
    llm = LLM.__new__(LLM)
    llm.engine, llm.tokenizer = engine, tokenizer
    assert greedy(llm) == want
    step = engine.model_runner.decode_graph
    assert sorted(step.graphs) == [1, 2] and not step.takes(3)
    assert step.steps == max(MAX_TOKENS) - 1 - 11  # the first 11 decode steps have 3 or more sequences


def test_enforce_eager_turns_graphs_off(tokenizer):
    llm = LLM.from_model(tiny_model(), tokenizer, accel=graph_plan(), enforce_eager=True, **ENGINE)
    assert not llm.accel.plan.cuda_graphs and llm.engine.model_runner.decode_graph is None
    assert llm.engine.stats.cuda_graphs == 0
    assert "CUDA graphs" in graph_plan().describe() and "CUDA graphs" not in Plan("cpu", torch.float32).describe()
    with pytest.raises(TypeError, match="enforce_eager"):
        LLM.from_model(tiny_model(), tokenizer, enforce_eager="yes")


def check_triton_new_token(device: str, dtype: torch.dtype = torch.float32, rtol: float = 1e-3) -> float:
    """The Triton kernel's k_new/v_new (the step's own token, not yet stored) against the PyTorch twin, with
    empty contexts (padded rows) among them and k/v views as a fused projection gives them."""
    from course_lib.accel.triton_paged import triton_paged_decode_attention

    q, k, v, tables, lens = random_decode_batch([0, 3, 4, 13, 0, 9], device=device, dtype=dtype)
    kv_new = torch.randn(6, 2, 2, 8, device=device, dtype=dtype)  # [seqs, k|v, kv_heads, head_dim]
    k_new, v_new = kv_new[:, 0], kv_new[:, 1]  # strided views
    tables = tables.clamp(min=0)  # a graph's static tables hold block ids, never -1
    want = decode_attention_with_new(q, k, v, tables, lens, k_new, v_new).float()
    got = triton_paged_decode_attention(q, k, v, tables, lens, k_new, v_new).float()
    rel = tolerance.assert_close(got, want, rtol)
    with pytest.raises(ValueError, match="together"):
        triton_paged_decode_attention(q, k, v, tables, lens, k_new)
    return rel


def test_triton_new_token_and_graph_steps_interpreted(run_triton_interpreted):
    """The kernel's k_new/v_new, and graph steps through it, under the Triton interpreter."""
    assert "triton graph steps ok" in run_triton_interpreted(__file__)


@pytest.mark.cuda
def test_cuda_graphs_match_eager_on_cuda(tokenizer):
    """The real capture: greedy tokens through CUDA graphs equal eager steps with the same kernels."""
    from course_lib.accel import plan_for

    check_triton_new_token("cuda")
    if torch.cuda.get_device_capability()[0] >= 8:  # a T4 has no bfloat16: LLM refuses it there
        check_triton_new_token("cuda", torch.bfloat16, rtol=2e-2)
    check_graph_steps("triton", torch.float32, 1e-4, "cuda")  # captured for real: same buffers, padding
    assert plan_for("cuda", torch.float32).cuda_graphs
    assert not plan_for("cuda", torch.float32, enforce_eager=True).cuda_graphs
    cuda = dict(ENGINE, kv_cache_memory=64 * 2**20)

    def run(enforce_eager: bool):
        llm = LLM.from_model(tiny_model().cuda(), tokenizer, accel=True, enforce_eager=enforce_eager,
                             max_num_seqs=8, **cuda)
        return llm, greedy(llm)

    eager, want = run(True)
    llm, got = run(False)
    assert got == want
    step = llm.engine.model_runner.decode_graph
    assert llm.engine.stats.cuda_graphs == 4 and step.steps == max(MAX_TOKENS) - 1
    assert eager.engine.stats.cuda_graphs == 0
    ids = torch.tensor([5, 6, 7], device="cuda")
    logits = step(ids, ids, [[0, 1], [2, 3], [4, 5]], torch.tensor([5, 14, 23], device="cuda"))
    assert logits.shape == (3, 49152) and logits.data_ptr() == step.logits.data_ptr()
    assert step.cached_lens[3:4].eq(0).all()


if __name__ == "__main__":  # run by test_triton_new_token_matches_torch_interpreted
    assert os.environ.get("TRITON_INTERPRET") == "1", "set TRITON_INTERPRET=1 to run the kernel on the CPU"
    print(f"triton new-token max rel err {check_triton_new_token('cpu'):.2e}")
    check_graph_steps("triton", torch.float32, 1e-4)
    print("triton graph steps ok")
