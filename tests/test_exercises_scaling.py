"""Chapter 13's checkers: True on reference solutions, False on typical mistakes."""
import torch.nn.functional as F

from course_lib.exercises import check_all_reduce_bytes, check_devices_needed, check_mlp_shard
from course_lib.exercises.scaling import reference_devices_needed, reference_mlp_shard


def test_mlp_shard_reference_passes_and_mistakes_fail(capsys):
    assert check_mlp_shard(reference_mlp_shard)

    def whole_down(x, w_gate, w_up, w_down, rank, tp):  # the slice times all of down: shapes fail
        n = w_up.shape[0] // tp
        rows = slice(rank * n, (rank + 1) * n)
        return (F.silu(x @ w_gate[rows].T) * (x @ w_up[rows].T)) @ w_down.T

    def strided(x, w_gate, w_up, w_down, rank, tp):  # every tp-th feature: a valid split, but not the course's
        rows = slice(rank, None, tp)
        return (F.silu(x @ w_gate[rows].T) * (x @ w_up[rows].T)) @ w_down[:, rows].T

    def divided(x, w_gate, w_up, w_down, rank, tp):  # the whole MLP divided by tp: sums right, wrong partials
        return (F.silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T / tp

    for wrong in (whole_down, strided, divided):
        assert not check_mlp_shard(wrong)
    assert "✗" in capsys.readouterr().out


def test_all_reduce_bytes_reference_passes_and_mistakes_fail():
    assert check_all_reduce_bytes(lambda c, tp, b: (2 * c.num_layers + 1) * c.hidden_size * b)
    assert not check_all_reduce_bytes(lambda c, tp, b: 2 * c.num_layers * c.hidden_size * b)  # embedding forgotten
    assert not check_all_reduce_bytes(lambda c, tp, b: (2 * c.num_layers + 1) * c.hidden_size * b // tp)  # split


def test_devices_needed_reference_passes_and_mistakes_fail():
    assert check_devices_needed(reference_devices_needed)

    def ignores_heads(w, kv, act, usable, heads):
        return next((tp for tp in (1, 2, 4, 8, 16, 32, 64) if (w + kv) / tp + act <= usable), None)

    def splits_activations(w, kv, act, usable, heads):
        return next((tp for tp in (1, 2, 4, 8, 16, 32, 64) if heads % tp == 0 and (w + kv + act) / tp <= usable),
                    None)

    assert not check_devices_needed(ignores_heads)
    assert not check_devices_needed(splits_activations)
