"""`course_lib.accel` and its seam: the reference engine builds and imports nothing from it, `LLM(accel=True)` gives
the reference's tokens, a machine without a compiler warns once and still runs, and nothing builds mid-request."""
from __future__ import annotations

import ast
import copy
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from course_lib import LLM, SamplingParams, tolerance
from course_lib.accel import Plan, plan_for
from course_lib.accel.fused_model import FusedAttention, FusedMLP, fuse_model
from course_lib.kv_cache import KVCache

ROOT = Path(__file__).resolve().parents[1]
REFERENCE_MODULES = ["model.py", "sampling.py", "kv_cache.py", "generate.py", "attention/paged.py",
                     "attention/__init__.py", "engine/scheduler.py", "engine/block_manager.py", "engine/sequence.py",
                     "engine/output_router.py", "engine/model_runner.py", "engine/llm_engine.py",
                     "engine/inputs.py", "engine/metrics.py", "engine/kv_budget.py", "engine/speculative.py"]
PROMPTS = ["The capital of France is", "Write a haiku about the KV cache.", "1, 2, 3, 4,"]
GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


def imported_modules(path: Path) -> list[str]:
    """Every module `path` imports, relative imports resolved against its package."""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = list(package[:len(package) - node.level + 1]) if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names += [module] + [f"{module}.{a.name}" for a in node.names]
    return names


@pytest.mark.parametrize("name", REFERENCE_MODULES)
def test_reference_modules_import_nothing_from_accel_and_name_no_cpu(name):
    path = ROOT / "course_lib" / name
    assert not [m for m in imported_modules(path) if m.startswith("course_lib.accel")], name
    text = path.read_text()
    for word in ("GenuineIntel", "AuthenticAMD", "AVX", "AMX", "mkldnn", "oneDNN", "cpp_extension", "Xeon", "EPYC"):
        assert word not in text, f"{name} names {word}"


MACHINE_SPECIFIC_CALLS = ("torch.compile", "torch.ops.mkldnn", "torch.backends.mkldnn", "torch._weight_int8pack_mm",
                          "torch._weight_int4pack_mm", "torch._convert_weight_to_int4pack")


def machine_specific_code(path: Path) -> list[str]:
    """What in `path` belongs behind `accel=True`: an import of Triton or of torch's C++ extension builder, a
    oneDNN-specific op or `torch.compile` named (called or passed), a host-tuned threshold (a *_ROWS constant)."""
    found = [m for m in imported_modules(path) if m.split(".")[0] == "triton" or "cpp_extension" in m]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            dotted, inner = [node.attr], node.value
            while isinstance(inner, ast.Attribute):
                dotted.insert(0, inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name):
                name = ".".join([inner.id] + dotted)
                found += [name for prefix in MACHINE_SPECIFIC_CALLS if name.startswith(prefix)]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found += [t.id for t in targets if isinstance(t, ast.Name) and t.id.endswith("DEQUANTIZE_ROWS")]
    return found


def test_no_machine_specific_code_outside_accel():
    """Triton, oneDNN's ops, torch.compile and host-tuned thresholds live in `course_lib/accel/` alone: `LLM()`
    and `LLM(quantization=...)` run the same pure PyTorch on every machine."""
    outside = [p for p in sorted((ROOT / "course_lib").rglob("*.py")) if "accel" not in p.relative_to(ROOT).parts]
    assert len(outside) > 50
    found = {p.relative_to(ROOT).as_posix(): names for p in outside if (names := machine_specific_code(p))}
    assert not found, found
    assert machine_specific_code(ROOT / "course_lib" / "accel" / "quant_linear.py")  # the test sees them there


def test_the_kernel_sources_are_at_most_four_under_accel_csrc():
    sources = sorted(p.relative_to(ROOT / "course_lib").as_posix()
                     for p in (ROOT / "course_lib").rglob("*") if p.suffix in (".cpp", ".cc", ".cu", ".h"))
    assert sources and len(sources) <= 4 and all(s.startswith("accel/csrc/") for s in sources), sources


