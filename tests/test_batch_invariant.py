"""Batch invariance: a row's result does not depend on how many other rows share its step."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib import tolerance
from course_lib.batch_invariant import TILE_ROWS, BatchInvariantLinear, make_batch_invariant
from course_lib.config import ModelConfig
from course_lib.model import Transformer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_gives_the_same_bits_alone_or_among_others(dtype):
    torch.manual_seed(0)
    layer = nn.Linear(576, 1536, bias=False).to(dtype)
    x = torch.randn(37, 576, dtype=dtype)
    wrapped = BatchInvariantLinear(layer)
    alone = wrapped(x[:1])
    for n in (2, 3, 16, 37):
        assert torch.equal(wrapped(x[:n])[:1], alone), n
        assert torch.equal(wrapped(x[n - 1:n]), wrapped(x[:n])[n - 1:])  # the last row, whichever tile it is in
    tolerance.assert_close(alone.float(), F.linear(x[:1], layer.weight).float(), 1e-2)


def test_plain_products_do_depend_on_the_rows_here():
    """The problem the wrapper solves, on this machine: a row's float32 product changes with the row count."""
    torch.manual_seed(0)
    w, x = torch.randn(1536, 576), torch.randn(16, 576)
    changed = [n for n in (2, 3, 16) if not torch.equal(F.linear(x[:n], w)[0], F.linear(x[:1], w)[0])]
    if not changed:
        pytest.skip("this machine's float32 matmul happens to give the same bits for 1 to 16 rows")
    assert TILE_ROWS > 1


def test_every_linear_layer_is_wrapped_and_the_tied_head_keeps_its_table():
    model = Transformer(ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                                    num_kv_heads=2, tie_word_embeddings=True)).eval()
    x = torch.randint(0, 64, (1, 9))
    before = model(x)
    assert make_batch_invariant(model) == 2 * 7 + 1  # seven per block, and the lm_head
    assert model.lm_head.weight is model.embed_tokens.weight
    tolerance.assert_close(model(x), before, tolerance.OP_RTOL[before.dtype])


STORIES = [f"Write a short story about a {w} who learns to fly." for w in
           ["cat", "dog", "robot", "teacher", "fish", "child", "dragon", "farmer", "pilot", "poet", "clock", "river",
            "mouse", "king", "tree", "cloud"]]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_each_prompt_gives_the_same_greedy_tokens_at_batch_sizes_1_3_and_16(dtype):
    from course_lib import LLM, SamplingParams

    llm = LLM(dtype=dtype, batch_invariant=True)
    params = SamplingParams(max_tokens=24, temperature=0)
    runs = {}
    for batch in (1, 3, 16):
        runs[batch] = [o.outputs[0].token_ids for i in range(0, 16, batch)
                       for o in llm.generate(STORIES[i:i + batch], params)]
    assert runs[3] == runs[1] and runs[16] == runs[1]
