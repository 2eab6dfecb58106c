"""What the browser tests do to and read from a JupyterLab page (Playwright, sync API)."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported without playwright too: conftest reads CHAPTERS before the tests can skip
    from playwright.sync_api import Page

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
CHAPTERS = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))  # 00_welcome ... whatever chapters exist now
CHINESE = sorted((NOTEBOOKS / "zh").glob("[0-9][0-9]_*.ipynb"))  # their Chinese edition (course_lib.i18n)
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"

# Every output area of the open notebook that shows something a learner must never see in a saved chapter.
_PROBLEMS_JS = """() => {
  const outs = [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output')];
  const text = (e) => e.innerText.slice(0, 300);
  return {
    stderr: outs.filter(e => e.matches('[data-mime-type="application/vnd.jupyter.stderr"]')).map(text),
    traceback: outs.filter(e => /Traceback \\(most recent call last\\)|Error displaying widget/.test(e.innerText))
                   .map(text),
    loading: outs.filter(e => e.innerText.includes('Loading widget')).map(text),
  };
}"""

# Widget views on the page: output areas whose content is a rendered ipywidget (not its text/plain fallback).
_WIDGETS_JS = """() => [...document.querySelectorAll(
  '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output')].filter(
  e => e.querySelector(':scope > .jupyter-widgets')).length"""

# Execution prompts of the open notebook's code cells: "[12]:" once run, "[*]:" while queued or running.
_PROMPTS_JS = """() => [...document.querySelectorAll(
  '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .jp-InputArea-prompt')].map(e => e.innerText.trim())"""

# Draws each character alone on a canvas in the font of `selector`'s element and compares the pixels. A missing
# glyph (tofu: an empty box, or nothing) draws the same image for every character, and the same image as a code
# point no font has; real glyphs have ink and differ from each other. Returns what is wrong ([] when fine).
_TOFU_JS = """([selector, chars]) => {
  const el = document.querySelector(selector);
  if (!el) return ['no element ' + selector];
  const style = getComputedStyle(el);
  const canvas = document.createElement('canvas');
  canvas.width = canvas.height = 64;
  const ctx = canvas.getContext('2d', {willReadFrequently: true});
  const draw = (ch) => {
    ctx.clearRect(0, 0, 64, 64);
    ctx.font = `32px ${style.fontFamily}`;
    ctx.fillStyle = '#000';
    ctx.textBaseline = 'top';
    ctx.fillText(ch, 8, 8);
    const px = ctx.getImageData(0, 0, 64, 64).data;
    let ink = 0;
    for (let i = 3; i < px.length; i += 4) ink += px[i] > 0;
    return {ink, key: Array.from(px.filter((_, i) => i % 4 === 3)).join(',')};
  };
  const missing = draw('\\u0378');  // an unassigned code point: no font has a glyph for it
  const problems = [];
  const seen = new Map();
  for (const ch of chars) {
    const g = draw(ch);
    if (g.ink === 0) problems.push(`${ch} draws nothing`);
    else if (g.key === missing.key) problems.push(`${ch} draws the missing-glyph box`);
    else if (seen.has(g.key)) problems.push(`${ch} draws the same as ${seen.get(g.key)}`);
    seen.set(g.key, ch);
  }
  return problems;
}"""


def saved_widget_views(path: Path) -> int:
    """How many widget views the saved notebook shows whose state its metadata holds (what JupyterLab can draw
    without a kernel)."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    state = nb["metadata"].get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    return sum(WIDGET_VIEW in out.get("data", {}) and out["data"][WIDGET_VIEW]["model_id"] in state
               for cell in nb["cells"] for out in cell.get("outputs", []))


def open_notebook(page: Page, url: str, timeout_ms: int = 90_000) -> None:
    """Load JupyterLab with only this notebook open (`reset` drops the saved workspace), wait for its cells and
    kernel, and fold the left sidebar away so screenshots show the notebook."""
    page.goto(url + "&reset")
    page.wait_for_selector(f"{PANEL} .jp-Notebook .jp-Cell", timeout=timeout_ms)
    wait_kernel_idle(page, timeout_ms)
    current = page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current")
    if current.count():
        current.first.click()
    page.wait_for_timeout(300)


def wait_kernel_idle(page: Page, timeout_ms: int) -> None:
    page.wait_for_selector(f'{PANEL} .jp-Notebook-ExecutionIndicator[data-status="idle"]', timeout=timeout_ms)


def problems(page: Page) -> dict[str, list[str]]:
    """Error and stderr outputs, tracebacks and widgets still "Loading widget..." in the open notebook."""
    return page.evaluate(_PROBLEMS_JS)


def rendered_widgets(page: Page) -> int:
    return page.evaluate(_WIDGETS_JS)


def wait_widgets(page: Page, expected: int, timeout_ms: int = 30_000) -> int:
    """Wait until `expected` widget views are drawn (they render after the cells); return how many are."""
    deadline = time.monotonic() + timeout_ms / 1000
    while (n := rendered_widgets(page)) < expected and time.monotonic() < deadline:
        page.wait_for_timeout(250)
    return n


def tofu(page: Page, selector: str, chars: str) -> list[str]:
    """Characters of `chars` that the font of `selector`'s element cannot draw ([] when all can)."""
    return page.evaluate(_TOFU_JS, [selector, chars])


def run_all_cells(page: Page, timeout_s: float) -> float:
    """Run > Run All Cells from the menu bar; wait until every code cell has run and the kernel is idle.
    Returns the seconds it took."""
    start = time.monotonic()
    page.locator(".lm-MenuBar-item", has_text="Run").first.click()
    page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()
    # The first prompts turn to [*] at once; wait for that before waiting for the end.
    page.wait_for_function(f"({_PROMPTS_JS})().some(p => p.includes('*'))", timeout=30_000)
    while True:
        prompts = page.evaluate(_PROMPTS_JS)
        busy = page.locator(f'{PANEL} .jp-Notebook-ExecutionIndicator[data-status="idle"]').count() == 0
        if prompts and not busy and all(p.startswith("[") and p[1:-2].isdigit() for p in prompts):
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            pending = sum(not p[1:-2].isdigit() for p in prompts)
            raise TimeoutError(f"{pending} of {len(prompts)} code cells still not run after {timeout_s:.0f} s")
        page.wait_for_timeout(500)
