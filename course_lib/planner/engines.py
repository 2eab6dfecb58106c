"""Choosing a local deployment (本地部署选型): which engine, in which weight format, on which hardware, for whom.

    from course_lib.planner.engines import ENGINES, DECISIONS, decide, decision_table, engine_table
    decide("one consumer GPU", "one")        # Choice(engine='llama.cpp', weight_format='q4_k_m', ...)
    decision_table()                          # hardware x users, a pandas DataFrame

`ENGINES` holds what each engine runs on, how a server starts, its API and formats (checked December 2026
against each project's documentation, in `Engine.source`). `DECISIONS` is the course's advice: for each kind of
hardware and each number of users, an engine, a weight format (a name in `planner.FORMATS`) and the measured
lesson of chapters 05-10 behind the choice. Advice, not a law: the chapter's exercises check against it.
"""
from __future__ import annotations

from dataclasses import dataclass

HARDWARE = ("laptop CPU", "Apple silicon", "one consumer GPU", "one data-centre GPU", "several GPUs")
USERS = ("one", "a team", "many")  # one person; a team (2-20 people, a few at once); many (a service, 100s)


@dataclass(frozen=True)
class Engine:
    """One inference framework (推理框架): where it runs, how to start its server, what it serves."""

    name: str
    runs_on: str
    start: str  # the command that starts an OpenAI-compatible server
    port: int  # its default port
    api: str
    formats: str
    fits: str
    source: str
    status: str = "active"


ENGINES: dict[str, Engine] = {e.name: e for e in [
    Engine("llama.cpp", "CPU, CUDA, Metal, Vulkan, HIP/ROCm, SYCL", "llama-server -m model.gguf --port 8080", 8080,
           "OpenAI /v1/chat/completions; /metrics with --metrics (throughput counters)",
           "GGUF (Q4_0, Q4_K_M, Q8_0, ...)", "one user, laptops, edge, any GPU maker, CPU+GPU split",
           "github.com/ggml-org/llama.cpp (tools/server/README.md)"),
    Engine("Ollama", "CPU, CUDA, ROCm, Metal; an MLX engine on Apple silicon (preview)",
           "ollama serve  (then: ollama run <model>)", 11434, "native /api/* and OpenAI /v1/*",
           "GGUF (library models mostly Q4_K_M)", "one person on a laptop; prototyping",
           "docs.ollama.com (openai-compatibility), ollama.com/blog/mlx-performance"),
    Engine("LM Studio", "Windows/Linux (llama.cpp), macOS Apple silicon (llama.cpp and MLX)",
           "lms server start  (or the desktop app)", 1234, "OpenAI-compatible", "GGUF, MLX",
           "desktop users, no command line", "lmstudio.ai/docs/api/openai-api"),
    Engine("MLX", "Apple silicon only", "mlx_lm.server --model <hf-id>  (not meant for production)", 8080,
           "OpenAI-like", "2-8 bit affine, default 4 bit in groups of 64 (4.5 bits a weight)", "one user on a Mac",
           "github.com/ml-explore/mlx-lm"),
    Engine("vLLM", "NVIDIA (compute capability >= 7.5), AMD ROCm, Intel XPU, x86/ARM CPUs; TPU via plugins",
           "vllm serve <model>", 8000, "OpenAI /v1/chat/completions, /v1/completions; /metrics",
           "AWQ, GPTQ (Marlin), FP8, INT8, bitsandbytes, NVFP4/MXFP4; GGUF experimental",
           "many users on GPU servers", "docs.vllm.ai (installation, online serving, quantization)"),
    Engine("SGLang", "NVIDIA, AMD, Xeon CPUs, TPU, Ascend",
           "sglang serve --model-path <model>  (older: python -m sglang.launch_server)", 30000,
           "OpenAI-compatible + native /generate", "FP8, FP4, INT4, AWQ, GPTQ",
           "many users, shared prefixes (RadixAttention)", "github.com/sgl-project/sglang, docs.sglang.io"),
    Engine("TensorRT-LLM", "NVIDIA only", "trtllm-serve <hf_model>  (PyTorch backend; no engine build step)", 8000,
           "OpenAI-compatible; /metrics (iteration stats)", "FP8, NVFP4, INT4/INT8 from ModelOpt checkpoints",
           "peak throughput on NVIDIA data-centre cards",
           "nvidia.github.io/TensorRT-LLM (tensorrt-backend-removal, trtllm-serve)"),
    Engine("TGI", "-", "-", 0, "-", "-", "migrating away: Hugging Face points to vLLM and SGLang for serving, "
           "llama.cpp and MLX for local use", "huggingface.co/docs/text-generation-inference",
           status="maintenance mode since December 2025"),
]}


