"""Chapter 12's checkers: True on reference solutions, False on typical mistakes."""
from course_lib.engine.speculative import greedy_accept, ngram_propose
from course_lib.exercises import check_greedy_accept, check_ngram_propose, check_tokens_per_step
from course_lib.exercises.speculative import reference_tokens_per_step


def test_ngram_propose_reference_passes_and_mistakes_fail(capsys):
    assert check_ngram_propose(ngram_propose)

    def oldest_match(ids, k, n_max, n_min):  # the first occurrence instead of the most recent
        for n in range(min(n_max, len(ids) - 1), n_min - 1, -1):
            for start in range(len(ids) - n):
                if ids[start:start + n] == ids[-n:]:
                    return ids[start + n:start + n + k]
        return []

    def shortest_first(ids, k, n_max, n_min):
        for n in range(n_min, min(n_max, len(ids) - 1) + 1):
            for start in range(len(ids) - n - 1, -1, -1):
                if ids[start:start + n] == ids[-n:]:
                    return ids[start + n:start + n + k]
        return []

    assert not check_ngram_propose(oldest_match)
    assert not check_ngram_propose(shortest_first)
    assert not check_ngram_propose(lambda ids, k, n_max, n_min: ngram_propose(ids, k + 1, n_max, n_min))
    assert "✗" in capsys.readouterr().out


def test_greedy_accept_reference_passes_and_mistakes_fail():
    assert check_greedy_accept(greedy_accept)
    assert not check_greedy_accept(lambda c, d: [x for x, y in zip(c, d) if x == y] + [c[len(d)]])  # no stop
    assert not check_greedy_accept(lambda c, d: greedy_accept(c, d)[:-1] or c[:1])  # forgets the free token


def test_tokens_per_step_reference_passes_and_mistakes_fail(capsys):
    assert check_tokens_per_step(reference_tokens_per_step)
    assert not check_tokens_per_step(lambda a, k: 1 + k * a)
    assert not check_tokens_per_step(lambda a, k: (1 - a ** k) / (1 - a) if a < 1 else k)


def test_not_attempted_is_not_a_failure_of_the_notebook(capsys):
    def stub(*args):
        raise NotImplementedError

    assert check_tokens_per_step(stub) is False
    assert "not attempted" in capsys.readouterr().out
