"""Slide metadata: every chapter and solutions notebook presents in JupyterLab's slide mode (jupyterlab-rise).

A slide here is a `slide` or `subslide` cell plus the `-` and `fragment` cells after it: what one screen shows.
Skipped cells (harness) and speaker notes are not on the screen."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
CHAPTERS = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
SOLUTIONS = sorted((NOTEBOOKS / "solutions").glob("*.ipynb"))
# The Chinese edition copies the slide metadata and code (tests/test_i18n.py checks it); only its markdown, and so
# the lines on a screen, can differ from the English.
CHINESE = sorted((NOTEBOOKS / "zh").glob("[0-9][0-9]_*.ipynb")) + \
    sorted((NOTEBOOKS / "zh" / "solutions").glob("*.ipynb"))

SLIDE_TYPES = {"slide", "subslide", "fragment", "-", "skip", "notes"}
STARTS = {"slide", "subslide"}
ON_SCREEN = {"slide", "subslide", "fragment", "-"}
# Lines of source a projector shows at a readable size (about 40 at 1280x720); a longer lesson breaks into
# sub-slides. One cell cannot be split by metadata, so a single cell may run to SINGLE_CELL_LIMIT if it stands
# alone on its slide.
SLIDE_LINE_LIMIT = 40
SINGLE_CELL_LIMIT = 50
MIN_CHAPTER_SLIDES = 3


def cells_of(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def slide_type(cell: dict) -> str | None:
    return cell["metadata"].get("slideshow", {}).get("slide_type")


def source_lines(cell: dict) -> int:
    return len("".join(cell["source"]).splitlines())


def screens(cells: list[dict]) -> list[list[int]]:
    """The cell indices of each slide or sub-slide, in order (skipped cells and notes left out)."""
    out: list[list[int]] = []
    for i, cell in enumerate(cells):
        kind = slide_type(cell)
        if kind in STARTS or (kind in ON_SCREEN and not out):
            out.append([i])
        elif kind in ON_SCREEN:
            out[-1].append(i)
    return out


def ids(paths: list[Path]) -> list[str]:
    return [p.relative_to(NOTEBOOKS).as_posix() for p in paths]


def test_the_globs_find_every_notebook():
    assert len(CHAPTERS) >= 13 and len(SOLUTIONS) >= 13
    assert {p.name[:2] for p in SOLUTIONS} <= {p.name[:2] for p in CHAPTERS}


@pytest.mark.parametrize("path", CHAPTERS + SOLUTIONS, ids=ids(CHAPTERS + SOLUTIONS))
def test_every_cell_has_a_known_slide_type_and_the_first_is_a_slide(path):
    cells = cells_of(path)
    missing = [i for i, c in enumerate(cells) if slide_type(c) not in SLIDE_TYPES]
    assert missing == [], f"{path.name}: cells {missing} have no slide_type from {sorted(SLIDE_TYPES)}"
    assert slide_type(cells[0]) == "slide", f"{path.name}: the title cell must open a slide"


@pytest.mark.parametrize("path", CHAPTERS + SOLUTIONS, ids=ids(CHAPTERS + SOLUTIONS))
def test_the_colab_setup_cell_is_skipped(path):
    cells = cells_of(path)
    setup = next(c for c in cells if c["cell_type"] == "code")
    assert "".join(setup["source"]).startswith("# Colab set-up"), f"{path.name}: first code cell is not the set-up"
    assert slide_type(setup) == "skip", f"{path.name}: the Colab set-up cell is shown on a slide"


@pytest.mark.parametrize("path", CHAPTERS, ids=ids(CHAPTERS))
def test_a_chapter_has_a_slide_per_idea(path):
    slides = sum(slide_type(c) == "slide" for c in cells_of(path))
    assert slides >= MIN_CHAPTER_SLIDES, f"{path.name}: {slides} slides, want at least {MIN_CHAPTER_SLIDES}"


@pytest.mark.parametrize("path", CHAPTERS + SOLUTIONS + CHINESE, ids=ids(CHAPTERS + SOLUTIONS + CHINESE))
def test_no_slide_holds_more_than_a_screen_of_source(path):
    cells = cells_of(path)
    too_long = []
    for screen in screens(cells):
        lines = sum(source_lines(cells[i]) for i in screen)
        limit = SINGLE_CELL_LIMIT if len(screen) == 1 else SLIDE_LINE_LIMIT
        if lines > limit:
            too_long.append(f"cells {screen}: {lines} lines > {limit}")
    assert too_long == [], f"{path.name}: break these with a subslide: " + "; ".join(too_long)


def test_the_screen_counter_follows_the_slide_types():
    def cell(kind: str, lines: int) -> dict:
        return {"metadata": {"slideshow": {"slide_type": kind}}, "source": ["x\n"] * lines}

    cells = [cell("slide", 3), cell("skip", 30), cell("-", 5), cell("notes", 9), cell("subslide", 2),
             cell("fragment", 1)]
    assert screens(cells) == [[0, 2], [4, 5]]
    assert [sum(source_lines(cells[i]) for i in s) for s in screens(cells)] == [8, 3]
