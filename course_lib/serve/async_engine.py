"""`AsyncEngine`: the engine behind an asyncio server. One thread steps it; each request awaits its own queue.

    HTTP handler (event loop)              engine thread
    ------------------------              -------------
    inbox <- ("add", id, prompt, params)   before each step: apply the inbox in order (adds, aborts)
    async for out in generate(...):    <-- step(); each request's output put on its own queue
        send out.delta to the client
    client gone: inbox <- ("abort", id)    aborted before the next step; its KV blocks return to the pool

vLLM's `AsyncLLM` and engine core have the same shape. Only the engine thread touches the engine, so an
abort never waits for the lock behind a busy step loop, and it can never overtake its own request's add:
both go through one first-in, first-out inbox. A step that fails kills the engine, as in vLLM: its requests
get a 500, later ones a 503, and `/health` says so.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator

from ..engine.llm_engine import LLMEngine
from ..engine.sequence import RequestOutput
from ..sampling import SamplingParams

log = logging.getLogger("course_lib.serve")


class EngineDead(RuntimeError):
    """The engine cannot serve this request: a step failed (`status` 500) or it had already stopped (503)."""

    def __init__(self, message: str, status: int = 503):
        super().__init__(message)
        self.status = status


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
        self.failure: str | None = None  # why the engine stopped serving, once a step has failed
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._inbox: deque[tuple] = deque()  # ("add", id, prompt, params) and ("abort", id), for the engine thread
        self._wake = threading.Event()  # set when a request arrives or at shutdown
        self._stopped = False
        self._thread = None
        if start_thread:
            self._thread = threading.Thread(target=self.run, name="course_lib-engine", daemon=True)
            self._thread.start()

    def unavailable(self) -> EngineDead | None:
        """Why a new request cannot be served now (a 503), or None when the engine is healthy."""
        if self.failure is not None:
            return EngineDead(f"the engine is not serving: {self.failure}")
        if self._stopped:
            return EngineDead("the server is shutting down")
        return None

    async def generate(self, prompt: str | list[int], params: SamplingParams,
                       request_id: str) -> AsyncIterator[RequestOutput]:
        """Yield the request's outputs as steps produce them, until it finishes.

        Check the input first (`LLMEngine.check_request`): an add that fails in the engine thread reaches
        the reader as its exception. Leaving early (a client that disconnects, a cancelled task) aborts the
        request before the next step, which frees its KV blocks.
        """
        if (error := self.unavailable()) is not None:
            raise error
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = (asyncio.get_running_loop(), queue)
        self._post("add", request_id, prompt, params)
        finished = False
        try:
            while not finished:
                out = await queue.get()
                if isinstance(out, BaseException):
                    raise out
                finished = out.finished
                yield out
        finally:
            self._queues.pop(request_id, None)
            if not finished:
                self._post("abort", request_id)

    def _post(self, *message) -> None:
        self._inbox.append(message)  # deque.append is atomic: no lock between the event loop and the engine thread
        self._wake.set()

    def _apply_inbox(self) -> None:
        """Adds and aborts in the order they were posted; runs in the engine thread, between steps."""
        while self._inbox:
            kind, request_id, *args = self._inbox.popleft()
            if kind == "abort":
                self.engine.abort_request(request_id)
                continue
            if self.failure is not None:  # posted just as a step failed: it will not be served
                self._deliver(request_id, EngineDead(f"the engine failed: {self.failure}", status=500))
                continue
            try:
                self.engine.add_request(*args, request_id=request_id)
            except Exception as e:  # checked before it was posted; a duplicate id, a config error
                self._deliver(request_id, e)

    def run(self) -> None:
        """The engine loop: apply the inbox, step while any request runs, sleep until a message arrives;
        returns after `shutdown()`."""
        while not self._stopped:
            self._wake.clear()  # before the inbox is read: a message posted after this wakes the wait below
            self._apply_inbox()
            if self.failure is not None or not self.engine.has_unfinished_requests():
                self._wake.wait(timeout=0.5)  # a timeout lets a main thread run its signal handlers
                continue
            try:
                outputs = self.engine.step()
            except Exception as e:
                log.exception("engine step failed; the engine stops serving")
                self._fail(f"a step failed with {type(e).__name__}: {e}")
                continue
            for out in outputs:
                self._deliver(out.request_id, out)

    def _fail(self, reason: str) -> None:
        """Stop serving: abort every request (the failed step's are aborted already) and tell each reader."""
        self.failure = reason
        self.engine.abort_all()
        for rid in list(self._queues):
            self._deliver(rid, EngineDead(f"the engine failed: {reason}", status=500))

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
