"""Editions of the chapters in other languages, kept in step with the English ones.

A translation is a text file per notebook, `notebooks/<lang>/text/<notebook>.md`: one section per markdown cell,
each opened by a marker line that names the English cell and a hash of the English text it was made from:

    <!-- cell 54323d6b · en 1a2b3c4d5e6f -->
    **你将学到什么**
    ...

When the English cell changes, its hash no longer matches and the translation is listed as stale.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
MARKER = re.compile(r"^<!-- cell (\S+) · en ([0-9a-f]{12}) -->$", re.MULTILINE)


@dataclass
class Translation:
    cell_id: str
    en_hash: str  # hash of the English cell this text was translated from
    text: str


def en_hash(source: str) -> str:
    """Twelve hex digits of the SHA-256 of an English markdown cell's source."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()[:12]


def cell_source(cell: dict) -> str:
    src = cell["source"]
    return src if isinstance(src, str) else "".join(src)


def english_notebooks() -> list[Path]:
    """Every English chapter and solutions notebook, in course order."""
    return sorted(NOTEBOOKS.glob("[0-9]*.ipynb")) + sorted((NOTEBOOKS / "solutions").glob("[0-9]*.ipynb"))


def text_path(notebook: Path, lang: str) -> Path:
    """Where the translation of an English notebook lives: notebooks/<lang>/text/[solutions/]<stem>.md."""
    return NOTEBOOKS / lang / "text" / notebook.relative_to(NOTEBOOKS).with_suffix(".md")


def read_translations(path: Path) -> dict[str, Translation]:
    """Parse a translation file into {cell id: Translation}."""
    text = path.read_text(encoding="utf-8")
    marks = list(MARKER.finditer(text))
    out = {}
    for m, nxt in zip(marks, marks[1:] + [None]):
        body = text[m.end() + 1: nxt.start() if nxt else len(text)]
        out[m.group(1)] = Translation(m.group(1), m.group(2), body.rstrip("\n"))
    return out


def write_translations(path: Path, translations: list[Translation]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    parts = [f"<!-- cell {t.cell_id} · en {t.en_hash} -->\n{t.text.rstrip()}\n" for t in translations]
    path.write_text("\n".join(parts), encoding="utf-8")


def skeleton(notebook: Path, lang: str) -> Path:
    """Write (or extend) a notebook's translation file: cells not yet translated get their English text to replace."""
    path = text_path(notebook, lang)
    have = read_translations(path) if path.exists() else {}
    cells = [c for c in json.loads(notebook.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "markdown"]
    out = [have.get(c["id"]) or Translation(c["id"], en_hash(cell_source(c)), cell_source(c)) for c in cells]
    write_translations(path, out)
    return path
