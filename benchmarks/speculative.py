"""Speculative decoding against plain decoding, side by side in one run: acceptance and speed per method and task.

    python -m benchmarks.speculative               # the default model, batch 1, greedy
    python -m benchmarks.speculative --rounds 1 --max-tokens 48   # quicker

Tasks: "edit" and "code" ask the model to give back a text it was handed with a small change (the answer repeats
its prompt: what prompt lookup is for); "open" asks for a story (nothing to look up). Methods: plain decoding, prompt
lookup (`ngram`) and a draft model (the target itself in INT4, `draft_model`), each with `num_speculative_tokens`
K. Every configuration serves the same prompts, one request at a time (batch 1, where decode is most bound by
bandwidth), in interleaved rounds; each number is the median over the rounds. Greedy decoding: every method must
return the very tokens plain decoding does, which the run checks.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from course_lib import LLM, SamplingParams

TEXT = ("The KV cache stores the keys and values of every token the model has already seen, so that each new "
        "token only computes its own. Without it, every step would recompute the whole prefix from scratch, "
        "and generation would slow down as the text grows longer.")
CODE = '''def mean(x):
    total = 0
    for item in x:
        total += item
    return total / len(x)'''
TASKS = {
    "edit": f"Repeat this paragraph exactly, but write 'KV cache' as 'key-value cache':\n\n{TEXT}",
    "code": f"Rename the argument x to values in this function and return the whole function:\n\n{CODE}",
    "open": "Write a short story about a robot who learns to paint.",
}
METHODS = {
    "plain": None,
    "ngram": {"method": "ngram", "prompt_lookup_max": 4, "prompt_lookup_min": 2},
    "draft int4": {"method": "draft_model", "quantization": "int4"},
}


def run_once(llm: LLM, prompt: str, params: SamplingParams) -> dict:
    """One request: its tokens, seconds from first to last token, and its speculation counts."""
    out = llm.chat([{"role": "user", "content": prompt}], params)[0]
    m = out.metrics
    return {"tokens": out.outputs[0].token_ids, "decode_s": m.token_times[-1] - m.token_times[0],
            "n": len(m.token_times), "drafts": m.num_drafts, "drafted": m.num_draft_tokens,
            "accepted": m.num_accepted_tokens}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--json", help="write the table here")
    args = ap.parse_args(argv)
    tasks = args.tasks.split(",")

    engines = {name: LLM(speculative_config=None if spec is None else {**spec, "num_speculative_tokens": args.k})
               for name, spec in METHODS.items()}
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0)
    for llm in engines.values():  # warm-up
        llm.generate("Hello", SamplingParams(max_tokens=4))
    runs: dict[tuple[str, str], list[dict]] = {}
    for _ in range(args.rounds):
        for task in tasks:
            for name, llm in engines.items():
                runs.setdefault((task, name), []).append(run_once(llm, TASKS[task], params))

    rows = []
    for task in tasks:
        plain = runs[(task, "plain")]
        plain_tps = statistics.median((r["n"] - 1) / r["decode_s"] for r in plain)
        for name in engines:
            rs = runs[(task, name)]
            assert all(r["tokens"] == plain[0]["tokens"] for r in rs), f"{name} changed the greedy output on {task}"
            tps = statistics.median((r["n"] - 1) / r["decode_s"] for r in rs)
            drafted, accepted, drafts = (sum(r[k] for r in rs) for k in ("drafted", "accepted", "drafts"))
            rows.append({"task": task, "method": name, "k": 0 if name == "plain" else args.k,
                         "tokens": rs[0]["n"], "acceptance": accepted / drafted if drafted else None,
                         "mean_accepted_length": 1 + accepted / drafts if drafts else None,
                         "decode_tok_s": tps, "speedup": tps / plain_tps})
    print(f"batch 1, greedy, {args.max_tokens} tokens at most, median of {args.rounds} interleaved rounds; "
          f"speed = decode tokens/s after the first token")
    print(f"{'task':6} {'method':11} {'k':>2} {'tokens':>6} {'accepted':>9} {'mean len':>9} {'tok/s':>7} {'vs plain':>9}")
    for r in rows:
        acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.0%}"
        mal = "-" if r["mean_accepted_length"] is None else f"{r['mean_accepted_length']:.2f}"
        print(f"{r['task']:6} {r['method']:11} {r['k']:2d} {r['tokens']:6d} {acc:>9} {mal:>9} "
              f"{r['decode_tok_s']:7.1f} {r['speedup']:8.2f}x")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"rows": rows, "time": time.strftime("%Y-%m-%d %H:%M")}, f, indent=1)
    return {"rows": rows}


if __name__ == "__main__":
    main()
