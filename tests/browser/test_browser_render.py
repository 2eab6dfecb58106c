"""Every chapter as a learner first sees it in JupyterLab, not run: its cells render, no error or stderr output
shows, its saved widgets draw, and its Chinese text has real glyphs (no empty boxes)."""
from __future__ import annotations

import json
import os
import re

import pytest

pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (pip install playwright)")

from tests.browser.lab_server import CHROMIUM, CHROMIUM_ARGS  # noqa: E402
from tests.browser.notebook_page import (CHAPTERS, PANEL, open_notebook, problems, saved_widget_views,  # noqa: E402
                                         tofu, wait_widgets)

pytestmark = pytest.mark.browser

CJK = re.compile(r"[\u4e00-\u9fff]")


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapter_renders(lab, page, shots, chapter):
    saved = json.loads(chapter.read_text(encoding="utf-8"))
    open_notebook(page, lab.url(f"lab/tree/{chapter.name}"))

    cells = page.locator(f"{PANEL} .jp-Notebook .jp-Cell")
    assert cells.count() == len(saved["cells"]), "JupyterLab shows a different number of cells than were saved"
    expected_widgets = saved_widget_views(chapter)
    drawn = wait_widgets(page, expected_widgets)
    page.screenshot(path=shots / f"{chapter.stem}.png")
    print(f"{chapter.name}: {cells.count()} cells, {drawn}/{expected_widgets} saved widgets drawn, "
          f"screenshot {shots / (chapter.stem + '.png')}")

    found = problems(page)
    assert found == {"stderr": [], "traceback": [], "loading": []}, f"{chapter.name} shows {found}"
    assert drawn == expected_widgets, (f"{chapter.name}: {drawn} of the {expected_widgets} widgets whose state is "
                                       "saved are drawn (the others show their text fallback)")

    # Chinese: every distinct ideograph of the rendered markdown must draw as its own glyph.
    markdown = page.locator(f"{PANEL} .jp-MarkdownOutput")
    shown = "".join(dict.fromkeys(CJK.findall(" ".join(markdown.all_inner_texts()))))
    saved_text = " ".join("".join(c["source"]) for c in saved["cells"] if c["cell_type"] == "markdown")
    assert bool(shown) == bool(CJK.search(saved_text)), "Chinese in the saved markdown is missing from the page"
    if shown:
        assert tofu(page, f"{PANEL} .jp-MarkdownOutput", shown) == [], f"{chapter.name}: Chinese draws as tofu"


def test_glossary_chinese_renders(lab, page, shots):
    """Chapter 00's glossary (术语表) is the course's densest Chinese: screenshot it and check its glyphs."""
    welcome = next(p for p in CHAPTERS if p.name.startswith("00_"))
    open_notebook(page, lab.url(f"lab/tree/{welcome.name}"))
    glossary = page.locator(f"{PANEL} .jp-MarkdownOutput", has_text="术语表").first
    glossary.scroll_into_view_if_needed()
    glossary.screenshot(path=shots / "00_glossary.png")
    chars = "".join(dict.fromkeys(CJK.findall(glossary.inner_text())))
    assert len(chars) >= 20, f"the glossary shows only {len(chars)} distinct Chinese characters: {chars}"
    assert tofu(page, f"{PANEL} .jp-MarkdownOutput", chars) == []


def test_tofu_check_fails_without_cjk_fonts(playwright, tmp_path):
    """The glyph check can fail: in a Chromium whose fontconfig sees no CJK font, Chinese is tofu and is caught."""
    fonts = tmp_path / "fonts.conf"
    fonts.write_text('<?xml version="1.0"?>\n<!DOCTYPE fontconfig SYSTEM "fonts.dtd">\n<fontconfig>\n'
                     "  <dir>/usr/share/fonts/truetype/dejavu</dir>\n"
                     f"  <cachedir>{tmp_path / 'fc-cache'}</cachedir>\n</fontconfig>\n")
    browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True,
                                         env={**os.environ, "FONTCONFIG_FILE": str(fonts)})
    try:
        page = browser.new_page()
        page.set_content('<p style="font-family: sans-serif">Latin and 中文 预填充</p>')
        assert tofu(page, "p", "AB") == [], "Latin glyphs must pass the check"
        caught = tofu(page, "p", "中文预填充")
        assert len(caught) >= 4, f"without a CJK font the check should flag Chinese, it found {caught}"
    finally:
        browser.close()
