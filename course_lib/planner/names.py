"""Forgiving lookup of a model or device by name: "llama-3-70b", "h100", "4090" all find theirs."""
from __future__ import annotations

import re
from typing import Iterable


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", name.lower())  # "H100 SXM" -> "h100sxm", "Llama-3-70B" -> "llama370b"


def lookup(name: str, choices: Iterable[str], kind: str, also: str = "") -> str:
    """The one choice that `name` names: equal ignoring case, spaces and dashes, else the only one it
    starts, else the only one containing it. A ValueError lists the choices (or the ambiguous ones)."""
    choices = list(choices)
    key = _key(name)
    for test in (lambda c: _key(c) == key, lambda c: _key(c).startswith(key), lambda c: key in _key(c)):
        found = [c for c in choices if test(c)] if key else []
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise ValueError(f"{kind} {name!r} is ambiguous: it could be {', '.join(found)}")
    extra = f", {also}" if also else ""
    raise ValueError(f"unknown {kind} {name!r}; choose one of: {', '.join(choices)}{extra}")
