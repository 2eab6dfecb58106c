"""The roofline, measured on this machine (Williams, Waterman & Patterson, 2009).

A step that does F FLOPs while moving B bytes cannot run faster than either ceiling:

    time >= max(F / peak_flops, B / bandwidth)  <=>  FLOP/s <= min(peak_flops, intensity * bandwidth)

with intensity = F / B. Below the ridge point (peak_flops / bandwidth FLOP/byte) a step is
bandwidth-bound; above it, compute-bound. Both ceilings are *measured* here, in the dtype
in use, on the model's device: bandwidth from a large copy, FLOP/s from a large matmul,
each from its fastest repeat (a ceiling is the best the machine did; steps use the median).
Prefill (hundreds of FLOPs per byte) lands right of the ridge, a batch-1 decode step
(about one) far left of it: compute decides TTFT, bandwidth decides decode speed.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..dtypes import resolve_device, resolve_dtype
from ..kv_cache import KVCache
from .flops import StepCost, decode_cost, prefill_cost
from .memory import weight_bytes
from .timer import Timing, measure


@dataclass
class Ceilings:
    """A machine's two roofs for one device and dtype."""

    peak_flops: float  # FLOP/s of a large matmul
    bandwidth: float  # bytes/s of a large copy (read + write)
    device: str = "cpu"
    dtype: str = "float32"

    @property
    def ridge_point(self) -> float:
        """Intensity (FLOP/byte) where the two roofs meet."""
        return self.peak_flops / self.bandwidth

    def attainable(self, intensity: float) -> float:
        """The roof above `intensity`: min(peak_flops, intensity * bandwidth), in FLOP/s."""
        return min(self.peak_flops, intensity * self.bandwidth)


