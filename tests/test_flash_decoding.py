"""The split (flash-decoding) path of the Triton decode-attention kernel (`course_lib.accel.triton_paged`): how many
splits the wrapper picks, and the kernel against the PyTorch twin `paged_decode_attention` at long contexts.

The kernel comparison runs this file as a script in a subprocess with TRITON_INTERPRET=1 (as
test_paged_attention.py does), on small heads (2 query heads on 1 KV head of 16) and blocks of 128 tokens: the
interpreter pays per block, not per number, so this keeps 32,768 tokens to a few seconds.
"""
from __future__ import annotations

import os
import time

import pytest
import torch

from course_lib import tolerance
from course_lib.accel.attention import decode_attention_with_new
from course_lib.attention.paged import paged_decode_attention
from tests.paged_inputs import random_decode_batch

pytest.importorskip("triton", reason="Triton is not installed (it ships wheels for Linux only)")

CONTEXTS = (1_000, 4_096, 9_000, 32_768)
SHAPE = dict(heads=2, kv_heads=1, head_dim=16, block_size=128)
# float32: sums of up to 32k terms, and a GPU's exp is an approximation of a few ulps (a token counted twice or a
# split lost moves the output by far more); float16, bfloat16: the kernel sums in float32 and rounds once.
RTOL = {torch.float32: 1e-4, **{t: tolerance.OP_RTOL[t] for t in (torch.float16, torch.bfloat16)}}


