"""`plan`: from a model and a device to memory, TTFT, output speed and how many users fit.

Memory (every term computed by the course's own code, nothing re-derived here):

    weights      the engine's `Transformer` built on the meta device (no memory), its linear layers swapped
                 for `QuantLinear` when quantized, summed by `profiling.memory.weight_bytes`
    KV cache     `kv_bytes_per_token` x context x users
    activations  `activation_bytes` of one prefill chunk (the engine's `max_num_batched_tokens`)

Time: a step that reads B bytes and does F FLOPs (`profiling.flops.prefill_cost` / `decode_cost`) takes

    t = B / (bandwidth x bandwidth_fraction) + F / (peak FLOP/s x flops_fraction)

with one flops_fraction for a prefill and a smaller one for a decode step: a decode step's matmuls have one
row per user, too few to keep the vector units (or a GPU's tensor-core tiles) busy. The two terms are
added, not maxed as in the ideal roofline: on the CPU this was validated on, decode steps of 2 to 32 requests
came within 25% of the sum (its two terms about equal at 16 requests, where the max would be half the measured
time). Where one term dominates (a GPU's decode: bytes; a long prefill: FLOPs), sum and max differ little.
TTFT is one prefill of `prompt_len` tokens; TPOT one decode step with every user's cache `context_len`
tokens long (the slowest step: weights read once for the whole batch, plus each user's KV).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, NamedTuple

import torch
import torch.nn as nn

from ..config import ModelConfig
from ..dtypes import dtype_name, resolve_dtype
from ..engine.llm_engine import EngineConfig
from ..model import Transformer
from ..profiling.flops import StepCost, decode_cost, prefill_cost
from ..profiling.memory import GiB, activation_bytes, bytes_per_value, weight_bytes
from ..profiling.roofline import weights_read
from ..quant.linear import QuantLinear
from .devices import DeviceSpec, find_device
from .formats import WeightFormat, find_format
from .presets import load_config

# CPU fractions: the shares of this machine's measured ceilings (`DeviceSpec.measure()`) that the engine reached,
# from `validate.calibrate(LLM())`: torch 2.13, float32, the reference engine (`LLM()`'s default). They belong to the
# CPU's maker, because the engine's float32 `F.linear` is MKL's, and MKL runs different code on each. Every
# session's shares: benchmarks/RESULTS.md ("The planner's Intel shares", "The planner's AMD shares").
#  - Intel Xeons: the median of the sessions. A quiet host speeds the engine's small steps more than a copy or a big
#    matmul, so the shares spread between quiet and busy sessions; the median sits between them.
#  - AMD EPYCs: MKL's one-row product there is slow code, not memory, so a batch-1 step reads its weights at a small
#    share of a copy's bytes/s while prefills run near the matmul ceiling. 16-row steps differ most between hosts.
#    The bandwidth share is set between the hosts, the prefill share at the median, and the decode share where its
#    worst ratio over every host measured stays inside the test's 35% (the median missed the slowest hosts).
# A CPU of another maker gets the Intel shares. GPUs get `GPU_FRACTIONS`: what published engines reach on datasheet
# peaks, since the course engine was not measured on one; pass fractions measured on the card when you have them.
class Fractions(NamedTuple):
    """Shares of the device's ceilings the engine reaches: `plan`'s three fractions, and where they come from."""

    bandwidth: float  # a batch-1 decode step streams its weights at this share of the bytes/s ceiling
    prefill_flops: float  # a long prefill: matmuls hundreds of rows tall
    decode_flops: float  # a 16-request decode step: matmuls 16 rows tall
    source: str = ""


_CALIBRATED = "validate.calibrate on 2-core {} CPUs (float32, the reference engine), shares of DeviceSpec.measure()"
FRACTIONS = {"GenuineIntel": Fractions(0.56, 0.71, 0.32, _CALIBRATED.format("Intel Xeon")),
             "AuthenticAMD": Fractions(0.30, 0.89, 0.55, _CALIBRATED.format("AMD EPYC"))}
GPU_FRACTIONS = Fractions(
    0.69, 0.60, 0.25,
    "published, not the course engine: bandwidth from gpt-fast's README (https://github.com/pytorch-labs/gpt-fast, "
    "Benchmarks: Llama-3.1-8B bf16, batch 1, A100-80GB at 330 W: 93.89 tok/s = 1,410.76 GB/s of 2,039 = 0.69; "
    "Llama-2-7B 1,397.31 GB/s = 0.685); prefill 0.60, under the 76% MFU of large-batch prefill in Pope et al., "
    "Efficiently Scaling Transformer Inference (https://arxiv.org/abs/2211.05102; PaLM 540B, TPU v4), as one "
    "prompt of a smaller model keeps a GPU less busy (a judgment); decode 0.25: no published figure for 16-row "
    "matmuls found, an assumption")
BANDWIDTH_FRACTION, PREFILL_FLOPS_FRACTION, DECODE_FLOPS_FRACTION = FRACTIONS["GenuineIntel"][:3]  # CPU default


def default_fractions(device: DeviceSpec) -> Fractions:
    """`GPU_FRACTIONS` on a GPU; on a CPU the fractions measured on its maker's (`DeviceSpec.vendor`), else Intel's."""
    if device.kind == "gpu":
        return GPU_FRACTIONS
    return FRACTIONS.get(device.vendor or "", FRACTIONS["GenuineIntel"])


MEMORY_UTILIZATION = 0.9  # vLLM's default gpu_memory_utilization: 10% left for the CUDA context, allocator, ...
WEIGHT_BITS = {None: None, 8: "int8", 4: "int4"}  # weight_bits -> `QuantLinear` method (None: not quantized)


@dataclass
class DeploymentPlan:
    """Memory, speed and capacity of one model on one device, each figure with the formula it came from."""

    model: str
    device: str
    dtype: str
    weights: str  # "bfloat16", "q4_k_m, 4.89 bits a weight", "course INT4: QuantLinear, groups of 32, ..."
    context_len: int
    concurrency: int
    prompt_len: int
    weight_bytes: int
    kv_bytes_per_token: int
    activation_bytes: int
    memory_bytes: int  # the device's
    memory_utilization: float  # the share of it the engine may use
    max_concurrency: int  # users of context_len tokens that fit next to the weights
    ttft_s: float
    tpot_s: float
    formulas: dict[str, str] = field(default_factory=dict, repr=False)
    weight_format: str | None = None  # the `FORMATS` name, when a real format was asked for
    fractions: Fractions | None = None  # the shares of the ceilings the times used, with their source

    @property
    def kv_bytes(self) -> int:
        return self.kv_bytes_per_token * self.context_len * self.concurrency

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.activation_bytes

    @property
    def usable_bytes(self) -> int:
        return int(self.memory_bytes * self.memory_utilization)

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.usable_bytes

    @property
    def decode_tokens_per_s(self) -> float:
        """One user's output speed."""
        return 1 / self.tpot_s

    @property
    def total_tokens_per_s(self) -> float:
        """All users together."""
        return self.concurrency / self.tpot_s

    def rows(self) -> list[tuple[str, str, str]]:
        """(figure, value, formula) for each figure, in reading order."""
        gib = lambda b: f"{b / GiB:,.2f} GiB"  # noqa: E731
        values = {
            "weights": gib(self.weight_bytes), "KV cache per token": f"{self.kv_bytes_per_token / 1024:,.0f} KiB",
            "KV cache": gib(self.kv_bytes), "activations": gib(self.activation_bytes), "total": gib(self.total_bytes),
            "fits": ("yes" if self.fits else "NO") + f" (usable {gib(self.usable_bytes)} of {gib(self.memory_bytes)})",
            "max users": f"{self.max_concurrency:,}", "TTFT": _seconds(self.ttft_s), "TPOT": _seconds(self.tpot_s),
            "tokens/s per user": f"{self.decode_tokens_per_s:,.1f}",
            "tokens/s in total": f"{self.total_tokens_per_s:,.1f}",
        }
        return [(name, value, self.formulas.get(name, "")) for name, value in values.items()]

    def table(self) -> str:
        """The plan as a text table, with a title line saying what was asked."""
        rows = self.rows()
        w0, w1 = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
        title = (f"{self.model} ({self.weights}) on {self.device}: {_users(self.concurrency)} x "
                 f"{self.context_len:,} tokens of context, TTFT for a prompt of {self.prompt_len:,} tokens")
        lines = [title, "-" * len(title)] + [f"{a:<{w0}}  {b:>{w1}}   {c}" for a, b, c in rows]
        if self.fractions is not None:
            f = self.fractions
            lines.append(f"fractions: bandwidth {f.bandwidth:.2f}, prefill FLOP/s {f.prefill_flops:.2f}, "
                         f"decode FLOP/s {f.decode_flops:.2f}; source: {f.source}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _users(n: int) -> str:
    return f"{n:,} user" + ("s" if n != 1 else "")


def _count(n: int) -> str:
    return f"{n / 1e9:,.2f}B" if n >= 1e9 else f"{n / 1e6:,.1f}M"


def _seconds(s: float) -> str:
    return f"{s * 1e3:,.1f} ms" if s < 1 else f"{s:,.2f} s"


def _si(x: float, unit: str) -> str:
    """3.35e12, "B/s" -> "3.35 TB/s"."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:,.3g} {prefix}{unit}"
    return f"{x:,.3g} {unit}"


class WeightMemory(NamedTuple):
    """Bytes of a model's weights: held in memory, read by each step, and per weight of a linear layer."""

    total: int
    read: int  # all but an untied input embedding, of which a step gathers only a few rows
    per_linear_weight: float  # 2 for bfloat16; codes + scales for INT8/INT4


def file_bits(config, weight_format: str | WeightFormat) -> float:
    """Bits a parameter over a whole checkpoint of `config` (a name, dict or ModelConfig) in `weight_format`:
    embeddings, head, norms and wider layers included (Q4_K_M: 4.89 for Llama-3-8B, where its Q4_K blocks are 4.5)."""
    config = load_config(config)
    return 8 * weight_memory(config, weight_format=weight_format).total / config.num_parameters()


def weight_memory(config: ModelConfig, dtype: torch.dtype | str = torch.bfloat16, weight_bits: int | None = None,
                  group_size: int = 32, weight_format: str | WeightFormat | None = None) -> WeightMemory:
    """The weights' bytes, from the engine's own modules built on the meta device (no memory).

    Quantized (`weight_bits` 8 or 4): every linear layer but `lm_head` becomes a `QuantLinear`, as
    `quantize_model` does, in its portable layout (codes, float32 scales and mins);
    embeddings, norms and `lm_head` stay in `dtype`. A `weight_format` ("q4_k_m", "awq", ...) instead counts
    each parameter at the bits that format stores it in (`formats.FORMATS`), as a checkpoint file holds them.
    """
    if weight_bits not in WEIGHT_BITS:
        raise ValueError(f"weight_bits must be None (not quantized), 8 or 4, got {weight_bits!r}")
    if weight_format is not None and weight_bits is not None:
        raise ValueError("pass weight_format (a real format such as 'q4_k_m') or weight_bits (the course "
                         f"engine's own INT{weight_bits} layout), not both")
    method = WEIGHT_BITS[weight_bits]
    with torch.device("meta"):
        model = Transformer(config).to(resolve_dtype(dtype))
    if weight_format is not None:
        return _format_memory(model, find_format(weight_format))
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear) and name != "lm_head"]
    for name, linear in linears if method is not None else []:
        model.set_submodule(name, QuantLinear(linear.in_features, linear.out_features, method, group_size,
                                              linear.bias is not None, "meta", linear.weight.dtype))
    first = model.get_submodule(linears[0][0])  # q_proj of layer 0, float or quantized
    per_weight = weight_bytes(first) / (first.in_features * first.out_features)  # its bias (if any) is negligible
    return WeightMemory(weight_bytes(model), weights_read(model), per_weight)


