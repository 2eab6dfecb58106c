"""`EngineConfig`: the engine's options, checked once."""
from __future__ import annotations

import difflib
from dataclasses import dataclass, fields

from ..checks import Integral, Real, invalid, number


@dataclass
class EngineConfig:
    """Serving knobs: KV memory, block size, per-step limits, prefix caching."""

    block_size: int = 16
    kv_cache_memory: int | float | None = None  # bytes, or a fraction of free GPU memory; None: see kv_budget
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024
    enable_prefix_caching: bool = True
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        at_least_1 = lambda v: v >= 1  # noqa: E731
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            setattr(self, name, number(f"EngineConfig.{name}", getattr(self, name), Integral, at_least_1,
                                       "an integer >= 1"))
        if self.max_model_len is not None:
            self.max_model_len = number("EngineConfig.max_model_len", self.max_model_len, Integral, at_least_1,
                                        "None or an integer >= 1")
        budget = self.kv_cache_memory
        if budget is not None:
            kind = Integral if isinstance(budget, Integral) else Real
            self.kv_cache_memory = number("EngineConfig.kv_cache_memory", budget, kind,
                                          at_least_1 if kind is Integral else lambda v: 0 < v <= 1,
                                          "None, bytes (an integer >= 1) or a fraction of free GPU memory in (0, 1]")
        if not isinstance(self.enable_prefix_caching, bool):
            raise invalid(TypeError, "EngineConfig.enable_prefix_caching", "True or False", self.enable_prefix_caching)

    @classmethod
    def from_options(cls, options: dict) -> "EngineConfig":
        """`EngineConfig(**options)`, but a misspelled option name is named, with the closest real one."""
        names = [f.name for f in fields(cls)]
        for key in options:
            if key not in names:
                close = difflib.get_close_matches(key, names, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise TypeError(f"unknown engine option {key!r}{hint} (the options are: {', '.join(names)})")
        return cls(**options)
