"""The planner over several devices (chapter 13) and the cost of an all-reduce: formulas and a measurement."""
import pytest
import torch

from course_lib.parallel import LINKS, all_reduce_seconds, comm_per_token, measure_all_reduce, ring_all_reduce_seconds
from course_lib.planner import devices_needed, load_config, plan, split_plan, valid_tp_sizes

LOAD = dict(weight_format="bf16", context_len=8192, concurrency=16)


def test_split_plan_divides_weights_and_kv_heads():
    whole = plan("Llama-3-70B", "H100 SXM", **LOAD)
    half = split_plan("Llama-3-70B", "H100 SXM", 2, **LOAD)
    assert half.weight_bytes == -(-whole.weight_bytes // 2) and half.kv_bytes == whole.kv_bytes // 2
    assert half.activation_bytes == whole.activation_bytes  # every rank runs the same tokens
    # 16 ranks over 8 KV heads: each rank keeps one whole KV head, so KV stops shrinking at tp = 8
    assert split_plan("Llama-3-70B", "H100 SXM", 16, **LOAD).kv_bytes == split_plan("Llama-3-70B", "H100 SXM", 8,
                                                                                     **LOAD).kv_bytes
    with pytest.raises(ValueError, match=r"tp=3 does not split .*64 query heads; use one of \[1, 2, 4, 8, 16, 32, 64\]"):
        split_plan("Llama-3-70B", "H100 SXM", 3, **LOAD)
    assert valid_tp_sizes("SmolLM2-135M-Instruct") == [1]  # 9 heads: no power of two above 1 divides them


def test_devices_needed_for_the_chapters_models():
    """What chapter 13's table states: 70B bf16 on 4 H100s or 2 H200s; 405B bf16 beyond one 8-GPU H100 machine,
    FP8 within it; the first fitting tp, so one fewer power of two does not fit."""
    assert load_config("llama-3.1-405b").num_parameters() == pytest.approx(405.85e9, rel=1e-4)
    for model, device, fmt, tp in [("Llama-3-8B", "H100 SXM", "bf16", 1), ("Llama-3-70B", "H100 SXM", "bf16", 4),
                                   ("Llama-3-70B", "H200", "bf16", 2), ("Llama-3.1-405B", "H100 SXM", "bf16", 16),
                                   ("Llama-3.1-405B", "H100 SXM", "fp8", 8), ("Llama-3.1-405B", "H200", "bf16", 8)]:
        load = {**LOAD, "weight_format": fmt}
        need = devices_needed(model, device, **load)
        assert need.tp == tp and need.fits, (model, device, fmt)
        if tp > 1:
            assert not split_plan(model, device, tp // 2, **load).fits
    assert devices_needed("Llama-3.1-405B", "RTX 4090", max_devices=8, **LOAD) is None


def test_split_plan_users_and_tpot():
    """More devices leave more memory for KV on each, so more users fit; the step divides over tp."""
    splits = {tp: split_plan("Llama-3-70B", "H100 SXM", tp, **LOAD) for tp in (1, 2, 4, 8)}
    assert splits[1].max_concurrency == 0  # the bf16 weights alone do not fit one H100
    assert 0 < splits[2].max_concurrency < 16 <= splits[4].max_concurrency < splits[8].max_concurrency
    s = splits[4]
    free, per_user = s.usable_bytes - s.weight_bytes - s.activation_bytes, s.kv_bytes / 16
    assert s.max_concurrency * per_user <= free < (s.max_concurrency + 1) * per_user
    assert s.tpot_s == pytest.approx(s.whole.tpot_s / 4)


def test_all_reduce_seconds_adds_a_latency_per_call():
    nvlink, pcie = LINKS["NVLink 4 (H100 SXM)"], LINKS["PCIe 4.0 x16"]
    assert all_reduce_seconds(1e6, 1, nvlink, calls=161) == 0
    assert all_reduce_seconds(8, 4, nvlink, calls=161) == pytest.approx(161 * nvlink.latency_s, rel=1e-3)
    assert all_reduce_seconds(1e6, 4, pcie, calls=3) == pytest.approx(3 * (30e-6 + 1.5e6 / 32e9))
    assert all_reduce_seconds(1e6, 2, pcie, latency_s=0) == ring_all_reduce_seconds(1e6, 2, pcie)
    with pytest.raises(ValueError, match="no per-call latency"):
        all_reduce_seconds(1e6, 4, LINKS["InfiniBand NDR (between machines)"])


def test_ring_all_reduce_formula():
    nvlink = LINKS["NVLink 4 (H100 SXM)"]
    assert ring_all_reduce_seconds(1e9, 1, nvlink) == 0
    assert ring_all_reduce_seconds(1e9, 2, nvlink) == pytest.approx(1e9 / 450e9)  # 2 (2-1)/2 = 1 payload each way
    assert ring_all_reduce_seconds(1e9, 4, nvlink) == pytest.approx(1.5e9 / 450e9)
    assert ring_all_reduce_seconds(0, 4, nvlink, per_step_latency_s=1e-5) == pytest.approx(6e-5)  # 2 (tp-1) steps
    per_token = comm_per_token(load_config("Llama-3-70B"), 4, torch.bfloat16)
    assert per_token.all_reduces == 161 and per_token.all_reduce_bytes == 161 * 8192 * 2
    assert all(link.source for link in LINKS.values())


def test_measure_all_reduce_between_two_processes():
    """Two gloo processes here: a time for every size, and 64 MiB takes longer than 4 KiB. (4 MiB did not always:
    on a 2-core host gloo's small all-reduce sometimes takes ~4 ms a call, as long as 4 MiB's ~1.5 ms.)"""
    times = measure_all_reduce([4096, 64 * 2**20], world_size=2, repeats=5)
    assert set(times) == {4096, 64 * 2**20} and all(t > 0 for t in times.values())
    assert times[64 * 2**20] > times[4096]
