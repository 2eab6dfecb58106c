"""The pieces of speculative decoding on their own: prompt lookup, the greedy and the sampling acceptance rules,
the draft model, the config."""
from __future__ import annotations

import pytest
import torch

from course_lib.config import ModelConfig
from course_lib.engine.speculative import (DraftModel, SpeculativeConfig, accept_or_resample, greedy_accept,
                                           ngram_propose)
from course_lib.kv_cache import KVCache
from course_lib.model import Transformer


def test_prompt_lookup_proposes_what_followed_the_latest_earlier_ngram():
    ctx = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert ngram_propose(ctx, k=3, n_max=3, n_min=2) == [7, 8, 5]  # the latest "1 2 3" before the tail
    assert ngram_propose(ctx, k=10, n_max=3, n_min=2) == [7, 8, 5, 1, 2, 3]  # up to the end of the context
    assert ngram_propose([4, 5, 6, 4, 5], k=2, n_max=4, n_min=2) == [6, 4]  # n falls from 4 to 2
    assert ngram_propose([1, 2, 3, 4], k=4, n_max=3, n_min=1) == []  # nothing repeats
    assert ngram_propose([5, 6, 5], k=2, n_max=3, n_min=2) == []  # a unigram match is below n_min
    assert ngram_propose([5, 6, 5], k=2, n_max=3, n_min=1) == [6, 5]


def test_greedy_rule_keeps_drafts_up_to_the_first_disagreement_then_the_models_token():
    assert greedy_accept([4, 5, 6, 7], [4, 5, 6]) == [4, 5, 6, 7]  # all accepted, plus the bonus token
    assert greedy_accept([4, 9, 6, 7], [4, 5, 6]) == [4, 9]  # rejected at 2: the model's 9 replaces it
    assert greedy_accept([1], []) == [1]  # no drafts: plain decoding


@pytest.mark.parametrize("with_draft_probs", [True, False])
def test_the_sampling_rule_keeps_the_target_distribution(with_draft_probs):
    """On a vocabulary of 6: the first emitted token and, given it was accepted, the second follow p exactly.
    With 40,000 fixed-seed trials, each probability's standard error is below 0.0025; the tolerance is 0.01."""
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.05, 0.40, 0.25, 0.10, 0.15, 0.05],
                      [0.30, 0.05, 0.05, 0.20, 0.10, 0.30]])
    q = torch.tensor([[0.30, 0.10, 0.40, 0.05, 0.10, 0.05]])  # a draft that often guesses wrong
    counts = torch.zeros(6)
    second = torch.zeros(6)
    trials = 40_000
    for _ in range(trials):
        if with_draft_probs:
            draft = int(torch.multinomial(q[0], 1, generator=gen))
            out = accept_or_resample(p, q, [draft], gen)
        else:  # prompt lookup: a fixed guess, all of q on it
            out = accept_or_resample(p, None, [2], gen)
        counts[out[0]] += 1
        if len(out) == 2:
            second[out[1]] += 1
    assert (counts / trials - p[0]).abs().max() < 0.01
    assert (second / second.sum() - p[1]).abs().max() < 0.02  # fewer samples: only the accepted ones


def test_config_follows_vllms_keys_and_names_what_is_wrong():
    spec = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                                        "prompt_lookup_min": 2})
    assert (spec.method, spec.num_speculative_tokens, spec.prompt_lookup_max) == ("ngram", 4, 4)
    assert SpeculativeConfig.from_dict(None) is None
    draft = SpeculativeConfig.from_dict({"method": "draft_model", "num_speculative_tokens": 3})
    assert draft.model is None and draft.quantization == "int4"
    for bad, words in [({"method": "eagle", "num_speculative_tokens": 2}, "method"),
                       ({"method": "ngram"}, "num_speculative_tokens"),
                       ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
                       ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5}, "prompt_lookup_min"),
                       ({"method": "ngram", "num_speculative_tokens": 2, "lookahead": 3}, "lookahead")]:
        with pytest.raises(ValueError, match=words):
            SpeculativeConfig.from_dict(bad)


@torch.inference_mode()
def test_an_unquantized_draft_proposes_the_models_own_greedy_continuation():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                                    num_kv_heads=2)).eval()
    draft = DraftModel.from_target(model, None)
    prompt = [3, 14, 15, 9, 26]
    greedy, cache = list(prompt), KVCache(model.config, 64)
    logits = model(torch.tensor([prompt]), kv=cache)[0, -1]
    for _ in range(8):
        greedy.append(int(logits.argmax()))
        logits = model(torch.tensor([[greedy[-1]]]), kv=cache)[0, -1]
    first, _ = draft.propose("r", prompt, 4, capacity=64)
    assert first == greedy[5:9]
    # Two of the four accepted and the model's own token after them: the draft catches up from there.
    context = prompt + first[:2] + [greedy[7]]
    again, _ = draft.propose("r", context, 4, capacity=64)
    assert again == greedy[8:12]
    draft.release("r")
    assert "r" not in draft.caches
