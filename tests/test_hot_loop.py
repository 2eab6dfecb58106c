"""The engine's step without waste: no device reads but the sampled tokens, one host->device copy of the step's
inputs, and every prompt chunk of a step in one attention call per layer."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from course_lib import SamplingParams, tolerance
from course_lib.attention import causal_attention, paged
from course_lib.attention.paged import PagedAttention, PagedAttentionMetadata, PagedKVCache, slots_for
from course_lib.config import ModelConfig
from course_lib.engine import model_runner
from course_lib.engine.llm_engine import EngineConfig, LLMEngine
from course_lib.engine.sequence import Sequence
from course_lib.generate import generate_stream
from course_lib.host_copy import to_device_at_once
from course_lib.model import Transformer

VOCAB = 512
READS = {"_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_consecutive"}  # ops that read back


class HostReads(TorchDispatchMode):
    """Counts what would make the host wait on a CUDA device: item()/bool()/int() (`_local_scalar_dense`),
    data-dependent shapes (nonzero, boolean indexing), and Tensor.tolist(), which bypasses dispatch."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        self.count += name in READS or (name in ("index", "index_put", "index_put_") and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] if i is not None))
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        self._tolist = torch.Tensor.tolist

        def tolist(t):
            self.count += 1
            return self._tolist(t)

        torch.Tensor.tolist = tolist
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                         num_kv_heads=2, max_position_embeddings=1024, tie_word_embeddings=False)
    return Transformer(config).to(torch.float64).eval()


def test_the_counter_sees_syncs():
    t = torch.arange(5)
    with HostReads() as reads:
        bool((t > 3).any()), t[t > 2], t.tolist(), (t > 1).nonzero()
    assert reads.count == 4


def run_engine(tiny, tokenizer, prompts, params, **config):
    engine = LLMEngine(tiny, tokenizer, EngineConfig(**config))
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    outs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outs[out.request_id] = out
    return engine, [outs[i].outputs[0].token_ids for i in ids]


def test_a_step_reads_the_device_once_and_copies_to_it_once(tiny, tokenizer, monkeypatch):
    torch.manual_seed(1)
    shared = torch.randint(3, VOCAB, (40,)).tolist()  # a cached prefix for the later prompts
    prompts = [shared + torch.randint(3, VOCAB, (n,)).tolist() for n in (5, 30, 2, 17)]
    params = [SamplingParams(max_tokens=6, temperature=0, ignore_eos=True),
              SamplingParams(max_tokens=6, temperature=0.8, top_k=50, top_p=0.9, seed=3, ignore_eos=True),
              SamplingParams(max_tokens=6, temperature=1.0, min_p=0.05, repetition_penalty=1.2,
                             logit_bias={7: 3.0}, ignore_eos=True),
              SamplingParams(max_tokens=6, temperature=0.7, ignore_eos=True)]
    copies, reads_per_step = [], []
    real_copy, real_run = model_runner.to_device_at_once, model_runner.ModelRunner.run

    def copy_spy(tensors, device):
        copies[-1] += 1
        return real_copy(tensors, device)

    def counted_run(self, batch):
        copies.append(0)
        with HostReads() as reads:
            tokens = real_run(self, batch)
        reads_per_step.append(reads.count)
        return tokens

    monkeypatch.setattr(model_runner, "to_device_at_once", copy_spy)  # the runner's inputs and the metadata's
    monkeypatch.setattr(paged, "to_device_at_once", copy_spy)
    monkeypatch.setattr(model_runner.ModelRunner, "run", counted_run)
    engine, _ = run_engine(tiny, tokenizer, prompts, params, max_num_batched_tokens=48, block_size=8)
    assert len(reads_per_step) >= 8
    assert all(n <= 1 for n in reads_per_step), reads_per_step  # the sampled tokens' .tolist(), and no more
    assert reads_per_step.count(1) >= 6  # steps that sample did read them back: the counter counts
    assert copies == [1] * len(copies), copies  # the model's inputs; the sampler's knobs travel in one more


