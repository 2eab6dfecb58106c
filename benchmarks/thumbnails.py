"""The README's pictures, from the saved chapters: one thumbnail per chapter, and the pipeline.

    python -m benchmarks.thumbnails            # figures/chapters/NN.png and figures/pipeline.png (seconds)

Each thumbnail is the first figure a chapter's saved run drew under the section named in `PICKS`, scaled to
320 pixels wide: re-executing the chapters and running this (or `make figures`) keeps the front page current.
"""
from __future__ import annotations

import argparse
import base64
import io
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from PIL import Image  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PICKS = {  # chapter number -> the start of the "## " heading whose first figure is the thumbnail
    "00": "One chat turn, step by step",
    "01": "Tokens per character across languages",
    "02": "5. RoPE",
    "03": "6. What do the heads look at?",
    "04": "4. From logits to a token",
    "05": "4. This machine's roofline",
    "06": "4. The memory budget",
    "07": "2. Static batching",
    "08": "7. Memory, quality and speed",
    "09": "3. Many requests at once",
    "10": "4. Load it and watch the metrics",
    "11": "3. The planner, for real models",
    "12": "4. Acceptance and speed against k",
    "13": "3. One layer, split in two",
}
WIDTH = 320


def first_figure(notebook: Path, heading: str) -> bytes:
    """The PNG bytes of the first image output after the markdown heading `## {heading}...`."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    inside = False
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and any(line.startswith("## ") for line in source.splitlines()):
            inside = any(line.startswith(f"## {heading}") for line in source.splitlines())
        for out in cell.get("outputs", []) if inside else []:
            if "image/png" in out.get("data", {}):
                return base64.b64decode(out["data"]["image/png"])
    raise LookupError(f"{notebook.name}: no figure under a heading starting '## {heading}'")


def thumbnail(png: bytes, width: int = WIDTH) -> Image.Image:
    image = Image.open(io.BytesIO(png)).convert("RGB")
    return image.resize((width, round(image.height * width / image.width)), Image.LANCZOS)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", default=str(ROOT / "figures"))
    args = ap.parse_args(argv)
    out = Path(args.out_dir)
    (out / "chapters").mkdir(parents=True, exist_ok=True)
    chapters = {p.name[:2]: p for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))}
    missing = sorted(set(chapters) - set(PICKS))
    if missing:
        raise SystemExit(f"chapters without a thumbnail pick in PICKS: {missing}")
    for number, notebook in chapters.items():
        path = out / "chapters" / f"{number}.png"
        thumbnail(first_figure(notebook, PICKS[number])).save(path, optimize=True)
        print(f"saved {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    from course_lib.viz.pipeline import show_pipeline

    fig = show_pipeline("all")
    fig.savefig(out / "pipeline.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    print(f"saved {out / 'pipeline.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
