"""`Scheduler`: which sequences run this step, and how many of their tokens.

Continuous batching (Orca, vLLM): every step is one forward over a packed batch that mixes one token for each
decoding sequence with prompt chunks, within `max_num_batched_tokens` tokens and `max_num_seqs` sequences. A
sequence joins as soon as blocks are free and leaves the moment it finishes. Each needs `len(seq) -
seq.num_computed_tokens` more tokens computed (a prompt, the rest of one, or 1 in decode). When blocks run out,
the youngest running sequence is preempted: its blocks are freed and it goes back to the front of the queue,
to be recomputed later. `update_from_output` (vLLM v1's name) is the one place a step's results land.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .block_manager import BlockManager
from .metrics import EngineStats
from .sequence import RequestOutput, Sequence, SequenceStatus
from .speculative import accept_drafts


@dataclass
class SchedulerConfig:
    """Per-step limits (the engine's come checked from `EngineConfig`)."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024


@dataclass
class ScheduledBatch:
    """One step's work: `seqs[i]` computes its next `num_tokens[i]` tokens."""

    seqs: list[Sequence] = field(default_factory=list)
    num_tokens: list[int] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    def add(self, seq: Sequence, budget: int) -> int:
        """Schedule as many of seq's uncomputed tokens as `budget` allows; returns how many."""
        n = min(len(seq) - seq.num_computed_tokens, budget)
        self.seqs.append(seq)
        self.num_tokens.append(n)
        return n


class Scheduler:
    """FCFS queues of waiting and running sequences over one BlockManager."""

    def __init__(self, config: SchedulerConfig, block_manager: BlockManager):
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # oldest first: the last one is the first to be preempted
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        """Decodes and unfinished prefills of running sequences first, then admit waiting ones."""
        batch = ScheduledBatch()
        budget = self.config.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:  # preempting shortens self.running from its end
            seq = self.running[i]
            if not self._make_room(seq, batch):
                break  # seq preempted itself: nothing younger is left running
            budget -= batch.add(seq, budget)
            i += 1
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if not self.block_manager.can_allocate(len(seq)):
                break  # FCFS: the head of the queue waits for memory, nobody overtakes it
            self.waiting.popleft()
            self.block_manager.allocate(seq)
            seq.num_computed_tokens = seq.num_cached_tokens  # the prefix cache computed these already
            seq.status = SequenceStatus.RUNNING
            seq.metrics.record_scheduled()
            self.running.append(seq)
            budget -= batch.add(seq, budget)
        return batch

    def _make_room(self, seq: Sequence, batch: ScheduledBatch) -> bool:
        """Give `seq` the blocks its next token needs, preempting the youngest others; False if seq itself went."""
        while not self.block_manager.can_append(seq):
            victim = self.running[-1]
            self.preempt(victim)
            batch.preempted.append(victim)
            if victim is seq:
                return False
        self.block_manager.append_slot(seq)
        return True

    def preempt(self, seq: Sequence) -> None:
        """Free a running sequence's blocks and put it first in line; it is recomputed later."""
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.drop_drafts()  # guesses for this step (speculative decoding) go too: it restarts from its real tokens
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def finish(self, seq: Sequence) -> None:
        """Take a finished (or aborted) sequence out of the queues; its blocks return at once."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)  # a waiting (never run or preempted) sequence holds none: a no-op

    def update_from_output(self, batch: ScheduledBatch, tokens: list[int | list[int] | None],
                           stats: EngineStats) -> list[RequestOutput]:
        """Apply a step's results (`ModelRunner.run`: a token, None mid-prompt, or the tokens verified drafts
        give) to its sequences; returns an output for each sequence that got tokens, finished ones freed."""
        outputs = []
        for seq, n, token in zip(batch.seqs, batch.num_tokens, tokens):
            if isinstance(token, list):  # verified drafts: the tokens they give, at once
                stats.record_speculation(n, *accept_drafts(seq, token, self.block_manager))
            else:
                stats.record_tokens(n, decode=seq.num_computed_tokens >= seq.num_prompt_tokens and n == 1,
                                    sampled=token is not None)
                seq.num_computed_tokens += n
                self.block_manager.cache_full_blocks(seq, seq.num_computed_tokens)
                if token is None:
                    continue  # a prompt chunk: nothing to sample yet
                seq.append_token(token)
            outputs.append(seq.output(seq.take_delta()))  # before a finish frees the blocks (and num_cached_tokens)
            if seq.is_finished:
                self.finish(seq)
        stats.record_step(len(batch.seqs), sum(batch.num_tokens), self.num_preemptions, self.block_manager)
        return outputs
