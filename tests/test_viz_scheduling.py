"""course_lib.viz.scheduling: the step recorder behind notebook 07's timelines, on a tiny random model."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from course_lib import SamplingParams  # noqa: E402
from course_lib.attention.paged import PagedKVCache  # noqa: E402
from course_lib.config import ModelConfig  # noqa: E402
from course_lib.engine.llm_engine import EngineConfig, LLMEngine  # noqa: E402
from course_lib.engine.scheduler import Scheduler  # noqa: E402
from course_lib.model import Transformer  # noqa: E402
from course_lib.viz.scheduling import (STATE_COLORS, StepRecorder, plot_state_grid, plot_timeline,  # noqa: E402
                                       timeline_grid)


class NoTextTokenizer:
    eos_token_ids: list[int] = []

    def decode(self, ids, skip_special_tokens=True):
        return ""


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                         num_kv_heads=1, max_position_embeddings=512, tie_word_embeddings=False)
    return Transformer(config).eval()


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def engine_for(tiny, **options):
    options = {"kv_cache_memory": 2**20, "enable_prefix_caching": False, **options}
    return LLMEngine(tiny, NoTextTokenizer(), EngineConfig(**options))


def serve(engine, prompt_lens, max_tokens):
    for i, n in enumerate(prompt_lens):
        engine.add_request([3 + (i + j) % 100 for j in range(n)],
                           SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
    with StepRecorder(engine) as rec:
        while engine.has_unfinished_requests():
            engine.step()
    return rec


def test_recorder_sees_every_step_and_restores_the_scheduler(tiny):
    engine = engine_for(tiny, max_num_batched_tokens=16, max_num_seqs=2)
    rec = serve(engine, [20, 5, 9], max_tokens=3)
    assert "schedule" not in vars(engine.scheduler)  # the class's method is back
    assert engine.scheduler.schedule.__func__ is Scheduler.schedule
    assert [s.num_tokens for s in rec.steps] == engine.stats.batch_tokens
    assert sum(s.tokens_of("decode") for s in rec.steps) == engine.stats.decode_tokens
    assert sum(s.tokens_of("prefill", "prefill chunk") for s in rec.steps) == engine.stats.prefill_tokens
    first = rec.steps[0]
    assert first.work == {"0": ("prefill chunk", 16)} and first.waiting == ["1", "2"]
    assert first.describe() == "step  1,   16 tokens: 0 prefill chunk 16 | waiting 1, 2"
    assert all(s.end is not None and s.end >= s.start for s in rec.steps)


def test_preemption_shows_as_preempted_then_recompute(tiny):
    block_bytes = PagedKVCache.bytes_per_block(tiny.config, 4, tiny.dtype)
    engine = engine_for(tiny, block_size=4, kv_cache_memory=8 * block_bytes)
    rec = serve(engine, [6, 6, 6], max_tokens=8)
    assert engine.stats.preemptions > 0
    rows, grid = timeline_grid(rec.steps)
    states = {s for row in grid for s in row}
    assert {"preempted", "recompute", "decode", "waiting"} <= states
    assert sum(row.count("preempted") for row in grid) == engine.stats.preemptions
    assert sum(s.tokens_of("prefill", "prefill chunk", "recompute") for s in rec.steps) == engine.stats.prefill_tokens


def test_plots_draw_steps_and_time(tiny):
    rec = serve(engine_for(tiny, max_num_batched_tokens=8), [12, 3], max_tokens=2)
    ax = plot_timeline(rec.steps, title="t")
    assert ax.get_xlim() == (0.5, len(rec.steps) + 0.5)
    ax = plot_timeline(rec.steps, time_axis=True)
    assert ax.get_xlim()[0] == 0 and ax.get_xlim()[1] == pytest.approx(rec.steps[-1].end - rec.steps[0].start)
    ax = plot_state_grid(["a", "b"], [["prefill", "padding"], ["waiting", "decode"]])
    assert {t.get_text() for t in ax.get_legend().get_texts()} == {"prefill", "padding", "waiting", "decode"}
    with pytest.raises(ValueError, match="x_edges"):
        plot_state_grid(["a"], [["decode"]], x_edges=[0.0])
    assert set(STATE_COLORS) >= {"prefill", "prefill chunk", "decode", "recompute", "padding", "preempted", "waiting"}
