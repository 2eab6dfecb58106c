"""Roofline measurement, plot and torch.profiler helper on a tiny random model."""
import pytest
import torch

from course_lib.config import ModelConfig
from course_lib.model import Transformer
from course_lib.profiling import Ceilings, measure_ceilings, measure_decode, measure_prefill
from course_lib.profiling.plots import plot_roofline
from course_lib.profiling.roofline import measure_bandwidth, measure_matmul_flops
from course_lib.profiling.torch_profile import profile_steps

SMALL = ModelConfig(vocab_size=320, hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4, num_kv_heads=2,
                    tie_word_embeddings=True)


def test_ceilings_arithmetic():
    c = Ceilings(peak_flops=100e9, bandwidth=10e9)
    assert c.ridge_point == 10.0
    assert c.attainable(1.0) == 10e9 and c.attainable(50.0) == 100e9


def test_measured_ceilings_are_plausible():
    bw = measure_bandwidth("cpu", nbytes=2 ** 24, repeats=2)
    fl = measure_matmul_flops("cpu", n=256, repeats=2)
    assert 1e8 < bw < 1e13 and 1e7 < fl < 1e14


@pytest.mark.parametrize("seconds,tried_sizes,measured", [(0.001, [512, 1024], 2048), (1.0, [512], 512)])
def test_the_cpu_product_grows_to_2048_only_while_it_stays_quick(monkeypatch, seconds, tried_sizes, measured):
    """A fast dtype is measured at 2048 as ever; one with no CPU kernel (a second a product) stops at 512."""
    from course_lib.profiling import roofline

    tried, shapes = [], []
    monkeypatch.setattr(roofline, "_seconds_of_one_product", lambda n, dev, dt: tried.append(n) or seconds)
    real_mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, b, **kw: shapes.append(a.shape[0]) or real_mm(a, b, **kw))
    measure_matmul_flops("cpu", repeats=1)
    assert tried == tried_sizes and set(shapes) == {measured}


@torch.inference_mode()
def test_points_plot_and_profile(tmp_path):
    torch.manual_seed(0)
    model = Transformer(SMALL).eval()
    prefill = measure_prefill(model, num_tokens=32, repeats=2, warmup=1)
    decode = measure_decode(model, context_len=32, repeats=2, warmup=1)
    assert prefill.intensity > 5 * decode.intensity
    assert prefill.achieved_flops > 0 and decode.achieved_bandwidth > 0
    ceilings = Ceilings(peak_flops=1e11, bandwidth=1e10)
    assert decode.bound(ceilings) == "memory"
    assert decode.fraction_of_roof(ceilings) == pytest.approx(decode.achieved_flops / (decode.intensity * 1e10))

    ax = plot_roofline(ceilings, [prefill, decode])
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "FLOP / byte" in ax.get_xlabel() and "GFLOP/s" in ax.get_ylabel()
    ax.figure.savefig(tmp_path / "roofline.png")
    assert (tmp_path / "roofline.png").stat().st_size > 0

    table = profile_steps(model, prompt_len=16, row_limit=5, trace_path=tmp_path / "trace.json")
    assert set(table["phase"]) == {"prefill", "decode"}
    assert (table.groupby("phase").size() <= 5).all()
    assert any("mm" in op for op in table[table.phase == "prefill"]["op"])
    assert (tmp_path / "trace.json").stat().st_size > 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_ceilings():
    c = measure_ceilings("cuda", "bfloat16", repeats=3)
    assert c.peak_flops > 1e12 and c.bandwidth > 1e11


def test_prefill_length_reaches_the_asked_intensity_with_the_shortest_doubling():
    model = Transformer(SMALL).eval()  # max_position_embeddings bounds the search
    from course_lib.profiling import prefill_tokens_for_intensity
    from course_lib.profiling.flops import prefill_cost
    from course_lib.profiling.roofline import weights_read

    def intensity(n):
        return prefill_cost(SMALL, n, dtype=model.dtype, weight_bytes=weights_read(model), logits_tokens=1).intensity

    target = intensity(64) * 1.01  # just past 64 tokens: 128 is the first doubling from 16 to reach it
    n = prefill_tokens_for_intensity(model, target, start=16)
    assert n == 128 and intensity(n) >= target > intensity(n // 2)
    assert prefill_tokens_for_intensity(model, 1e9, start=16) is None  # no prompt the model takes gets there
