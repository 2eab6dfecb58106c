"""`AsyncEngine`: the engine behind an asyncio server. One thread steps it; each request awaits its own queue.

    HTTP handler (event loop)           engine thread
    ------------------------           -------------
    add_request(prompt) ──────────────► step() while anything runs:
    async for out in generate(...):  ◄── outputs of every running request, each put on its request's queue
        send out.delta to the client
    client gone ─► abort_request(id)    its KV blocks return to the pool at once

vLLM's `AsyncLLM` has the same shape. Steps, adds and aborts take the engine's lock, so they run in a
worker thread (`asyncio.to_thread`) and never block the event loop while a step runs.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator

from ..engine.llm_engine import LLMEngine
from ..engine.sequence import RequestOutput
from ..sampling import SamplingParams

log = logging.getLogger("course_lib.serve")


class EngineDead(RuntimeError):
    """The engine failed while stepping; the request that was waiting on it cannot finish."""


class AsyncEngine:
    """Serves `generate` calls from any number of coroutines on one `LLMEngine`, batched step by step."""

    def __init__(self, engine: LLMEngine, start_thread: bool = True):
        """`start_thread=False`: the caller runs `run()` itself, in the thread that loaded the model.

        Why that matters on the CPU: PyTorch's OpenMP workers belong to the thread that first ran an
        op. Stepping from a second thread starts a second team, and with more threads than cores
        libgomp stops spinning between ops, so every step is slower (benchmarks/RESULTS.md).
        `python -m course_lib.serve` therefore steps the engine in its main thread and runs uvicorn in another.
        """
        self.engine = engine
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._wake = threading.Event()  # set when a request arrives or at shutdown
        self._stopped = False
        self._thread = None
        if start_thread:
            self._thread = threading.Thread(target=self.run, name="course_lib-engine", daemon=True)
            self._thread.start()

    async def generate(self, prompt: str | list[int], params: SamplingParams,
                       request_id: str) -> AsyncIterator[RequestOutput]:
        """Yield the request's outputs as steps produce them, until it finishes.

        Bad input raises before anything is queued. Leaving early (a client that disconnects, a
        cancelled task) aborts the request and frees its KV blocks.
        """
        if self._stopped:
            raise EngineDead("the server is shutting down")
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = (asyncio.get_running_loop(), queue)
        finished = False
        try:
            await asyncio.to_thread(self.engine.add_request, prompt, params, request_id)
            self._wake.set()
            while not finished:
                out = await queue.get()
                if isinstance(out, BaseException):
                    raise out
                finished = out.finished
                yield out
        finally:
            self._queues.pop(request_id, None)
            if not finished:
                await asyncio.shield(asyncio.to_thread(self.engine.abort_request, request_id))

    def run(self) -> None:
        """The engine loop: step while any request runs, sleep until one arrives; returns after `shutdown()`."""
        while not self._stopped:
            if not self.engine.has_unfinished_requests():
                self._wake.wait(timeout=0.5)  # a timeout lets a main thread run its signal handlers
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except Exception as e:  # the engine aborted the step's requests; tell whoever waits on them
                log.exception("engine step failed")
                for rid in list(self._queues):
                    if rid not in self.engine.requests:
                        self._deliver(rid, EngineDead(f"the engine failed: {type(e).__name__}: {e}"))
                continue
            for out in outputs:
                self._deliver(out.request_id, out)

    def _deliver(self, request_id: str, item: RequestOutput | BaseException) -> None:
        entry = self._queues.get(request_id)
        if entry is not None:
            loop, queue = entry
            loop.call_soon_threadsafe(queue.put_nowait, item)

    def shutdown(self) -> None:
        """Abort what still runs (its readers get `EngineDead`) and stop the engine thread."""
        self._stopped = True
        for rid in list(self._queues):
            self.engine.abort_request(rid)
            self._deliver(rid, EngineDead("the server shut down before the request finished"))
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    @property
    def num_running(self) -> int:
        return len(self.engine.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.engine.scheduler.waiting)

    @property
    def kv_cache_usage(self) -> float:
        """Fraction of KV blocks held by requests, in [0, 1]."""
        bm = self.engine.block_manager
        return bm.num_used_blocks / bm.num_blocks
