"""`ModelRunner`: tensors in, tokens out. Packs a scheduled batch into one row and runs the model.

    seq A: prefill chunk of 5  | seq B: decode 1 | seq C: decode 1
    input_ids    [1, 7]  = [a3 a4 a5 a6 a7 | b9 | c4]
    positions    [1, 7]  = [ 3  4  5  6  7 |  9 |  4]       where each token sits in its sequence
    slot_mapping [7]     = flat KV slot each token's K/V is written to (through the block tables)
    logits_index         = the last token of each sequence that finished its prompt: it samples

All of a step's integer inputs travel to the device in one copy (`PagedAttentionMetadata.to`), and the
sampled tokens come back in one `.tolist()`: the step's only wait on the device.
"""
from __future__ import annotations

import torch

from ..attention.paged import PagedAttention, PagedAttentionMetadata, PagedKVCache, slots_for
from ..host_copy import to_device_at_once
from ..model import Transformer
from ..sampling import Sampler
from .scheduler import ScheduledBatch


class ModelRunner:
    """Owns the paged KV memory and the sampler; runs one step of a `ScheduledBatch`.

    `accel` (a `course_lib.accel.Accelerator`, or None for the reference engine) supplies the attention backend
    and, with `compile_decode`, a compiled step for decode-only steps (compiled here, once).
    """

    def __init__(self, model: Transformer, kv_cache: PagedKVCache, accel=None):
        self.model = model
        self.kv_cache = kv_cache
        self.attention = PagedAttention if accel is None else accel.attention  # (kv_cache, metadata) -> backend
        self.sampler = Sampler()
        self.compiled_decode = None if accel is None else accel.decode_step(model, kv_cache)

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> list[int | None]:
        """One forward over the packed batch; returns the sampled token per sequence (None mid-prompt)."""
        device = self.model.device
        ids, positions, samples, logits_index = [], [], [], []
        for seq, n in zip(batch.seqs, batch.num_tokens):
            start = seq.num_computed_tokens
            ids += seq.token_ids[start:start + n]
            positions += range(start, start + n)
            done = start + n == len(seq)  # this step completes the sequence's known tokens: it samples
            samples.append(done)
            if done:
                logits_index.append(len(ids) - 1)
        if (self.compiled_decode is not None and len(ids) == len(batch.seqs) == len(logits_index)
                and self.compiled_decode.takes(len(ids))):
            slots = [slots_for(seq.block_table, [p], self.kv_cache.block_size)[0]
                     for seq, p in zip(batch.seqs, positions)]
            input_ids, pos, slot_mapping = to_device_at_once(  # [n] each, one copy
                [torch.tensor(ids), torch.tensor(positions), torch.tensor(slots)], device)
            logits = self.compiled_decode(  # every sequence adds one token and samples
                input_ids, pos, [seq.block_table for seq in batch.seqs], slot_mapping)
            return self._sample(logits, batch.seqs, samples)
        meta = PagedAttentionMetadata.build(
            block_tables=[seq.block_table for seq in batch.seqs],
            context_lens=[seq.num_computed_tokens + n for seq, n in zip(batch.seqs, batch.num_tokens)],
            query_lens=batch.num_tokens, block_size=self.kv_cache.block_size, device=None)  # on the host
        meta, input_ids, pos, index = meta.to(  # one host->device copy for the whole step
            device, torch.tensor([ids]), torch.tensor([positions]), torch.tensor(logits_index, dtype=torch.long))
        kv = self.attention(self.kv_cache, meta)  # input_ids, pos: [1, num_tokens]
        logits = self.model(input_ids, pos, kv=kv, logits_index=index)[0]
        return self._sample(logits, batch.seqs, samples)

    def _sample(self, logits: torch.Tensor, seqs: list, samples: list[bool]) -> list[int | None]:
        sampling = [seq for seq, s in zip(seqs, samples) if s]  # logits: [num_sampling, vocab]
        tokens = iter(self.sampler(logits, [s.params for s in sampling], [s.token_ids for s in sampling],
                                   [s.request_id for s in sampling]) if sampling else [])
        return [next(tokens) if s else None for s in samples]