@dataclass(frozen=True)
class Choice:
    """One cell of the decision table: the engine to start with, the weight format, and why."""

    engine: str  # a key of ENGINES
    weight_format: str  # a key of planner.FORMATS
    lesson: str  # the measured lesson behind the choice, with the chapter it came from
    also: tuple[str, ...] = ()  # engines that fit this cell as well


_BANDWIDTH = "decode reads every weight once a token (05): Q4_K_M reads ~3x fewer bytes than bf16, ~3x the tokens/s"
_BATCHING = "a decode step serves the whole batch for one read of the weights (07, 10): tokens/s grows with users"
_PAGED = "paged KV (06) and continuous batching (07) keep many users' caches in one pool"
DECISIONS: dict[tuple[str, str], Choice] = {
    ("laptop CPU", "one"): Choice("llama.cpp", "q4_k_m", _BANDWIDTH, ("Ollama", "LM Studio")),
    ("laptop CPU", "a team"): Choice("llama.cpp", "q4_k_m", "llama-server --parallel N batches a few users; "
                                     "prefill is compute-bound (05), so long prompts queue: keep the model small",
                                     ("Ollama",)),
    ("laptop CPU", "many"): Choice("vLLM", "awq", "a CPU's FLOP/s cannot prefill hundreds of prompts (05, 09): "
                                   "move to a GPU server"),
    ("Apple silicon", "one"): Choice("MLX", "mlx-4bit", "unified memory is the bandwidth (M2 Max 400 GB/s) and the "
                                     "capacity: " + _BANDWIDTH, ("LM Studio", "Ollama", "llama.cpp")),
    ("Apple silicon", "a team"): Choice("llama.cpp", "q4_k_m", "llama-server batches parallel slots; mlx_lm.server "
                                        "is not meant for production", ("Ollama", "LM Studio")),
    ("Apple silicon", "many"): Choice("vLLM", "awq", "one Mac's bandwidth is shared by every user: move to GPUs"),
    ("one consumer GPU", "one"): Choice("llama.cpp", "q4_k_m", "the weights must fit VRAM (planner): an 8B model "
                                        "in Q4_K_M fits 16 GB with room for KV; " + _BANDWIDTH,
                                        ("Ollama", "LM Studio")),
    ("one consumer GPU", "a team"): Choice("vLLM", "awq", _BATCHING, ("SGLang", "llama.cpp")),
    ("one consumer GPU", "many"): Choice("vLLM", "awq", _PAGED + "; users that fit = (VRAM - weights) / KV per "
                                         "user (planner)", ("SGLang",)),
    ("one data-centre GPU", "one"): Choice("vLLM", "fp8", "still bandwidth-bound: FP8 halves the bytes of bf16 "
                                           "(Hopper, Ada, Blackwell)", ("TensorRT-LLM", "SGLang")),
    ("one data-centre GPU", "a team"): Choice("vLLM", "fp8", _BATCHING, ("SGLang", "TensorRT-LLM")),
    ("one data-centre GPU", "many"): Choice("SGLang", "fp8", "many users sharing a system prompt: prefix caching "
                                            "(06) skips their shared prefill; " + _PAGED, ("vLLM", "TensorRT-LLM")),
    ("several GPUs", "one"): Choice("vLLM", "bf16", "a 70B model in bf16 (~131 GiB) fits no single 80 GB card "
                                    "(planner): split it with --tensor-parallel-size", ("SGLang",)),
    ("several GPUs", "a team"): Choice("vLLM", "fp8", "tensor parallel for the weights, batching for the users",
                                       ("SGLang", "TensorRT-LLM")),
    ("several GPUs", "many"): Choice("TensorRT-LLM", "fp8", "peak throughput on NVIDIA data-centre cards; vLLM and "
                                     "SGLang come close and are easier to run", ("vLLM", "SGLang")),
}


