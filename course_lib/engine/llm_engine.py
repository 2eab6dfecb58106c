"""`LLMEngine`: requests in, outputs out, one `step()` at a time.

    step():  speculator.add_drafts(...)        # optional: guessed tokens after each decoding sequence
             batch = scheduler.schedule()      # who runs, how many tokens each
             tokens = model_runner.run(batch)  # one packed forward + sampling
             self._postprocess(...)            # append tokens, detokenize, stop, free finished
             outputs -> each request's mailbox (OutputRouter); step() returns those of its own requests

Two ways to drive it:
  - one driver:   `add_request(...)`, then `step()` in a loop; each step returns the new outputs.
  - many callers: `add_requests(...)`, then `outputs(ids)`, which steps the engine until those
    requests finish. Any number of callers, in any threads, may do this at once: one lock
    serialises the steps, and the `OutputRouter` hands each caller exactly its own requests'
    outputs. `LLM.generate`, `LLM.stream` and a server use this way.
"""
from __future__ import annotations

import difflib
import itertools
import threading
from dataclasses import dataclass, field, fields
from typing import Iterator

from ..attention.paged import PagedKVCache
from ..checks import Integral, Real, invalid, number, with_param
from ..model import Transformer
from ..sampling import SamplingParams
from ..tokenizer import Tokenizer
from .block_manager import BlockManager
from .kv_budget import default_kv_cache_memory
from .model_runner import ModelRunner
from .output_router import OutputRouter
from .scheduler import ScheduledBatch, Scheduler, SchedulerConfig
from .sequence import RequestOutput, Sequence


