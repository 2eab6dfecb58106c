"""Notebook 12's replay of prompt lookup and its pictures."""
import matplotlib

matplotlib.use("Agg")

from course_lib.viz.speculative import plot_acceptance, replay_prompt_lookup, steps_html  # noqa: E402


class Chars:
    def decode(self, ids):
        return "".join(chr(96 + i) for i in ids)


def test_replay_emits_the_output_and_counts_acceptances():
    prompt = [1, 2, 3, 4, 5, 6, 1, 2]
    output = [3, 4, 5, 9, 1, 2]  # copies 3 4 5, then departs (9), then 1 2 again
    steps = replay_prompt_lookup(prompt, output, k=3)
    assert [t for s in steps for t in s.emitted] == output
    assert steps[0].drafts == [3, 4, 5] and steps[0].accepted == 3 and steps[0].emitted == [3, 4, 5, 9]
    assert all(s.accepted <= len(s.drafts) for s in steps)


def test_html_marks_accepted_rejected_and_own_tokens():
    steps = replay_prompt_lookup([1, 2, 3, 1, 2], [3, 5], k=2)
    text = steps_html(steps, Chars())
    assert "line-through" in text and "#b7e4b0" in text and "#b8d4f4" in text
    assert text.count("<tr>") == len(steps) + 1


def test_plot_has_one_line_per_task():
    rows = [{"task": t, "k": k, "acceptance": 0.5, "speedup": 1.2} for t in ("edit", "open") for k in (1, 2)]
    fig = plot_acceptance(rows, "test")
    assert all(len(ax.get_lines()) >= 2 for ax in fig.axes)
