"""Speculative decoding: guess a few tokens cheaply, check them all in one forward pass of the model.

A decode step reads every weight to make one token, and a step over k + 1 tokens reads them once too. So the
model verifies k guesses for nearly the price of one token, keeps the longest run it agrees with, and adds
one token of its own at the first disagreement (or after the last guess):

    context ... the cat sat on the | drafts: mat . The  -> one forward over [the, mat, ., The]
    the model's choice at each position:  mat  .  A  (dog)  -> accept "mat", ".", reject "The", emit "A"

Proposers (vLLM's `speculative_config`):
    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
        prompt lookup: propose what followed the context's last n tokens earlier in it (free)
    {"method": "draft_model", "model": None, "quantization": "int4", "num_speculative_tokens": 4}
        a smaller model drafts token by token; with no `model`, the target itself quantized to INT4

Greedy requests accept a draft when it is the model's argmax, so the output is exactly plain greedy decoding's.
Sampled requests accept draft x with probability min(1, p(x) / q(x)) and at the first rejection sample from
max(0, p - q) (Leviathan et al., Chen et al. 2023): each token is then distributed exactly as p.
The engine meets speculation here only: `Speculator.schedule`, `Speculator.verify` and `accept_drafts`.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, fields

import torch

from ..kv_cache import KVCache
from ..model import Transformer
from ..sampling_batch import BatchKnobs, processed_logits_batch

METHODS = ("ngram", "draft_model")


@dataclass
class SpeculativeConfig:
    """vLLM's `speculative_config` keys, checked. Build it with `SpeculativeConfig.from_dict`."""

    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 2
    model: str | None = None  # draft_model: a path or Hub id; None = the target quantized (`quantization`)
    quantization: str | None = "int4"

    @classmethod
    def from_dict(cls, config: dict | "SpeculativeConfig" | None) -> "SpeculativeConfig | None":
        """`config` as vLLM takes it (a dict), checked; None stays None (no speculation)."""
        if config is None or isinstance(config, SpeculativeConfig):
            return config
        if not isinstance(config, dict):
            raise TypeError(f"speculative_config must be a dict or None, got {config!r}")
        known = sorted(f.name for f in fields(cls))
        unknown = sorted(set(config) - set(known))
        if unknown:
            raise ValueError(f"unknown speculative_config key {unknown[0]!r}; the keys are: {', '.join(known)}")
        if "num_speculative_tokens" not in config:
            raise ValueError("speculative_config needs 'num_speculative_tokens' (how many tokens to guess a step)")
        spec = cls(**{"method": "ngram" if "prompt_lookup_max" in config else None, **config})
        if spec.method not in METHODS:
            raise ValueError(f"speculative_config['method'] must be one of {METHODS}, got {spec.method!r}")
        for name in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"):
            value = getattr(spec, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"speculative_config[{name!r}] must be an integer >= 1, got {value!r}")
        if spec.prompt_lookup_min > spec.prompt_lookup_max:
            raise ValueError(f"speculative_config: prompt_lookup_min ({spec.prompt_lookup_min}) > "
                             f"prompt_lookup_max ({spec.prompt_lookup_max})")
        if spec.quantization not in (None, "int8", "int4"):
            raise ValueError(f"speculative_config['quantization'] must be None, 'int8' or 'int4', "
                             f"got {spec.quantization!r}")
        return spec


def ngram_propose(token_ids: list[int], k: int, n_max: int = 4, n_min: int = 2) -> list[int]:
    """Prompt lookup: the up-to-k tokens that followed the most recent earlier occurrence of the context's last
    n tokens, trying n from n_max down to n_min; [] when no such n-gram occurred before."""
    for n in range(min(n_max, len(token_ids) - 1), n_min - 1, -1):
        tail = token_ids[-n:]
        for start in range(len(token_ids) - n - 1, -1, -1):  # most recent match first, never the tail itself
            if token_ids[start:start + n] == tail:
                return token_ids[start + n:start + n + k]
    return []


def greedy_accept(target_choice: list[int], drafts: list[int]) -> list[int]:
    """The tokens a greedy step emits: drafts while they equal the model's choice at their position, then the
    model's own choice. `target_choice` has len(drafts) + 1 entries (the argmax after each position)."""
    for i, (choice, draft) in enumerate(zip(target_choice, drafts)):
        if choice != draft:
            return target_choice[:i + 1]
    return target_choice[:len(drafts) + 1]  # every draft accepted: the model's next token is free


