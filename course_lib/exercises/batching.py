"""Checkers for chapter 07 (batching and scheduling): static batching's padding, one scheduler step, a whole schedule.

    check_padded_slots(fn)       fn(output_lens, batch_size) -> seats static batching computes and throws away
    check_tokens_this_step(fn)   fn(running_needs, waiting_prompt_lens, budget, max_num_seqs) -> tokens per request
    check_count_steps(fn)        fn(prompt_lens, output_lens, max_num_seqs, max_num_batched_tokens) -> engine steps

The second is checked against the engine's real `Scheduler`, the third against a real `LLMEngine`
on a tiny random model (scheduling never looks at the weights or the text, so a tiny model and a
stand-in tokenizer give the same steps as SmolLM2 would, in milliseconds).
"""
from __future__ import annotations

import functools
import operator
from typing import Callable

import torch

from .check import Case, run_checks

TINY_VOCAB = 512


# ---- 1. static batching: padded seats ------------------------------------------------------------
def simulate_static_padding(output_lens: list[int], batch_size: int) -> int:
    """Step by step: batches of `batch_size` in order, each running until its longest request is done."""
    wasted = 0
    for first in range(0, len(output_lens), batch_size):
        batch = output_lens[first:first + batch_size]
        for step in range(1, max(batch) + 1):
            wasted += sum(1 for n in batch if n < step)  # finished, but its seat is still computed
    return wasted


def _equals(expected: int, hint: str) -> Callable[[object], None]:
    def verify(got: object) -> None:
        try:
            got = operator.index(got)  # an int (numpy and 0-d torch integers pass too)
        except TypeError:
            raise AssertionError(f"return an int, got {type(got).__name__} {got!r}") from None
        assert got == expected, f"expected {expected}, got {got}; {hint}"
    return verify


def check_padded_slots(fn: Callable[[list[int], int], int]) -> bool:
    """fn(output_lens, batch_size) -> how many (request, step) seats static batching wastes on finished requests."""
    hint = ("a batch runs max(its lengths) steps and a request of n tokens idles for max - n of them; "
            "the last batch may hold fewer than batch_size requests")
    cases = []
    for lens, b in [([8, 3, 5, 1], 4), ([8, 3, 5, 1], 2), ([6, 6, 6, 6, 6, 6], 3), ([4, 30, 6, 5, 7, 12, 9], 3),
                    ([10, 2, 7], 1), ([5, 1, 9, 2, 2, 16, 3, 4, 8, 2], 4)]:
        expected = simulate_static_padding(lens, b)
        cases.append(Case(f"output lengths {lens}, batch_size {b}", (list(lens), b),
                          _equals(expected, hint)))
    return run_checks("padded_slots", fn, cases)


# ---- 2. one scheduler step under a token budget --------------------------------------------------
class _StandInTokenizer:
    """What a `Sequence` needs from a tokenizer when text does not matter: no EOS, empty text."""

    eos_token_ids: list[int] = []

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return ""


def _ids(n: int, tag: int) -> list[int]:
    return [3 + (tag * 37 + 11 * i) % (TINY_VOCAB - 3) for i in range(n)]  # any ids in the tiny vocabulary


def real_scheduler_step(running_needs: list[int], waiting_prompt_lens: list[int], budget: int,
                        max_num_seqs: int) -> list[int]:
    """Tokens per request (running first, then waiting) of one real `Scheduler.schedule()` from that state."""
    from ..engine.block_manager import BlockManager
    from ..engine.scheduler import Scheduler, SchedulerConfig
    from ..engine.sequence import Sequence, SequenceStatus
    from ..sampling import SamplingParams

    bm = BlockManager(num_blocks=4096, block_size=16, enable_prefix_caching=False)
    scheduler = Scheduler(SchedulerConfig(max_num_seqs, budget), bm)
    params, tok = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True), _StandInTokenizer()
    seqs = []
    for i, need in enumerate(running_needs):  # running: its prompt is computed but for its last `need` tokens
        seq = Sequence(f"r{i}", _ids(need + 8, i), params, tok)
        bm.allocate(seq)
        seq.num_computed_tokens, seq.status = len(seq) - need, SequenceStatus.RUNNING
        scheduler.running.append(seq)
        seqs.append(seq)
    for j, n in enumerate(waiting_prompt_lens):
        seq = Sequence(f"w{j}", _ids(n, 100 + j), params, tok)
        scheduler.add(seq)
        seqs.append(seq)
    batch = scheduler.schedule()
    got = dict(zip((s.request_id for s in batch.seqs), batch.num_tokens))
    return [got.get(s.request_id, 0) for s in seqs]


