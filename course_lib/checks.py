"""Checks at the door: a public parameter of the wrong type is a TypeError, one out of range a ValueError,
and both messages name the parameter, the value and what is allowed, before anything reaches torch.
The error's `param` attribute holds the field's bare name, so a server can report it without parsing the message."""
from __future__ import annotations

from numbers import Integral, Real
from typing import Callable


def with_param(e: Exception, name: str) -> Exception:
    """`e` with `e.param` set to the field `name` names, class prefix dropped: "SamplingParams.top_k" -> "top_k"."""
    e.param = name.rpartition(".")[2]
    return e


def invalid(error: type[Exception], name: str, allowed: str, value) -> Exception:
    """The error to raise for a bad `name` (e.g. "SamplingParams.top_k"); its `param` is "top_k"."""
    return with_param(error(f"{name} must be {allowed}, got {value!r}"), name)


def number(name: str, value, kind: type, ok: Callable[[float], bool], allowed: str) -> int | float:
    """`value` as an int (kind Integral) or a float (kind Real); numpy scalars are accepted.

    TypeError if it is not of that kind (a bool never is), ValueError if `ok(value)` is false; see `invalid`.
    """
    if isinstance(value, bool) or not isinstance(value, kind):
        raise invalid(TypeError, name, allowed, value)
    result = int(value) if kind is Integral else float(value)
    if not ok(result):
        raise invalid(ValueError, name, allowed, value)
    return result


__all__ = ["Integral", "Real", "invalid", "number", "with_param"]
