"""Client-side serving benchmark against any OpenAI-compatible server (this one, vLLM, TGI, llama.cpp).

    python -m course_lib.serve.bench --base-url http://127.0.0.1:8000 --concurrency 4 --num-requests 32 \\
        --json bench.json

`--num-requests` streaming chat requests, at most `--concurrency` in flight, each asking for
`--max-tokens` tokens (`ignore_eos`, a vLLM field, keeps the lengths equal where the server knows it).
Measured at the client, as a user sees it (definitions as in the profiling chapter, 09):

    TTFT   request sent -> first content chunk          (queueing + prefill + the network)
    TPOT   (last chunk - first chunk) / (output tokens - 1), output tokens from the server's `usage`
    ITL    every gap between consecutive content chunks (one chunk is one step's text here)
    E2E    request sent -> last chunk
    throughput = all output tokens / wall time of the run
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import time
from dataclasses import asdict, dataclass, field

from ..profiling.loadtest import TOPICS
from ..profiling.metrics import PERCENTILES, describe


@dataclass
class ClientRecord:
    """One request as the client saw it (seconds on time.perf_counter())."""

    sent: float
    chunk_times: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.sent if self.chunk_times else None

    @property
    def tpot(self) -> float | None:
        if len(self.chunk_times) < 2 or self.output_tokens < 2:
            return None
        return (self.chunk_times[-1] - self.chunk_times[0]) / (self.output_tokens - 1)

    @property
    def itl(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]

    @property
    def e2e(self) -> float | None:
        return self.chunk_times[-1] - self.sent if self.chunk_times else None


def prompt_text(i: int, words: int) -> str:
    """A user message of about `words` words; it starts with its index, so prompts share no prefix."""
    parts, k = [f"Request {i}:"], i
    while sum(len(p.split()) for p in parts) < words:
        parts.append(f"explain {TOPICS[k % len(TOPICS)]} and how it relates to {TOPICS[(k * 7 + 3) % len(TOPICS)]}.")
        k += 1
    return " ".join(parts)


async def one_request(client, model: str, i: int, args) -> ClientRecord:
    record = ClientRecord(sent=time.perf_counter())
    try:
        stream = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt_text(i, args.prompt_words)}],
            max_tokens=args.max_tokens, temperature=0.0, stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True} if args.ignore_eos else None)
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                record.chunk_times.append(time.perf_counter())
            if chunk.usage is not None:
                record.prompt_tokens, record.output_tokens = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
    except Exception as e:  # noqa: BLE001 -- a failed request is counted, not fatal to the run
        record.error = f"{type(e).__name__}: {e}"
    return record


async def run(args) -> tuple[list[ClientRecord], float, str]:
    """Send every request (at most `args.concurrency` at once); returns the records, the wall time, the model."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=args.base_url.rstrip("/") + "/v1", api_key=args.api_key, max_retries=0,
                         timeout=args.timeout)
    model = args.model or (await client.models.list()).data[0].id
    gate = asyncio.Semaphore(args.concurrency)

    async def limited(i: int) -> ClientRecord:
        async with gate:
            return await one_request(client, model, i, args)

    start = time.perf_counter()
    records = await asyncio.gather(*(limited(i) for i in range(args.num_requests)))
    duration = time.perf_counter() - start
    await client.close()
    return list(records), duration, model


def benchmark(base_url: str, concurrency: int = 4, num_requests: int = 16, max_tokens: int = 32,
              prompt_words: int = 40, model: str | None = None, ignore_eos: bool = True,
              timeout: float = 300.0) -> tuple[dict, list[ClientRecord]]:
    """The benchmark from Python (a notebook, a test): returns `summarize`'s dict and every request's record.

    Runs its own event loop in a worker thread, so it also works where one is already running (Jupyter).
    """
    args = argparse.Namespace(base_url=base_url, concurrency=concurrency, num_requests=num_requests,
                              max_tokens=max_tokens, prompt_words=prompt_words, model=model, ignore_eos=ignore_eos,
                              api_key="none", timeout=timeout)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        records, duration, _ = pool.submit(asyncio.run, run(args)).result()
    return summarize(records, duration), records


def summarize(records: list[ClientRecord], duration: float, ps=PERCENTILES) -> dict:
    """Counts, throughput and `describe`'s mean + percentiles of each latency (seconds), failed requests left out."""
    ok = [r for r in records if r.error is None]
    out = {"requests": len(records), "failed": len(records) - len(ok), "duration": duration,
           "output_tokens": sum(r.output_tokens for r in ok), "prompt_tokens": sum(r.prompt_tokens for r in ok)}
    out["output_throughput"] = out["output_tokens"] / duration
    out["request_throughput"] = len(ok) / duration
    series = {"ttft": [r.ttft for r in ok], "tpot": [r.tpot for r in ok],
              "itl": [gap for r in ok for gap in r.itl], "e2e": [r.e2e for r in ok]}
    for name, values in series.items():
        out.update({f"{name}_{k}": v for k, v in describe(values, ps).items()})
    return out


def table(summary: dict, ps=PERCENTILES) -> str:
    cols = ["mean"] + [f"p{p:g}" for p in ps]
    lines = [f"{'ms':<6}" + "".join(f"{c:>10}" for c in cols)]
    for name in ("ttft", "tpot", "itl", "e2e"):
        lines.append(f"{name.upper():<6}" + "".join(f"{summary[f'{name}_{c}'] * 1e3:>10.1f}" for c in cols))
    lines.append(f"{summary['requests'] - summary['failed']}/{summary['requests']} requests in "
                 f"{summary['duration']:.2f} s: {summary['output_throughput']:.1f} output tok/s, "
                 f"{summary['request_throughput']:.2f} req/s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server, without /v1")
    ap.add_argument("--model", default=None, help="model name to request (default: the server's first)")
    ap.add_argument("--concurrency", type=int, default=4, help="requests in flight at once")
    ap.add_argument("--num-requests", type=int, default=16)
    ap.add_argument("--prompt-words", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                    help="do not send vLLM's ignore_eos (for servers that reject unknown fields)")
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--json", default=None, help="write the summary and every request's record here")
    args = ap.parse_args(argv)
    if args.concurrency < 1 or args.num_requests < 1:
        ap.error("--concurrency and --num-requests must be >= 1")
    records, duration, model = asyncio.run(run(args))
    summary = summarize(records, duration)
    print(f"{model} at {args.base_url}, concurrency {args.concurrency}")
    print(table(summary))
    for r in records:
        if r.error:
            print("failed:", r.error)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"args": vars(args), "summary": summary, "records": [asdict(r) for r in records]}, f, indent=1)
    return summary


if __name__ == "__main__":
    main()
