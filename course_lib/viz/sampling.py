"""Plots and the slider widget of the sampling chapter (notebook 04).

The plain functions do the work and are tested; `sampling_widget` only wires sliders to `plot_filter`.

    logits = next_token_logits(model, tok, "Once upon a time, there was a")   # [vocab], on the model's device
    ids, probs = filtered_distribution(logits, temperature=0.8, top_p=0.9)    # what the engine samples from
    plot_filter(logits, tok, top_k=5)                                         # top-20 before / after
    print(compare_filtered(top_k_filter(logits, 5), TopKLogitsWarper(5)(None, logits[None])[0]))  # engine vs HF
    plot_nucleus({"broad": logits, "peaked": other}, top_p=0.9)              # how many tokens top-p keeps

Matplotlib's default font has no CJK glyphs, so token labels are ASCII: `' Paris'`, `'\\u5728'` (在),
or the raw bytes of a token that is only part of a UTF-8 character.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch

from ..sampling import SAMPLING_EPS, SamplingParams, processed_logits, top_p_filter

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ..model import Transformer
    from ..tokenizer import Tokenizer


@torch.inference_mode()
def next_token_logits(model: Transformer, tokenizer: Tokenizer, prompt: str | list[int]) -> torch.Tensor:
    """Logits [vocab] (float32, on the model's device) of the token after `prompt` (text or ids): one full forward."""
    ids = tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    x = torch.tensor([ids], device=model.device)  # [1, seq]
    return model(x, last_only=True)[0, -1].float()  # [vocab], on the model's device, float32 as the Sampler sees it


def filtered_distribution(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                          min_p: float = 0.0, repetition_penalty: float = 1.0,
                          seen: Sequence[int] | torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The distribution the engine's Sampler draws from, after its filters.

    logits [vocab]; `seen`: token ids already in the prompt/output (for the repetition penalty).
    Returns (ids, probs): the tokens the filters keep, most likely first (ties by id), and their
    probabilities, which sum to 1. Temperature 0 (below `SAMPLING_EPS`) is greedy: one token with probability 1.
    """
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                            repetition_penalty=repetition_penalty)  # checks the ranges
    if seen is not None:
        seen = torch.as_tensor(sorted(set(torch.as_tensor(seen).tolist())), dtype=torch.long, device=logits.device)
    out = processed_logits(logits, params, seen)  # [vocab], -inf where a filter dropped the token
    if params.greedy:
        return out.argmax().reshape(1), torch.ones(1, device=out.device)
    probs = out.softmax(-1)  # [vocab]
    kept = torch.isfinite(out).nonzero().flatten()  # ids in ascending order
    order = torch.argsort(probs[kept], descending=True, stable=True)
    return kept[order], probs[kept[order]]


@dataclass
class FilterComparison:
    """Two filtered logits [vocab] side by side (-inf = dropped): which tokens each keeps, how far the kept differ."""

    both: int  # tokens both keep
    only_first: int  # kept by the first only
    only_second: int  # kept by the second only
    max_abs_diff: float  # over the tokens both keep

    @property
    def same_tokens(self) -> bool:
        return self.only_first == 0 and self.only_second == 0

    def __str__(self) -> str:
        return (f"{self.both} tokens kept by both, {self.only_first + self.only_second} by only one, "
                f"max |difference| {self.max_abs_diff:.1e}")


def compare_filtered(first: torch.Tensor, second: torch.Tensor) -> FilterComparison:
    """Compare two filtered logits of the same shape: kept sets and the largest difference where both keep."""
    a, b = torch.isfinite(first), torch.isfinite(second)
    both = a & b
    diff = (first[both].double() - second[both].double()).abs().max().item() if both.any() else 0.0
    return FilterComparison(int(both.sum()), int((a & ~b).sum()), int((b & ~a).sum()), diff)


def token_label(tokenizer: Tokenizer, token_id: int) -> str:
    """A short ASCII label for a plot: the token's text as repr, escaped if not ASCII, bytes if partial UTF-8."""
    raw = tokenizer.token_bytes(token_id)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:  # a piece of a multi-byte character (many CJK tokens are)
        return repr(raw)
    return ascii(text)


def top_tokens(tokenizer: Tokenizer, ids: torch.Tensor, probs: torch.Tensor,
               n: int = 10) -> list[tuple[int, str, float]]:
    """The first n rows of (token id, token text, probability rounded to 4 digits), for printing."""
    return [(int(i), tokenizer.decode([int(i)]), round(float(p), 4)) for i, p in zip(ids[:n], probs[:n])]


def _filter_name(temperature: float, top_k: int, top_p: float, min_p: float, repetition_penalty: float) -> str:
    if temperature < SAMPLING_EPS:
        return "greedy (temperature 0)"
    parts = [f"T={temperature:g}"]
    parts += [f"top_k={top_k}"] if top_k > 0 else []
    parts += [f"top_p={top_p:g}"] if top_p < 1 else []
    parts += [f"min_p={min_p:g}"] if min_p > 0 else []
    parts += [f"repetition_penalty={repetition_penalty:g}"] if repetition_penalty != 1 else []
    return ", ".join(parts)


def plot_filter(logits: torch.Tensor, tokenizer: Tokenizer, temperature: float = 1.0, top_k: int = 0,
                top_p: float = 1.0, min_p: float = 0.0, repetition_penalty: float = 1.0,
                seen: Sequence[int] | torch.Tensor | None = None, n: int = 20, title: str | None = None) -> Figure:
    """Bars of the n most likely next tokens before (plain softmax) and after the given filters.

    A token a filter removed has no coloured bar and is marked with an x under its grey one.
    """
    import matplotlib.pyplot as plt

    before_ids, before_p = filtered_distribution(logits)
    after_ids, after_p = filtered_distribution(logits, temperature, top_k, top_p, min_p, repetition_penalty, seen)
    after = dict(zip(after_ids.tolist(), after_p.tolist()))
    ids = before_ids[:n].tolist()
    xs = list(range(len(ids)))
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.bar([x - 0.2 for x in xs], [100 * p for p in before_p[:n].tolist()], width=0.4, color="lightgrey",
           label="before: softmax(logits), T=1")
    name = _filter_name(temperature, top_k, top_p, min_p, repetition_penalty)
    ax.bar([x + 0.2 for x in xs], [100 * after.get(i, 0.0) for i in ids], width=0.4, color="tab:blue",
           label=f"after: {name}")
    dropped = [x for x, i in zip(xs, ids) if i not in after]
    if dropped:
        ax.scatter(dropped, [0] * len(dropped), marker="x", color="tab:red", zorder=3, label="removed by the filter")
    ax.set_xticks(xs)
    ax.set_xticklabels([token_label(tokenizer, i) for i in ids], rotation=60, ha="right", fontsize=8)
    ax.set_xlabel(f"next token (the {len(ids)} most likely before filtering)")
    ax.set_ylabel("probability (%)")
    ax.set_title(title or f"Next-token distribution: {name}; {len(after)} of {logits.shape[-1]} tokens kept")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_temperatures(logits: torch.Tensor, tokenizer: Tokenizer, temperatures: Sequence[float] = (0.5, 1.0, 1.5),
                      n: int = 20) -> Figure:
    """One line per temperature over the n most likely tokens: low T sharpens, high T flattens."""
    import matplotlib.pyplot as plt

    ids = filtered_distribution(logits)[0][:n]
    fig, ax = plt.subplots(figsize=(10, 4))
    for t in temperatures:
        if t > 0:
            probs = (logits.float() / t).softmax(-1)  # [vocab]
        else:  # the limit T -> 0 is greedy: all mass on the argmax
            probs = torch.nn.functional.one_hot(logits.argmax(), logits.shape[-1]).float()
        ax.plot(range(len(ids)), (100 * probs[ids]).tolist(), marker="o", label=f"T = {t:g}")
    ax.set_xticks(range(len(ids)))
    ax.set_xticklabels([token_label(tokenizer, int(i)) for i in ids], rotation=60, ha="right", fontsize=8)
    ax.set_xlabel(f"next token (the {len(ids)} most likely at T = 1)")
    ax.set_ylabel("probability (%)")
    ax.set_title("Temperature: softmax(logits / T)")
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def plot_nucleus(curves: dict[str, torch.Tensor], top_p: float) -> Figure:
    """Cumulative probability against rank (most likely first) for each logits [vocab] in `curves`.

    A dashed line marks `top_p`; a dot marks how many tokens the engine's `top_p_filter` keeps,
    where each curve first reaches it: few for a peaked distribution, many for a broad one.
    """
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.8))
    for name, logits in curves.items():
        probs = logits.double().softmax(-1).sort(descending=True).values
        cumulative = probs.cumsum(-1).cpu()
        kept = int(torch.isfinite(top_p_filter(logits.double(), top_p)).sum())
        line, = ax.plot(range(1, len(cumulative) + 1), cumulative.tolist(), label=f"{name}: keeps {kept:,}")
        ax.scatter([kept], [cumulative[kept - 1].item()], color=line.get_color(), zorder=3)
    ax.axhline(top_p, color="grey", linestyle="--", label=f"top_p = {top_p:g}")
    ax.set_xscale("log")
    ax.set_xlabel("rank of the token (1 = most likely), log scale")
    ax.set_ylabel("cumulative probability")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"Top-p keeps the most likely tokens until their total reaches {top_p:g}")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def sample_counts(probs: torch.Tensor, num_samples: int, seed: int = 0) -> torch.Tensor:
    """How often each entry of probs [m] wins in num_samples draws by the engine's sampler (one seeded generator).

    Pass a short distribution (e.g. `filtered_distribution(logits, top_k=10)[1]`): the draws are
    done at once on a [num_samples, m] tensor.
    """
    from ..sampling import sample_from_probs

    gen = torch.Generator(device=probs.device).manual_seed(seed)
    draws = sample_from_probs(probs.float().expand(num_samples, -1).contiguous(), gen)  # [num_samples]
    return torch.bincount(draws, minlength=probs.shape[-1]).cpu()  # [m]


