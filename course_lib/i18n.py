"""Editions of the chapters in other languages, kept in step with the English ones.

A translation is a text file per notebook, `notebooks/<lang>/text/<notebook>.md`: one section per markdown cell,
each opened by a marker line that names the English cell and a hash of the English text it was made from:

    <!-- cell 54323d6b · en 1a2b3c4d5e6f -->
    **你将学到什么**
    ...

When the English cell changes, its hash no longer matches and the translation is listed as stale.

    python -m course_lib.i18n sync zh     # write notebooks/zh/*.ipynb; list what is missing, stale or English
    python -m course_lib.i18n status zh   # only list (also the notebooks that sync would change); exit 1 if any

A translated notebook is the English one with only the markdown sources replaced: code, outputs, metadata and
cell ids stay byte for byte, and relative links are rewritten to resolve from notebooks/<lang>/.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
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


def markdown_cells(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if c["cell_type"] == "markdown"]


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
    cells = markdown_cells(json.loads(notebook.read_text(encoding="utf-8")))
    out = [have.get(c["id"]) or Translation(c["id"], en_hash(cell_source(c)), cell_source(c)) for c in cells]
    write_translations(path, out)
    return path


# --- Building the edition -------------------------------------------------------------------------------------
ROOT = NOTEBOOKS.parent
CODE = re.compile(r"^(```|~~~).*?^\1[^\n]*$|`[^`\n]+`", re.MULTILINE | re.DOTALL)  # fenced blocks, code spans
LINK = re.compile(r"(!?\[[^\]\n]*\]\()([^)\s]+)|^(\s*\[[^\]\n]+\]:\s*)(\S+)|((?:src|href)=\")([^\"]+)",
                  re.MULTILINE)  # [text](target), ![alt](target), [ref]: target, src="target", href="target"
NOT_PROSE = re.compile(r"\$\$.*?\$\$|\$[^$\n]+\$|<[^>\n]+>|\]\([^)]*\)|^\s*\[[^\]\n]+\]:.*$|https?://\S+",
                       re.MULTILINE | re.DOTALL)
CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
WORD = re.compile(r"[A-Za-z]{2,}(?:['’-][A-Za-z]+)*")
# Thresholds from the course itself: English cells have at most 0.66 Chinese characters per Latin word (the
# glossary's), translated ones at least 3.9 (names, code and English terms in parentheses stay Latin).
CJK_PER_WORD = 1.5  # a translated cell has at least this many Chinese characters per Latin word
ENGLISH_LINE = 12  # a line (paragraph, list item, row) of this many Latin words and no Chinese is left in English


def edition_path(notebook: Path, lang: str) -> Path:
    """The translated twin of an English notebook: notebooks/<lang>/[solutions/]<name>.ipynb."""
    return NOTEBOOKS / lang / notebook.relative_to(NOTEBOOKS)


def rewrite_links(text: str, notebook: Path, lang: str) -> str:
    """Relative link and image targets of a cell of `notebook`, made to resolve from its twin in notebooks/<lang>/.
    Inside notebooks/ every file has a twin at the same relative place (chapters, solutions/, README.md), so
    those stay; a target outside notebooks/ gets the extra `../`, and the repository's README.md its translation."""
    here = edition_path(notebook, lang).parent

    def target(t: str) -> str:
        if re.match(r"[a-z][a-z0-9+.-]*:|#|/", t):  # a URL, an anchor, an absolute path
            return t
        path, sep, rest = re.match(r"([^#?]*)([#?]?)(.*)", t).groups()
        resolved = Path(os.path.normpath(notebook.parent / path))
        if resolved == NOTEBOOKS or NOTEBOOKS in resolved.parents:
            return t
        if resolved == ROOT / "README.md":
            resolved = ROOT / f"README.{lang}.md"
        new = os.path.relpath(resolved, here).replace(os.sep, "/") + ("/" if path.endswith("/") else "")
        return new + sep + rest

    # Find links in the text with its code blanked out (a link's text may be a code span; code is never rewritten).
    masked = CODE.sub(lambda m: "\0" * len(m.group(0)), text)
    out, last = [], 0
    for m in LINK.finditer(masked):
        i = next(i for i in (2, 4, 6) if m.group(i) is not None)
        out += [text[last:m.start(i)], target(m.group(i))]
        last = m.end(i)
    return "".join(out) + text[last:]


