"""Pictures of speculative decoding (notebook 12): prompt lookup replayed step by step, and acceptance against k.

    steps = replay_prompt_lookup(prompt_ids, output_ids, k=4)    # what each greedy step drafted and kept
    display(steps_html(steps, tokenizer))                          # accepted green, rejected red, the model's own blue
    plot_acceptance(rows)                                          # acceptance and speed-up against k, per task

A greedy speculative run emits exactly plain greedy decoding's tokens, so the plain output is the target's choice at
every position: replaying prompt lookup over it gives the very drafts and acceptances the engine saw.
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from ..engine.speculative import greedy_accept, ngram_propose

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ..tokenizer import Tokenizer


@dataclass
class Step:
    """One verification step: the drafted tokens, how many were accepted, and the tokens the step emitted."""

    drafts: list[int]
    accepted: int
    emitted: list[int]  # the accepted drafts, then the model's own token


def replay_prompt_lookup(prompt_ids: Sequence[int], output_ids: Sequence[int], k: int, n_max: int = 4,
                         n_min: int = 2) -> list[Step]:
    """The steps a greedy prompt-lookup run takes to emit `output_ids` after `prompt_ids` (the plain greedy output)."""
    context, out, steps = list(prompt_ids), list(output_ids), []
    i = 0
    while i < len(out):
        drafts = ngram_propose(context + out[:i], k, n_max, n_min)[:max(0, len(out) - i - 1)]
        emitted = greedy_accept(out[i:i + len(drafts) + 1], drafts)
        steps.append(Step(drafts, len(emitted) - 1 if drafts else 0, emitted))
        i += len(emitted)
    return steps


OWN = "the model's own token"


def _span(text: str, colour: str, strike: bool = False) -> str:
    style = f"background:{colour};padding:1px 2px;margin:1px;border-radius:3px;white-space:pre"
    style += ";text-decoration:line-through" if strike else ""
    return f'<span style="{style}">{html.escape(text)}</span>'


def steps_html(steps: list[Step], tokenizer: "Tokenizer", max_steps: int = 40) -> str:
    """An HTML table, one row per step: accepted drafts (green), rejected drafts (red, struck out) and the
    model's own token (blue)."""
    rows = ['<tr><th>step</th><th style="text-align:left">tokens</th><th>accepted / drafted</th></tr>']
    for n, step in enumerate(steps[:max_steps], 1):
        cells = [_span(tokenizer.decode([t]), "#b7e4b0") for t in step.emitted[:step.accepted]]
        cells += [_span(tokenizer.decode([t]), "#f4b6b6", strike=True) for t in step.drafts[step.accepted:]]
        cells.append(_span(tokenizer.decode([step.emitted[-1]]), "#b8d4f4"))
        rows.append(f'<tr><td>{n}</td><td style="text-align:left">{"".join(cells)}</td>'
                    f"<td>{step.accepted} / {len(step.drafts)}</td></tr>")
    legend = (f'<p>{_span("accepted draft", "#b7e4b0")} {_span("rejected draft", "#f4b6b6", strike=True)} '
              f'{_span(OWN, "#b8d4f4")}</p>')
    return legend + "<table>" + "".join(rows) + "</table>"


def plot_acceptance(rows: list[dict], title: str) -> "Figure":
    """Two panels against k: acceptance rate and decode speed-up over plain, one line per task.
    `rows`: dicts with task, k, acceptance, speedup."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    for task in dict.fromkeys(r["task"] for r in rows):
        mine = sorted((r for r in rows if r["task"] == task), key=lambda r: r["k"])
        ks = [r["k"] for r in mine]
        left.plot(ks, [100 * r["acceptance"] for r in mine], "o-", label=task)
        right.plot(ks, [r["speedup"] for r in mine], "o-", label=task)
    right.axhline(1.0, color="grey", lw=1, ls="--")
    left.set(xlabel="k (num_speculative_tokens)", ylabel="acceptance rate (%)", ylim=(-5, 105))
    right.set(xlabel="k (num_speculative_tokens)", ylabel="decode tokens/s vs plain (x)")
    ks = sorted({r["k"] for r in rows})
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.minorticks_off()
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    return fig
