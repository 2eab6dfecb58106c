"""Throughput of the serving engine vs one-at-a-time and vs transformers' `generate`, in one run.

    python -m benchmarks.throughput                 # 32 requests on the default model
    python -m benchmarks.throughput --num-requests 8 --max-output 24   # quicker

Every system serves the same requests (mixed prompt and output lengths, greedy, EOS ignored so
each request produces exactly its output length). Output lengths are long-tailed, as in real chat
traffic (most answers short, a few long): log-normal around 24 tokens, clipped to [8, max_output].
Output tokens/s counts only the tokens the requests asked for: static batching in `generate`
keeps computing for requests that are already done (padding) until the longest in the batch
finishes, which is exactly what continuous batching avoids (Orca, OSDI 2022).
"""
from __future__ import annotations

import argparse
import math
import random
import time

import torch

from course_lib import LLM, SamplingParams
from course_lib.generate import generate_stream
from course_lib.engine.sequence import Sequence
from course_lib.loading import default_gguf_path
from course_lib.profiling.timer import synchronize

TOPICS = ["the KV cache", "paged attention", "tokenization", "quantization", "GPU memory bandwidth",
          "continuous batching", "rotary position embeddings", "sampling with temperature"]


def make_requests(n: int, max_output: int, seed: int = 0, median_output: int = 24) -> list[tuple[str, int]]:
    """n chat prompts of varied length, each with its own (long-tailed) output length."""
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        detail = " ".join(rng.choice(TOPICS) for _ in range(rng.randint(0, 24)))
        question = f"Request {i}: explain {rng.choice(TOPICS)} to a new engineer. Context: {detail}."
        length = round(rng.lognormvariate(math.log(median_output), 0.8))
        reqs.append((question, min(max(length, 8), max_output)))
    return reqs


def engine_batched(llm: LLM, prompts, lengths) -> float:
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in lengths]
    t = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - t
    assert [len(o.outputs[0].token_ids) for o in outs] == lengths
    return elapsed


def engine_one_at_a_time(llm: LLM, prompts, lengths) -> float:
    t = time.perf_counter()
    for p, n in zip(prompts, lengths):
        llm.generate(p, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
    return time.perf_counter() - t


def simple_loop_one_at_a_time(llm: LLM, prompts, lengths) -> float:
    """The contiguous-cache loop of course_lib.generate: no paging, no scheduler."""
    t = time.perf_counter()
    for i, (p, n) in enumerate(zip(prompts, lengths)):
        seq = Sequence(f"s{i}", llm.tokenizer.encode(p), SamplingParams(max_tokens=n, temperature=0, ignore_eos=True),
                       llm.tokenizer)
        for _ in generate_stream(llm.model, seq):
            pass
    return time.perf_counter() - t


@torch.inference_mode()
def hf_batched(hf, tok, prompts, lengths, batch_size: int) -> float:
    """Static batches with left padding; each batch runs until its longest request is done."""
    synchronize()
    t = time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        chunk, n = prompts[i:i + batch_size], max(lengths[i:i + batch_size])
        enc = tok(chunk, return_tensors="pt", padding=True)
        hf.generate(**enc, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id)
    synchronize()
    return time.perf_counter() - t


@torch.inference_mode()
def hf_one_at_a_time(hf, tok, prompts, lengths) -> float:
    synchronize()
    t = time.perf_counter()
    for p, n in zip(prompts, lengths):
        enc = tok([p], return_tensors="pt")
        hf.generate(**enc, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id)
    synchronize()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--max-output", type=int, default=128)
    ap.add_argument("--skip-hf", action="store_true", help="leave out transformers (saves its load time)")
    ap.add_argument("--skip-simple", action="store_true", help="leave out the contiguous-cache loop")
    args = ap.parse_args()

    llm = LLM(device="cpu" if not torch.cuda.is_available() else None)
    reqs = make_requests(args.num_requests, args.max_output)
    prompts = [llm.tokenizer.apply_chat_template([{"role": "user", "content": q}]) for q, _ in reqs]
    lengths = [n for _, n in reqs]
    prompt_lens = [len(llm.tokenizer.encode(p)) for p in prompts]
    total_out = sum(lengths)
    print(f"{len(reqs)} requests on {llm.config.name}, {llm.device}, threads={torch.get_num_threads()}: "
          f"prompt tokens {min(prompt_lens)}-{max(prompt_lens)}, output tokens {min(lengths)}-{max(lengths)} "
          f"({total_out} in all)")
    engine_batched(llm, prompts[:2], lengths[:2])  # warm-up
    llm.engine.stats = type(llm.engine.stats)()  # count only the measured run

    rows = {"engine, all at once (continuous batching)": engine_batched(llm, prompts, lengths)}
    s = llm.engine.stats
    print(f"  engine: {s.steps} steps, mean batch {sum(s.batch_sizes) / len(s.batch_sizes):.1f} seqs, "
          f"preemptions {s.preemptions}, prefix-cache hit rate {s.prefix_cache_hit_rate:.2f}")
    rows["engine, one request at a time"] = engine_one_at_a_time(llm, prompts, lengths)
    if not args.skip_simple:
        rows["simple loop (contiguous cache), one at a time"] = simple_loop_one_at_a_time(llm, prompts, lengths)
    if not args.skip_hf:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = default_gguf_path()
        hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=llm.model.dtype)
        hf = hf.to(llm.device).eval()
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, padding_side="left")
        rows[f"transformers generate, batched ({len(reqs)}, padded)"] = hf_batched(hf, tok, prompts, lengths, len(reqs))
        rows["transformers generate, one at a time"] = hf_one_at_a_time(hf, tok, prompts, lengths)

    base = rows["engine, all at once (continuous batching)"]
    print(f"\n{'system':<52} {'seconds':>8} {'out tok/s':>10} {'engine batched is':>18}")
    for name, sec in rows.items():
        print(f"{name:<52} {sec:8.2f} {total_out / sec:10.1f} {sec / base:17.2f}x")


if __name__ == "__main__":
    main()