def plot_sample_counts(ids: torch.Tensor, probs: torch.Tensor, counts: torch.Tensor, tokenizer: Tokenizer) -> Figure:
    """Probability against observed frequency for tokens `ids` (probs and counts aligned with ids)."""
    import matplotlib.pyplot as plt

    probs, freq = probs.float().cpu(), counts.float().cpu() / counts.sum().item()
    xs = range(len(ids))
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.bar([x - 0.2 for x in xs], 100 * probs, width=0.4, color="lightgrey", label="probability")
    ax.bar([x + 0.2 for x in xs], 100 * freq, width=0.4, color="tab:green",
           label=f"observed frequency in {int(counts.sum())} draws")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([token_label(tokenizer, int(i)) for i in ids], rotation=60, ha="right", fontsize=8)
    ax.set_xlabel("next token")
    ax.set_ylabel("share of draws (%)")
    ax.set_title("Sampling draws each token about as often as its probability says")
    ax.legend()
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_per_layer(values: Sequence[float], ylabel: str, title: str) -> Figure:
    """A line over the layers of the model: values[i] is measured after block i (0 = the embedding)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot(range(len(values)), list(values), marker="o")
    ax.set_xlabel("layer (0 = embedding output, i = after block i)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def plot_parameter_shares(parts: dict[str, int], title: str) -> Figure:
    """One horizontal bar split into `parts` (parameter name -> count), each labelled with its share.

    Names are shortened to their `*_proj` part ("self_attn.q_proj.weight" -> "q_proj"). Attention's q/k/v/o_proj
    are drawn in blues, the MLP's gate/up/down_proj in oranges, anything else in grey.
    """
    from itertools import cycle

    import matplotlib.pyplot as plt

    total = sum(parts.values())
    blues, oranges = cycle(plt.cm.Blues([0.8, 0.65, 0.5, 0.35])), cycle(plt.cm.Oranges([0.8, 0.6, 0.4]))
    fig, ax = plt.subplots(figsize=(11, 2.4))
    left = 0.0
    for name, count in parts.items():
        share = count / total
        short = next((part for part in name.split(".") if part.endswith("proj")), name)
        color = (next(blues) if short in ("q_proj", "k_proj", "v_proj", "o_proj") else
                 next(oranges) if short in ("gate_proj", "up_proj", "down_proj") else "lightgrey")
        ax.barh(0, 100 * share, left=100 * left, color=color, edgecolor="white", label=f"{short} ({share:.1%})")
        if share > 0.04:
            ax.text(100 * (left + share / 2), 0, f"{short}\n{share:.0%}", ha="center", va="center", fontsize=8)
        left += share
    ax.set_xlim(0, 100)
    ax.set_yticks([])
    ax.set_xlabel(f"share of the {total:,} parameters (%)")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    return fig


def sampling_widget(logits: torch.Tensor, tokenizer: Tokenizer, n: int = 20):
    """Sliders for temperature, top-k, top-p and min-p that redraw `plot_filter` (needs ipywidgets)."""
    import ipywidgets as w
    import matplotlib.pyplot as plt

    def draw(temperature, top_k, top_p, min_p):
        plot_filter(logits, tokenizer, temperature, top_k, top_p, min_p, n=n)
        plt.show()

    style = {"description_width": "90px"}
    return w.interactive(
        draw,
        temperature=w.FloatSlider(value=1.0, min=0.0, max=2.0, step=0.05, description="temperature", style=style),
        top_k=w.IntSlider(value=0, min=0, max=50, description="top_k (0=off)", style=style),
        top_p=w.FloatSlider(value=1.0, min=0.05, max=1.0, step=0.05, description="top_p", style=style),
        min_p=w.FloatSlider(value=0.0, min=0.0, max=0.5, step=0.01, description="min_p", style=style),
    )