def test_every_kernel_source_ships_with_the_package():
    """A .cpp that pyproject's package-data leaves out builds from a checkout but not from an installed wheel."""
    import fnmatch
    import tomllib

    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["course_lib"]
    sources = sorted(p.relative_to(ROOT / "course_lib").as_posix() for p in (ROOT / "course_lib").rglob("*.cpp"))
    assert sources and all(any(fnmatch.fnmatch(s, pat) and s.count("/") == pat.count("/") for pat in patterns)
                           for s in sources), sources


@pytest.mark.parametrize("attention_bias", [False, True])
def test_fused_model_matches_reference(attention_bias, tiny):
    ref = tiny(attention_bias)
    fast = fuse_model(copy.deepcopy(ref))
    assert not isinstance(ref.layers[0].self_attn, FusedAttention)
    assert isinstance(fast.layers[0].self_attn, FusedAttention) and isinstance(fast.layers[0].mlp, FusedMLP)
    assert not hasattr(fast.layers[0].self_attn, "q_proj")  # removed, not kept as a copy
    assert sum(p.numel() for p in fast.parameters()) == sum(p.numel() for p in ref.parameters())
    ids = torch.randint(0, 97, (2, 17))
    tolerance.assert_close(fast(ids), ref(ids), 1e-12)
    caches = [KVCache(ref.config, 32, batch=2, dtype=torch.float64) for _ in range(2)]  # prefill, then decode
    outs = [m(ids, kv=c) for m, c in zip((ref, fast), caches)]
    tolerance.assert_close(outs[1], outs[0], 1e-12)
    step = ids[:, -1:]
    for _ in range(3):
        a, b = ref(step, kv=caches[0]), fast(step, kv=caches[1])
        tolerance.assert_close(b, a, 1e-12)
        step = a[:, -1].argmax(-1, keepdim=True)


@pytest.fixture(scope="module")
def accel_llm():
    return LLM(device="cpu", accel=True)


@pytest.mark.needs_cpp
def test_accel_greedy_equals_reference_and_uses_its_plan(llm, accel_llm):
    plan = accel_llm.accel.plan
    assert plan == plan_for("cpu", torch.float32) and plan.fused_ops and plan.attention == "cpp"
    assert llm.accel is None
    want = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]
    assert [o.outputs[0].token_ids for o in accel_llm.generate(PROMPTS, GREEDY)] == want


@pytest.mark.needs_cpp
def test_quantized_layers_are_pure_without_accel_and_give_the_same_tokens_with_it():
    """`LLM(quantization="int4")` multiplies through the pure `QuantLinear` (dequantize, then F.linear); with
    `accel=True` the same codes go through this machine's kernels, and the greedy tokens stay the same."""
    from course_lib.quant import QuantLinear

    pure = LLM(device="cpu", quantization="int4")
    assert {type(m) for m in pure.model.modules() if isinstance(m, QuantLinear)} == {QuantLinear}
    fast = LLM(device="cpu", quantization="int4", accel=True)
    kinds = {type(m).__name__ for m in fast.model.modules() if isinstance(m, QuantLinear)}
    assert kinds == {"OneDNNQuantLinear"}, kinds
    want = [o.outputs[0].token_ids for o in pure.generate(PROMPTS, GREEDY)]
    assert [o.outputs[0].token_ids for o in fast.generate(PROMPTS, GREEDY)] == want


@pytest.mark.needs_cpp
def test_nothing_builds_or_measures_inside_a_request(accel_llm, monkeypatch):
    """`generate`, `stream` and `step` never start a build or a measurement: both happen when the LLM is made."""
    import torch.utils.cpp_extension

    from course_lib.accel import plan as plan_module

    def refuse(*args, **kwargs):
        raise AssertionError("a build or measurement started inside a request")

    monkeypatch.setattr(torch.utils.cpp_extension, "load", refuse)
    monkeypatch.setattr(plan_module, "measure_panel_rows", refuse)
    accel_llm.generate(PROMPTS, GREEDY)
    assert "".join(accel_llm.stream("Once upon a time", SamplingParams(max_tokens=8, temperature=0)))
    accel_llm.engine.add_request("Hello", SamplingParams(max_tokens=4, temperature=0.8, seed=1))
    while accel_llm.engine.has_unfinished_requests():
        accel_llm.engine.step()


