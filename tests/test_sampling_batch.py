"""The Sampler's batched pass: each knob against transformers' logits processors, row by row, with every row's
knobs different in one batch; bit for bit equal to `processed_logits`; seeded rows as the per-row loop drew them."""
import pytest
import torch
from transformers.generation.logits_process import (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                                                    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

from course_lib.sampling import (Sampler, SamplingParams, processed_logits, sample_from_probs)
from course_lib.sampling_batch import BatchKnobs, processed_logits_batch

VOCAB = 1000

# One batch, a different setting in every row: knobs off, knobs alone, all at once, greedy rows among them.
ROWS = [
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.0, top_k=5),
    SamplingParams(temperature=1.3, top_p=0.9),
    SamplingParams(temperature=0.9, min_p=0.05),
    SamplingParams(temperature=0),  # greedy
    SamplingParams(temperature=0.8, top_k=50, top_p=0.9, min_p=0.02, repetition_penalty=1.3),
    SamplingParams(temperature=1.0, repetition_penalty=0.8),
    SamplingParams(temperature=0, repetition_penalty=1.5, top_k=3),  # greedy: top_k ignored, penalty kept
    SamplingParams(temperature=0.5, top_k=VOCAB + 10, top_p=0.5),  # top_k past the vocab: off
    SamplingParams(temperature=1.0),  # nothing on
]


def batch_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(ROWS), VOCAB, generator=g) * 3  # [rows, vocab]
    histories = [torch.randint(0, VOCAB, (20,), generator=g).tolist() for _ in ROWS]
    return logits, histories


def transformers_row(logits_row, history, p: SamplingParams):
    """The same chain through transformers' processors, one row."""
    ids, scores = torch.tensor([history]), logits_row[None].clone()
    if p.repetition_penalty != 1.0:
        scores = RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(ids, scores)
    if p.greedy:
        return scores[0]
    scores = TemperatureLogitsWarper(p.temperature)(ids, scores)
    if 0 < p.top_k < VOCAB:
        scores = TopKLogitsWarper(p.top_k)(ids, scores)
    if p.top_p < 1.0:
        scores = TopPLogitsWarper(p.top_p)(ids, scores)
    if p.min_p > 0:
        scores = MinPLogitsWarper(p.min_p)(ids, scores)
    return scores[0]


def test_each_row_matches_transformers_processors():
    logits, histories = batch_inputs()
    ours = processed_logits_batch(logits, BatchKnobs.build(ROWS, histories, VOCAB, "cpu"))
    for i, p in enumerate(ROWS):
        ref = transformers_row(logits[i], histories[i], p)
        assert torch.equal(torch.isfinite(ours[i]), torch.isfinite(ref)), (i, p)
        torch.testing.assert_close(ours[i], ref, msg=f"row {i}: {p}")
    kept = torch.isfinite(ours).sum(-1).tolist()
    assert kept[1] == 5 and kept[0] == kept[4] == kept[6] == VOCAB and 1 < kept[2] < VOCAB  # knobs did act


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batched_rows_equal_processed_logits_bit_for_bit(seed):
    logits, histories = batch_inputs(seed)
    params = ROWS[:3] + [SamplingParams(temperature=0.6, top_k=7, logit_bias={3: 100.0, 9: -5.0})] + ROWS[3:]
    histories = histories[:3] + [histories[0]] + histories[3:]
    logits = torch.cat([logits[:3], logits[:1], logits[3:]])
    ours = processed_logits_batch(logits, BatchKnobs.build(params, histories, VOCAB, "cpu"))
    for i, (p, hist) in enumerate(zip(params, histories)):
        seen = torch.tensor(sorted(set(hist))) if p.repetition_penalty != 1.0 else None
        assert torch.equal(ours[i], processed_logits(logits[i], p, seen)), (i, p)


