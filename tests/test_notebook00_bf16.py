"""Notebook 00 run end to end in bfloat16 on the CPU, as a stand-in for a GPU's dtype.

Every assert in the notebook must hold with the tolerances it states for bfloat16: the engine's `LLM.chat` against the
step-by-step loop and `transformers`' greedy answer (equal up to a near tie), the prefill logits against
`transformers` (within the bfloat16 logit tolerance), the KV cache against a full forward. `setup_chapter()` reads
COURSE_DTYPE, so the notebook itself is unchanged; it runs in memory and the executed copy is written to a temp dir.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "00_welcome.ipynb"


def _stdout(nb) -> str:
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                   if o.get("name") == "stdout")


@pytest.mark.slow
def test_notebook00_holds_in_bfloat16(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_DTYPE", "bfloat16")
    monkeypatch.setenv("COURSE_DEVICE", "cpu")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    try:
        client.execute()  # a failing assert in any cell raises CellExecutionError
    finally:
        nbformat.write(nb, tmp_path / "00_welcome_bfloat16.ipynb")
    out = _stdout(nb)
    assert re.search(r"Machine: .* · cpu bfloat16", out)  # setup_chapter's line: the dtype it read
    assert "in bfloat16 on cpu" in out  # the engine's weights
    assert "bfloat16: logits must agree within 4e-02 of the largest logit" in out  # the tolerance the asserts used, stated
    for line in out.splitlines():  # the measured differences, next to their tolerance (pytest -s shows them)
        if re.search(r"max \|.*\||tokens equal|split at token", line):
            print(line)
