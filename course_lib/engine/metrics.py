"""`RequestMetrics`: one request's timestamps, stamped live by the engine as it moves (see
`course_lib.profiling.metrics` for the picture and the summaries); `EngineStats`: the engine's counters."""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class RequestMetrics:
    """Timestamps of one request, in seconds on one clock (`time.perf_counter` by default). The `record_*`
    methods stamp an event now, or at an explicit `t`; latencies are None until their events have happened."""

    arrival_time: float = field(default_factory=time.perf_counter)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    num_prompt_tokens: int = 0
    request_id: str = ""
    num_drafts: int = 0  # speculative decoding: steps that verified drafted tokens
    num_draft_tokens: int = 0  # tokens drafted
    num_accepted_tokens: int = 0  # of those, tokens the model agreed with

    def record_scheduled(self, t: float | None = None) -> None:
        """Mark that the request was scheduled; only the first call counts (preemption reschedules)."""
        if self.first_scheduled_time is None:
            self.first_scheduled_time = time.perf_counter() if t is None else t

    def record_token(self, t: float | None = None) -> None:
        """Mark that one output token was produced; the first one also sets `first_token_time`."""
        t = time.perf_counter() if t is None else t
        self.token_times.append(t)
        if self.first_token_time is None:
            self.first_token_time = t

    def record_finished(self, t: float | None = None) -> None:
        """Mark the request as done (stop token, length limit or abort)."""
        self.finished_time = time.perf_counter() if t is None else t

    def record_speculation(self, drafted: int, accepted: int) -> None:
        """One speculative step: `drafted` guesses checked, `accepted` of them kept."""
        self.num_drafts += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted

    @property
    def acceptance_rate(self) -> float | None:
        """The share of drafted tokens the model accepted (None without speculation)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens emitted per speculative step: the accepted drafts plus the model's own token (vLLM's
        "mean acceptance length"); 1 means no draft ever helped."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else None

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far."""
        return len(self.token_times)

    @property
    def queue_time(self) -> float | None:
        """Seconds from arrival to first being scheduled."""
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time

    @property
    def ttft(self) -> float | None:
        """Time to first token: seconds from arrival to the first output token."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def itl(self) -> list[float]:
        """Inter-token latencies: the gaps between consecutive output tokens, in seconds."""
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (last - first token time) / (tokens - 1), the mean ITL
        (vLLM's (e2e - TTFT) / (tokens - 1) when the finish is stamped with the last token, as here)."""
        n = len(self.token_times)
        return None if n < 2 else (self.token_times[-1] - self.token_times[0]) / (n - 1)

    @property
    def e2e_latency(self) -> float | None:
        """Seconds from arrival to finish."""
        return None if self.finished_time is None else self.finished_time - self.arrival_time


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
    compile_seconds: float = 0.0  # torch.compile's time at start-up (`LLM(accel=True, compile_decode=True)`)
    cuda_graphs: int = 0  # decode graphs captured at start-up, one per batch-size bucket (accel on CUDA)
    graph_capture_seconds: float = 0.0
    spec_num_drafts: int = 0  # speculative decoding: verifications of drafted tokens
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0

    @property
    def spec_mean_accepted_length(self) -> float | None:
        """Tokens emitted per verification: accepted drafts plus the model's own token."""
        return 1 + self.spec_num_accepted_tokens / self.spec_num_drafts if self.spec_num_drafts else None

    def record_tokens(self, n: int, decode: bool, sampled: bool) -> None:
        """A sequence's share of a step: n prompt (or recomputed) tokens, or one decode token."""
        if decode:
            self.decode_tokens += n
        else:
            self.prefill_tokens += n
            self.partial_prefills += not sampled  # a prompt chunk that did not finish its prompt

    def record_speculation(self, n: int, drafted: int, accepted: int) -> None:
        """A sequence that verified `drafted` tokens over n positions and accepted `accepted` of them."""
        self.decode_tokens += n
        self.spec_num_drafts += 1
        self.spec_num_draft_tokens += drafted
        self.spec_num_accepted_tokens += accepted

    def record_step(self, num_seqs: int, num_tokens: int, preemptions: int, block_manager) -> None:
        """The step's batch, and the scheduler's and block manager's counters after it."""
        self.steps += 1
        self.batch_sizes.append(num_seqs)
        self.batch_tokens.append(num_tokens)
        self.preemptions = preemptions
        self.prefix_cache_hit_rate = block_manager.prefix_cache_hit_rate

