"""A chapter as a teacher presents it: JupyterLab's slide mode (jupyterlab-rise, `/rise/<notebook>`) shows its
slideshow metadata as slides; two slides are screenshotted, and the arrow key moves from one to the next."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (pip install playwright)")

from tests.browser.notebook_page import CHAPTERS  # noqa: E402

pytestmark = pytest.mark.browser

PRESENT = ".reveal .slides section.present"
SLIDE_CHAPTER = "12_"  # its first two slides: the title, then section 1


def test_chapter_as_slides(lab, page, shots):
    chapter = next(p for p in CHAPTERS if p.name.startswith(SLIDE_CHAPTER))
    saved = json.loads(chapter.read_text(encoding="utf-8"))
    slides = sum(c["metadata"].get("slideshow", {}).get("slide_type") == "slide" for c in saved["cells"])
    page.goto(lab.url(f"rise/{chapter.name}"))
    page.wait_for_selector(".reveal .slides > section", timeout=90_000)
    page.wait_for_timeout(1500)  # the first slide's fade-in
    assert page.locator(".reveal .slides > section").count() == slides, "one horizontal slide per 'slide' cell"

    def current() -> str:
        return page.locator(PRESENT).last.inner_text()

    first = current()
    page.screenshot(path=shots / f"{chapter.stem}_slide1.png")
    page.keyboard.press("ArrowRight")
    for _ in range(40):  # the transition takes a moment
        if current() != first:
            break
        page.wait_for_timeout(250)
    page.wait_for_timeout(800)
    second = current()
    page.screenshot(path=shots / f"{chapter.stem}_slide2.png")
    print(f"{chapter.name}: {slides} slides; slide 1 {first.splitlines()[0]!r}, slide 2 {second.splitlines()[0]!r}; "
          f"screenshots in {shots}")
    title = "".join(saved["cells"][0]["source"]).splitlines()[0].lstrip("# ").strip()
    assert first.splitlines()[0] == title, f"slide 1 should be the chapter's title cell, shows {first[:80]!r}"
    assert second.splitlines()[0].startswith("1."), f"slide 2 should open section 1, shows {second[:80]!r}"
    assert (shots / f"{chapter.stem}_slide1.png").read_bytes() != (shots / f"{chapter.stem}_slide2.png").read_bytes()
