"""How many devices a model needs when tensor parallelism splits it (chapter 13).

    split = split_plan("llama-3-70b", "h100", tp=2, weight_format="bf16", context_len=8192, concurrency=16)
    split.fits, split.per_device_bytes
    devices_needed("llama-3.1-405b", "h200", weight_format="fp8")   # the smallest tp that fits, or None

With tensor parallelism every device holds 1/tp of each weight matrix and of the KV heads (a whole KV head per
device once tp exceeds the model's KV heads: they are copied, not split) and runs the activations of the same
tokens. The figures come from `plan` for one device, so weights, formats and KV follow the planner's formulas.
"""
from __future__ import annotations

from dataclasses import dataclass

from .estimate import DeploymentPlan, plan
from .presets import load_config


@dataclass(frozen=True)
class SplitPlan:
    """One model over `tp` devices of one kind: what each device holds, and whether it fits."""

    model: str
    device: str
    tp: int
    weight_bytes: int  # per device
    kv_bytes: int  # per device, for every user's context
    activation_bytes: int  # per device: every rank runs the same tokens
    usable_bytes: int  # per device
    whole: DeploymentPlan  # the one-device plan the shares come from

    @property
    def per_device_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.activation_bytes

    @property
    def fits(self) -> bool:
        return self.per_device_bytes <= self.usable_bytes

    @property
    def max_concurrency(self) -> int:
        """Users of the plan's context length whose KV share fits on each device next to its weights and activations."""
        per_user = self.kv_bytes / self.whole.concurrency
        return max(int((self.usable_bytes - self.weight_bytes - self.activation_bytes) // per_user), 0)

    @property
    def tpot_s(self) -> float:
        """The one-device plan's decode step divided over tp devices (each reads 1/tp of the weights and KV and does
        1/tp of the FLOPs); the all-reduces come on top (`course_lib.parallel.all_reduce_seconds`)."""
        return self.whole.tpot_s / self.tp


def valid_tp_sizes(config, limit: int = 64) -> list[int]:
    """Device counts that split the query heads evenly (powers of two, as engines use them), up to `limit`."""
    cfg = load_config(config)
    return [tp for tp in (1, 2, 4, 8, 16, 32, 64) if tp <= limit and cfg.num_heads % tp == 0]


def split_plan(config, device, tp: int, **plan_kwargs) -> SplitPlan:
    """`plan(config, device, **plan_kwargs)` with weights and KV cache split over `tp` devices."""
    cfg = load_config(config)
    if tp < 1 or cfg.num_heads % tp:
        raise ValueError(f"tp={tp} does not split {cfg.name or 'the model'}'s {cfg.num_heads} query heads; "
                         f"use one of {valid_tp_sizes(cfg)}")
    whole = plan(cfg, device, **plan_kwargs)
    kv_share = max(cfg.num_kv_heads // tp, 1) / cfg.num_kv_heads  # a KV head is copied, not split, past tp = kv
    return SplitPlan(whole.model, whole.device, tp, -(-whole.weight_bytes // tp), int(whole.kv_bytes * kv_share),
                     whole.activation_bytes, whole.usable_bytes, whole)


def devices_needed(config, device, max_devices: int = 64, **plan_kwargs) -> SplitPlan | None:
    """The smallest valid tp (`valid_tp_sizes`) whose split fits, or None when even `max_devices` do not."""
    for tp in valid_tp_sizes(config, max_devices):
        split = split_plan(config, device, tp, **plan_kwargs)
        if split.fits:
            return split
    return None