def accept_or_resample(p: torch.Tensor, q: torch.Tensor | None, drafts: list[int],
                       generator: torch.Generator | None = None) -> list[int]:
    """The tokens a sampled step emits, by the module docstring's rule. p [k + 1, vocab]: the target's
    probabilities at each draft position and after the last; q [k, vocab]: the draft's, or None for prompt
    lookup (all of q on the proposed token). When every draft is accepted, one more token comes from p_k."""
    k, ids = len(drafts), torch.tensor(drafts, device=p.device, dtype=torch.long)
    if q is None:
        q = torch.zeros_like(p[:k]).scatter_(1, ids[:, None], 1.0)
    rows = torch.arange(k, device=p.device)
    ratio = (p[rows, ids] / q[rows, ids]).clamp(max=1.0)  # [k]: acceptance probability of each draft token
    u = torch.rand(k, generator=generator, device=p.device)
    for i, accepted in enumerate((u < ratio).tolist()):
        if not accepted:
            residual = (p[i] - q[i]).clamp(min=0)
            residual = residual / residual.sum() if residual.sum() > 0 else p[i]
            return drafts[:i] + [int(torch.multinomial(residual, 1, generator=generator))]
    return drafts + [int(torch.multinomial(p[k], 1, generator=generator))]


def accept_drafts(seq, tokens: list[int], block_manager) -> tuple[int, int]:
    """A sequence that verified its drafts keeps the K/V of its last token and the accepted drafts, appends the
    tokens (each through the stop checks) and frees the rejected drafts' blocks; returns (drafted, accepted)."""
    drafts = seq.drop_drafts()
    accepted = len(tokens) - 1  # the tokens are the accepted drafts and one of the model's own
    seq.metrics.record_speculation(len(drafts), accepted)
    seq.num_computed_tokens += 1 + accepted
    for token in tokens:
        seq.append_token(token)
        if seq.is_finished:
            break
    block_manager.cache_full_blocks(seq, seq.num_computed_tokens)
    block_manager.trim(seq)
    return len(drafts), accepted


class DraftModel:
    """A small model that drafts token by token, with a contiguous KV cache per request (batch 1). Each call
    catches the cache up with the tokens the target accepted since the last (one forward over them); rejected
    drafts cost nothing to undo: the cache's length is set back."""

    def __init__(self, model: Transformer):
        self.model = model
        self.caches: dict[str, KVCache] = {}
        self.known: dict[str, list[int]] = {}  # the tokens whose K/V each request's cache holds

    @classmethod
    def from_target(cls, target: Transformer, quantization: str | None) -> "DraftModel":
        """The target itself, quantized: a copy that shares the target's embedding and norms, and costs only its
        codes and scales (unquantized: a whole copy)."""
        from ..quant import quantized_copy

        if quantization is None:
            return cls(copy.deepcopy(target))
        return cls(quantized_copy(target, quantization, group_size=32))  # as LLM(quantization=...) groups them

    @torch.inference_mode()
    def propose(self, request_id: str, token_ids: list[int], k: int, capacity: int, sample_probs=None,
                generator: torch.Generator | None = None) -> tuple[list[int], torch.Tensor | None]:
        """Up to k draft tokens after `token_ids`, and their draft probabilities [k, vocab] when `sample_probs`
        (logits [vocab] -> probs [vocab], the request's sampling filters) is given; greedy otherwise.
        `capacity`: the most tokens the request can ever hold (its cache is made that long, once)."""
        if request_id not in self.caches:
            self.caches[request_id] = KVCache(self.model.config, capacity, 1, self.model.device, self.model.dtype)
            self.known[request_id] = []
        cache, known = self.caches[request_id], self.known[request_id]
        same = 0  # the cache is valid up to the first token that differs; the last always goes through the model
        while same < min(len(known), len(token_ids) - 1) and known[same] == token_ids[same]:
            same += 1
        cache.seq_len = same
        ids = torch.tensor([token_ids[same:]], device=self.model.device)
        logits = self.model(ids, kv=cache, last_only=True)[0, -1]
        drafts, probs = [], []
        for i in range(k):
            if sample_probs is None:
                token = int(logits.argmax())
            else:
                probs.append(sample_probs(logits))
                token = int(torch.multinomial(probs[-1], 1, generator=generator))
            drafts.append(token)
            if i + 1 < k:
                logits = self.model(torch.tensor([[token]], device=self.model.device), kv=cache)[0, -1]
        self.known[request_id] = list(token_ids) + drafts[:-1]  # the last draft never went through the model
        return drafts, (torch.stack(probs) if probs else None)

    def release(self, request_id: str) -> None:
        self.caches.pop(request_id, None)
        self.known.pop(request_id, None)