def _format_memory(model: Transformer, fmt: WeightFormat) -> WeightMemory:
    """Bytes of `model`'s parameters stored in `fmt` (buffers such as RoPE's are not in a checkpoint)."""
    tied = model.lm_head.weight is model.embed_tokens.weight
    linear_bits = {f"{name}.weight": fmt.linear_bits(name) for name, m in model.named_modules()
                   if isinstance(m, nn.Linear) and name != "lm_head"}
    bits, linear_weights, linear_total = 0.0, 0, 0.0
    for name, p in model.named_parameters():  # a tied table once, under its embedding name
        if name == "embed_tokens.weight":
            b = fmt.head_bits if tied else fmt.embedding_bits
        elif name == "lm_head.weight":
            b = fmt.head_bits
        elif name in linear_bits:
            b = linear_bits[name]
            linear_weights, linear_total = linear_weights + p.numel(), linear_total + b * p.numel()
        else:
            b = fmt.other_bits
        bits += b * p.numel()
    total = int(bits / 8)
    untied_embedding = 0 if tied else int(model.embed_tokens.weight.numel() * fmt.embedding_bits / 8)
    return WeightMemory(total, total - untied_embedding, linear_total / linear_weights / 8)


def plan(config: ModelConfig | Mapping[str, Any] | str | Path, device: DeviceSpec | str,
         dtype: torch.dtype | str | None = None, weight_bits: int | None = None, context_len: int = 4096,
         concurrency: int = 1, prompt_len: int | None = None, group_size: int = 32,
         bandwidth_fraction: float | None = None, prefill_flops_fraction: float | None = None,
         decode_flops_fraction: float | None = None, memory_utilization: float = MEMORY_UTILIZATION,
         weight_format: str | WeightFormat | None = None) -> DeploymentPlan:
    """Plan serving `config` on `device` for `concurrency` users holding `context_len` tokens each.

    config: a `ModelConfig`, a `config.json` dict, a preset name or a path (`load_config`); device: a
    `DeviceSpec` or a name in `DEVICES` (`find_device`). dtype: of the activations, the KV cache and every
    weight that is not quantized (default: the device's, as the engine's policy picks: float16 on a T4).
    weight_format: a real checkpoint format by name ("q4_k_m", "q8_0", "awq", "gptq", "mlx-4bit", "fp8", "bf16";
    `FORMATS`), at the bits its layout stores each layer in. weight_bits: 8 or 4, the course engine's own
    `QuantLinear` layout instead (INT4 in groups of `group_size`, ~6 bits a weight with its scales); not both.
    prompt_len: the prompt TTFT is computed for (default: `context_len`, a prompt that fills the context).
    The three fractions default to `default_fractions(device)`.
    """
    cfg, dev = load_config(config), find_device(device)
    fmt = None if weight_format is None else find_format(weight_format)
    shares = default_fractions(dev)
    given = [n for n, v in (("bandwidth", bandwidth_fraction), ("prefill", prefill_flops_fraction),
                            ("decode", decode_flops_fraction)) if v is not None]
    bandwidth_fraction = shares.bandwidth if bandwidth_fraction is None else bandwidth_fraction
    prefill_flops_fraction = shares.prefill_flops if prefill_flops_fraction is None else prefill_flops_fraction
    decode_flops_fraction = shares.decode_flops if decode_flops_fraction is None else decode_flops_fraction
    prompt_len = context_len if prompt_len is None else prompt_len
    for name, value in (("context_len", context_len), ("concurrency", concurrency), ("prompt_len", prompt_len),
                        ("group_size", group_size)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if max(context_len, prompt_len) > cfg.max_position_embeddings:
        raise ValueError(f"{cfg.name or 'the model'} reads at most {cfg.max_position_embeddings:,} tokens "
                         f"(max_position_embeddings); context_len {context_len:,} or prompt_len {prompt_len:,} is more")
    for name, value in (("bandwidth_fraction", bandwidth_fraction), ("memory_utilization", memory_utilization),
                        ("prefill_flops_fraction", prefill_flops_fraction),
                        ("decode_flops_fraction", decode_flops_fraction)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")
    dt = dtype_name(dtype or dev.default_dtype)
    peak = dev.peak_flops(dt)

    weights, read, per_weight = weight_memory(cfg, dt, weight_bits, group_size, fmt)
    per_token = cfg.kv_bytes_per_token(dt)
    chunk = min(prompt_len, EngineConfig.max_num_batched_tokens)  # the engine prefills in steps of this many
    acts = activation_bytes(cfg, chunk, dtype=dt, logits_tokens=1)
    usable = int(dev.memory_bytes * memory_utilization)  # also DeploymentPlan.usable_bytes
    max_users = max(0, (usable - weights - acts) // (per_token * context_len))

    def seconds(cost: StepCost, flops_fraction: float) -> tuple[float, str]:
        t = cost.bytes / (dev.bandwidth * bandwidth_fraction) + cost.flops / (peak * flops_fraction)
        return t, (f"{_si(cost.bytes, 'B')} / ({_si(dev.bandwidth, 'B/s')} x {bandwidth_fraction:.2f}) + "
                   f"{_si(cost.flops, 'FLOP')} / ({_si(peak, 'FLOP/s')} x {flops_fraction:.2f})")

    ttft, ttft_formula = seconds(prefill_cost(cfg, prompt_len, dtype=dt, weight_bytes=read, logits_tokens=1),
                                 prefill_flops_fraction)
    tpot, tpot_formula = seconds(decode_cost(cfg, context_len, batch=concurrency, dtype=dt, weight_bytes=read),
                                 decode_flops_fraction)

    if fmt is not None:
        kind = f"{fmt.name}, {8 * weights / cfg.num_parameters():.2f} bits a weight"
        weights_formula = (f"linear layers {8 * per_weight:.2f} bits a weight, embeddings {fmt.embedding_bits:g}, "
                           f"lm_head {fmt.head_bits:g} ({fmt.name}; runs on: {fmt.needs})")
    elif weight_bits is not None:
        kind = (f"course INT{weight_bits}: QuantLinear" + f", groups of {group_size}" * (weight_bits == 4)
                + f", {8 * per_weight:.1f} bits a weight incl. scales")
        weights_formula = (f"linear layers {per_weight:.3f} bytes a weight (the course engine's QuantLinear: "
                           f"int{weight_bits} codes + scales), embeddings and lm_head {bytes_per_value(dt)} ({dt})")
    else:
        kind = dt
        weights_formula = f"{_count(cfg.num_parameters())} parameters x {bytes_per_value(dt)} bytes ({dt})"
    used = Fractions(bandwidth_fraction, prefill_flops_fraction, decode_flops_fraction,
                     f"given ({', '.join(given)}); the rest: {shares.source}" if given else shares.source)
    formulas = {
        "weights": weights_formula,
        "KV cache per token": f"2 (K, V) x {cfg.num_layers} layers x {cfg.num_kv_heads} KV heads x {cfg.head_dim} "
                              f"x {bytes_per_value(dt)} bytes ({dt})",
        "KV cache": f"{_users(concurrency)} x {context_len:,} tokens x KV per token",
        "activations": f"peak of one {chunk:,}-token prefill step (the engine's max_num_batched_tokens)",
        "total": "weights + KV cache + activations",
        "fits": f"total <= {memory_utilization:.0%} of memory (the rest: "
                + ("CUDA context, allocator, fragments)" if dev.kind == "gpu" else "the OS and other programs)"),
        "max users": f"(usable - weights - activations) / ({context_len:,} tokens x KV per token)",
        "TTFT": f"{prompt_len:,}-token prefill: {ttft_formula}",
        "TPOT": f"decode step, batch {concurrency:,}, KV of {context_len:,} tokens each: {tpot_formula}",
        "tokens/s per user": "1 / TPOT",
        "tokens/s in total": f"{_users(concurrency)} / TPOT",
    }
    return DeploymentPlan(model=cfg.name or "model", device=dev.name, dtype=dt, weights=kind, context_len=context_len,
                          concurrency=concurrency, prompt_len=prompt_len, weight_bytes=weights,
                          kv_bytes_per_token=per_token, activation_bytes=acts, memory_bytes=dev.memory_bytes,
                          memory_utilization=memory_utilization, max_concurrency=int(max_users), ttft_s=ttft,
                          tpot_s=tpot, formulas=formulas, weight_format=None if fmt is None else fmt.name,
                          fractions=used)