def prose(text: str) -> str:
    """A markdown cell without code, formulas, HTML, URLs and link targets: what a translator translates."""
    return NOT_PROSE.sub(" ", CODE.sub(" ", text))


def counts(text: str) -> tuple[int, int]:
    """(Chinese characters, Latin words) of a markdown cell's prose."""
    words = prose(text)
    return len(CJK.findall(words)), len(WORD.findall(words))


def looks_english(text: str) -> bool:
    """Whether a cell (or a line of it) is still English: too few Chinese characters for its Latin words."""
    cjk, words = counts(text)
    return (words > 0 and cjk < CJK_PER_WORD * words) or any(
        len(WORD.findall(line)) >= ENGLISH_LINE and not CJK.search(line) for line in prose(text).splitlines())


def dump(nb: dict) -> str:
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"  # as the English notebooks are written


def build(notebook: Path, lang: str, translations: dict[str, Translation]) -> tuple[str, list[str]]:
    """The translated notebook's JSON text and what is wrong with its translation: the English notebook with each
    markdown cell's source replaced (a stale translation is still used; a missing one stays English)."""
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    where, problems = text_path(notebook, lang).relative_to(ROOT), []
    for cell in markdown_cells(nb):
        t, source = translations.get(cell["id"]), cell_source(cell)
        if t is None:
            problems.append(f"{where}: cell {cell['id']} missing (its English added to translate)")
            continue
        if t.en_hash != en_hash(source):
            problems.append(f"{where}: cell {cell['id']} stale (the English changed since; en {en_hash(source)})")
        elif looks_english(t.text):
            problems.append(f"{where}: cell {cell['id']} still English ({counts(t.text)[1]} Latin words)")
        cell["source"] = rewrite_links(t.text, notebook, lang).splitlines(keepends=True)
    gone = set(translations) - {c["id"] for c in markdown_cells(nb)}
    problems += [f"{where}: cell {i} has no English cell any more (dropped)" for i in sorted(gone)]
    return dump(nb), problems


def sync(lang: str, write: bool = True) -> list[str]:
    """Build every translated notebook; with `write`, save those that changed and add missing cells (in English)
    to the text files. Returns every problem, and with `write=False` also the notebooks that are not current."""
    problems = []
    for notebook in english_notebooks():
        path, out = text_path(notebook, lang), edition_path(notebook, lang)
        translations = read_translations(path) if path.exists() else {}
        text, found = build(notebook, lang, translations)
        problems += found
        cells = [c["id"] for c in markdown_cells(json.loads(notebook.read_text(encoding="utf-8")))]
        if write and list(translations) != cells:  # cells missing, dropped or out of order: the English order
            skeleton(notebook, lang)
            text, _ = build(notebook, lang, read_translations(path))
        if not out.exists() or out.read_text(encoding="utf-8") != text:
            if write:
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(text, encoding="utf-8")
            else:
                problems.append(f"{out.relative_to(ROOT)}: not what sync writes (run sync)")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Build notebooks/<lang>/ from the English notebooks and the "
                                 "translations in notebooks/<lang>/text/, and list what needs translating.")
    ap.add_argument("command", choices=["sync", "status"], help="sync: write the notebooks; status: only list")
    ap.add_argument("lang", help="the edition, e.g. zh")
    args = ap.parse_args(argv)
    problems = sync(args.lang, write=args.command == "sync")
    print("\n".join(problems) if problems else f"{args.lang}: every markdown cell translated and current")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