def old_sampler_loop(sampler, logits, params, histories, request_ids):
    """The per-row Sampler.__call__ the batched pass replaced, kept as the reference for seeded rows."""
    tokens = []
    for row, p, hist, rid in zip(logits, params, histories, request_ids):
        seen = torch.tensor(sorted(set(hist)), dtype=torch.long) if p.repetition_penalty != 1.0 else None
        row = processed_logits(row, p, seen)
        if p.greedy:
            tokens.append(row.argmax())
        else:
            tokens.append(sample_from_probs(row.softmax(-1), sampler.generator_for(rid, p, row.device)))
    return torch.stack(tokens).tolist()


def test_seeded_and_greedy_rows_give_the_old_loops_tokens_step_after_step():
    params = [SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=7),
              SamplingParams(temperature=0),
              SamplingParams(temperature=1.2, seed=123, min_p=0.01, repetition_penalty=1.2),
              SamplingParams(temperature=0.8),  # unseeded: drawn from the shared noise
              SamplingParams(temperature=0.7, top_p=0.8, seed=2**40, logit_bias={5: 2.0}),
              SamplingParams(temperature=0, repetition_penalty=1.4)]
    ids = [f"r{i}" for i in range(len(params))]
    new, old = Sampler(), Sampler()
    logits, histories = batch_inputs(5)
    logits = logits[:len(params)]
    histories = histories[:len(params)]
    seeded_or_greedy = [i for i, p in enumerate(params) if p.seed is not None or p.greedy]
    for step in range(8):
        step_logits = logits + step * 0.1 * torch.arange(VOCAB) % 3  # a different distribution each step
        got = new(step_logits, params, histories, ids)
        want = old_sampler_loop(old, step_logits, params, histories, ids)
        assert [got[i] for i in seeded_or_greedy] == [want[i] for i in seeded_or_greedy], step
        assert 0 <= got[3] < VOCAB
        histories = [h + [t] for h, t in zip(histories, got)]


def test_unseeded_rows_sharing_one_draw_sample_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().expand(8000, 4).contiguous()
    torch.manual_seed(0)
    draws = torch.tensor(Sampler()(logits, [SamplingParams(temperature=1.0)] * 8000, [[]] * 8000,
                                   [f"r{i}" for i in range(8000)]))
    freq = torch.bincount(draws, minlength=4).float() / len(draws)
    assert torch.allclose(freq, probs, atol=0.02), freq


def test_greedy_rows_in_a_sampled_batch_take_the_first_maximum():
    logits = torch.zeros(3, 10)
    logits[:, [2, 6]] = 5.0  # tie: token 2 first
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1.0, seed=0),
              SamplingParams(temperature=0, logit_bias={6: 0.5})]
    got = Sampler()(logits, params, [[]] * 3, ["a", "b", "c"])
    assert got[0] == 2 and got[2] == 6 and got[1] in (2, 6)


@pytest.mark.parametrize("seed", [0, 1])
def test_rows_that_all_cap_k_sort_only_their_largest_k(seed):
    """Every filtering row has a top-k: only max(k) candidates are sorted, the result as processed_logits'."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(6, VOCAB, generator=g) * 2
    params = [SamplingParams(temperature=0.9, top_k=30, top_p=0.8), SamplingParams(temperature=1.1, top_k=3),
              SamplingParams(temperature=0), SamplingParams(temperature=0.7, top_k=80, top_p=0.95, min_p=0.01),
              SamplingParams(temperature=1.0), SamplingParams(temperature=2.0, top_k=80, top_p=0.3)]
    knobs = BatchKnobs.build(params, [[]] * 6, VOCAB, "cpu")
    assert knobs.max_k == 80
    ours = processed_logits_batch(logits, knobs)
    for i, p in enumerate(params):
        want = processed_logits(logits[i], p)
        assert torch.equal(torch.isfinite(ours[i]), torch.isfinite(want)), (i, p)
        torch.testing.assert_close(ours[i], want, rtol=0, atol=0)
