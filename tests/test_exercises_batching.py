"""Checkers of notebook 07: each passes a reference solution and fails a plausible mistake and an unattempted stub."""
from __future__ import annotations

import pytest

from course_lib.exercises import check_count_steps, check_padded_slots, check_tokens_this_step
from course_lib.exercises.batching import engine_steps, real_scheduler_step, simulate_static_padding


def stub(*args):
    raise NotImplementedError


# ---- references -----------------------------------------------------------------------------------
def padded_slots(output_lens, batch_size):
    batches = [output_lens[i:i + batch_size] for i in range(0, len(output_lens), batch_size)]
    return sum(len(b) * max(b) - sum(b) for b in batches)


def tokens_this_step(running_needs, waiting_prompt_lens, budget, max_num_seqs):
    out = []
    for need in running_needs:
        out.append(min(need, budget))
        budget -= out[-1]
    seats = max_num_seqs - len(running_needs)
    for n in waiting_prompt_lens:
        out.append(min(n, budget) if seats > 0 else 0)
        budget -= out[-1]
        seats -= out[-1] > 0
    return out


def count_steps(prompt_lens, output_lens, max_num_seqs, budget, step_fn=tokens_this_step):
    need, left = list(prompt_lens), list(output_lens)
    waiting, running, steps = list(range(len(need))), [], 0
    while waiting or running:
        steps += 1
        tokens = step_fn([need[i] for i in running], [need[i] for i in waiting], budget, max_num_seqs)
        for i, n in [(i, n) for i, n in zip(running + waiting, tokens) if n > 0]:
            if i in waiting:
                waiting.remove(i)
                running.append(i)
            need[i] -= n
            if need[i] == 0:
                left[i] -= 1
                need[i] = 1
                if left[i] == 0:
                    running.remove(i)
    return steps


# ---- plausible mistakes ---------------------------------------------------------------------------
def padded_slots_full_last_batch(output_lens, batch_size):
    """Counts the missing seats of a short last batch as padding too."""
    batches = [output_lens[i:i + batch_size] for i in range(0, len(output_lens), batch_size)]
    return sum(batch_size * max(b) - sum(b) for b in batches)


def tokens_ignoring_seats(running_needs, waiting_prompt_lens, budget, max_num_seqs):
    return tokens_this_step(running_needs, waiting_prompt_lens, budget, 10**9)


def tokens_waiting_first(running_needs, waiting_prompt_lens, budget, max_num_seqs):
    """Serves the queue before the running requests."""
    seats = max_num_seqs - len(running_needs)
    waiting = []
    for n in waiting_prompt_lens:
        waiting.append(min(n, budget) if seats > 0 else 0)
        budget -= waiting[-1]
        seats -= waiting[-1] > 0
    return [min(n, budget) for n in running_needs] + waiting


def count_steps_no_chunking(prompt_lens, output_lens, max_num_seqs, budget):
    """Forgets the budget: every prompt is computed in one step."""
    return count_steps(prompt_lens, output_lens, max_num_seqs, 10**9)


def count_steps_first_token_extra(prompt_lens, output_lens, max_num_seqs, budget):
    """Thinks the prefill step samples nothing: one extra step per request in a row of seats."""
    return count_steps(prompt_lens, [o + 1 for o in output_lens], max_num_seqs, budget)


# ---- tests ----------------------------------------------------------------------------------------
def test_static_padding_simulation():
    assert simulate_static_padding([8, 3, 5, 1], 4) == 4 * 8 - 17  # 5 + 3 + 7 idle seats
    assert simulate_static_padding([4, 30, 6, 5], 3) == (30 - 4) + (30 - 6) + 0


def test_real_scheduler_step_follows_budget_and_seats():
    assert real_scheduler_step([1, 1, 1], [50, 30], 64, 8) == [1, 1, 1, 50, 11]
    assert real_scheduler_step([1, 1], [10, 10, 10], 512, 3) == [1, 1, 10, 0, 0]
    assert real_scheduler_step([40, 1], [20], 32, 8) == [32, 0, 0]


def test_engine_steps_equal_the_reference_simulation():
    for args in [([20, 20, 20], [5, 3, 8], 8, 1024), ([100, 30], [4, 4], 4, 32), ([50, 10, 70], [3, 12, 5], 2, 40)]:
        assert engine_steps(*args) == count_steps(*args)


@pytest.mark.parametrize("check,good,wrongs", [
    (check_padded_slots, padded_slots, [padded_slots_full_last_batch]),
    (check_tokens_this_step, tokens_this_step, [tokens_ignoring_seats, tokens_waiting_first]),
    (check_count_steps, count_steps, [count_steps_no_chunking, count_steps_first_token_extra]),
])
def test_checker(check, good, wrongs, capsys):
    assert check(good) is True
    for wrong in wrongs:
        assert check(wrong) is False, wrong.__name__
    assert "✗" in capsys.readouterr().out
    assert check(stub) is False
    assert "not attempted" in capsys.readouterr().out
