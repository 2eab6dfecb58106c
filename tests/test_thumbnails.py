"""The README's pictures come from the saved chapters: every chapter has a pick, each pick finds a figure, and the
README shows each at the width the crops were chosen for, with the pick's sentence as its alt text."""
import html
import re
from pathlib import Path

import pytest

from benchmarks.thumbnails import PICKS, SHOWN, WIDTH, first_figure, thumbnail

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
README = (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_every_chapter_has_a_thumbnail_figure(chapter):
    heading, index, crop, alt = PICKS[chapter.name[:2]]
    png = first_figure(chapter, heading, index)
    assert png.startswith(b"\x89PNG")
    left, top, right, bottom = crop
    assert 0 <= left < right <= 1 and 0 <= top < bottom <= 1
    image = thumbnail(png, crop)
    assert image.width <= WIDTH
    assert alt.startswith(f"Chapter {chapter.name[:2]}: ") and len(alt) > 40


@pytest.mark.parametrize("number", sorted(PICKS))
def test_the_readme_shows_each_thumbnail_with_its_alt_text(number):
    tag = f'<img src="figures/chapters/{number}.png" width="{SHOWN}" alt="{html.escape(PICKS[number][3])}">'
    assert tag in README
    assert (ROOT / "figures" / "chapters" / f"{number}.png").exists()


def test_no_picture_in_the_readme_says_nothing():
    assert not re.search(r'alt="a figure from', README)
    assert "![One request from text to text" in README and "decode loop" in README.split("(figures/pipeline.png)")[0]


def test_a_missing_heading_is_an_error():
    with pytest.raises(LookupError, match="no figure 0 under a heading starting '## no such section'"):
        first_figure(CHAPTERS[0], "no such section")
