"""Online softmax and blocked (FlashAttention-style) attention equal the plain versions."""
import pytest
import torch

from course_lib.attention import causal_attention, reference_attention
from course_lib.online_softmax import online_softmax, online_softmax_attention


@pytest.mark.parametrize("block_size", [1, 3, 4, 100])
def test_online_softmax_matches_softmax(block_size):
    torch.manual_seed(0)
    x = torch.randn(2, 5, 13) * 10
    torch.testing.assert_close(online_softmax(x, block_size), x.softmax(-1))


def test_online_softmax_large_scores_do_not_overflow():
    x = torch.tensor([[1000.0, 1001.0, 999.0, -1000.0]])
    out = online_softmax(x, block_size=1)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, x.softmax(-1))


def test_online_softmax_handles_masked_entries():
    x = torch.tensor([[float("-inf"), float("-inf"), 1.0, 2.0]])
    torch.testing.assert_close(online_softmax(x, block_size=2), x.softmax(-1))


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (9, 3), (4, 1)])
@pytest.mark.parametrize("block_size", [1, 5, 64])
def test_attention_matches_causal_attention(heads, kv_heads, block_size):
    torch.manual_seed(1)
    B, T, D = 2, 11, 16
    q = torch.randn(B, T, heads, D)
    k, v = torch.randn(B, T, kv_heads, D), torch.randn(B, T, kv_heads, D)
    expected = causal_attention(q, k, v)
    torch.testing.assert_close(online_softmax_attention(q, k, v, block_size=block_size), expected)
    torch.testing.assert_close(reference_attention(q, k, v)[0], expected)


def test_attention_with_start_offset_matches_causal_attention():
    """Queries 7..9 over 10 cached keys: a chunked prefill / decode step."""
    torch.manual_seed(2)
    q = torch.randn(1, 3, 6, 8)
    k, v = torch.randn(1, 10, 2, 8), torch.randn(1, 10, 2, 8)
    expected = causal_attention(q, k, v, start=7)
    torch.testing.assert_close(online_softmax_attention(q, k, v, block_size=4, start=7), expected)


def test_non_causal_matches_full_softmax():
    torch.manual_seed(3)
    q, k, v = torch.randn(1, 4, 2, 8), torch.randn(1, 9, 2, 8), torch.randn(1, 9, 2, 8)
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    expected = ((qh @ kh.transpose(-1, -2)) / 8 ** 0.5).softmax(-1) @ vh
    out = online_softmax_attention(q, k, v, block_size=2, causal=False)
    torch.testing.assert_close(out, expected.transpose(1, 2))


def test_bad_arguments_fail_with_a_message():
    q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 2, 4)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        online_softmax_attention(q, k, k)
    with pytest.raises(ValueError, match="block_size"):
        online_softmax(torch.randn(3), block_size=0)