def test_packed_steps_keep_greedy_tokens_of_the_one_at_a_time_loop(tiny, tokenizer):
    torch.manual_seed(2)
    shared = torch.randint(3, VOCAB, (24,)).tolist()
    prompts = [shared + torch.randint(3, VOCAB, (n,)).tolist() for n in (1, 9, 33)] + [[5, 6]]
    params = [SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)] * len(prompts)
    _, got = run_engine(tiny, tokenizer, prompts, params, max_num_batched_tokens=40, block_size=4)
    for prompt, tokens in zip(prompts, got):
        seq = Sequence("ref", prompt, params[0], tokenizer)
        list(generate_stream(tiny, seq))
        assert tokens == seq.output_token_ids


def test_to_device_at_once_splits_back_shapes_and_dtypes():
    parts = [torch.tensor([[1, 2, 3]]), torch.tensor([[4, -1], [5, 6]], dtype=torch.int32),
             torch.zeros(0, dtype=torch.int64), torch.tensor([7], dtype=torch.int32)]
    moved = to_device_at_once(parts, "cpu")
    for a, b in zip(parts, moved):
        assert a.dtype == b.dtype and torch.equal(a, b)
    floats = to_device_at_once([torch.tensor([0.5, 2.0]), torch.ones(2, 2)], "cpu")
    assert floats[1].shape == (2, 2) and floats[0].tolist() == [0.5, 2.0]
    with pytest.raises(ValueError, match="one dtype"):
        to_device_at_once([torch.ones(2), torch.ones(2, dtype=torch.float64)], "cpu")


def test_staging_copies_the_values_and_pins_nothing_without_cuda(monkeypatch):
    """On the CPU the staging helpers are torch.tensor and copy_: the right values, and pin_memory is never
    called (it needs CUDA); CUDA devices pin only where CUDA is there."""
    from course_lib import host_copy

    def no_pinning(*args, **kwargs):
        raise AssertionError("pin_memory called without CUDA")

    monkeypatch.setattr(torch.Tensor, "pin_memory", no_pinning)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not host_copy.pins("cpu") and not host_copy.pins("cuda") and not host_copy.pins(torch.device("cuda", 1))
    rows = host_copy.staged([[3, 1], [4, 1]], torch.int32, "cpu")
    assert rows.dtype == torch.int32 and rows.tolist() == [[3, 1], [4, 1]]
    bias = host_copy.staged([0.5, -2.0], torch.bfloat16, torch.device("cpu"))
    assert bias.dtype == torch.bfloat16 and bias.tolist() == [0.5, -2.0]
    tables = torch.full((4, 3), -1, dtype=torch.int32)  # a graph's static block tables, [max_rows, max_blocks]
    host_copy.copy_into(tables[:2], [[7, 8, 0], [9, 0, 0]])  # the first rows: contiguous
    assert tables.tolist() == [[7, 8, 0], [9, 0, 0], [-1, -1, -1], [-1, -1, -1]]
    with pytest.raises(ValueError, match="contiguous"):
        host_copy.copy_into(tables[:, :2], [[1, 2]] * 4)
    moved = to_device_at_once([torch.tensor([1, 2]), torch.tensor([3], dtype=torch.int32)], "cpu")
    assert [m.tolist() for m in moved] == [[1, 2], [3]]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert host_copy.pins("cuda") and not host_copy.pins("cpu")


def test_engine_checks_its_limits_before_capturing_graphs(tiny, tokenizer):
    """A refused max_model_len raises before the accelerator's decode step is made (captured or compiled)."""
    captured = []
    accel = type("Accel", (), {"attention": PagedAttention, "stats": lambda self: {},
                                "decode_step": lambda self, model, kv: captured.append(kv) or None})()
    with pytest.raises(ValueError, match="max_model_len"):
        LLMEngine(tiny, tokenizer, EngineConfig(max_model_len=10 ** 9), accel=accel)
    assert captured == []
    LLMEngine(tiny, tokenizer, EngineConfig(max_model_len=64), accel=accel)
    assert len(captured) == 1


