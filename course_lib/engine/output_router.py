"""`OutputRouter`: every request's outputs go to that request's own mailbox, never to someone else's.

Whoever steps the engine produces outputs for *all* running requests (two `generate` calls in two threads, a
stream beside them, a server's requests), so each caller takes only its own (vLLM's `RequestOutputCollector`).
A mailbox holds the newest output not yet taken: one that arrives first is replaced, the two text deltas
joined, so a reader that falls behind loses no text and memory stays bounded. A mailbox is *claimed* when a
reader waits on it (`LLMEngine.outputs`); unclaimed ones belong to the driver of `LLMEngine.step()`.
"""
from __future__ import annotations

import dataclasses

from .sequence import RequestOutput


class OutputRouter:
    """Per-request mailboxes of `RequestOutput`s, each holding the newest output not yet taken."""

    def __init__(self) -> None:
        self._boxes: dict[str, RequestOutput | None] = {}  # request id -> pending output (None: nothing new)
        self._claimed: set[str] = set()

    def open(self, request_ids: list[str], claimed: bool, in_use=()) -> None:
        """A mailbox for each new request id; refuses them all if one is open already, in `in_use`, or twice."""
        taken = [rid for rid in request_ids if rid in in_use or rid in self._boxes]
        if taken or len(set(request_ids)) < len(request_ids):
            raise ValueError(f"request id {(taken or request_ids)[0]!r} is already in use")
        for request_id in request_ids:
            self._boxes[request_id] = None
            if claimed:
                self._claimed.add(request_id)

    def close(self, request_id: str) -> None:
        self._boxes.pop(request_id, None)
        self._claimed.discard(request_id)

    def check_claimed(self, request_ids) -> None:
        """Refuse ids that no reader may wait on: not added to be read (`add_requests`), or finished."""
        unknown = [rid for rid in request_ids if rid not in self._claimed]
        if unknown:
            raise ValueError(f"request {unknown[0]!r} was not added with add_requests() or is finished")

    def put(self, out: RequestOutput) -> None:
        """Leave `out` in its request's mailbox, joined to an output still waiting there."""
        if out.request_id not in self._boxes:
            return  # closed: the request was aborted and its reader told
        waiting = self._boxes[out.request_id]
        if waiting is not None:
            out = dataclasses.replace(out, delta=waiting.delta + out.delta)
        self._boxes[out.request_id] = out

    def put_final(self, out: RequestOutput) -> None:
        """An aborted request's last output: to its reader if one waits, else its mailbox just closes."""
        if out.request_id in self._claimed:
            self.put(out)
        else:
            self.close(out.request_id)

    def take(self, request_id: str) -> RequestOutput | None:
        """The request's pending output, or None; the mailbox closes once its final output is taken."""
        out = self._boxes.get(request_id)
        if out is None:
            return None
        self._boxes[request_id] = None
        if out.finished:
            self.close(request_id)
        return out

    def take_unclaimed(self) -> list[RequestOutput]:
        """Pending outputs of every request no reader waits on, in the order the requests arrived."""
        ready = [rid for rid, out in self._boxes.items() if out is not None and rid not in self._claimed]
        return [self.take(rid) for rid in ready]

    def has_unclaimed(self) -> bool:
        return any(out is not None and rid not in self._claimed for rid, out in self._boxes.items())
