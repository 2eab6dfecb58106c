"""Three chapters with widgets run through JupyterLab's UI (Run > Run All Cells), then a learner's move on one
widget: its output must change. No error or stderr output may show after the run."""
from __future__ import annotations

import time

import pytest

pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (pip install playwright)")

from tests.browser.notebook_page import (CHAPTERS, PANEL, open_notebook, problems,  # noqa: E402
                                         run_all_cells)

pytestmark = pytest.mark.browser

RUN_ALL_TIMEOUT_S = 600  # ~1-1.5 min each on a 2-core CPU; generous for a loaded CI machine
LIVE_WIDGET = f"{PANEL} .jp-OutputArea-output > .jupyter-widgets:not(.jupyter-widgets-disconnected)"


def wait_changed(read, before: str, timeout_s: float = 60) -> str:
    """Poll `read()` until it differs from `before` (the kernel recomputes the widget's output); return it."""
    deadline = time.monotonic() + timeout_s
    while (now := read()) == before and time.monotonic() < deadline:
        time.sleep(0.25)
    return now


def type_in_token_box(widget):
    """01: type a new text into the token viewer; its summary line must count the new text."""
    summary = widget.locator(".widget-html-content > div > div").first
    before = summary.inner_text()
    text = "KV cache 缓存 speeds up decode"
    widget.locator("textarea").fill(text)
    after = wait_changed(summary.inner_text, before)
    expected = f"{len(text)} characters, {len(text.encode())} UTF-8 bytes"
    assert after.startswith(expected), f"after typing, the widget says {after!r}, expected {expected!r}..."
    return before, after


def move_slider(widget, index: int, key: str, presses: int):
    """Focus the `index`-th slider's handle and press `key`; the figure under the sliders must be redrawn."""
    figure = widget.locator("img").first
    readout = widget.locator(".widget-readout").nth(index)
    before = (readout.inner_text(), figure.get_attribute("src"))
    handle = widget.locator(".noUi-handle").nth(index)
    handle.focus()
    for _ in range(presses):
        handle.press(key)
    after = wait_changed(lambda: (readout.inner_text(), figure.get_attribute("src")), before)
    # The readout moves at once; the new figure arrives from the kernel a moment later.
    if after[1] == before[1]:
        after = wait_changed(lambda: (readout.inner_text(), figure.get_attribute("src")), (after[0], before[1]))
    assert after[0] != before[0], f"the slider did not move: readout {before[0]!r}"
    assert after[1] != before[1], f"the slider moved to {after[0]} but the figure was not redrawn"
    return before[0], after[0]


INTERACTIONS = {
    "01": ("type into the token viewer's text box", type_in_token_box),
    "03": ("move the attention layer slider", lambda w: move_slider(w, 0, "ArrowRight", 2)),
    "04": ("move the temperature slider", lambda w: move_slider(w, 0, "ArrowLeft", 10)),
}


@pytest.mark.slow
@pytest.mark.parametrize("number", INTERACTIONS)
def test_run_all_then_use_widget(lab, page, shots, number):
    chapter = next(p for p in CHAPTERS if p.name.startswith(f"{number}_"))
    what, interact = INTERACTIONS[number]
    open_notebook(page, lab.url(f"lab/tree/{chapter.name}"))
    seconds = run_all_cells(page, RUN_ALL_TIMEOUT_S)
    found = problems(page)
    assert found == {"stderr": [], "traceback": [], "loading": []}, f"{chapter.name} after Run All: {found}"

    widgets = page.locator(LIVE_WIDGET)
    assert widgets.count() >= 1, f"{chapter.name}: no live widget after running all cells"
    widget = widgets.first
    widget.scroll_into_view_if_needed()
    widget.screenshot(path=shots / f"{chapter.stem}_before.png")
    before, after = interact(widget)
    widget.screenshot(path=shots / f"{chapter.stem}_after.png")
    print(f"{chapter.name}: Run All {seconds:.0f} s; {what}: {before!r} -> {after!r}; screenshots in {shots}")
    assert problems(page) == found, f"{chapter.name}: the interaction produced an error output"
