"""The device and dtype policy (`course_lib.dtypes`) on GPUs this machine does not have.

A T4 (Colab's free GPU, compute capability 7.5) has no native bfloat16, an A100 (8.0) and an H100 (9.0)
have it. The tests patch torch.cuda's queries to play each card, then check what every entry point picks.
"""
from __future__ import annotations

import pytest
import torch

import course_lib
from course_lib import tolerance
from course_lib.chapter import setup_chapter
from course_lib.config import ModelConfig
from course_lib.accel.plan import check_triton_dtype
from course_lib.dtypes import default_dtype, resolve_device_dtype
from course_lib.accel.fused_model import FusedRMSNorm
from course_lib.model import RMSNorm, Transformer

CARDS = {  # name: (compute capability, the dtype the engine must pick)
    "Tesla T4": ((7, 5), torch.float16),
    "NVIDIA A100-SXM4-80GB": ((8, 0), torch.bfloat16),
    "NVIDIA H100 80GB HBM3": ((9, 0), torch.bfloat16),
}


@pytest.fixture(params=sorted(CARDS))
def card(request, monkeypatch):
    """Pretend a CUDA GPU is present: the card's name and capability; bfloat16 'supported' (emulated) on all."""
    name = request.param
    capability, _ = CARDS[name]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    monkeypatch.setattr(torch.version, "hip", None)
    return name


def test_default_dtype_per_card(card):
    want = CARDS[card][1]
    assert default_dtype("cuda") == want
    assert default_dtype("cuda:0") == want
    assert default_dtype("cpu") == torch.float32


def test_device_none_picks_the_gpu_and_its_dtype(card):
    want = CARDS[card][1]
    assert resolve_device_dtype() == (torch.device("cuda"), want)
    assert resolve_device_dtype("cpu") == (torch.device("cpu"), torch.float32)
    assert resolve_device_dtype(None, "float32") == (torch.device("cuda"), torch.float32)  # asked for wins
    assert resolve_device_dtype("cuda", torch.bfloat16)[1] == torch.bfloat16


def test_entry_points_follow_the_policy(card, monkeypatch, capsys):
    """setup_chapter, load_model and LLM pick the card and its dtype when given nothing."""
    want = CARDS[card][1]
    setup = setup_chapter()
    assert (setup.device.type, setup.dtype, setup.name) == ("cuda", want, card)
    assert f"cuda ({card}) {str(want).removeprefix('torch.')}" in capsys.readouterr().out

    seen = {}

    class Stop(Exception):
        pass

    def fake_build(config, state, device, dtype):  # no CUDA here: record where the weights would go, then stop
        seen.update(device=device, dtype=dtype)
        raise Stop

    monkeypatch.setattr(course_lib.loading, "build_model", fake_build)
    for entry in (course_lib.load_model, course_lib.LLM):
        seen.clear()
        with pytest.raises(Stop):
            entry()
        assert seen == {"device": torch.device("cuda"), "dtype": want}, entry


@pytest.mark.parametrize("options", [dict(accel=True), dict(accel=True, quantization="int8"),
                                     dict(accel=True, compile_decode=True)])
def test_bfloat16_with_triton_is_refused_below_sm80(card, options, monkeypatch):
    """A T4 has no bfloat16 arithmetic: `LLM` refuses it for the Triton kernels, before touching the model, and
    says to use float16. The A100 and H100 take it; the reference engine takes it anywhere."""
    monkeypatch.setattr(Transformer, "device", property(lambda self: torch.device("cuda")))  # no GPU here
    model = Transformer(ModelConfig(vocab_size=16, hidden_size=16, intermediate_size=16, num_layers=1, num_heads=2,
                                    num_kv_heads=1)).to(torch.bfloat16)

    class Started(Exception):
        pass

    monkeypatch.setattr(course_lib.engine.llm, "LLMEngine", lambda *a, **k: (_ for _ in ()).throw(Started()))
    monkeypatch.setattr("course_lib.accel.Accelerator.apply", lambda *a, **k: None)  # nothing to fuse on the CPU
    monkeypatch.setattr("course_lib.quant.quantize_model", lambda *a, **k: None)
    refused = CARDS[card][1] == torch.float16
    with pytest.raises(ValueError if refused else Started, match="dtype='float16'" if refused else None):
        course_lib.LLM.from_model(model, None, **options)
    for reference in (dict(), dict(quantization="int8")):  # the reference engine, its quantized layers pure too
        with pytest.raises(Started):
            course_lib.LLM.from_model(model, None, **reference)
    check_triton_dtype("cuda", torch.float16)
    check_triton_dtype("cpu", torch.bfloat16)


def test_cpu_only_machine_picks_float32(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device_dtype() == (torch.device("cpu"), torch.float32)
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        resolve_device_dtype("cuda")


@pytest.mark.parametrize("norm_cls", [RMSNorm, FusedRMSNorm])
def test_rmsnorm_does_not_overflow_in_float16(norm_cls):
    """Activations of a few hundred square to more than float16's maximum (65504): the mean of squares
    must be taken in float32, as Llama does, or the norm returns zeros and NaNs."""
    torch.manual_seed(0)
    norm = norm_cls(64, eps=1e-5)
    x = torch.randn(3, 64) * 1000
    naive = x.half() * torch.rsqrt(x.half().pow(2).mean(-1, keepdim=True) + 1e-5)  # what float16 alone gives
    assert naive.abs().max() == 0  # inf mean of squares -> rsqrt 0: the activations vanish
    got = norm.half()(x.half())
    want = norm.float()(x)
    assert got.dtype == torch.float16 and torch.isfinite(got).all()
    tolerance.assert_close(got.float(), want, 1e-2)


@pytest.mark.parametrize("accel", [False, True])
def test_float16_engine_answers_like_float32(llm, accel):
    """What a T4 runs, on the CPU: the whole engine in float16 (paged cache, decode attention, sampler)."""
    params = course_lib.SamplingParams(max_tokens=12, temperature=0)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    want = llm.chat(question, params)[0].outputs[0]
    half = course_lib.LLM(device="cpu", dtype="float16", accel=accel)
    assert half.model.dtype == torch.float16
    got = half.chat(question, params)[0].outputs[0]
    assert got.token_ids == want.token_ids, (got.text, want.text)
