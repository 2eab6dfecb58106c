"""benchmarks/compare.py: systems take turns within each round, so drift slows them alike."""
from __future__ import annotations

from benchmarks.compare import rounds


class Fake:
    def __init__(self, name: str, log: list[str]):
        self.name, self.log = name, log

    def run(self) -> float:
        self.log.append(self.name)
        return float(len(self.log))  # the call's place in the whole sequence


def test_rounds_alternate_rotate_and_drop_the_warm_up():
    log: list[str] = []
    systems = [Fake("a", log), Fake("b", log), Fake("c", log)]
    values = rounds(systems, lambda s: s.run(), repeats=3)
    # one warm-up round, then three; each round runs every system once, starting one later each time
    assert log == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert values == {"a": [6.0, 8.0, 10.0], "b": [4.0, 9.0, 11.0], "c": [5.0, 7.0, 12.0]}


def test_a_drifting_machine_leaves_the_ratio_of_equal_systems_near_one():
    # each call takes longer than the last (a machine slowing down): measured one after another,
    # the second of two equal systems would look 2.6x slower (calls 5-8 against 1-4)
    clock = iter(range(1, 1000))
    systems = [Fake("x", []), Fake("y", [])]
    values = rounds(systems, lambda s: float(next(clock)), repeats=4)
    ratio = sum(values["y"]) / sum(values["x"])
    assert 0.95 < ratio < 1.1, ratio
