"""Byte-level BPE written from scratch, for teaching (tested against the real tokenizer)."""
from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from each of the 256 byte values to a printable character.

    Printable Latin-1 bytes map to themselves; the rest (control bytes, space) are shifted to
    U+0100 and up, which is why a leading space shows up as 'Ġ' (U+0120) in the vocabulary.
    """
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return chars