def test_num_splits_for_short_long_and_full_batches():
    """1 split below 2 * MIN_SPLIT_TOKENS, enough to give 132 multiprocessors a program each at batch 1 for long
    contexts, 1 when the batch fills the card, and never more splits than blocks."""
    from course_lib.accel.triton_paged import MIN_SPLIT_TOKENS, num_splits_for

    assert MIN_SPLIT_TOKENS == 512
    smol = dict(kv_heads=3, block_size=16)  # the default model's KV heads, the engine's block size
    for tokens in (16, 512, 1_008):
        assert num_splits_for(1, max_blocks=tokens // 16, **smol) == 1
    assert num_splits_for(1, max_blocks=1_024 // 16, **smol) == 2
    assert num_splits_for(1, max_blocks=4_096 // 16, **smol) == 8
    assert num_splits_for(1, max_blocks=32_768 // 16, **smol) == 44  # 3 * 44 = 132 programs
    assert num_splits_for(1, max_blocks=32_768 // 16, num_sms=58, **smol) == 20  # an L4: 60 programs
    assert num_splits_for(4, max_blocks=32_768 // 16, **smol) == 11  # 4 * 3 * 11 = 132
    assert num_splits_for(44, max_blocks=32_768 // 16, **smol) == 1  # 132 programs without splitting
    assert num_splits_for(1, kv_heads=1, max_blocks=0, block_size=16) == 1  # only the new token to attend to
    for max_blocks in range(0, 70):
        for block_size in (1, 16, 512, 4096):
            n = num_splits_for(1, 1, max_blocks, block_size)
            assert 1 <= n <= max(max_blocks, 1)
            assert n == 1 or max_blocks * block_size // n >= 512  # each split holds at least 512 tokens
    with pytest.raises(ValueError, match="positive"):
        num_splits_for(0, 3, 8, 16)


def decode_case(lens: list[int], dtype: torch.dtype, with_new: bool, device: str, seed: int, **shape):
    """Inputs and the float64 reference: (args for the kernel, want). With `with_new`, k_new/v_new are strided
    views (as a fused projection gives them) and, in a batch, the last sequence has nothing cached, only its new
    token."""
    shape = {**SHAPE, **shape}
    q, k, v, tables, cl = random_decode_batch(lens, dtype=dtype, device=device, seed=seed, **shape)
    k_new = v_new = None
    if with_new:
        g = torch.Generator().manual_seed(seed)
        kv_new = torch.randn(len(lens), 2, shape["kv_heads"], shape["head_dim"], generator=g).to(device, dtype)
        k_new, v_new = kv_new[:, 0], kv_new[:, 1]  # [seqs, kv_heads, head_dim], strided
        if len(lens) > 1:
            cl = cl.clone()
            cl[-1] = 0
    tables = tables.clamp(min=0)  # a graph's static tables hold block ids, never -1
    up = [None if t is None else t.double() for t in (k_new, v_new)]
    want = paged_decode_attention(q.double(), k.double(), v.double(), tables, cl) if k_new is None else \
        decode_attention_with_new(q.double(), k.double(), v.double(), tables, cl, *up)
    return (q, k, v, tables, cl, k_new, v_new), want


def check_long_contexts(device: str, low: torch.dtype = torch.float16) -> list[str]:
    """Each context length at batch 1 and batch 3 (the length, a quarter of it and 5 tokens), with and without
    k_new/v_new, float32; `low` (float16; bfloat16 on a GPU that has it: the interpreter's is not to be trusted)
    for the graph step at batch 3. Returns one line per case with its time."""
    from course_lib.accel.triton_paged import num_splits_for, triton_paged_decode_attention

    lines = []
    for seed, n in enumerate(CONTEXTS):
        for lens in ([n], [n, n // 4, 5]):
            for dtype, with_new in ((torch.float32, False), (torch.float32, True)) + (
                    ((low, True),) if len(lens) == 3 else ()):
                args, want = decode_case(lens, dtype, with_new, device, seed)
                splits = num_splits_for(len(lens), SHAPE["kv_heads"], args[3].shape[1], SHAPE["block_size"])
                assert splits > 1, (lens, splits)  # every case here takes the split path
                start = time.perf_counter()
                got = triton_paged_decode_attention(*args)
                seconds = time.perf_counter() - start
                assert got.dtype == dtype
                rel = tolerance.assert_close(got.double(), want, RTOL[dtype], f"{lens} {dtype} new={with_new}")
                lines.append(f"{str(lens):>20} {str(dtype)[6:]:>7} new={with_new!s:5} {splits:2} splits "
                             f"rel err {rel:.1e} {seconds:5.2f} s")
    return lines


def check_forced_splits(device: str) -> float:
    """Short contexts with the split count forced (`num_splits`): splits of one block, splits past a short
    context (empty: lse -inf), a new token with nothing cached in a split launch, GQA groups of 3 and 1, and a
    block size that is not a power of two. Returns the worst relative error."""
    from course_lib.accel.triton_paged import triton_paged_decode_attention

    worst = 0.0
    cases = [dict(lens=[1, 5, 16, 11], splits=(2, 5)), dict(lens=[40, 3, 17], heads=6, kv_heads=2, head_dim=12,
             block_size=3, splits=(2, 7, 14)), dict(lens=[70, 1], heads=4, kv_heads=4, head_dim=8, block_size=16,
             splits=(3, 5))]
    for seed, case in enumerate(cases):
        shape = {**SHAPE, "block_size": 4, **{k: v for k, v in case.items() if k not in ("lens", "splits")}}
        for with_new in (False, True):
            args, want = decode_case(case["lens"], torch.float32, with_new, device, seed, **shape)
            for splits in (1,) + case["splits"]:
                got = triton_paged_decode_attention(*args, num_splits=splits)
                worst = max(worst, tolerance.assert_close(got.double(), want, RTOL[torch.float32],
                                                          f"{case} new={with_new} splits={splits}"))
    args, _ = decode_case([5, 9], torch.float32, False, device, 0, block_size=4)
    with pytest.raises(ValueError, match="num_splits"):
        triton_paged_decode_attention(*args, num_splits=args[3].shape[1] + 1)  # more splits than blocks
    return worst


def test_flash_decoding_matches_torch_interpreted(run_triton_interpreted):
    out = run_triton_interpreted(__file__)
    print(out)
    assert "forced splits max rel err" in out and out.count(" splits rel err ") == 20


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_flash_decoding_matches_torch_cuda():
    check_long_contexts("cuda")
    if torch.cuda.get_device_capability()[0] >= 8:  # a T4 has no bfloat16
        check_long_contexts("cuda", torch.bfloat16)
    check_forced_splits("cuda")


if __name__ == "__main__":  # run by test_flash_decoding_matches_torch_interpreted
    assert os.environ.get("TRITON_INTERPRET") == "1", "set TRITON_INTERPRET=1 to run the kernel on the CPU"
    start = time.perf_counter()
    print(f"forced splits max rel err {check_forced_splits('cpu'):.2e}")
    for line in check_long_contexts("cpu"):
        print(line, flush=True)
    print(f"interpreted in {time.perf_counter() - start:.1f} s")
