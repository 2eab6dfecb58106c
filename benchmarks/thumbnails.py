"""The README's pictures, from the saved chapters: one thumbnail per chapter, and the pipeline.

    python -m benchmarks.thumbnails            # figures/chapters/NN.png and figures/pipeline.png (seconds)

Each thumbnail is the first figure a chapter's saved run drew under the section named in `PICKS`, cut to the
panel that carries the lesson and shown SHOWN pixels wide, with `PICKS`' sentence as its alt text (the README's
table repeats it; tests/test_thumbnails.py checks both): re-executing the chapters and running this (or
`make figures`) keeps the front page current.
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
PICKS = {  # chapter -> (start of a "## " heading, which figure under it (0: the first), crop box, the alt text)
    # crop: (left, top, right, bottom) as fractions of the figure, the panel that carries the lesson, so that its
    # labels stay readable at the README's SHOWN width
    "00": ("One chat turn, step by step", 2, (0.0, 0.0, 1.0, 1.0),
           "Chapter 00: time of one prefill of n tokens against n decode steps, 1 to 128 tokens, log scales"),
    "01": ("Tokens per character across languages", 0, (0.51, 0.08, 1.0, 1.0),
           "Chapter 01: tokens per character of the same sentence in ten languages, Chinese 1.72 against English 0.19"),
    "02": ("5. RoPE", 0, (0.0, 0.06, 0.335, 1.0),
           "Chapter 02: RoPE turns a pair of dimensions like a clock hand, one step per position"),
    "03": ("6. What do the heads look at?", 0, (0.0, 0.0, 0.88, 1.0),
           "Chapter 03: attention weights of one head over a repeated sentence, query tokens against key tokens"),
    "04": ("4. From logits to a token", 0, (0.0, 0.08, 0.55, 0.92),
           "Chapter 04: the next-token distribution before and after greedy sampling keeps one token"),
    "05": ("4. This machine's roofline", 0, (0.0, 0.0, 1.0, 1.0),
           "Chapter 05: prefill near the compute roof and a decode step far left on this machine's roofline"),
    "06": ("4. The memory budget", 0, (0.0, 0.0, 1.0, 0.87),
           "Chapter 06: weights, KV cache and activations of 7B, 8B and 70B models against 80 GB and 141 GB cards"),
    "07": ("2. Static batching", 0, (0.0, 0.0, 0.88, 1.0),
           "Chapter 07: sixteen requests scheduled step by step, static batching with padding above, continuous below"),
    "08": ("7. Memory, quality and speed", 0, (0.66, 0.07, 1.0, 1.0),
           "Chapter 08: decode and prefill speed of bfloat16, INT8 and INT4 relative to float32"),
    "09": ("3. Many requests at once", 0, (0.0, 0.1, 0.33, 1.0),
           "Chapter 09: output throughput against concurrency in a closed-loop load test"),
    "10": ("4. Load it and watch the metrics", 0, (0.0, 0.1, 0.5, 1.0),
           "Chapter 10: the server's TTFT and TPOT against concurrent requests, from the client"),
    "11": ("3. The planner, for real models", 0, (0.0, 0.0, 1.0, 0.87),
           "Chapter 11: Llama-3-8B on a 16 GB laptop GPU in bf16, q8_0 and q4_k_m: only the quantized ones fit"),
    "12": ("4. Acceptance and speed against k", 0, (0.5, 0.17, 1.0, 1.0),
           "Chapter 12: decode speed-up of prompt lookup against k, an edit task against open text"),
    "13": ("1. Why a model stops fitting", 0, (0.0, 0.0, 1.0, 1.0),
           "Chapter 13: weights and KV cache of Llama-3 8B, 70B and 405B against an RTX 4090, an H100 and an H200"),
}
SHOWN = 400  # the width, in pixels, at which the README's chapter table shows each picture
WIDTH = 2 * SHOWN  # at most this many pixels wide: sharp on high-density screens, never enlarged


def first_figure(notebook: Path, heading: str, index: int = 0) -> bytes:
    """The PNG bytes of the first (or the `index`-th) image output after the markdown heading `## {heading}...`."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    inside = False
    seen = 0
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and any(line.startswith("## ") for line in source.splitlines()):
            inside = any(line.startswith(f"## {heading}") for line in source.splitlines())
        for out in cell.get("outputs", []) if inside else []:
            if "image/png" in out.get("data", {}):
                if seen == index:
                    return base64.b64decode(out["data"]["image/png"])
                seen += 1
    raise LookupError(f"{notebook.name}: no figure {index} under a heading starting '## {heading}'")


def thumbnail(png: bytes, crop: tuple[float, float, float, float] = (0.0, 0.0, 1.0, 1.0),
              width: int = WIDTH) -> Image.Image:
    """The figure cut to `crop` (fractions of its width and height), scaled down to at most `width` pixels."""
    image = Image.open(io.BytesIO(png)).convert("RGB")
    left, top, right, bottom = crop
    image = image.crop((round(left * image.width), round(top * image.height),
                        round(right * image.width), round(bottom * image.height)))
    if image.width > width:
        image = image.resize((width, round(image.height * width / image.width)), Image.LANCZOS)
    return image


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
        heading, index, crop, _ = PICKS[number]
        thumbnail(first_figure(notebook, heading, index), crop).save(path, optimize=True)
        print(f"saved {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    from course_lib.viz.pipeline import draw_request_loop

    fig = draw_request_loop()  # shown full width (about 880 px on GitHub): 11 inches at 150 dpi, scaled down
    fig.savefig(out / "pipeline.png", dpi=150, bbox_inches="tight")
    plt.close(fig)
    print(f"saved {out / 'pipeline.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
