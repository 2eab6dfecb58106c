"""Fixtures of the browser tests: one JupyterLab server for the session, one headless Chromium per module, a
fresh page and a screenshot folder per test. Without /usr/bin/chromium (Debian's `chromium`) every test here skips."""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest

from tests.browser.lab_server import CHROMIUM, CHROMIUM_ARGS, start_lab, stop_lab, trust_notebooks
from tests.browser.notebook_page import CHAPTERS, CHINESE, NOTEBOOKS

SCREENSHOTS = Path(os.environ.get("BROWSER_SCREENSHOTS", Path(__file__).parent / "screenshots"))
VIEWPORT = {"width": 1280, "height": 900}

_shot_dirs: list[Path] = []


def _digests() -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(NOTEBOOKS.rglob("*.ipynb"))}


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """A JupyterLab server on `notebooks/`, its chapters trusted in a private data folder (as a learner's are
    once they trust or run them, so saved widgets may draw). Stopped with its kernels whatever happens; the
    notebooks must come out byte for byte as they went in."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} not found: the browser tests need Debian's chromium (apt-get install chromium "
                    "fonts-noto-cjk)")
    tmp = tmp_path_factory.mktemp("jupyterlab")
    trust_notebooks(CHAPTERS + CHINESE, tmp)
    before = _digests()
    server = start_lab(NOTEBOOKS, tmp)
    try:
        yield server
    finally:
        stop_lab(server)
    changed = [name for name, digest in _digests().items() if before.get(name) != digest]
    assert not changed, f"the browser tests rewrote notebooks: {changed}"


@pytest.fixture(scope="module")
def playwright(lab):
    """Playwright's driver (the one its Python package bundles; it downloads nothing here). Per module, not per
    session: its sync API runs an asyncio loop in this thread while it lives, and the tests after these ones
    (the server's) call `asyncio.run`, which refuses to start inside a running loop."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser_context(playwright, tmp_path_factory):
    """Headless system Chromium (never a downloaded one) with a fresh profile."""
    context = playwright.chromium.launch_persistent_context(
        str(tmp_path_factory.mktemp("chromium-profile")), executable_path=str(CHROMIUM), args=CHROMIUM_ARGS,
        headless=True, viewport=VIEWPORT)
    try:
        yield context
    finally:
        context.close()


@pytest.fixture
def page(browser_context, lab):
    """A new tab; afterwards it is closed and every kernel the test started is shut down."""
    page = browser_context.new_page()
    page.set_default_timeout(60_000)
    try:
        yield page
    finally:
        page.close()
        lab.shutdown_kernels()


@pytest.fixture
def shots(request) -> Path:
    """The screenshot folder of this test: $BROWSER_SCREENSHOTS (default tests/browser/screenshots) / test name."""
    folder = SCREENSHOTS / re.sub(r"[^\w.-]+", "_", request.node.originalname)
    folder.mkdir(parents=True, exist_ok=True)
    if folder not in _shot_dirs:
        _shot_dirs.append(folder)
    return folder


def pytest_terminal_summary(terminalreporter):
    for folder in _shot_dirs:
        n = len(list(folder.glob("*.png")))
        terminalreporter.write_line(f"browser screenshots: {n} in {folder}")
