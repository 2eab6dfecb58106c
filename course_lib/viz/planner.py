"""The deployment planner's picture and widget (chapter 09): where the memory goes, and the plan's table.

    plot_memory_plan(plan)                                     # one bar: weights | KV cache | activations, red line
    plot_memory_plan({"bf16": p16, "int8": p8, "int4": p4})    # one bar per plan, same device
    result, fig = planner_view("Llama-3-70B", "int4", "H100 SXM", context=8192, users=16)
    planner_widget()                                           # dropdowns and boxes -> the table and the chart

`planner_view` does the work and is tested; `planner_widget` only wires ipywidgets to it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from ..planner import DEVICES, FORMATS, PRESETS, THIS_MACHINE, DeploymentPlan, DeviceSpec, find_device, plan
from ..profiling.memory import GiB
from .kv_cache import plot_stacked_bars

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# the widget's choices -> plan's weight arguments: the course engine's own INT8/INT4, then real formats
QUANTIZATION: dict[str, dict] = {"none": {}, "int8": {"weight_bits": 8}, "int4": {"weight_bits": 4},
                                 **{name: {"weight_format": name} for name in FORMATS}}


def plot_memory_plan(plans: DeploymentPlan | Mapping[str, DeploymentPlan], title: str | None = None) -> Figure:
    """One horizontal bar per plan, split into weights, KV cache and activations (GiB), with a red line where
    the device's memory ends and a dashed one where the usable part ends (`plot_stacked_bars`). All plans must
    share a device; each bar's label says whether it fits."""
    one = isinstance(plans, DeploymentPlan)
    plans = {f"{plans.weights}, {plans.concurrency} x {plans.context_len:,}": plans} if one else dict(plans)
    first = next(iter(plans.values()))
    if any(p.memory_bytes != first.memory_bytes for p in plans.values()):
        raise ValueError("plot_memory_plan draws one device's memory line: give it plans for the same device")
    rows = {f"{name}: " + ("fits" if p.fits else f"{p.max_concurrency} of {p.concurrency} users fit"):
            {"weights": p.weight_bytes / GiB, "KV cache": p.kv_bytes / GiB, "activations": p.activation_bytes / GiB}
            for name, p in plans.items()}
    memory, usable = first.memory_bytes / GiB, first.usable_bytes / GiB
    lines = {f"{first.device}: {memory:,.0f} GiB": memory, f"usable ({usable / memory:.0%})": usable}
    return plot_stacked_bars(rows, "GiB", title or f"Where the memory goes: {first.model} on {first.device}",
                             lines=lines, line_colour="#d62828")


def planner_view(model: str, quantization: str, device: str | DeviceSpec, context: int, users: int,
                 measured: dict[str, DeviceSpec] | None = None) -> tuple[DeploymentPlan, Figure]:
    """The plan for the widget's choices and its memory chart. `device` THIS_MACHINE is measured once and kept
    in `measured` (pass the same dict each call); the dtype is the device's own (float32 on a CPU), plan's default."""
    if isinstance(device, str) and device == THIS_MACHINE:
        measured = {} if measured is None else measured
        if THIS_MACHINE not in measured:
            measured[THIS_MACHINE] = DeviceSpec.measure()
        device = measured[THIS_MACHINE]
    spec = find_device(device)
    if quantization not in QUANTIZATION:
        raise ValueError(f"quantization must be one of {list(QUANTIZATION)}, got {quantization!r}")
    result = plan(model, spec, **QUANTIZATION[quantization],
                  context_len=context, concurrency=users)
    title = (f"{result.model} ({result.weights}) on {result.device}: {users:,} user{'s' if users != 1 else ''} "
             f"x {context:,} tokens")
    return result, plot_memory_plan({f"{users} x {context:,} tokens": result}, title=title)


def planner_widget(model: str = "Llama-3-8B", device: str = "H100 SXM"):
    """Model, quantization, device, context and users -> the plan's table and where the memory goes
    (needs ipywidgets). "this machine" measures this machine's ceilings the first time it is chosen."""
    import ipywidgets as w
    import matplotlib.pyplot as plt

    measured: dict[str, DeviceSpec] = {}

    def draw(model, quantization, device, context, users):
        try:
            result, _ = planner_view(model, quantization, device, context, users, measured)
        except ValueError as e:  # e.g. a context longer than the model's window, a dtype the device lacks
            print(f"cannot plan this: {e}")
            return
        print(result.table())
        plt.show()

    style = {"description_width": "80px"}
    return w.interactive(
        draw,
        model=w.Dropdown(options=list(PRESETS), value=model, description="model", style=style),
        quantization=w.Dropdown(options=list(QUANTIZATION), value="none", description="weights", style=style),
        device=w.Dropdown(options=[*DEVICES, THIS_MACHINE], value=device, description="device", style=style),
        context=w.Dropdown(options=[1024, 2048, 4096, 8192, 16384, 32768], value=4096, description="context",
                           style=style),
        users=w.IntSlider(value=1, min=1, max=256, description="users", style=style),
    )
