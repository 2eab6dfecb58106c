"""`torch.profiler` around one prefill and one decode step: which operators take the time.

In a prefill the matmuls (aten::mm / addmm) dominate; in a batch-1 decode step the same
matmuls become matrix-vector products limited by reading the weights, and on a GPU the
many small launches (norms, RoPE, copies into the cache) start to show: the reason engines
capture decode in a CUDA graph. `phase_summary` adds the operators up by family (matmul,
attention, elementwise, copies). Open the exported trace in chrome://tracing or Perfetto.
"""
from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from ..kv_cache import KVCache

PHASES = ("prefill", "decode")
# Operator families: an aten op belongs to the first family that one of the words of its name is in.
CATEGORIES: tuple[tuple[str, frozenset[str]], ...] = (
    ("attention", frozenset({"attention", "sdpa", "flash"})),
    ("matmul", frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear"})),
    ("norm / activation / elementwise", frozenset({"add", "mul", "pow", "mean", "rsqrt", "silu", "neg", "sub", "div",
                                                    "sigmoid", "exp", "softmax", "cos", "sin", "sum", "where"})),
    ("copies / indexing", frozenset({"copy", "cat", "index", "embedding", "gather", "scatter", "to", "contiguous",
                                     "slice", "select", "view", "reshape", "transpose", "strided", "expand", "t",
                                     "permute", "unsqueeze", "chunk", "split", "clone", "empty", "zeros", "ones",
                                     "full", "arange", "fill"})),
)


@torch.inference_mode()
def profile_steps(model: torch.nn.Module, prompt_len: int = 128, row_limit: int | None = 10,
                  trace_path: str | Path | None = None) -> pd.DataFrame:
    """Profile a prefill of `prompt_len` random tokens and the decode step after it.

    Returns the top `row_limit` operators of each phase (all of them when None) by self time
    (device time on a GPU, CPU time otherwise): columns phase, op, calls, self_cpu_ms,
    cpu_total_ms, and self_device_ms on a GPU. `trace_path` also writes a Chrome trace of both steps.
    """
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # read at the profiler's first start: no "profiler_start" on stderr
    cfg, dev = model.config, model.device
    ids = torch.randint(0, cfg.vocab_size, (1, prompt_len + 1), device=dev)
    cache = KVCache(cfg, prompt_len + 1, 1, dev, model.dtype)

    def run() -> None:
        cache.reset()
        with record_function("prefill"):
            model(ids[:, :prompt_len], kv=cache, last_only=True)
            _sync(dev)
        with record_function("decode"):
            model(ids[:, prompt_len:], kv=cache)
            _sync(dev)

    run()  # warm-up: first calls pay for allocation and lazy initialisation
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=activities) as prof:
        run()
    if trace_path is not None:
        Path(trace_path).parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace_path))
    return _top_ops(prof.events(), row_limit, device=dev.type == "cuda")


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _phase(event) -> str | None:
    node = event.cpu_parent
    while node is not None:
        if node.name in PHASES:
            return node.name
        node = node.cpu_parent
    return None


def _top_ops(events, row_limit: int | None, device: bool) -> pd.DataFrame:
    """Sum the raw profiler events per (phase, operator name)."""
    acc: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for e in events:
        phase = _phase(e)
        if phase is None or e.device_type != torch.autograd.DeviceType.CPU:
            continue
        row = acc[(phase, e.name)]
        row["calls"] += 1
        row["self_cpu_ms"] += e.self_cpu_time_total / 1e3
        row["cpu_total_ms"] += e.cpu_time_total / 1e3
        if device:
            row["self_device_ms"] += e.self_device_time_total / 1e3
    frame = pd.DataFrame([{"phase": p, "op": name, **vals} for (p, name), vals in acc.items()])
    frame["calls"] = frame["calls"].astype(int)
    key = "self_device_ms" if device else "self_cpu_ms"
    frame = frame.sort_values(["phase", key], ascending=[True, False])
    if row_limit is not None:
        frame = frame.groupby("phase", sort=False).head(row_limit)
    order = {p: i for i, p in enumerate(PHASES)}
    return frame.sort_values("phase", key=lambda s: s.map(order), kind="stable").reset_index(drop=True)


def op_category(name: str) -> str:
    """The family of an aten operator: "attention", "matmul", "norm / activation / elementwise",
    "copies / indexing" (moving, reshaping or creating tensors) or "other" (see `CATEGORIES`).

    aten::_scaled_dot_product_flash_attention is attention, aten::addmm matmul, aten::add_ elementwise,
    aten::index_put_ a copy.
    """
    words = set(name.lower().removeprefix("aten::").strip("_").split("_"))
    for category, keys in CATEGORIES:
        if words & keys:
            return category
    return "other"


def phase_summary(ops: pd.DataFrame) -> pd.DataFrame:
    """Time per operator family and phase from `profile_steps(..., row_limit=None)`.

    One row per (phase, category): calls, ms (self time on the device that ran the op: the GPU
    when there is one) and share of the phase's time.
    """
    key = "self_device_ms" if "self_device_ms" in ops else "self_cpu_ms"
    frame = ops.assign(category=ops["op"].map(op_category))
    out = frame.groupby(["phase", "category"], sort=False).agg(calls=("calls", "sum"), ms=(key, "sum")).reset_index()
    out["share"] = out["ms"] / out.groupby("phase")["ms"].transform("sum")
    order = {p: i for i, p in enumerate(PHASES)}
    out = out.sort_values(["phase", "ms"], key=lambda s: s.map(order) if s.name == "phase" else -s)
    return out.reset_index(drop=True)