@dataclass
class EngineConfig:
    """Serving knobs: KV memory, block size, per-step limits, prefix caching."""

    block_size: int = 16
    kv_cache_memory: int | float | None = None  # bytes, or a fraction of free GPU memory; None: see kv_budget
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024
    enable_prefix_caching: bool = True
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        at_least_1 = lambda v: v >= 1  # noqa: E731
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            setattr(self, name, number(f"EngineConfig.{name}", getattr(self, name), Integral, at_least_1,
                                       "an integer >= 1"))
        if self.max_model_len is not None:
            self.max_model_len = number("EngineConfig.max_model_len", self.max_model_len, Integral, at_least_1,
                                        "None or an integer >= 1")
        budget = self.kv_cache_memory
        if budget is not None:
            kind = Integral if isinstance(budget, Integral) else Real
            self.kv_cache_memory = number("EngineConfig.kv_cache_memory", budget, kind,
                                          at_least_1 if kind is Integral else lambda v: 0 < v <= 1,
                                          "None, bytes (an integer >= 1) or a fraction of free GPU memory in (0, 1]")
        if not isinstance(self.enable_prefix_caching, bool):
            raise invalid(TypeError, "EngineConfig.enable_prefix_caching", "True or False", self.enable_prefix_caching)

    @classmethod
    def from_options(cls, options: dict) -> "EngineConfig":
        """`EngineConfig(**options)`, but a misspelled option name is named, with the closest real one."""
        names = [f.name for f in fields(cls)]
        for key in options:
            if key not in names:
                close = difflib.get_close_matches(key, names, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise TypeError(f"unknown engine option {key!r}{hint} (the options are: {', '.join(names)})")
        return cls(**options)


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
    compile_seconds: float = 0.0  # time torch.compile took at start-up (`LLM(accel=True, compile_decode=True)`)
    cuda_graphs: int = 0  # decode graphs captured at start-up, one per batch-size bucket (accel on CUDA)
    graph_capture_seconds: float = 0.0
    spec_num_drafts: int = 0  # speculative decoding: verifications of drafted tokens
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0

    @property
    def spec_acceptance_rate(self) -> float | None:
        """The share of drafted tokens the model accepted, over the engine's life."""
        return self.spec_num_accepted_tokens / self.spec_num_draft_tokens if self.spec_num_draft_tokens else None

    @property
    def spec_mean_accepted_length(self) -> float | None:
        """Tokens emitted per verification: accepted drafts plus the model's own token."""
        return 1 + self.spec_num_accepted_tokens / self.spec_num_drafts if self.spec_num_drafts else None


class LLMEngine:
    """Continuous-batching engine over a paged KV cache.

    `accel`: a `course_lib.accel.Accelerator` whose kernels the model runner uses, or None (the reference).
    `speculator`: an `engine.speculative.Speculator` that drafts tokens for decoding sequences, or None.
    `attention`: an attention backend in place of the reference's or accel's (`course_lib.batch_invariant`)."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer, config: EngineConfig | None = None, accel=None,
                 speculator=None, attention=None):
        self.model, self.tokenizer, self.speculator = model, tokenizer, speculator
        self.config = config = config or EngineConfig()
        budget = config.kv_cache_memory
        if budget is None:  # what max_num_seqs x max_model_len can use, within the device's cap
            budget = default_kv_cache_memory(model.config, config.max_num_seqs, config.max_model_len,
                                             config.block_size, model.device, model.dtype)
        kv_cache = PagedKVCache.from_memory(model.config, budget, config.block_size, model.device, model.dtype)
        limit = min(model.config.max_position_embeddings, kv_cache.num_blocks * config.block_size)
        if config.max_model_len is not None and not 1 <= config.max_model_len <= limit:
            raise ValueError(f"max_model_len must be in [1, {limit}] (the model's context and the KV cache), "
                             f"got {config.max_model_len}")
        self.max_model_len = config.max_model_len or limit
        self.block_manager = BlockManager(kv_cache.num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens),
                                   self.block_manager)
        # last: with accel the runner captures the CUDA graphs (or compiles the decode step), seconds to minutes
        # of work that limits refused above would have wasted
        self.model_runner = ModelRunner(model, kv_cache, accel, attention, speculator)
        self.requests: dict[str, Sequence] = {}
        self.router = OutputRouter()
        self.stats = EngineStats(**(accel.stats() if accel is not None else {}))
        self._ids = itertools.count()
        self._lock = threading.RLock()  # one step, add or abort at a time, whichever thread asks

    @property
    def kv_cache(self) -> PagedKVCache:
        return self.model_runner.kv_cache

    # ---- requests in --------------------------------------------------------------------------
    def check_request(self, prompt: str | list[int], params: SamplingParams) -> list[int]:
        """Check a prompt (text or token ids) and its params against this model; return its token ids.

        Raises TypeError/ValueError naming what is wrong, its `param` set to the field ("prompt", "stop_token_ids",
        "logit_bias"), so bad input never reaches torch (an id outside the vocabulary is an IndexError on the CPU
        and a device-side assert on a GPU).
        """
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        vocab = self.model.config.vocab_size
        try:
            if isinstance(prompt, str):
                ids = self.tokenizer.encode(prompt)
            elif isinstance(prompt, (list, tuple)):
                allowed = f"a prompt of token ids must hold integers in [0, {vocab}) (the vocabulary)"
                if not all(isinstance(t, Integral) and not isinstance(t, bool) for t in prompt):
                    raise TypeError(f"{allowed}, got {[t for t in prompt if not isinstance(t, Integral)][:1]!r}")
                ids = [int(t) for t in prompt]
                if not all(0 <= t < vocab for t in ids):
                    raise ValueError(f"{allowed}, got {[t for t in ids if not 0 <= t < vocab][0]}")
            else:
                raise TypeError(f"a prompt must be a str or a list of token ids, got {type(prompt).__name__}")
            if not ids:
                raise ValueError("prompt is empty: it must hold at least one token")
            if len(ids) >= self.max_model_len:
                raise ValueError(f"prompt is {len(ids)} tokens, but the context window (max_model_len) is "
                                 f"{self.max_model_len}: the prompt must be shorter than {self.max_model_len} tokens")
        except (TypeError, ValueError) as e:
            with_param(e, "prompt")
            raise
        if any(t >= vocab for t in params.stop_token_ids):
            raise invalid(ValueError, "SamplingParams.stop_token_ids", f"ids in [0, {vocab}) (the vocabulary)",
                          params.stop_token_ids)
        outside = {t: b for t, b in (params.logit_bias or {}).items() if t >= vocab}
        if outside:
            raise invalid(ValueError, "SamplingParams.logit_bias", f"token ids in [0, {vocab}) (the vocabulary)",
                          outside)
        return ids

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None) -> str:
        """Queue a prompt (text or token ids) for the driver of `step()`; returns its request id.

        Bad input raises before anything is queued.
        """
        seq = self._new_sequence(prompt, params, request_id, arrival_time)
        self._enqueue([seq], claimed=False)
        return seq.request_id

    def add_requests(self, prompts: list[str | list[int]], params: list[SamplingParams]) -> list[str]:
        """Queue prompts whose outputs are read with `outputs(ids)`; returns their request ids.

        All are checked before any is queued: one bad prompt refuses the whole batch, and the
        engine is left as it was.
        """
        if len(prompts) != len(params):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} SamplingParams")
        seqs = [self._new_sequence(p, sp) for p, sp in zip(prompts, params)]
        self._enqueue(seqs, claimed=True)
        return [seq.request_id for seq in seqs]

    def _new_sequence(self, prompt, params, request_id=None, arrival_time=None) -> Sequence:
        params = SamplingParams() if params is None else params
        ids = self.check_request(prompt, params)
        if request_id is not None and not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
        if arrival_time is not None and (not isinstance(arrival_time, Real) or isinstance(arrival_time, bool)):
            raise TypeError(f"arrival_time must be a number (seconds, time.perf_counter()), got {arrival_time!r}")
        request_id = str(next(self._ids)) if request_id is None else request_id
        text = prompt if isinstance(prompt, str) else None
        return Sequence(request_id, ids, params, self.tokenizer, text, arrival_time, self.max_model_len)

    def _enqueue(self, seqs: list[Sequence], claimed: bool) -> None:
        with self._lock:
            ids = [seq.request_id for seq in seqs]
            taken = [rid for rid in ids if rid in self.requests or self.router.is_open(rid)]
            if taken or len(set(ids)) < len(ids):
                raise ValueError(f"request id {(taken or ids)[0]!r} is already in use")
            for seq in seqs:
                self.requests[seq.request_id] = seq
                self.router.open(seq.request_id, claimed)
                self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> None:
        """Stop a request now; its KV blocks return to the pool at once. A waiting reader gets an "abort" output."""
        with self._lock:
            seq = self.requests.pop(request_id, None)
            if seq is None:
                return
            seq.abort()
            out = seq.output(seq.take_delta())  # before its blocks are freed (that resets num_cached_tokens)
            self.scheduler.finish(seq)
            self._release(request_id)
            if self.router.is_claimed(request_id):
                self.router.put(out)
            else:
                self.router.close(request_id)

    def abort_all(self) -> None:
        """Abort every request, waiting or running (a server whose engine failed stops them all)."""
        with self._lock:
            for request_id in list(self.requests):
                self.abort_request(request_id)

    def has_unfinished_requests(self) -> bool:
        """Whether any request still runs or waits, or has an output that `step()` has not returned yet."""
        with self._lock:
            return self.scheduler.has_unfinished() or self.router.has_unclaimed()

    # ---- outputs out --------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduling step; return the new output of every request added with `add_request`."""
        with self._lock:
            self._step()
            return self.router.take_unclaimed()

    def outputs(self, request_ids: list[str]) -> Iterator[RequestOutput]:
        """Yield new outputs of `request_ids` (from `add_requests`) until all finish, stepping when none is ready.

        Safe for many callers in many threads: whoever needs an output and finds none runs the next
        step, which advances every running request and leaves each output in its own mailbox.
        A caller that stops early, or an error, aborts its unfinished requests.
        """
        pending = dict.fromkeys(request_ids)
        try:
            with self._lock:
                unknown = [rid for rid in pending if not self.router.is_claimed(rid)]
                if unknown:
                    raise ValueError(f"request {unknown[0]!r} was not added with add_requests() or is finished")
            while pending:
                with self._lock:
                    ready = [out for rid in pending if (out := self.router.take(rid)) is not None]
                    if not ready:
                        if not self.scheduler.has_unfinished():  # cannot happen; never spin on it
                            raise RuntimeError(f"requests {list(pending)} wait for outputs, but nothing runs")
                        self._step()
                        continue
                for out in ready:
                    if out.finished:
                        del pending[out.request_id]
                    yield out
        finally:
            for rid in pending:
                self.abort_request(rid)
                self.router.close(rid)

    def _release(self, request_id: str) -> None:
        """Forget a finished or aborted request's sampling state (its RNG, its draft model's cache)."""
        self.model_runner.sampler.release(request_id)
        if self.speculator is not None:
            self.speculator.release(request_id)

    def _step(self) -> None:
        """Schedule, run the model, post-process; outputs go to their requests' mailboxes. Hold the lock."""
        proposed = []
        if self.speculator is not None:  # drafts first: the scheduler gives them slots and computes them
            proposed = self.speculator.add_drafts(self.scheduler.running, self.model_runner.sampler, self.model.device)
        batch = self.scheduler.schedule()
        if proposed:
            self.speculator.fit_drafts(batch, proposed, self.block_manager)
        if not batch.seqs:
            if self.scheduler.waiting and not self.scheduler.running:
                raise RuntimeError("the next request does not fit in the free KV cache; raise kv_cache_memory")
            return
        try:
            tokens = self.model_runner.run(batch)
        except BaseException:
            for seq in batch.seqs:  # nothing left allocated after an error
                self.abort_request(seq.request_id)
            raise
        for out in self._postprocess(batch, tokens):
            self.router.put(out)

    def _postprocess(self, batch: ScheduledBatch, tokens: list[int | list[int] | None]) -> list[RequestOutput]:
        outputs = []
        for seq, n, token in zip(batch.seqs, batch.num_tokens, tokens):
            if isinstance(token, list):  # verified drafts: the tokens they give, at once
                self._accept(seq, n, token)
            else:
                is_decode = seq.num_computed_tokens >= seq.num_prompt_tokens and n == 1
                self.stats.decode_tokens += n if is_decode else 0
                self.stats.prefill_tokens += 0 if is_decode else n
                seq.num_computed_tokens += n
                self.block_manager.cache_full_blocks(seq, seq.num_computed_tokens)
                if token is None:
                    self.stats.partial_prefills += 1  # a prompt chunk: nothing to sample yet
                    continue
                seq.append_token(token)
            outputs.append(seq.output(seq.take_delta()))  # before a finish frees the blocks (and num_cached_tokens)
            if seq.is_finished:
                self.scheduler.finish(seq)
                self.requests.pop(seq.request_id, None)
                self._release(seq.request_id)
        s = self.stats
        s.steps += 1
        s.batch_sizes.append(len(batch))
        s.batch_tokens.append(batch.total_tokens)
        s.preemptions = self.scheduler.num_preemptions
        s.prefix_cache_hit_rate = self.block_manager.prefix_cache_hit_rate
        s.blocks_used, s.blocks_free = self.block_manager.num_used_blocks, self.block_manager.num_free_blocks
        return outputs

    def _accept(self, seq: Sequence, n: int, tokens: list[int]) -> None:
        """A sequence that verified its drafts: keep the K/V of its last token and of the accepted drafts, append
        the tokens (each through the stop checks), give back the blocks the rejected drafts held."""
        drafts = seq.drop_drafts()
        accepted = len(tokens) - 1  # the tokens are the accepted drafts and one of the model's own
        seq.metrics.record_speculation(len(drafts), accepted)
        s = self.stats
        s.decode_tokens += n
        s.spec_num_drafts, s.spec_num_draft_tokens = s.spec_num_drafts + 1, s.spec_num_draft_tokens + len(drafts)
        s.spec_num_accepted_tokens += accepted
        seq.num_computed_tokens += 1 + accepted
        for token in tokens:
            seq.append_token(token)
            if seq.is_finished:
                break
        self.block_manager.cache_full_blocks(seq, seq.num_computed_tokens)
        self.block_manager.trim(seq)
