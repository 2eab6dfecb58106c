"""benchmarks/gpu_check.py: its --cpu rehearsal runs end to end (CI's stand-in for the GPU run), and its
checks fail when the engine is wrong."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_check
from course_lib import load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=64, vocab_size=1024, max_position_embeddings=256)


@pytest.mark.slow
def test_cpu_rehearsal_writes_every_check_and_figure(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--cpu", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["passed"] and report["env"]["device"] == "cpu" and report["env"]["policy_dtype"] == "torch.float32"
    names = {c["name"] for c in report["checks"]}
    for shape in gpu_check.SHAPES:
        for dtype in ("float32", "float16", "bfloat16"):
            assert {f"{shape} {dtype} logits", f"{shape} {dtype} greedy"} <= names
    assert sum(c["section"] == "triton" for c in report["checks"]) == 4
    assert all(c["passed"] for c in report["checks"])
    figures = {(r["run"], r["shape"], r["system"], r["metric"]): r for r in report["speed"]}
    low, high = report["workload"]["concurrency"]
    for shape in gpu_check.SHAPES:
        for system in ("engine", "transformers"):
            for metric in ("decode_tok_s", f"throughput_{low}_uniform", f"throughput_{high}_uniform"):
                assert ("float32", shape, system, metric) in figures
    int4 = {(system, r["precision"]) for (run, shape, system, metric), r in figures.items()
            if run == "int4 vs float16" and shape == gpu_check.INT4_SHAPE and metric == "decode_tok_s"}
    assert int4 == {("engine", "float16"), ("engine int4", "int4"), ("transformers", "float16")}
    assert all(0 < r["extra"]["of_bandwidth"] for k, r in figures.items() if k[3] == "decode_tok_s")
    assert all(r["value"] > 0 for r in report["speed"])
    assert "none on the CPU" in report["cuda_graphs"]
    assert [(k["section"], k["reason"].split(":")[0]) for k in report["skipped"]] == [("real weights", "no GPU")] * 2
    assert f"{high} requests / transformers batch-1" in proc.stdout
    assert "engine int4 / float16 batch-1 decode" in proc.stdout


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_checks_pass_on_the_same_weights_and_fail_on_others(dtype):
    tokenizer = load_tokenizer()
    hf, model = gpu_check.random_pair(TINY, torch.device("cpu"), dtype)
    report = gpu_check.Report(env={})
    gpu_check.check_against_transformers(report, "tiny", hf, model, tokenizer, dtype)
    assert [c.passed for c in report.checks] == [True, True]

    hf, model = gpu_check.random_pair(TINY, torch.device("cpu"), dtype)
    with torch.no_grad():  # a new tensor, so the reference (which shares the old one) stays right
        w = model.layers[1].mlp.down_proj.weight
        model.layers[1].mlp.down_proj.weight = torch.nn.Parameter(w * 1.5, requires_grad=False)
    report = gpu_check.Report(env={})
    gpu_check.check_against_transformers(report, "tiny, one layer off", hf, model, tokenizer, dtype)
    assert not report.checks[0].passed  # logits
    assert report.checks[0].value > gpu_check.TOLERANCE[dtype]


def test_an_error_in_one_section_is_a_failed_check_and_the_run_goes_on(capsys):
    report = gpu_check.Report(env={})

    def broken():
        raise RuntimeError("CUDA out of memory")

    gpu_check.guarded(report, "a section", broken)
    gpu_check.guarded(report, "the next one", lambda: report.add(gpu_check.Check("x", "the next one", True)))
    assert [(c.name, c.passed) for c in report.checks] == [("a section", False), ("the next one", True)]
    assert "CUDA out of memory" in report.checks[0].detail


def test_graphs_run_both_ways_only_where_llm_can_turn_them_off(monkeypatch):
    class Eager:
        def __init__(self, model=None, enforce_eager: bool = False):
            pass

        @classmethod
        def from_model(cls, model, tokenizer, **engine_args):
            pass

    class Graphless(Eager):
        def __init__(self, model=None):
            pass

    monkeypatch.setattr(gpu_check, "LLM", Eager)
    assert gpu_check.graphs_switch()
    assert "on and off" in gpu_check.cuda_graphs_note(torch.device("cuda"))
    monkeypatch.setattr(gpu_check, "LLM", Graphless)
    assert not gpu_check.graphs_switch()
    assert "not compared" in gpu_check.cuda_graphs_note(torch.device("cuda"))
    assert "none on the CPU" in gpu_check.cuda_graphs_note(torch.device("cpu"))


def test_real_weights_check_says_why_it_skips(monkeypatch):
    """No GPU, or a GPU without the Hub: the real-weights check loads nothing and reports a reason."""
    def no_loading(*args, **kwargs):
        raise AssertionError("a skipped check must not load the model")

    monkeypatch.setattr(gpu_check, "load_model", no_loading)
    report = gpu_check.Report(env={})
    gpu_check.real_weights_float16(report, torch.device("cpu"))
    assert report.checks == [] and len(report.skipped) == 2 and "no GPU" in report.skipped[0]["reason"]
    monkeypatch.setattr(gpu_check, "hub_reachable", lambda: False)
    assert gpu_check.real_weights_skip_reason(torch.device("cuda")).startswith("no network")


def test_real_weights_check_measures_float16_against_float32(monkeypatch):
    """The measuring half on the CPU, with random weights standing in for the Hub model in both dtypes."""
    shape = {**TINY, "vocab_size": 49152}  # the default tokenizer's ids
    monkeypatch.setattr(gpu_check, "real_weights_skip_reason", lambda device: "")
    monkeypatch.setattr(gpu_check, "load_tokenizer", lambda name: load_tokenizer())
    monkeypatch.setattr(gpu_check, "load_model",
                        lambda name, device, dtype: gpu_check.random_pair(shape, device, dtype)[1])
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    report = gpu_check.Report(env={})
    gpu_check.real_weights_float16(report, torch.device("cpu"))
    activation, top1 = report.checks
    assert activation.passed and 0 < activation.value < 1e-2 and "at " in activation.detail
    assert top1.passed and top1.value >= gpu_check.REAL_TOP1 and "positions of 4 prompts" in top1.detail
