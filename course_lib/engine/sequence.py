"""`Sequence`: one request's state as it moves through the engine, and the outputs it returns.

    WAITING --scheduled--> RUNNING --EOS / max_tokens / stop string / abort--> FINISHED
        ^                     |
        +----- preempted -----+   (its KV blocks are freed; its tokens are prefilled again later)

Tokens leave through `append_token`, which also detokenizes them and checks every stop condition,
so the simple loop (`course_lib.generate`) and the batched engine stop in exactly the same way.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .metrics import RequestMetrics
from ..sampling import SamplingParams
from ..tokenizer import StreamingDetokenizer, Tokenizer


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class CompletionOutput:
    """One completion of a prompt (vLLM's name and fields)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" (EOS or stop string), "length" (max_tokens), "abort", None while running
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it


@dataclass
class RequestOutput:
    """What `LLM.generate` returns per prompt, and `LLMEngine.step` per request that advanced."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    num_cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    delta: str = ""  # text produced by this step (for streaming)


class Sequence:
    """A request: prompt ids + generated ids, where its KV lives, and how far it has been computed."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 tokenizer: Tokenizer, prompt: str | None = None, arrival_time: float | None = None,
                 max_model_len: int | None = None):
        self.request_id, self.prompt, self.params = request_id, prompt, params
        self.token_ids: list[int] = list(prompt_token_ids)  # prompt + output
        self.num_prompt_tokens = len(prompt_token_ids)
        self.max_model_len = max_model_len or 1 << 62  # the context window: a sequence never grows past it
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []  # physical KV block of each logical block
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache
        self.num_cached_tokens = 0  # of those, how many the prefix cache supplied
        self.num_draft_tokens = 0  # speculative decoding: guessed tokens at the end of token_ids, not yet verified
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.metrics = RequestMetrics(num_prompt_tokens=len(prompt_token_ids), request_id=request_id)
        if arrival_time is not None:
            self.metrics.arrival_time = arrival_time
        self._stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(tokenizer.eos_token_ids))
        self._detok = StreamingDetokenizer(tokenizer, skip_special_tokens=params.skip_special_tokens)
        self.text = ""  # output text, cut before a stop string
        self._emitted = 0  # characters of `text` already handed out as deltas

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[:self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def add_drafts(self, drafts: list[int]) -> None:
        """Put guessed tokens after the last real one: the scheduler computes them with it, in one step."""
        self.token_ids += drafts
        self.num_draft_tokens += len(drafts)

    def drop_drafts(self, num: int | None = None) -> list[int]:
        """Take the last `num` guessed tokens (all by default) off the end of token_ids; returns them."""
        num = self.num_draft_tokens if num is None else num
        dropped = self.token_ids[len(self.token_ids) - num:] if num else []
        del self.token_ids[len(self.token_ids) - num:]
        self.num_draft_tokens -= num
        return dropped

    def append_token(self, token_id: int) -> None:
        """Record a sampled token, extend the text, and finish the sequence if a stop condition holds."""
        self.token_ids.append(token_id)
        self.metrics.record_token()
        if token_id in self._stop_ids:  # EOS (unless ignore_eos) or one of params.stop_token_ids
            self._finish("stop", token_id)
            return
        old_len = len(self.text)
        self.text += self._detok.add(token_id)
        for stop in self.params.stop if len(self.text) > old_len else ():
            at = self.text.find(stop, max(0, old_len - len(stop) + 1))  # earlier text held no stop string
            if at != -1:
                self.text = self.text[:at]
                self._finish("stop", stop)
                return
        if self.num_output_tokens >= self.params.max_tokens or len(self) >= self.max_model_len:
            self._finish("length")

    def _finish(self, reason: str, stop_reason: int | str | None = None) -> None:
        # A trailing partial UTF-8 character (max_tokens cut it) is dropped, as vLLM does.
        self.status = SequenceStatus.FINISHED
        self.finish_reason, self.stop_reason = reason, stop_reason
        self.metrics.record_finished()

    def abort(self) -> None:
        if not self.is_finished:
            self._finish("abort")

    def take_delta(self) -> str:
        """New text since the last call; holds back a tail that could still become a stop string."""
        end = len(self.text) if self.is_finished else len(self.text) - self._stop_prefix_len()
        delta = self.text[self._emitted:end]
        self._emitted = end
        return delta

    def _stop_prefix_len(self) -> int:
        """Length of the longest unsent tail of `text` that some stop string begins with (0 if none)."""
        longest = 0
        for stop in self.params.stop:
            for n in range(min(len(stop) - 1, len(self.text) - self._emitted), longest, -1):  # longest tail first
                if self.text.endswith(stop[:n]):
                    longest = n
                    break
        return longest

    def output(self, delta: str = "") -> RequestOutput:
        completion = CompletionOutput(0, self.text, list(self.output_token_ids), self.finish_reason, self.stop_reason)
        return RequestOutput(self.request_id, self.prompt, list(self.prompt_token_ids), [completion],
                             self.is_finished, self.metrics, self.num_cached_tokens, delta)
