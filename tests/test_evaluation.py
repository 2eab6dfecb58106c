"""course_lib.evaluation on a tiny random model: perplexity windows, agreement, memory, texts."""
from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from course_lib import evaluation as ev
from course_lib import tolerance
from course_lib.config import ModelConfig
from course_lib.model import Transformer
from course_lib.quant import quantize_model


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                      num_kv_heads=2, tie_word_embeddings=True, max_position_embeddings=256)
    return Transformer(cfg).eval()


def test_score_text_one_window_is_the_plain_cross_entropy(tiny):
    ids = torch.randint(0, 128, (40,))
    with torch.no_grad():
        logits = tiny(ids[None])[0]  # [40, vocab]
    nll = F.cross_entropy(logits[:-1], ids[1:]).item()
    s = ev.score_text(tiny, ids, window=64)
    assert s.num_tokens == 39 and s.predictions.shape == (39,)
    assert s.perplexity == pytest.approx(math.exp(nll), rel=1e-5)
    assert torch.equal(s.predictions, logits[:-1].argmax(-1))


def test_windows_score_every_token_once(tiny):
    ids = torch.randint(0, 128, (50,))
    whole = ev.score_text(tiny, ids, window=64)
    chunks = ev.score_text(tiny, ids, window=16)  # 4 forwards of <= 16 tokens
    sliding = ev.score_text(tiny, ids, window=16, stride=4)  # every token sees >= 12 tokens before it
    assert whole.num_tokens == chunks.num_tokens == sliding.num_tokens == 49
    assert chunks.predictions.shape == sliding.predictions.shape == (49,)
    # up to position 16 all three read the same prefix, so they predict the same tokens
    assert torch.equal(chunks.predictions[:16], whole.predictions[:16])
    assert torch.equal(sliding.predictions[:16], whole.predictions[:16])
    assert not math.isclose(chunks.nll, whole.nll)  # less context after each cut: a different number
    # a window as long as the text is a single forward, whatever the stride
    assert ev.score_text(tiny, ids, window=50, stride=50).nll == pytest.approx(whole.nll, rel=1e-6)
    with pytest.raises(ValueError, match="stride"):
        ev.score_text(tiny, ids, window=8, stride=9)


def test_agreement_and_memory_of_a_quantized_copy(tiny):
    ids = torch.randint(0, 128, (30,))
    q = quantize_model(copy.deepcopy(tiny), "int8")
    assert ev.top1_agreement(tiny, tiny, ids) == 1.0
    assert 0.5 < ev.top1_agreement(tiny, q, ids) <= 1.0
    float_bytes = ev.linear_weight_bytes(tiny)
    per_layer = 4 * (64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128)  # q, o; k, v; gate, up, down
    assert float_bytes == 2 * per_layer
    assert ev.linear_weight_bytes(tiny, include_lm_head=True) == float_bytes + 4 * 128 * 64
    ratio = ev.linear_weight_bytes(q) / float_bytes
    assert 0.25 < ratio < 0.3  # one byte a weight plus a float32 scale a row


def test_decode_speed_and_greedy(tiny):
    prompt = [1, 2, 3]
    out = ev.greedy_generate(tiny, prompt, 5)
    with torch.no_grad():
        full = tiny(torch.tensor([prompt + out[:-1]]))[0].argmax(-1)  # [7]
    assert out == full[len(prompt) - 1 :].tolist()  # the cached loop equals a full forward
    assert ev.decode_tokens_per_second(tiny, prompt, 4) > 0


def test_evaluation_texts_are_fixed_and_offline():
    texts = ev.evaluation_texts()
    assert set(texts) == {"en", "zh"}
    assert texts == ev.evaluation_texts()
    assert len(texts["en"].split()) > 500 and "tournament" in texts["en"]
    assert len(texts["zh"]) > 500 and sum("\u4e00" <= c <= "\u9fff" for c in texts["zh"]) > 400


def test_kl_divergence_is_zero_for_the_same_model_and_matches_the_definition(tiny):
    ids = torch.randint(0, 128, (30,))
    ref = ev.score_text(tiny, ids, keep_logprobs=True)
    assert ref.logprobs.shape == (29, 128)
    assert ev.kl_divergence(ref, ev.score_text(tiny, ids, keep_logprobs=True)) == 0.0
    q = quantize_model(copy.deepcopy(tiny), "int4", group_size=32)
    other = ev.score_text(q, ids, keep_logprobs=True)
    with torch.no_grad():
        p = F.log_softmax(tiny(ids[None])[0, :-1].double(), -1)  # [29, vocab]
        r = F.log_softmax(q(ids[None])[0, :-1].double(), -1)
    expected = F.kl_div(r, p, log_target=True, reduction="none").sum(-1)  # KL(P || R) per position
    # KL comes from float32 log-probabilities: each term rounds at float32's eps of |log p|, so the difference is judged
    # against the log-probabilities' size, not the KL's, which can be ~0
    gap = (ev.kl_per_token(ref, other).double() - expected).abs().max().item()
    assert gap <= tolerance.OP_RTOL[torch.float32] * p.abs().max().item(), gap
    assert ev.kl_divergence(ref, other) > 0
    with pytest.raises(ValueError, match="keep_logprobs"):
        ev.kl_divergence(ev.score_text(tiny, ids), other)


def test_step_timings_interleave_rounds_and_keep_every_sample(tiny):
    q = quantize_model(copy.deepcopy(tiny), "int8")
    out = ev.step_timings({"float": tiny, "int8": q}, context_len=8, prefill_tokens=16, rounds=2, decode_repeats=3)
    assert set(out) == {"float", "int8"}
    for points in out.values():
        assert len(points["decode"].timing.all) == 6 and len(points["prefill"].timing.all) == 2
        assert points["decode"].cost.flops < points["prefill"].cost.flops


def test_paired_speedup_is_the_median_of_each_rounds_ratio():
    from types import SimpleNamespace

    from course_lib.profiling.timer import Timing

    def steps(**samples):
        return {k: {"decode": SimpleNamespace(timing=Timing.from_samples(v))} for k, v in samples.items()}

    timed = steps(f32=[2.0, 3.0, 8.0], int4=[1.0, 1.0, 2.0])  # rounds' ratios 2, 3, 4; best over best: 2
    assert ev.paired_speedup(timed, "f32", "int4", "decode") == pytest.approx(3.0)
    assert ev.paired_speedup(timed, "int4", "f32", "decode") == pytest.approx(1 / 3)
    with pytest.raises(ValueError):  # samples from different runs do not pair
        ev.paired_speedup(steps(f32=[1.0, 2.0], int4=[1.0]), "f32", "int4", "decode")
