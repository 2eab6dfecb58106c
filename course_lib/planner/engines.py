"""Choosing a local deployment (本地部署选型): which engine, in which weight format, on which hardware, for whom.

    from course_lib.planner.engines import ENGINES, DECISIONS, decide, decision_table, engine_table
    decide("one consumer GPU", "one")        # Choice(engine='llama.cpp', weight_format='q4_k_m', ...)
    decision_table()                          # hardware x users, a pandas DataFrame
    FACTORS, VENDORS                          # what else decides (MoE, context, KV dtype, OS); AMD, Intel, Ascend

`ENGINES` holds what each engine runs on, how a server starts, its API and formats (checked December 2026
against each project's documentation, in `Engine.source`). `DECISIONS` is the course's advice: for each kind of
hardware and each number of users, an engine, a weight format (a name in `planner.FORMATS`) and the measured
lesson of chapters 05-10 and 13 behind the choice. Several GPUs split by their link: over PCIe one model copy a
card (or pipeline parallel), over NVLink tensor parallel (chapter 13). Where the hardware cannot serve that many
users, the cell says so (`Choice.enough`). Advice, not a law: the chapter's exercises check against it.
"""
from __future__ import annotations

from dataclasses import dataclass

HARDWARE = ("laptop CPU", "Apple silicon", "one consumer GPU", "one data-centre GPU", "several GPUs over PCIe",
            "several GPUs over NVLink")  # chapter 13: tensor parallelism needs a fast link between the cards
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
    Engine("llama.cpp", "CPU, CUDA, Metal, Vulkan, HIP/ROCm, SYCL",
           "llama-server -m model.gguf --port 8080  (pass --port: the default is changing)", 8080,
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
    Engine("vLLM", "Linux (and WSL) only: NVIDIA (compute capability >= 7.5), AMD ROCm, Intel XPU, x86/ARM CPUs; "
           "TPU, Ascend via plugins",
           "vllm serve <model>", 8000, "OpenAI /v1/chat/completions, /v1/completions; /metrics",
           "AWQ, GPTQ (Marlin), FP8, INT8, bitsandbytes, NVFP4/MXFP4; GGUF experimental",
           "many users on GPU servers",
           "docs.vllm.ai (installation: Linux only, not native on macOS or Windows; online serving, quantization)"),
    Engine("SGLang", "NVIDIA, AMD, Xeon CPUs, TPU, Ascend",
           "sglang serve --model-path <model>  (older: python -m sglang.launch_server)", 30000,
           "OpenAI-compatible + native /generate", "FP8, FP4, INT4, AWQ, GPTQ",
           "many users, shared prefixes (RadixAttention), structured generation",
           "github.com/sgl-project/sglang, docs.sglang.io; Zheng et al. 2023, arXiv:2312.07104"),
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
    enough: bool = True  # False: the best this hardware does, and it does not serve that many users


_BANDWIDTH = "decode reads every weight once a token (05): Q4_K_M reads ~3x fewer bytes than bf16, ~3x the tokens/s"
_BATCHING = "a decode step serves the whole batch for one read of the weights (07, 10): tokens/s grows with users"
_PAGED = "paged KV (06) and continuous batching (07) keep many users' caches in one pool"
_LINUX = "vLLM runs on Linux and WSL, not natively on macOS or Windows (docs.vllm.ai, installation)"
_PARALLEL = "llama-server --port 8080 --parallel 4 batches 4 slots (continuous batching, tools/server/README.md)"
_TOO_FEW = ("this hardware does not serve hundreds: prefill is compute-bound (05) and a CPU's FLOP/s prefill a few "
            "prompts a second, while every user shares one memory bus (09); for a service, Linux GPU servers "
            "(the rows below)")
_PCIE = ("over PCIe an all-reduce costs as much as the compute (13), so no tensor parallelism: one model copy "
         "per card")
_NVLINK = "NVLink makes tensor parallelism's all-reduces cheap (13)"
DECISIONS: dict[tuple[str, str], Choice] = {
    ("laptop CPU", "one"): Choice("llama.cpp", "q4_k_m", _BANDWIDTH, ("Ollama", "LM Studio")),
    ("laptop CPU", "a team"): Choice("llama.cpp", "q4_k_m", _PARALLEL + "; prefill is compute-bound (05), so long "
                                     "prompts queue: keep the model small", ("Ollama",)),
    ("laptop CPU", "many"): Choice("llama.cpp", "q4_k_m", f"{_PARALLEL} for the few it can; {_TOO_FEW}; "
                                   f"{_LINUX}", enough=False),
    ("Apple silicon", "one"): Choice("MLX", "mlx-4bit", "unified memory is the bandwidth (M2 Max 400 GB/s) and the "
                                     "capacity: " + _BANDWIDTH, ("LM Studio", "Ollama", "llama.cpp")),
    ("Apple silicon", "a team"): Choice("llama.cpp", "q4_k_m", _PARALLEL + "; mlx_lm.server is not meant for "
                                        "production", ("Ollama", "LM Studio")),
    ("Apple silicon", "many"): Choice("llama.cpp", "q4_k_m", f"{_LINUX}: on a Mac, {_PARALLEL}; one Mac's 400 GB/s "
                                      f"is shared by every user, and {_TOO_FEW}", enough=False),
    ("one consumer GPU", "one"): Choice("llama.cpp", "q4_k_m", "the weights must fit VRAM (planner): an 8B model "
                                        "in Q4_K_M fits 16 GB with room for KV; " + _BANDWIDTH,
                                        ("Ollama", "LM Studio")),
    ("one consumer GPU", "a team"): Choice("vLLM", "awq", _BATCHING + "; on Windows without WSL: " + _PARALLEL,
                                           ("SGLang", "llama.cpp")),
    ("one consumer GPU", "many"): Choice("vLLM", "awq", _PAGED + "; users that fit = (VRAM - weights) / KV per "
                                         "user (planner): KV in FP8 (--kv-cache-dtype fp8) doubles them", ("SGLang",)),
    ("one data-centre GPU", "one"): Choice("vLLM", "fp8", "still bandwidth-bound: FP8 halves the bytes of bf16 "
                                           "(Hopper, Ada, Blackwell)", ("TensorRT-LLM", "SGLang")),
    ("one data-centre GPU", "a team"): Choice("vLLM", "fp8", _BATCHING, ("SGLang", "TensorRT-LLM")),
    ("one data-centre GPU", "many"): Choice("SGLang", "fp8", "both cache shared prefixes (06); SGLang adds "
                                            "cache-aware scheduling (RadixAttention: requests with the longest "
                                            "cached prefix first, so shared prefixes stay cached under load) and a "
                                            "structured-generation language for multi-call programs "
                                            "(arXiv:2312.07104); plain chat: vLLM is as good",
                                            ("vLLM", "TensorRT-LLM")),
    ("several GPUs over PCIe", "one"): Choice("llama.cpp", "q4_k_m", "a model too big for one card: split its layers "
                                              "(--split-mode layer, the default; pipeline parallel, 13): one hidden "
                                              "vector a token crosses PCIe", ("vLLM",)),
    ("several GPUs over PCIe", "a team"): Choice("vLLM", "awq", _PCIE + " (--data-parallel-size N) if it fits one; "
                                                 "else --pipeline-parallel-size N", ("SGLang", "llama.cpp")),
    ("several GPUs over PCIe", "many"): Choice("vLLM", "awq", _PCIE + " (--data-parallel-size N): throughput grows "
                                               "with the copies, which never talk (13); 4-bit so one copy fits a "
                                               "card", ("SGLang",)),
    ("several GPUs over NVLink", "one"): Choice("vLLM", "bf16", "a 70B model in bf16 (141 GB = 131 GiB) fits no "
                                                "single 80 GB card (planner): " + _NVLINK + ", so "
                                                "--tensor-parallel-size N also cuts each token's time", ("SGLang",)),
    ("several GPUs over NVLink", "a team"): Choice("vLLM", "fp8", "tensor parallel over NVLink for the weights, "
                                                   "batching for the users", ("SGLang", "TensorRT-LLM")),
    ("several GPUs over NVLink", "many"): Choice("TensorRT-LLM", "fp8", "peak throughput on NVIDIA data-centre "
                                                 "cards: tensor parallel inside the NVLink domain, data parallel "
                                                 "for more users; vLLM and SGLang come close and are easier to run",
                                                 ("vLLM", "SGLang")),
}

# What else decides, beyond hardware and users: (factor, what it changes, where it is stated). Chapter 11 shows them.
FACTORS = [
    ("mixture of experts (MoE)", "a token reads only its active experts (e.g. 37B of DeepSeek-V3's 671B), so decode "
     "speed follows the active bytes while memory must hold all of them; llama.cpp's --cpu-moe / --n-cpu-moe N keep "
     "(N layers') expert weights in CPU RAM and the rest on the GPU",
     "llama.cpp tools/server/README.md (--cpu-moe, --n-cpu-moe; added in PR #15077), docs/moe-cache.md"),
    ("context length", "the KV cache grows with tokens x users (06): at long contexts it, not the weights, decides "
     "the users that fit and the card", "chapter 06; the planner's max_concurrency"),
    ("KV-cache quantization", "an 8-bit KV cache halves its bytes, so twice the users or the context fit: vLLM "
     "--kv-cache-dtype fp8, llama-server --port 8080 --cache-type-k q8_0 --cache-type-v q8_0",
     "docs.vllm.ai (quantized KV cache); llama.cpp tools/server/README.md"),
    ("operating system", "vLLM, SGLang and TensorRT-LLM serve from Linux (vLLM also in WSL), not natively on macOS "
     "or Windows: there, llama.cpp, Ollama, LM Studio, MLX", "docs.vllm.ai (installation)"),
]

# Beyond NVIDIA, Apple and CPUs: what serves there (one line each; "unsure" where the support is young or thin).
VENDORS = {
    "AMD (Instinct, Radeon)": ("vLLM on ROCm, SGLang on ROCm; llama.cpp (HIP/ROCm, Vulkan) for one user",
                               "docs.vllm.ai (installation, GPU: ROCm); docs.sglang.io (AMD GPUs)"),
    "Intel (Arc, Data Center GPU Max, Xeon)": ("vLLM on Intel XPU; SGLang on Xeon CPUs; OpenVINO (Model Server) "
                                               "(unsure: not checked here); llama.cpp (SYCL, Vulkan); IPEX-LLM is "
                                               "archived by Intel", "docs.vllm.ai (installation, GPU: XPU); "
                                               "github.com/intel/ipex-llm README (archived)"),
    "Huawei Ascend (NPU)": ("vLLM-Ascend (the vLLM community's hardware plugin), MindIE (Huawei's own), SGLang",
                            "docs.vllm.ai/projects/ascend; hiascend.com (MindIE); docs.sglang.io"),
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
    """Hardware x users as a DataFrame: "engine · format" per cell, "(not enough)" where the hardware does not serve
    that many users (with `detail`, one row per cell and the lesson)."""
    import pandas as pd

    if detail:
        return pd.DataFrame([{"hardware": h, "users": u, "engine": c.engine, "format": c.weight_format,
                              "also": ", ".join(c.also), "enough": c.enough, "why": c.lesson}
                             for (h, u), c in DECISIONS.items()])
    return pd.DataFrame({u: [cell_text(h, u) for h in HARDWARE] for u in USERS},
                        index=pd.Index(HARDWARE, name="hardware \\ users"))


def cell_text(hardware: str, users: str) -> str:
    """ "engine · format" for one cell; "(not enough)" where the hardware does not serve that many users."""
    c = decide(hardware, users)
    return f"{c.engine} · {c.weight_format}" + ("" if c.enough else " (not enough)")


def engine_table():
    """ENGINES as a DataFrame: runs on, start command, port, API, formats, status."""
    import pandas as pd

    return pd.DataFrame([{"engine": e.name, "runs on": e.runs_on, "start a server": e.start,
                          "port": f"{e.port} (--port)" if "--port" in e.start else e.port or "-", "API": e.api,
                          "formats": e.formats, "status": e.status}
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
