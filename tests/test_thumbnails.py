"""The README's thumbnails come from the saved chapters: every chapter has a pick, and each pick finds a figure."""
from pathlib import Path

import pytest

from benchmarks.thumbnails import PICKS, first_figure, thumbnail

CHAPTERS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_every_chapter_has_a_thumbnail_figure(chapter):
    png = first_figure(chapter, PICKS[chapter.name[:2]])
    assert png.startswith(b"\x89PNG")
    assert thumbnail(png).width == 320


def test_a_missing_heading_is_an_error():
    with pytest.raises(LookupError, match="no figure under a heading starting '## no such section'"):
        first_figure(CHAPTERS[0], "no such section")