def decide(hardware: str, users: str) -> Choice:
    """The table's choice for `hardware` (one of HARDWARE) and `users` (one of USERS)."""
    if hardware not in HARDWARE:
        raise ValueError(f"hardware must be one of {HARDWARE}, got {hardware!r}")
    if users not in USERS:
        raise ValueError(f"users must be one of {USERS}, got {users!r}")
    return DECISIONS[hardware, users]


def placed_engines() -> set[str]:
    """Every engine the decision table names, as first choice or as an alternative."""
    return {name for c in DECISIONS.values() for name in (c.engine, *c.also)}


def decision_table(detail: bool = False):
    """Hardware x users as a DataFrame: "engine · format" per cell (with `detail`, one row per cell and the lesson)."""
    import pandas as pd

    if detail:
        return pd.DataFrame([{"hardware": h, "users": u, "engine": c.engine, "format": c.weight_format,
                              "also": ", ".join(c.also), "why": c.lesson} for (h, u), c in DECISIONS.items()])
    return pd.DataFrame({u: [f"{DECISIONS[h, u].engine} · {DECISIONS[h, u].weight_format}" for h in HARDWARE]
                         for u in USERS}, index=pd.Index(HARDWARE, name="hardware \\ users"))


def engine_table():
    """ENGINES as a DataFrame: runs on, start command, port, API, formats, status."""
    import pandas as pd

    return pd.DataFrame([{"engine": e.name, "runs on": e.runs_on, "start a server": e.start,
                          "port": e.port or "-", "API": e.api, "formats": e.formats, "status": e.status}
                         for e in ENGINES.values()]).set_index("engine")


# What each engine's /metrics calls the chapter-09 metrics (vLLM docs/design/metrics.md; llama.cpp
# tools/server/README.md, "GET /metrics", only with --metrics). None: not published; the client must time it.
METRICS = [  # (what, vLLM, llama-server)
    ("TTFT, a histogram", "vllm:time_to_first_token_seconds", None),
    ("ITL: every gap between outputs", "vllm:inter_token_latency_seconds", None),
    ("TPOT: one value per request, decode time / (tokens - 1)", "vllm:request_time_per_output_token_seconds", None),
    ("end-to-end latency", "vllm:e2e_request_latency_seconds", None),
    ("KV cache in use", "vllm:kv_cache_usage_perc", None),
    ("prompt tokens, a counter", "vllm:prompt_tokens_total", "llamacpp:prompt_tokens_total"),
    ("output tokens, a counter", "vllm:generation_tokens_total", "llamacpp:tokens_predicted_total"),
    ("average decode tokens/s", None, "llamacpp:predicted_tokens_seconds"),
    ("requests running", "vllm:num_requests_running", "llamacpp:requests_processing"),
    ("requests waiting", "vllm:num_requests_waiting", "llamacpp:requests_deferred"),
]
REMOVED_METRICS = {"vllm:time_per_output_token_seconds": "deprecated in 0.11, removed January 2026: "
                   "use vllm:inter_token_latency_seconds (it measured the same gaps)",
                   "vllm:gpu_cache_usage_perc": "now vllm:kv_cache_usage_perc"}


def gpus(device, n: int):
    """`n` copies of a `DeviceSpec` as one device, as tensor parallelism uses them: memory, bandwidth and FLOP/s
    add up (ideal; the all-reduce after each layer is not counted, so times are a lower bound)."""
    from .devices import DeviceSpec, find_device

    d = find_device(device)
    if n == 1:
        return d
    return DeviceSpec(f"{n}x {d.name}", n * d.memory_bytes, n * d.bandwidth, {k: n * v for k, v in d.flops.items()},
                      f"{n} x ({d.source}); tensor parallel, communication not counted", d.kind, d.vendor)
