"""course_lib.viz.quant: the plots of notebook 08 render, and the Q4_1 block split agrees with the decoder."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from course_lib import tolerance  # noqa: E402
from course_lib.quant import gguf_blocks  # noqa: E402
from course_lib.viz import quant as vq  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _block() -> bytes:
    return bytes(gguf_blocks.quantize_q4_1(torch.linspace(-1, 2, 32))[0].numpy())


def test_split_q4_1_matches_the_decoder():
    d, m, low, high = vq.split_q4_1(_block())
    w = torch.tensor([d * c + m for c in low + high], dtype=torch.float32)
    tolerance.assert_close(w, gguf_blocks.dequantize_q4_1(_block()), tolerance.OP_RTOL[torch.float32])
    with pytest.raises(ValueError, match="20 bytes"):
        vq.split_q4_1(_block()[:19])


def test_plots_render():
    vq.plot_q4_1_block(_block())
    values = torch.randn(32)
    grid = torch.linspace(-2, 2, 16)
    fig = vq.plot_levels(values, [grid, grid * 2], ["a", "b"], "levels")
    assert len(fig.axes) == 2
    vq.plot_error_vs_bound(torch.rand(10), torch.rand(10) / 2, "bound")
    row = {"linear_mb": 1.0, "other_mb": 0.5, "kl": 0.0, "decode_tok_s": 10.0, "prefill_tok_s": 100.0}
    fig = vq.plot_format_tradeoffs({"float32": row, "int4": {**row, "kl": 0.1, "decode_tok_s": 20.0}}, "t")
    assert len(fig.axes) == 3
