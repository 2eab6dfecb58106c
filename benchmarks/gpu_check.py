"""One-shot GPU check for a session that has a device: correctness against transformers, then speed.

    python -m benchmarks.gpu_check                 # on the GPU machine (about 3-5 minutes)
    python -m benchmarks.gpu_check --device cpu --quick   # rehearse it here first

1. pytest's CUDA-only tests (Triton paged-attention and quantized-matmul kernels on the GPU, CUDA timer).
2. The engine vs transformers on the same GGUF weights: float32 logits and 32 greedy tokens, then
   bfloat16 greedy agreement (bf16 rounding may legitimately flip a near-tie late in an answer).
3. Speed, side by side: engine batched vs one at a time vs transformers batched, and the roofline
   ceilings with prefill/decode fractions (benchmarks.throughput / benchmarks.roofline functions).
Everything prints; the roofline plot goes to $OUT (the device tool's folder) or the temp folder.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import torch

from course_lib import LLM, SamplingParams
from course_lib.loading import default_gguf_path


def section(title: str) -> None:
    print(f"\n=== {title} ===", flush=True)


def run_cuda_tests() -> None:
    section("pytest -m cuda")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "cuda", "tests", "-p", "no:cacheprovider"],
                          capture_output=True, text=True)
    print(proc.stdout[-3000:], proc.stderr[-2000:])


@torch.inference_mode()
def check_against_transformers(device: str, quick: bool) -> None:
    from transformers import AutoModelForCausalLM

    path = default_gguf_path()
    for dtype in (torch.float32, torch.bfloat16):
        section(f"engine vs transformers, {device}, {dtype}")
        llm = LLM(device=device, dtype=dtype)
        hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype).to(device).eval()
        prompt = llm.tokenizer.apply_chat_template([{"role": "user", "content": "Explain the KV cache to a new engineer."}])
        ids = llm.tokenizer.encode(prompt)
        x = torch.tensor([ids], device=device)
        diff = (llm.model(x) - hf(x).logits).abs().max().item()
        n = 16 if quick else 32
        ours = llm.generate([ids], SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))[0].outputs[0].token_ids
        ref = hf.generate(x, max_new_tokens=n, min_new_tokens=n, do_sample=False)[0, len(ids):].tolist()
        same = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), n)
        print(f"prompt {len(ids)} tokens: max |logit diff| = {diff:.2e}; greedy tokens identical for {same}/{n}")
        if dtype == torch.float32:
            print("PASS" if diff < 1e-3 and same == n else "FAIL", "(float32 needs diff < 1e-3 and all tokens equal)")
        del llm, hf
        if device == "cuda":
            torch.cuda.empty_cache()


def speed(device: str, quick: bool) -> None:
    from benchmarks import roofline, throughput

    section(f"throughput, {device}")
    argv = ["--num-requests", "8" if quick else "64", "--max-output", "32" if quick else "128", "--skip-simple"]
    sys.argv = ["throughput", *argv]
    throughput.main()
    section(f"roofline, {device}")
    out = os.path.join(os.environ.get("OUT", tempfile.gettempdir()), f"roofline_{device}.png")
    roofline.main(["--device", device, "--out", out] + (["--prefill-tokens", "128", "--context", "128"] if quick else []))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="smaller runs (for rehearsing on the CPU)")
    args = ap.parse_args()
    t = time.perf_counter()
    print(f"torch {torch.__version__}, device {args.device}"
          + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else ""))
    if args.device == "cuda":
        run_cuda_tests()
    check_against_transformers(args.device, args.quick)
    speed(args.device, args.quick)
    print(f"\ngpu_check done in {time.perf_counter() - t:.0f} s")


if __name__ == "__main__":
    main()