@dataclass
class RooflinePoint:
    """One measured step: its counted cost and its median time."""

    name: str
    cost: StepCost
    timing: Timing

    @property
    def seconds(self) -> float:
        """Median seconds of the step."""
        return self.timing.median

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved (counted, not measured)."""
        return self.cost.intensity

    @property
    def achieved_flops(self) -> float:
        """Counted FLOPs / measured seconds."""
        return self.cost.flops / self.seconds

    @property
    def achieved_bandwidth(self) -> float:
        """Counted bytes / measured seconds."""
        return self.cost.bytes / self.seconds

    def fraction_of_roof(self, ceilings: Ceilings) -> float:
        """Achieved FLOP/s over the roof at this intensity (1.0 = as fast as the machine allows)."""
        return self.achieved_flops / ceilings.attainable(self.intensity)

    def bound(self, ceilings: Ceilings) -> str:
        """"memory" left of the ridge point, "compute" right of it."""
        return "memory" if self.intensity < ceilings.ridge_point else "compute"


def measure_bandwidth(device: torch.device | str | None = None, dtype: torch.dtype | str = torch.float32,
                      nbytes: int | None = None, repeats: int = 5) -> float:
    """Bytes/s of `dst.copy_(src)`: 2 x nbytes (read + write) over the fastest repeat.

    The buffers (default 256 MiB on CPU, 1 GiB on GPU) must dwarf the caches, else the
    copy measures the cache, not memory.
    """
    dev, dt = resolve_device(device), resolve_dtype(dtype)
    nbytes = nbytes or (2 ** 30 if dev.type == "cuda" else 2 ** 28)
    n = nbytes // torch.empty((), dtype=dt).element_size()
    src = torch.ones(n, device=dev, dtype=dt)
    dst = torch.empty_like(src)
    t = measure(lambda: dst.copy_(src), repeats=repeats, warmup=1, device=dev)
    return 2 * src.nbytes / t.min


def _seconds_of_one_product(n: int, device: torch.device, dtype: torch.dtype) -> float:
    a = torch.randn(n, n, device=device).to(dtype)
    start = time.perf_counter()
    torch.mm(a, a)
    return time.perf_counter() - start


def measure_matmul_flops(device: torch.device | str | None = None, dtype: torch.dtype | str = torch.float32,
                         n: int | None = None, repeats: int = 5) -> float:
    """FLOP/s of an [n, n] @ [n, n] product: 2 n^3 over the fastest repeat. Default n: 8192 on a GPU; on a CPU
    2048, unless a product already takes over 0.1 s at 512 or 1024 (as `timeit`'s autorange grows its
    loop): a dtype the CPU has no kernel for (float16, bfloat16 on many) runs at ~1 GFLOP/s, and 2048 took minutes."""
    dev, dt = resolve_device(device), resolve_dtype(dtype)
    if n is None and dev.type == "cuda":
        n = 8192
    elif n is None:
        n = 512
        while n < 2048 and _seconds_of_one_product(n, dev, dt) < 0.1:
            n *= 2
    a = torch.randn(n, n, device=dev).to(dt)
    b = torch.randn(n, n, device=dev).to(dt)
    out = torch.empty(n, n, device=dev, dtype=dt)
    t = measure(lambda: torch.mm(a, b, out=out), repeats=repeats, warmup=1, device=dev)
    return 2 * n ** 3 / t.min


def measure_ceilings(device: torch.device | str | None = None, dtype: torch.dtype | str = torch.float32,
                     repeats: int = 5) -> Ceilings:
    """Both roofs of this machine for `device` and `dtype`."""
    dev, dt = resolve_device(device), resolve_dtype(dtype)
    return Ceilings(
        peak_flops=measure_matmul_flops(dev, dt, repeats=repeats),
        bandwidth=measure_bandwidth(dev, dt, repeats=repeats),
        device=str(dev), dtype=str(dt).removeprefix("torch."),
    )


@torch.inference_mode()
def measure_prefill(model: torch.nn.Module, num_tokens: int = 512, batch: int = 1,
                    repeats: int = 3, warmup: int = 1) -> RooflinePoint:
    """Time a prefill of `num_tokens` random tokens into a fresh cache; logits for the last position only."""
    cfg, dev = model.config, model.device
    ids = torch.randint(0, cfg.vocab_size, (batch, num_tokens), device=dev)
    cache = KVCache(cfg, num_tokens, batch, dev, model.dtype)

    def step() -> None:
        cache.reset()
        model(ids, kv=cache, last_only=True)

    timing = measure(step, repeats=repeats, warmup=warmup, device=dev)
    cost = prefill_cost(cfg, num_tokens, batch, dtype=model.dtype, weight_bytes=weights_read(model),
                        logits_tokens=1)
    return RooflinePoint(f"prefill {num_tokens} tok", cost, timing)


@torch.inference_mode()
def measure_decode(model: torch.nn.Module, context_len: int = 512, batch: int = 1,
                   repeats: int = 10, warmup: int = 2) -> RooflinePoint:
    """Time one decode step (one new token per sequence) after `context_len` cached tokens.

    The cache's contents do not change the work, so it is not filled by a real prefill:
    its length is just set to `context_len` before each step.
    """
    cfg, dev = model.config, model.device
    ids = torch.randint(0, cfg.vocab_size, (batch, 1), device=dev)
    cache = KVCache(cfg, context_len + 1, batch, dev, model.dtype)

    def step() -> None:
        cache.seq_len = context_len
        model(ids, kv=cache)

    timing = measure(step, repeats=repeats, warmup=warmup, device=dev)
    cost = decode_cost(cfg, context_len, batch, dtype=model.dtype, weight_bytes=weights_read(model))
    return RooflinePoint(f"decode b={batch} ctx {context_len}", cost, timing)


def prefill_tokens_for_intensity(model: torch.nn.Module, intensity: float, start: int = 512) -> int | None:
    """The shortest prompt, doubling from `start` up to the model's context, whose prefill (as `measure_prefill`
    counts it) reaches `intensity` FLOP/byte; None if none does. Compute-bound on a machine means right of its
    ridge point with a margin: a fixed length can fall left of a GPU's ridge (an L4's, an H100 PCIe's)."""
    n, limit = start, model.config.max_position_embeddings
    while n <= limit:
        if prefill_cost(model.config, n, dtype=model.dtype, weight_bytes=weights_read(model),
                        logits_tokens=1).intensity >= intensity:
            return n
        n *= 2
    return None


def weights_read(model: torch.nn.Module) -> int:
    """Bytes of weights a step reads: all of them, less the input embedding table (only rows are gathered)
    unless the lm_head multiplies by that very table (tied, not packed into a copy of its own), and less
    the panels a layer of `course_lib.accel` holds beside its packed weight (a step reads one of the two), and
    less the INT4 layer a W4A8 layer keeps for long prefills (a decode step reads its packed blocks only)."""
    total = weight_bytes(model)
    emb = model.embed_tokens.weight
    head = model.lm_head
    if not (isinstance(head, torch.nn.Linear) and head.weight is emb):
        total -= emb.numel() * emb.element_size()
    for m in model.modules():
        panels = getattr(m, "panels", None)
        if isinstance(panels, torch.Tensor):
            total -= panels.numel() * panels.element_size()
        fallback = getattr(m, "fallback", None)
        if isinstance(getattr(m, "packed", None), torch.Tensor) and isinstance(fallback, torch.nn.Module):
            total -= sum(t.numel() * t.element_size() for name, t in fallback.named_buffers() if name != "bias")
    return total
