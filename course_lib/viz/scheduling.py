"""Scheduler timelines: what every engine step did for each request, recorded live and drawn.

    with StepRecorder(engine) as rec:           # records each ScheduledBatch as the engine makes it
        while engine.has_unfinished_requests():
            engine.step()
    print(rec.steps[0].describe())             # "step  1,   64 tokens: 0 prefill 40 | 1 prefill chunk 24 | waiting 2"
    plot_timeline(rec.steps, title="...")       # steps on x, requests on y, colour = what each did

The same grid picture draws toy schedules made by hand (`plot_state_grid`), e.g. static batching,
where a finished request's seat is "padding" until the longest one in its batch is done.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from ..engine.llm_engine import LLMEngine
    from ..engine.scheduler import ScheduledBatch
    from ..engine.sequence import Sequence as EngineSequence

# What a request can be doing in one step, and its colour.
STATE_COLORS: dict[str, str] = {
    "prefill": "#e8590c",  # the prompt (or its last chunk) is computed and the first token sampled
    "prefill chunk": "#ffc078",  # part of a prompt that does not finish it: nothing sampled yet
    "decode": "#1c7ed6",  # one new token
    "recompute": "#9c36b5",  # a preempted request's prompt and output computed again
    "padding": "#ced4da",  # static batching: a finished request's seat, computed and thrown away
    "preempted": "#e03131",  # this step took its KV blocks away; it goes back to the queue
    "waiting": "#f1f3f5",  # queued: arrived, not running
}


@dataclass
class StepRecord:
    """One engine step: per request in the batch, what it did and how many tokens; who waited or was preempted."""

    index: int  # 1 for the first recorded step
    start: float  # time.perf_counter() when the step was scheduled
    end: float | None = None  # when the next step was scheduled, or the recorder closed (None until then)
    work: dict[str, tuple[str, int]] = field(default_factory=dict)  # request id -> (state, tokens)
    waiting: list[str] = field(default_factory=list)  # request ids still queued after scheduling
    preempted: list[str] = field(default_factory=list)  # request ids this step preempted

    @property
    def num_tokens(self) -> int:
        """Tokens run through the model in this step (the scheduler keeps it <= max_num_batched_tokens)."""
        return sum(n for _, n in self.work.values())

    def tokens_of(self, *states: str) -> int:
        """Tokens of this step spent in the given states, e.g. `tokens_of("decode")`."""
        return sum(n for s, n in self.work.values() if s in states)

    def describe(self) -> str:
        """One line: every request's work, then who was preempted and who waits."""
        parts = [f"{rid} {state}" + (f" {n}" if state != "decode" else "") for rid, (state, n) in self.work.items()]
        text = f"step {self.index:2d}, {self.num_tokens:4d} tokens: " + " | ".join(parts)
        if self.preempted:
            text += f" | preempted {', '.join(self.preempted)}"
        waiting = [r for r in self.waiting if r not in self.preempted]
        if waiting:
            text += f" | waiting {', '.join(waiting)}"
        return text


def classify(seq: EngineSequence, num_tokens: int) -> str:
    """The state of a scheduled sequence that computes `num_tokens` tokens from `seq.num_computed_tokens` on."""
    start, end = seq.num_computed_tokens, seq.num_computed_tokens + num_tokens
    if num_tokens == 1 and start == len(seq) - 1 and start >= seq.num_prompt_tokens:
        return "decode"
    if seq.num_output_tokens > 0:
        return "recompute"  # it has output already but its KV is gone: it was preempted
    return "prefill" if end == len(seq) else "prefill chunk"


class StepRecorder:
    """Context manager: while open, every batch `engine.scheduler.schedule()` makes is recorded in `steps`.

    It wraps the scheduler's `schedule` method of this one engine (and restores it on exit), so it
    sees exactly what the engine ran: nothing is re-derived after the fact.
    """

    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self.steps: list[StepRecord] = []

    def __enter__(self) -> "StepRecorder":
        scheduler = self.engine.scheduler
        schedule = scheduler.schedule  # the bound method of the class

        def recording_schedule() -> ScheduledBatch:
            t = time.perf_counter()
            if self.steps and self.steps[-1].end is None:
                self.steps[-1].end = t  # the previous step is over when the next one is scheduled
            batch = schedule()
            if batch.seqs:  # an empty batch runs nothing and is not an engine step
                self.steps.append(self._record(batch, t))
            return batch

        scheduler.schedule = recording_schedule
        return self

    def __exit__(self, *exc: object) -> None:
        del self.engine.scheduler.schedule  # the instance attribute goes; the class's method is back
        if self.steps and self.steps[-1].end is None:
            self.steps[-1].end = time.perf_counter()

    def _record(self, batch: ScheduledBatch, t: float) -> StepRecord:
        work = {seq.request_id: (classify(seq, n), n) for seq, n in zip(batch.seqs, batch.num_tokens)}
        return StepRecord(index=len(self.steps) + 1, start=t, work=work,
                          waiting=[s.request_id for s in self.engine.scheduler.waiting],
                          preempted=[s.request_id for s in batch.preempted])


