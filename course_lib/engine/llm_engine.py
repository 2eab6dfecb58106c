"""`LLMEngine`: requests in, outputs out, one `step()` at a time.

    step():  batch = scheduler.schedule()                      # who runs, how many tokens each (and drafts)
             tokens = model_runner.run(batch)                  # one packed forward + sampling
             outputs = scheduler.update_from_output(...)       # append tokens, stop, accept drafts, free finished
             outputs -> each request's mailbox (`OutputRouter`)

One driver calls `add_request(...)`, then `step()` in a loop. Many callers (`LLM.generate`, `LLM.stream`, a
server, in any threads) call `add_requests(...)`, then `outputs(ids)`, which steps the engine until those
requests finish: one lock serialises the steps, and the router hands each caller its own requests' outputs.
"""
from __future__ import annotations

import itertools
import threading
from typing import Iterator

from ..attention.paged import PagedKVCache
from ..model import Transformer
from ..sampling import SamplingParams
from ..tokenizer import Tokenizer
from .block_manager import BlockManager
from .config import EngineConfig
from .inputs import check_request, check_request_id
from .kv_budget import kv_pool
from .metrics import EngineStats
from .model_runner import ModelRunner
from .output_router import OutputRouter
from .scheduler import Scheduler, SchedulerConfig
from .sequence import RequestOutput, Sequence

__all__ = ["EngineConfig", "EngineStats", "LLMEngine"]


class LLMEngine:
    """Continuous-batching engine over a paged KV cache. `accel`: a `course_lib.accel.Accelerator`, or None (the
    reference); `speculator`: a `Speculator`, or None; `attention`: a backend in place of the reference's."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer, config: EngineConfig | None = None, accel=None,
                 speculator=None, attention=None):
        self.model, self.tokenizer, self.speculator = model, tokenizer, speculator
        self.config = config = config or EngineConfig()
        # the KV pool in blocks, and the context window it serves (a max_model_len it cannot hold is refused)
        num_blocks, self.max_model_len = kv_pool(model.config, config, model.device, model.dtype)
        kv_cache = PagedKVCache(model.config, num_blocks, config.block_size, model.device, model.dtype)
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
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

    def check_request(self, prompt: str | list[int], params: SamplingParams) -> list[int]:
        """Check a prompt (text or token ids) and its params against this model; return its token ids."""
        return check_request(prompt, params, self.tokenizer, self.model.config.vocab_size, self.max_model_len)

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None) -> str:
        """Queue a prompt (text or token ids) for the driver of `step()`; returns its id. Bad input queues nothing."""
        seq = self._new_sequence(prompt, params, request_id, arrival_time)
        self._enqueue([seq], claimed=False)
        return seq.request_id

    def add_requests(self, prompts: list[str | list[int]], params: list[SamplingParams]) -> list[str]:
        """Queue prompts whose outputs are read with `outputs(ids)`; returns their request ids.
        All are checked before any is queued: one bad prompt refuses the whole batch."""
        if len(prompts) != len(params):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} SamplingParams")
        seqs = [self._new_sequence(p, sp) for p, sp in zip(prompts, params)]
        self._enqueue(seqs, claimed=True)
        return [seq.request_id for seq in seqs]

    def _new_sequence(self, prompt, params, request_id=None, arrival_time=None) -> Sequence:
        params = SamplingParams() if params is None else params
        ids = self.check_request(prompt, params)
        check_request_id(request_id, arrival_time)
        request_id = str(next(self._ids)) if request_id is None else request_id
        text = prompt if isinstance(prompt, str) else None
        return Sequence(request_id, ids, params, self.tokenizer, text, arrival_time, self.max_model_len)

    def _enqueue(self, seqs: list[Sequence], claimed: bool) -> None:
        with self._lock:
            self.router.open([seq.request_id for seq in seqs], claimed, in_use=self.requests)
            for seq in seqs:
                self.requests[seq.request_id] = seq
                self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> None:
        """Stop a request now; its KV blocks return to the pool at once. A waiting reader gets an "abort" output."""
        with self._lock:
            seq = self.requests.get(request_id)
            if seq is None:
                return
            seq.abort()
            out = seq.output(seq.take_delta())  # before its blocks are freed (that resets num_cached_tokens)
            self.scheduler.finish(seq)
            self._forget(request_id)
            self.router.put_final(out)

    def abort_all(self) -> None:
        """Abort every request, waiting or running (a server whose engine failed stops them all)."""
        with self._lock:
            for request_id in list(self.requests):
                self.abort_request(request_id)

    def has_unfinished_requests(self) -> bool:
        """Whether any request still runs or waits, or has an output that `step()` has not returned yet."""
        with self._lock:
            return self.scheduler.has_unfinished() or self.router.has_unclaimed()

    def step(self) -> list[RequestOutput]:
        """Run one scheduling step; return the new output of every request added with `add_request`."""
        with self._lock:
            self._step()
            return self.router.take_unclaimed()

    def outputs(self, request_ids: list[str]) -> Iterator[RequestOutput]:
        """Yield new outputs of `request_ids` (from `add_requests`) until all finish, stepping when none is ready.
        Safe for many callers in many threads: whoever needs an output and finds none runs the next step, which
        leaves each output in its own mailbox. A caller that stops early, or an error, aborts its unfinished ones."""
        pending = dict.fromkeys(request_ids)
        try:
            with self._lock:
                self.router.check_claimed(pending)
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

    def _step(self) -> None:
        """Schedule, run the model, update the requests, route their outputs. Hold the lock."""
        batch = self.scheduler.schedule() if self.speculator is None else \
            self.speculator.schedule(self.scheduler, self.model_runner.sampler, self.model.device)
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
        for out in self.scheduler.update_from_output(batch, tokens, self.stats):
            if out.finished:
                self._forget(out.request_id)
            self.router.put(out)

    def _forget(self, request_id: str) -> None:
        """Drop a finished or aborted request and its sampling state (its RNG, its draft model's cache)."""
        self.requests.pop(request_id, None)
        self.model_runner.sampler.release(request_id)
        if self.speculator is not None:
            self.speculator.release(request_id)