class Speculator:
    """The engine's side of speculative decoding: drafts for each decoding sequence before a step, and the tokens
    its verified logits allow after it. Needs the engine's sampler for the requests' seeded generators."""

    def __init__(self, config: SpeculativeConfig, target: Transformer):
        self.config, self.draft = config, None
        self.draft_probs: dict[str, torch.Tensor | None] = {}  # this step's q of each sampled request
        if config.method == "draft_model" and config.model is None:
            self.draft = DraftModel.from_target(target, config.quantization)
        elif config.method == "draft_model":
            from ..loading import load_model
            from ..quant import quantize_model

            model = load_model(config.model, device=target.device, dtype=target.dtype)
            if model.config.vocab_size != target.config.vocab_size:
                raise ValueError(f"the draft model's vocabulary ({model.config.vocab_size}) differs from the "
                                 f"target's ({target.config.vocab_size}): they must share a tokenizer")
            if config.quantization is not None:
                quantize_model(model, config.quantization, group_size=32)
            self.draft = DraftModel(model)

    def propose(self, seq, generator: torch.Generator | None = None) -> list[int]:
        """Draft tokens for a sequence about to decode: at most num_speculative_tokens, and never more than its
        max_tokens and the context window leave room for (the step also emits one token of the model's own)."""
        room = min(seq.params.max_tokens - seq.num_output_tokens, seq.max_model_len - len(seq)) - 1
        k = min(self.config.num_speculative_tokens, room)
        if k <= 0:
            return []
        if self.draft is None:
            return ngram_propose(seq.token_ids, k, self.config.prompt_lookup_max, self.config.prompt_lookup_min)
        sample = None
        if not seq.params.greedy:  # the draft's q, with the request's own filters (the penalty on the context)
            model = self.draft.model
            knobs = BatchKnobs.build([seq.params], [seq.token_ids], model.config.vocab_size, model.device)
            sample = lambda logits: processed_logits_batch(logits[None], knobs)[0].softmax(-1)  # noqa: E731
        capacity = min(seq.max_model_len, seq.num_prompt_tokens + seq.params.max_tokens)
        drafts, q = self.draft.propose(seq.request_id, seq.token_ids, k, capacity, sample, generator)
        self.draft_probs[seq.request_id] = q
        return drafts

    def verify(self, seq, logits: torch.Tensor, drafts: list[int],
               generator: torch.Generator | None = None) -> list[int]:
        """The tokens to emit, from the model's logits [len(drafts) + 1, vocab] at the last real token and each
        draft, each row filtered by the request's params (its penalty sees the drafts before it)."""
        history, rows = seq.token_ids[:len(seq) - len(drafts)], len(drafts) + 1
        knobs = BatchKnobs.build([seq.params] * rows, [history + drafts[:i] for i in range(rows)],
                                 logits.shape[-1], logits.device)
        processed = processed_logits_batch(logits, knobs)  # [k + 1, vocab], float32
        q = self.draft_probs.pop(seq.request_id, None)
        if seq.params.greedy:
            return greedy_accept(processed.argmax(-1).tolist(), drafts)
        q = None if q is None else q[:len(drafts)]  # the step may have computed fewer drafts than proposed
        return accept_or_resample(processed.softmax(-1), q, drafts, generator)

    def schedule(self, scheduler, sampler, device: torch.device):
        """The scheduler's next batch (a `ScheduledBatch`), each decoding sequence (its tokens all computed but the
        last) carrying drafts: as many as its step computes, since the token budget may cut them."""
        proposed = []
        for seq in scheduler.running:
            if seq.num_output_tokens and seq.num_computed_tokens == len(seq) - 1:
                drafts = self.propose(seq, sampler.generator_for(seq.request_id, seq.params, device))
                if drafts:
                    seq.add_drafts(drafts)
                    proposed.append(seq)
        batch = scheduler.schedule()  # gives the drafts slots
        scheduled = {id(seq): n for seq, n in zip(batch.seqs, batch.num_tokens)}
        for seq in proposed:  # drafts the step does not compute go, with the blocks they took
            extra = seq.num_draft_tokens - max(0, scheduled.get(id(seq), 0) - 1)
            if extra > 0:
                seq.drop_drafts(extra)
                scheduler.block_manager.trim(seq)
        return batch

    def release(self, request_id: str) -> None:
        self.draft_probs.pop(request_id, None)
        if self.draft is not None:
            self.draft.release(request_id)