def test_a_plan_is_applied_part_by_part(tokenizer, tiny):
    """Every part can be turned off on its own: the reference plan leaves the model as it was."""
    model = tiny().float()
    plan = dataclasses.replace(plan_for("cpu", torch.float32), fused_blocks=False, fused_ops=False, panel_rows=0,
                               attention="torch", packed_linears=False, w4a8_rows=0)
    assert not plan.needs_kernels
    llm = LLM.from_model(model, tokenizer, accel=plan)
    assert type(llm.model.layers[0].self_attn).__name__ == "Attention" and llm.accel.ops is None
    assert "PyTorch" in plan.describe() and "separate (reference)" in plan.describe()


def test_accel_option_checked():
    with pytest.raises(TypeError, match="accel"):
        LLM(device="cpu", accel="yes")
    with pytest.raises(TypeError, match="unknown engine option 'fast_path'"):
        LLM(device="cpu", fast_path=True)  # gone: accel=True replaces it


def run_python(code: str, **env) -> dict:
    """Run `code` in a fresh interpreter with `env` added; it prints one JSON line last, which is returned."""
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


GENERATE = """
import json, warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    from course_lib import LLM, SamplingParams
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    tokens = {{name: [o.outputs[0].token_ids for o in LLM(device="cpu", accel=accel).generate({prompts!r}, params)]
               for name, accel in {engines}}}
print(json.dumps({{"tokens": tokens, "warnings": [str(w.message) for w in caught if "course_lib" in str(w.message)]}}))
"""


def hf_greedy(hf_model, tokenizer, prompt: str, n: int) -> list[int]:
    ids = torch.tensor([tokenizer.encode(prompt)])
    with torch.inference_mode():
        out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                do_sample=False, pad_token_id=0)
    return out[0, ids.shape[1]:].tolist()


def test_the_reference_engine_builds_nothing(tmp_path, hf_model, tokenizer):
    """With an empty extensions folder, LLM() gives transformers' greedy tokens and leaves the folder empty."""
    folder = tmp_path / "torch_extensions"
    folder.mkdir()
    got = run_python(GENERATE.format(prompts=PROMPTS, engines=[("reference", False)]), TORCH_EXTENSIONS_DIR=str(folder))
    assert got["tokens"]["reference"] == [hf_greedy(hf_model, tokenizer, p, 24) for p in PROMPTS]
    assert list(folder.iterdir()) == [] and got["warnings"] == []


def test_accel_without_a_compiler_warns_once_and_gives_the_same_tokens(tmp_path):
    folder = tmp_path / "torch_extensions"
    folder.mkdir()
    got = run_python(GENERATE.format(prompts=PROMPTS, engines=[("reference", False), ("accel", True)]),
                     TORCH_EXTENSIONS_DIR=str(folder), PATH=str(tmp_path), CXX="c++")
    assert got["tokens"]["accel"] == got["tokens"]["reference"]
    assert len(got["warnings"]) == 1 and "could not be built" in got["warnings"][0] and "c++" in got["warnings"][0]


@pytest.mark.needs_cpp
def test_a_stale_build_lock_is_cleared_not_waited_on():
    from course_lib.accel.build import build_directory

    load = "from course_lib.accel.build import build; assert build().module is not None; print('{}')"
    run_python(load)  # built (or found built) once
    (build_directory() / "lock").touch()  # what a process killed while holding PyTorch's lock leaves behind
    run_python(load)  # PyTorch alone waits on that file forever: run_python's timeout turns a hang into a failure
    assert not (build_directory() / "lock").exists()


@pytest.mark.needs_cpp
def test_panel_rows_are_measured_once_and_kept(monkeypatch, tmp_path):
    from course_lib.accel import build as build_module
    from course_lib.accel import plan as plan_module

    ops = build_module.build().module
    rows = plan_module.measure_panel_rows(ops, torch.float32, megabytes=8, rounds=1)
    assert rows in (0,) + plan_module.PANEL_ROWS
    monkeypatch.setattr(build_module, "build_directory", lambda: tmp_path)
    calls = []
    monkeypatch.setattr(plan_module, "measure_panel_rows", lambda ops, dtype: calls.append(dtype) or 24)
    assert plan_module.panel_rows(ops, torch.float32) == 24 and plan_module.panel_rows(ops, torch.float32) == 24
    assert calls == [torch.float32]  # the second answer came from the file
    assert isinstance(plan_for("cpu", torch.float32), Plan)