@pytest.mark.cuda
def test_to_device_at_once_on_cuda_makes_one_nonblocking_copy():
    moved = to_device_at_once([torch.arange(6).view(2, 3), torch.tensor([1, 2], dtype=torch.int32)], "cuda")
    torch.cuda.synchronize()
    assert moved[0].is_cuda and moved[0].tolist() == [[0, 1, 2], [3, 4, 5]] and moved[1].tolist() == [1, 2]
    assert moved[1].dtype == torch.int32 and moved[0].untyped_storage().nbytes() == 8 * 8  # a view of one buffer


@pytest.mark.cuda
def test_staging_on_cuda_pins_and_copies():
    from course_lib import host_copy

    target = torch.zeros(4, 3, dtype=torch.int32, device="cuda")
    host_copy.copy_into(target[:2], [[1, 2, 3], [4, 5, 6]])
    picked = host_copy.staged([2, 0], torch.long, "cuda")
    torch.cuda.synchronize()
    assert target.tolist()[:2] == [[1, 2, 3], [4, 5, 6]] and picked.is_cuda and picked.tolist() == [2, 0]


# ---- prompt chunks in one call per layer ---------------------------------------------------------------------
HEADS, KV_HEADS, HEAD_DIM, BLOCK = 6, 2, 8, 4


def per_sequence_step(seqs, full):
    """What the backend computed before: each prompt chunk by its own causal SDPA, each decode alone."""
    return torch.cat([causal_attention(q[None, ctx - n:], k[None], v[None], start=ctx - n)[0]
                      for (q, k, v), (ctx, n) in zip(full, seqs)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_prompt_chunks_with_cached_prefixes_and_decodes_in_one_step(dtype, monkeypatch):
    # two prompt chunks after cached prefixes, two decodes, and a fresh prompt, packed in one step
    seqs = [(19, 7), (33, 1), (13, 5), (6, 1), (9, 9)]  # (context after the step, new tokens)
    g = torch.Generator().manual_seed(0)
    full = [tuple(torch.randn(c, h, HEAD_DIM, generator=g, dtype=dtype) for h in (HEADS, KV_HEADS, KV_HEADS))
            for c, _ in seqs]
    num_blocks = sum(-(-c // BLOCK) for c, _ in seqs) + 2
    perm = torch.randperm(num_blocks, generator=g).tolist()
    tables, at = [], 0
    for c, _ in seqs:
        tables.append(perm[at:at + -(-c // BLOCK)])
        at += len(tables[-1])
    cfg = ModelConfig(vocab_size=8, hidden_size=HEADS * HEAD_DIM, intermediate_size=8, num_layers=1,
                      num_heads=HEADS, num_kv_heads=KV_HEADS)
    cache = PagedKVCache(cfg, num_blocks, BLOCK, dtype=dtype)
    for (q, k, v), table, (ctx, n) in zip(full, tables, seqs):  # the cached part, as earlier steps left it
        slots = torch.tensor(slots_for(table, range(ctx - n), BLOCK), dtype=torch.long)
        cache.k_cache[0].view(-1, KV_HEADS, HEAD_DIM)[slots] = k[:ctx - n]
        cache.v_cache[0].view(-1, KV_HEADS, HEAD_DIM)[slots] = v[:ctx - n]
    calls = []
    real = paged.paged_prefill_attention
    monkeypatch.setattr(paged, "paged_prefill_attention", lambda *a: calls.append(a[0].shape) or real(*a))
    md = PagedAttentionMetadata.build(tables, [c for c, _ in seqs], [n for _, n in seqs], BLOCK)
    new = [torch.cat([t[i][c - n:] for t, (c, n) in zip(full, seqs)])[None] for i in range(3)]
    out = PagedAttention(cache, md).attend(0, *new)[0]  # [num_tokens, heads, head_dim]
    assert calls == [(3, 9, HEADS, HEAD_DIM)]  # three chunks (7, 5 and 9 queries), one call
    tolerance.assert_close(out, per_sequence_step(seqs, full), 1e-5 if dtype == torch.float32 else 1e-12)