def check_tokens_this_step(fn: Callable[[list[int], list[int], int, int], list[int]]) -> bool:
    """fn(running_needs, waiting_prompt_lens, budget, max_num_seqs) -> tokens each request computes this step."""
    scenarios = [
        ([1, 1, 1], [50, 30], 64, 8, "3 decodes, then prompts fill the rest of the budget"),
        ([], [100], 64, 8, "a prompt longer than the budget is cut into a chunk"),
        ([1, 1], [10, 10, 10], 512, 3, "max_num_seqs caps how many run at once"),
        ([40, 1], [20], 32, 8, "a running prompt chunk goes first and may use the whole budget"),
        ([1, 1, 1, 1], [5], 4, 8, "decodes alone use up the budget: nobody new starts"),
        ([7, 1, 1], [3, 90, 4], 50, 6, "running first (oldest first), then the queue in order"),
    ]
    cases = []
    for running, waiting, budget, max_seqs, what in scenarios:
        expected = real_scheduler_step(running, waiting, budget, max_seqs)

        def verify(got, expected=expected):
            got = [int(x) for x in got]
            assert len(got) == len(expected), (f"return one number per request ({len(expected)}: running first, then "
                                               f"waiting), got {len(got)}")
            assert got == expected, f"the real Scheduler gives {expected}, you gave {got}"
        cases.append(Case(f"{what}: running {running}, waiting {waiting}, budget {budget}, max_num_seqs {max_seqs}",
                          (list(running), list(waiting), budget, max_seqs), verify))
    return run_checks("tokens_this_step", fn, cases)


# ---- 3. a whole schedule: how many steps -----------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _tiny_model():
    from ..config import ModelConfig
    from ..model import Transformer

    torch.manual_seed(0)
    config = ModelConfig(vocab_size=TINY_VOCAB, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                         num_kv_heads=1, max_position_embeddings=1024, tie_word_embeddings=False)
    return Transformer(config).eval()


def engine_steps(prompt_lens: list[int], output_lens: list[int], max_num_seqs: int,
                 max_num_batched_tokens: int) -> int:
    """`engine.stats.steps` of a real LLMEngine (tiny random model, no prefix cache) serving the workload."""
    from ..engine.llm_engine import EngineConfig, LLMEngine
    from ..sampling import SamplingParams

    model = _tiny_model()
    config = EngineConfig(block_size=16, kv_cache_memory=2 * 2**20, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=False)
    engine = LLMEngine(model, _StandInTokenizer(), config)
    for i, (p, o) in enumerate(zip(prompt_lens, output_lens)):
        engine.add_request(_ids(p, i), SamplingParams(max_tokens=o, temperature=0, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    return engine.stats.steps


def check_count_steps(fn: Callable[[list[int], list[int], int, int], int]) -> bool:
    """fn(prompt_lens, output_lens, max_num_seqs, max_num_batched_tokens) -> steps the engine takes for them all."""
    hint = ("each step: running requests first (a decode is 1 token, an unfinished prompt takes what the budget "
            "allows), then the queue in order while budget and seats last; a step that completes a prompt "
            "also samples its first token; a request leaves the step it makes its last token")
    scenarios = [
        ([20, 20, 20], [5, 3, 8], 8, 1024, "all fit at once"),
        ([20, 20, 20, 20], [6, 2, 9, 3], 2, 1024, "two seats: a finished request's seat is refilled"),
        ([100, 30], [4, 4], 4, 32, "chunked prefill: prompts longer than the budget"),
        ([50, 10, 70, 5, 33], [3, 12, 5, 7, 1], 3, 40, "seats and a budget together"),
    ]
    cases = []
    with torch.inference_mode():
        for prompts, outputs, seqs, budget, what in scenarios:
            expected = engine_steps(prompts, outputs, seqs, budget)
            cases.append(Case(f"{what}: prompts {prompts}, outputs {outputs}, max_num_seqs {seqs}, budget {budget}",
                              (list(prompts), list(outputs), seqs, budget),
                              _equals(expected, f"that is engine.stats.steps on this workload; {hint}")))
    return run_checks("count_steps", fn, cases)