def timeline_grid(steps: Sequence[StepRecord], request_ids: Sequence[str] | None = None
                  ) -> tuple[list[str], list[list[str]]]:
    """Rows (request ids, in order of first appearance unless given) and grid[row][step] = state or ""."""
    if request_ids is None:
        seen: dict[str, None] = {}
        for s in steps:
            for rid in [*s.work, *s.waiting]:
                seen.setdefault(rid, None)
        request_ids = list(seen)
    grid = []
    for rid in request_ids:
        row = []
        for s in steps:
            if rid in s.preempted and rid not in s.work:
                row.append("preempted")
            elif rid in s.work:
                row.append(s.work[rid][0])
            elif rid in s.waiting:
                row.append("waiting")
            else:
                row.append("")  # not arrived yet, or finished
        grid.append(row)
    return list(request_ids), grid


def plot_state_grid(rows: Sequence[str], grid: Sequence[Sequence[str]], ax: Axes | None = None,
                    title: str | None = None, labels: Sequence[Sequence[str]] | None = None,
                    x_edges: Sequence[float] | None = None, xlabel: str | None = None) -> Axes:
    """Draw grid[row][step] (states of `STATE_COLORS`, "" = empty) as coloured cells, one row per request.

    `labels[row][step]`, when given, is written inside the cell (e.g. the tokens of a prefill chunk).
    `x_edges` (one more than the steps, e.g. seconds) gives each step its own width: a long step looks long.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    num_steps = max((len(r) for r in grid), default=0)
    if x_edges is None:  # column x is step x + 1, drawn over [x + 0.55, x + 1.45]
        spans = [(x + 0.55, 0.9) for x in range(num_steps)]
    else:
        if len(x_edges) != num_steps + 1:
            raise ValueError(f"x_edges needs {num_steps + 1} values (one more than the steps), got {len(x_edges)}")
        spans = [(x_edges[x], x_edges[x + 1] - x_edges[x]) for x in range(num_steps)]
    if ax is None:
        _, ax = plt.subplots(figsize=(min(14, max(7, 3 + 0.22 * num_steps)), 0.8 + 0.38 * len(rows)))
    used: list[str] = []
    for y, row in enumerate(grid):
        for state in STATE_COLORS:
            cells = [spans[x] for x, s in enumerate(row) if s == state]  # (start, width)
            if cells:
                edge = "white" if x_edges is not None else "#adb5bd" if state in ("waiting", "padding") else "none"
                ax.broken_barh(cells, (y - 0.4, 0.8), facecolors=STATE_COLORS[state], edgecolor=edge, lw=0.5,
                               hatch="///" if state == "padding" else None)
                used.append(state)
        for x, text in enumerate(labels[y] if labels else []):
            if text:
                ax.text(spans[x][0] + spans[x][1] / 2, y, text, ha="center", va="center", fontsize=7,
                        rotation=90 if num_steps > 30 else 0)
    ax.set_yticks(range(len(rows)), list(rows))
    ax.set_ylim(len(rows) - 0.5, -0.5)  # first request on top
    if x_edges is None:
        ax.set_xlim(0.5, max(num_steps, 1) + 0.5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    else:
        ax.set_xlim(x_edges[0], x_edges[-1])
    ax.set_xlabel(xlabel or ("engine step" if x_edges is None else "seconds"))
    ax.set_ylabel("request")
    ax.grid(True, axis="x", alpha=0.25)
    handles = [Patch(facecolor=STATE_COLORS[s], edgecolor="#adb5bd", hatch="///" if s == "padding" else None, label=s)
               for s in STATE_COLORS if s in used]
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def plot_timeline(steps: Sequence[StepRecord], ax: Axes | None = None, title: str | None = None,
                  request_ids: Sequence[str] | None = None, show_tokens: bool = True, time_axis: bool = False) -> Axes:
    """The recorded steps as a grid: x = engine step, y = request, colour = state; prefill cells show their tokens.

    `time_axis=True` draws each step as wide as it took (x in seconds since the first step), without token labels.
    """
    rows, grid = timeline_grid(steps, request_ids)
    labels, x_edges = None, None
    if time_axis:
        if any(s.end is None for s in steps):
            raise ValueError("a step has no end time yet: draw the timeline after the StepRecorder has closed")
        x_edges = [s.start - steps[0].start for s in steps] + [steps[-1].end - steps[0].start]
    elif show_tokens:
        labels = [[str(s.work[rid][1]) if rid in s.work and s.work[rid][0] != "decode" else "" for s in steps]
                  for rid in rows]
    return plot_state_grid(rows, grid, ax=ax, title=title, labels=labels, x_edges=x_edges,
                           xlabel="seconds since the first step" if time_axis else None)
