"""`EngineConfig`: every option of `LLM(...)` but the model, device and dtype, checked once, in one object
(vLLM's `EngineArgs` -> config). `LLM`, `LLMEngine`, the server and the tensor-parallel workers take it whole.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, fields

from ..checks import Integral, Real, invalid, number
from ..quant.linear import METHODS as QUANTIZATION_METHODS
from .speculative import SpeculativeConfig


@dataclass
class EngineConfig:
    """The engine's options. Bad values fail here, each naming its field, before any weight is touched."""

    quantization: str | None = None  # "int8" | "int4": every linear layer a `QuantLinear`
    group_size: int = 32  # INT4 inputs per group: the default model's GGUF blocks hold 32
    accel: object = False  # True, False or a `course_lib.accel.Plan`
    compile_decode: bool = False  # part of accel's plan: the decode step through torch.compile
    enforce_eager: bool = False  # part of accel's plan: no CUDA graphs (vLLM's name)
    speculative_config: dict | SpeculativeConfig | None = None  # vLLM's keys; checked into a SpeculativeConfig
    batch_invariant: bool = False  # the same logits whatever else is in the batch (reference engine only)
    tensor_parallel_size: int = 1  # ranks, one process each (reference engine only)
    block_size: int = 16
    kv_cache_memory: int | float | None = None  # bytes, or a fraction of free GPU memory; None: see kv_budget
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024
    enable_prefix_caching: bool = True
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        at_least_1 = lambda v: v >= 1  # noqa: E731
        for name in ("group_size", "tensor_parallel_size", "block_size", "max_num_seqs", "max_num_batched_tokens"):
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
        for name in ("enable_prefix_caching", "compile_decode", "enforce_eager", "batch_invariant"):
            if not isinstance(getattr(self, name), bool):
                raise invalid(TypeError, f"EngineConfig.{name}", "True or False", getattr(self, name))
        if self.quantization not in (None, *QUANTIZATION_METHODS):
            raise ValueError(f"quantization must be None or one of {QUANTIZATION_METHODS}, got {self.quantization!r}")
        self.speculative_config = SpeculativeConfig.from_dict(self.speculative_config)
        self._check_accel()

    def _check_accel(self) -> None:
        """accel is True, False or a Plan; its options need it, and two ways of running need the reference."""
        from ..accel.plan import Plan  # a dataclass; importing it builds nothing

        if not isinstance(self.accel, (bool, Plan)):
            raise TypeError(f"accel must be True, False or a course_lib.accel.Plan, got {self.accel!r}")
        if self.compile_decode and self.accel is False:
            raise ValueError("compile_decode=True is part of accel's plan: pass accel=True too (LLM() is the eager "
                             "reference engine)")
        if self.batch_invariant and self.accel is not False:
            raise ValueError("batch_invariant=True runs the reference engine: leave accel off")
        if self.tensor_parallel_size > 1 and self.accel is not False:
            raise ValueError("tensor_parallel_size > 1 runs the reference engine: leave accel off")
        if self.tensor_parallel_size > 1 and self.batch_invariant:
            raise ValueError("batch_invariant=True runs one process: leave tensor_parallel_size at 1")

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
