"""Checkers for the chapters' exercises: `check_<name>(fn)` tests a learner's function against the engine.

Each checker prints one line per case, "✓ ..." or "✗ ... (what is wrong)", or "not attempted" while the
function still raises NotImplementedError, and returns True only when every case passes. The chapters
call them after each exercise; `notebooks/solutions/` call them on the solutions and assert True.
One module per chapter; the names are re-exported here:

    from course_lib.exercises import check_decode_bytes
"""
from .check import Case, run_checks

__all__ = ["Case", "run_checks"]


def _export(module) -> None:
    names = [n for n in vars(module) if n.startswith("check_")]
    globals().update({n: getattr(module, n) for n in names})
    __all__.extend(names)


from . import (attention, batching, choosing, embeddings, kv_cache, positions, prefill_decode,  # noqa: E402
               profiling, quantization, sampling, scaling, serving, speculative, tokenization, welcome)

for _module in (welcome, tokenization, embeddings, positions, attention, sampling, prefill_decode, kv_cache, batching,
                quantization, profiling, serving, choosing, speculative, scaling):
    _export(_module)
