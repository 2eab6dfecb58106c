"""The Chinese edition as a learner opens it: chapters 00 and 05 from notebooks/zh/ render in JupyterLab with no
error, and their Chinese is drawn by a CJK font (Chromium's own report of the fonts it used, a full-width advance
per character, no tofu), not merely present in the page."""
from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (pip install playwright)")

from tests.browser.notebook_page import CHINESE, NOTEBOOKS, PANEL, open_notebook, problems, tofu  # noqa: E402

pytestmark = pytest.mark.browser

CJK = re.compile(r"[\u4e00-\u9fff]")
PICKED = [p for p in CHINESE if p.name[:2] in ("00", "05")]

# Marks the first rendered heading or paragraph with a run of at least 4 Chinese characters and measures that run:
# its width, the number of characters and the element's font size.
_PROBE_JS = """() => {
  const run = /[\\u4e00-\\u9fff]{4,}/;
  for (const el of document.querySelectorAll(
      '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-MarkdownOutput :is(h1, h2, p, li)')) {
    const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const m = run.exec(node.data);
      if (!m) continue;
      const range = document.createRange();
      range.setStart(node, m.index);
      range.setEnd(node, m.index + m[0].length);
      el.setAttribute('data-cjk-probe', '');
      return {text: m[0], width: range.getBoundingClientRect().width,
              fontSize: parseFloat(getComputedStyle(el).fontSize)};
    }
  }
  return null;
}"""


def fonts_used(page, selector: str) -> dict[str, int]:
    """{font family: glyphs drawn} for the element's text, as Chromium's renderer reports it (CSS domain)."""
    cdp = page.context.new_cdp_session(page)
    try:
        cdp.send("DOM.enable")
        cdp.send("CSS.enable")
        root = cdp.send("DOM.getDocument", {"depth": 0})["root"]["nodeId"]
        node = cdp.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
        fonts = cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]
    finally:
        cdp.detach()
    return {f["familyName"]: f["glyphCount"] for f in fonts}


@pytest.mark.parametrize("chapter", PICKED, ids=[p.stem for p in PICKED])
def test_chinese_chapter_renders_with_cjk_glyphs(lab, page, shots, chapter):
    assert len(PICKED) == 2, "notebooks/zh/ lacks chapter 00 or 05: run python -m course_lib.i18n sync zh"
    saved = json.loads(chapter.read_text(encoding="utf-8"))
    open_notebook(page, lab.url(f"lab/tree/{chapter.relative_to(NOTEBOOKS).as_posix()}"))
    cells = page.locator(f"{PANEL} .jp-Notebook .jp-Cell")
    assert cells.count() == len(saved["cells"]), "JupyterLab shows a different number of cells than were saved"
    found = problems(page)
    assert found == {"stderr": [], "traceback": [], "loading": []}, f"zh/{chapter.name} shows {found}"

    title = page.locator(f"{PANEL} .jp-MarkdownOutput h1").first.inner_text()
    assert CJK.search(title), f"zh/{chapter.name}: the title is not Chinese: {title!r}"
    probe = page.evaluate(_PROBE_JS)
    assert probe, f"zh/{chapter.name}: no rendered paragraph holds a run of Chinese characters"
    fonts = fonts_used(page, "[data-cjk-probe]")
    cjk_glyphs = sum(n for family, n in fonts.items() if "CJK" in family)
    advance = probe["width"] / len(probe["text"]) / probe["fontSize"]
    page.screenshot(path=shots / f"zh_{chapter.stem}.png")
    print(f"zh/{chapter.name}: {cells.count()} cells; {probe['text']!r} {probe['width']:.0f} px at "
          f"{probe['fontSize']:.0f} px ({advance:.2f} em a character); fonts {fonts}; screenshot in {shots}")
    assert cjk_glyphs >= len(probe["text"]), f"the Chinese is not drawn by a CJK font: {fonts}"
    assert 0.9 <= advance <= 1.1, f"a Chinese character should advance one em (full width), not {advance:.2f}"
    markdown = " ".join(page.locator(f"{PANEL} .jp-MarkdownOutput").all_inner_texts())
    chars = "".join(dict.fromkeys(CJK.findall(markdown)))
    assert len(chars) >= 100, f"only {len(chars)} distinct Chinese characters rendered"
    assert tofu(page, f"{PANEL} .jp-MarkdownOutput", chars[:300]) == [], f"zh/{chapter.name}: Chinese draws as tofu"
