"""What INT8 and INT4 weights cost and buy on the default model, side by side with float32.

    python -m benchmarks.quantization                  # CPU, 1 thread, 256 tokens of each text, 24 decode steps
    python -m benchmarks.quantization --tokens 512 --decode-tokens 64 --device cuda

For float32, bfloat16 (where the device supports it), INT8, and INT4 with groups of 32 and 128:
weight memory of the linear layers and of the whole model, perplexity on a fixed English and a
fixed Chinese text (`course_lib.evaluation.evaluation_texts`), teacher-forced top-1 next-token
agreement with float32, and greedy decode speed (1 / the median step); each with its ratio to
float32. Quantized layers use `LLM(accel=True)`'s kernels (`course_lib.accel.quant_linear`: PyTorch's packed
ops on the CPU, which compute in bfloat16; Triton on CUDA). lm_head, tied to the embedding, stays in float.
Checks at the end: INT8 linear weights <= 0.3x float32, INT4 (group 128) <= 0.17x.
"""
from __future__ import annotations

import argparse
import copy
import sys
import time

import torch

import course_lib
from course_lib import evaluation as ev
from course_lib.profiling.memory import weight_bytes
from course_lib.accel.quant_linear import use_quant_kernels
from course_lib.quant import QuantLinear, quantize_model

CONFIGS = [  # (label, method, group_size); method None = a float dtype
    ("float32", None, None),
    ("bfloat16", None, None),
    ("int8", "int8", None),
    ("int4 g32", "int4", 32),
    ("int4 g128", "int4", 128),
]
LIMITS = {"int8": 0.3, "int4 g128": 0.17}  # linear weight bytes relative to float32, from the issue


def bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    try:
        torch.ones(2, 2, dtype=torch.bfloat16, device=device) @ torch.ones(2, 2, dtype=torch.bfloat16, device=device)
        return True
    except RuntimeError:
        return False


def build(base: torch.nn.Module, label: str, method: str | None, group_size: int | None) -> torch.nn.Module:
    """A converted copy; `base` stays float32. Quantized copies share base's other tensors (embedding, norms)."""
    if method is None:
        return copy.deepcopy(base).to(torch.bfloat16)
    shared = {id(t): t for t in list(base.parameters()) + list(base.buffers())}
    model = quantize_model(copy.deepcopy(base, memo=shared), method, group_size=group_size or 128)
    return use_quant_kernels(model, "triton" if base.device.type == "cuda" else "onednn")  # as LLM(accel=True)


def measure(model, texts_ids: dict[str, list[int]], reference: dict | None, prompt: list[int], args) -> dict:
    row = {"linear_bytes": ev.linear_weight_bytes(model), "model_bytes": weight_bytes(model)}
    names = {"cpu": "packed, bf16 x", "torch": "dequantize", "triton": "triton"}  # how QuantLinear computes
    backends = sorted({names[m.backend] for m in model.modules() if isinstance(m, QuantLinear)})
    row["backend"] = " + ".join(backends) if backends else str(model.dtype).removeprefix("torch.")
    row["scores"] = {k: ev.score_text(model, ids, window=args.tokens) for k, ids in texts_ids.items()}
    for k, s in row["scores"].items():
        row[f"ppl_{k}"] = s.perplexity
        row[f"top1_{k}"] = ev.agreement(reference[k], s) if reference else 1.0
    row["tok_s"] = ev.decode_tokens_per_second(model, prompt, args.decode_tokens)
    return row


def print_table(rows: dict[str, dict]) -> None:
    base = rows["float32"]
    cols = ["config", "compute", "linear MB", "x", "model MB", "x", "ppl en", "x", "ppl zh", "x",
            "top1 en", "top1 zh", "tok/s", "x"]
    lines = []
    for label, r in rows.items():
        lines.append([
            label, r["backend"],
            f"{r['linear_bytes'] / 1e6:.1f}", f"{r['linear_bytes'] / base['linear_bytes']:.3f}",
            f"{r['model_bytes'] / 1e6:.1f}", f"{r['model_bytes'] / base['model_bytes']:.3f}",
            f"{r['ppl_en']:.3f}", f"{r['ppl_en'] / base['ppl_en']:.3f}",
            f"{r['ppl_zh']:.3f}", f"{r['ppl_zh'] / base['ppl_zh']:.3f}",
            f"{r['top1_en']:.3f}", f"{r['top1_zh']:.3f}",
            f"{r['tok_s']:.1f}", f"{r['tok_s'] / base['tok_s']:.2f}",
        ])
    widths = [max(len(c), *(len(line[i]) for line in lines)) for i, c in enumerate(cols)]
    fmt = "  ".join("{:<%d}" % w if i < 2 else "{:>%d}" % w for i, w in enumerate(widths))
    print(fmt.format(*cols))
    for line in lines:
        print(fmt.format(*line))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads (0: torch's choice; 1 keeps decode timings steadier on a busy machine)")
    p.add_argument("--tokens", type=int, default=256, help="tokens of each text to score (one window)")
    p.add_argument("--decode-tokens", type=int, default=24, help="greedy tokens; tok/s = 1 / median step")
    args = p.parse_args(argv)

    t0 = time.perf_counter()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    tok = course_lib.load_tokenizer()
    base = course_lib.load_model(device=device, dtype=torch.float32)  # the reference every format is judged against
    texts_ids = {k: tok.encode(v)[: args.tokens] for k, v in ev.evaluation_texts().items()}
    prompt = tok.encode_chat([{"role": "user", "content": "Explain the KV cache in one sentence."}])
    print(f"SmolLM2-135M-Instruct on {device} ({torch.get_num_threads()} threads): "
          f"{len(texts_ids['en'])} EN and {len(texts_ids['zh'])} ZH tokens scored, "
          f"{args.decode_tokens} decode tokens timed after a {len(prompt)}-token prompt\n", flush=True)

    rows: dict[str, dict] = {}
    for label, method, group_size in CONFIGS:
        if label == "bfloat16" and not bf16_supported(device):
            print(f"skipping bfloat16: not supported on {device}")
            continue
        model = base if label == "float32" else build(base, label, method, group_size)
        ref = rows["float32"]["scores"] if rows else None
        rows[label] = measure(model, texts_ids, ref, prompt, args)
        print(f"  {label}: done at {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
        del model

    print_table(rows)
    ok = True
    for label, limit in LIMITS.items():
        ratio = rows[label]["linear_bytes"] / rows["float32"]["linear_bytes"]
        ok &= ratio <= limit
        print(f"{label}: linear weights {ratio:.3f}x float32 (limit {limit}x): {'ok' if ratio <= limit else 'FAIL'}")
    print(f"total {time.perf_counter() - t0:.0f}s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
