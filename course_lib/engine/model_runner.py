"""`ModelRunner`: tensors in, tokens out. Packs a scheduled batch into one row and runs the model.

    seq A: prefill chunk of 5  | seq B: decode 1 | seq C: decode 1
    input_ids    [1, 7]  = [a3 a4 a5 a6 a7 | b9 | c4]
    positions    [1, 7]  = [ 3  4  5  6  7 |  9 |  4]       where each token sits in its sequence
    slot_mapping [7]     = flat KV slot each token's K/V is written to (through the block tables)
    logits_index         = the last token of each sequence that finished its prompt: it samples
                           (and, for a sequence verifying k drafted tokens, its last k + 1 positions)

All of a step's integer inputs travel to the device in one copy (`PagedAttentionMetadata.to`), and the
sampled tokens come back in one `.tolist()`: the step's only wait on the device.
"""
from __future__ import annotations

import torch

from ..attention.paged import PagedAttention, PagedAttentionMetadata, PagedKVCache, slots_for
from ..host_copy import staged, to_device_at_once
from ..model import Transformer
from ..sampling import Sampler
from .scheduler import ScheduledBatch


class ModelRunner:
    """Owns the paged KV memory and the sampler; runs one step of a `ScheduledBatch`. `accel` (None for the
    reference) supplies the attention backend and a decode graph for decode-only steps (CUDA graphs or a compiled
    step); `attention` overrides the backend (`course_lib.batch_invariant`); `speculator` verifies drafts."""

    def __init__(self, model: Transformer, kv_cache: PagedKVCache, accel=None, attention=None, speculator=None):
        self.model, self.kv_cache, self.speculator, self.sampler = model, kv_cache, speculator, Sampler()
        self.attention = attention or (PagedAttention if accel is None else accel.attention)  # (cache, meta) -> kv
        self.decode_graph = None if accel is None else accel.decode_step(model, kv_cache)

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> list[int | list[int] | None]:
        """One forward over the packed batch; returns the sampled token per sequence (None mid-prompt), or the
        tokens a sequence's verified drafts give (a list)."""
        device = self.model.device
        ids, positions, samples, logits_index = [], [], [], []
        for seq, n in zip(batch.seqs, batch.num_tokens):
            start = seq.num_computed_tokens
            ids += seq.token_ids[start:start + n]
            positions += range(start, start + n)
            done = start + n == len(seq)  # this step completes the sequence's known tokens: it samples
            samples.append(done)
            if done:  # its last position, or the last 1 + drafts positions when it verifies drafts
                logits_index += range(len(ids) - 1 - seq.num_draft_tokens, len(ids))
        if (self.decode_graph is not None and len(ids) == len(batch.seqs) == len(logits_index)
                and self.decode_graph.takes(len(ids))):
            slots = [slots_for(seq.block_table, [p], self.kv_cache.block_size)[0]
                     for seq, p in zip(batch.seqs, positions)]
            input_ids, pos, slot_mapping = to_device_at_once(  # [n] each, one copy
                [torch.tensor(ids), torch.tensor(positions), torch.tensor(slots)], device)
            logits = self.decode_graph(  # every sequence adds one token and samples
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

    def _sample(self, logits: torch.Tensor, seqs: list, samples: list[bool]) -> list[int | list[int] | None]:
        """Sample each sampling sequence's token from its row of logits, all rows in one batch; a sequence with
        drafts owns 1 + drafts rows and gets the speculator's verdict instead."""
        plain, rows, first, r = [], [], {}, 0  # first[i]: sequence i's first row of logits
        for i, (seq, s) in enumerate(zip(seqs, samples)):
            if s:
                first[i] = r
                if not seq.num_draft_tokens:
                    plain.append(i)
                    rows.append(r)
                r += 1 + seq.num_draft_tokens
        out: list = [None] * len(seqs)
        if plain:
            picked = logits if len(rows) == logits.shape[0] else logits[staged(rows, torch.long, logits.device)]
            tokens = self.sampler(picked, [seqs[i].params for i in plain], [seqs[i].token_ids for i in plain],
                                  [seqs[i].request_id for i in plain])
            for i, token in zip(plain, tokens):
                out[i] = token
        for i, r in first.items():
            seq, d = seqs[i], seqs[i].num_draft_tokens
            if d:
                gen = self.sampler.generator_for(seq.request_id, seq.params, logits.device)
                out[i] = self.speculator.verify(seq, logits[r:r + d + 1], seq.token_ids[len(seq) - d:], gen)
        return out
