"""`LLMEngine`: requests in, outputs out, one `step()` at a time.

    step():  batch = scheduler.schedule()      # who runs, how many tokens each
             tokens = model_runner.run(batch)  # one packed forward + sampling
             return self._postprocess(...)     # append tokens, detokenize, stop, free finished

`LLM` (engine/llm.py) drives it for offline use; a server would call `add_request` as requests
arrive and `step()` in a loop.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field


from ..attention.paged import PagedKVCache
from ..model import Transformer
from ..sampling import SamplingParams
from ..tokenizer import Tokenizer
from .block_manager import BlockManager
from .model_runner import ModelRunner
from .scheduler import ScheduledBatch, Scheduler, SchedulerConfig
from .sequence import RequestOutput, Sequence

CPU_KV_CACHE_BYTES = 512 * 2**20  # default KV budget on the CPU
GPU_KV_CACHE_FRACTION = 0.5  # default on CUDA: this share of the free GPU memory


@dataclass
class EngineConfig:
    """Serving knobs: KV memory, block size, per-step limits, prefix caching."""

    block_size: int = 16
    kv_cache_memory: int | float | None = None  # bytes, or a fraction of free GPU memory; None = default
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024
    enable_prefix_caching: bool = True
    max_model_len: int | None = None


@dataclass
class EngineStats:
    """Counters a serving team watches."""

    steps: int = 0
    batch_sizes: list[int] = field(default_factory=list)  # sequences per step
    batch_tokens: list[int] = field(default_factory=list)  # tokens per step
    prefill_tokens: int = 0  # prompt (and recomputed) tokens run through the model
    decode_tokens: int = 0
    preemptions: int = 0
    partial_prefills: int = 0  # prompt chunks that did not finish their prompt (chunked prefill)
    prefix_cache_hit_rate: float = 0.0
    blocks_used: int = 0
    blocks_free: int = 0


class LLMEngine:
    """Continuous-batching engine over a paged KV cache."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer, config: EngineConfig | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.config = config = config or EngineConfig()
        budget = config.kv_cache_memory
        if budget is None:
            budget = GPU_KV_CACHE_FRACTION if model.device.type == "cuda" else CPU_KV_CACHE_BYTES
        kv_cache = PagedKVCache.from_memory(model.config, budget, config.block_size, model.device, model.dtype)
        self.block_manager = BlockManager(kv_cache.num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens),
                                   self.block_manager)
        self.model_runner = ModelRunner(model, kv_cache)
        limit = min(model.config.max_position_embeddings, kv_cache.num_blocks * config.block_size)
        if config.max_model_len is not None and not 1 <= config.max_model_len <= limit:
            raise ValueError(f"max_model_len must be in [1, {limit}] (the model's context and the KV cache), "
                             f"got {config.max_model_len}")
        self.max_model_len = config.max_model_len or limit
        self.requests: dict[str, Sequence] = {}
        self.stats = EngineStats()
        self._ids = itertools.count()

    @property
    def kv_cache(self) -> PagedKVCache:
        return self.model_runner.kv_cache

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None) -> str:
        """Queue a prompt (text or token ids); returns its request id. Bad input raises before anything is queued."""
        params = params or SamplingParams()
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
        request_id = str(next(self._ids)) if request_id is None else request_id
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        seq = Sequence(request_id, ids, params, self.tokenizer, text, arrival_time, self.max_model_len)
        self.requests[request_id] = seq
        self.scheduler.add(seq)
        return request_id

    def abort_request(self, request_id: str) -> None:
        """Stop a request now; its KV blocks return to the pool at once."""
        seq = self.requests.pop(request_id, None)
        if seq is not None:
            self.scheduler.finish(seq)
            seq.abort()
            self.model_runner.sampler.release(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """Run one scheduling step; return an output for every request that produced a token."""
        batch = self.scheduler.schedule()
        if not batch.seqs:
            if self.scheduler.waiting and not self.scheduler.running:
                raise RuntimeError("the next request does not fit in the free KV cache; raise kv_cache_memory")
            return []
        try:
            tokens = self.model_runner.run(batch)
        except BaseException:
            for seq in batch.seqs:  # nothing left allocated after an error
                self.abort_request(seq.request_id)
            raise
        return self._postprocess(batch, tokens)

    def _postprocess(self, batch: ScheduledBatch, tokens: list[int | None]) -> list[RequestOutput]:
        outputs = []
        for seq, n, token in zip(batch.seqs, batch.num_tokens, tokens):
            is_decode = seq.num_computed_tokens >= seq.num_prompt_tokens and n == 1
            self.stats.decode_tokens += n if is_decode else 0
            self.stats.prefill_tokens += 0 if is_decode else n
            seq.num_computed_tokens += n
            self.block_manager.cache_full_blocks(seq, seq.num_computed_tokens)
            if token is None:
                self.stats.partial_prefills += 1  # a prompt chunk: nothing to sample yet
                continue
            seq.append_token(token)
            if seq.is_finished:
                self.scheduler.finish(seq)
                self.requests.pop(seq.request_id, None)
                self.model_runner.sampler.release(seq.request_id)
            outputs.append(seq.output(seq.take_delta()))
        s = self.stats
        s.steps += 1
        s.batch_sizes.append(len(batch))
        s.batch_tokens.append(batch.total_tokens)
        s.preemptions = self.scheduler.num_preemptions
        s.prefix_cache_hit_rate = self.block_manager.prefix_cache_hit_rate
        s.blocks_used, s.blocks_free = self.block_manager.num_used_blocks, self.block_manager.num_free_blocks
        return outputs
