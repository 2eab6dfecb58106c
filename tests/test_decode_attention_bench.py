"""benchmarks/decode_attention.py: it runs end to end on tiny settings, reports what it measured, and refuses
to time a kernel whose outputs differ from the reference."""
from __future__ import annotations

import json

import pytest
import torch

from benchmarks import decode_attention as bench
from course_lib.accel.build import build

pytestmark = pytest.mark.skipif(build().module is None, reason="the C++ decode kernel cannot be built here")


def test_rows_for_every_dtype_and_batch(tmp_path, capsys):
    out = tmp_path / "attention.json"
    bench.main(["--seqs", "1,3", "--dtypes", "float32,bfloat16", "--context", "5,40", "--repeats", "2",
                "--json", str(out)])
    report = json.loads(out.read_text())
    assert [(r["dtype"], r["seqs"]) for r in report["rows"]] == [
        ("float32", 1), ("float32", 3), ("bfloat16", 1), ("bfloat16", 3)]
    for r in report["rows"]:
        lens = bench.decode_inputs(r["seqs"], (5, 40), getattr(torch, r["dtype"]))[-1]
        assert r["tokens"] == int(lens.sum()) and all(5 <= n <= 40 for n in lens.tolist())
        assert r["kernel_us"] > 0 and r["reference_us"] > 0
        kv_bytes = 2 * r["tokens"] * bench.KV_HEADS * bench.HEAD_DIM * (4 if r["dtype"] == "float32" else 2)
        assert r["kernel_gb_s"] == pytest.approx(kv_bytes / (r["kernel_us"] * 1e-6) / 1e9)
    assert report["copy_bandwidth_gb_s"] > 0 and not report["hot"]
    assert "x faster" in capsys.readouterr().out


def test_a_wrong_kernel_is_not_timed(monkeypatch):
    real = bench.decode_kernel()
    monkeypatch.setattr(bench, "decode_kernel", lambda: lambda *args: real(*args) * 1.01 + 0.01)
    with pytest.raises(SystemExit, match="differ"):
        bench.main(["--seqs", "2", "--dtypes", "float32", "--repeats", "1"])


def test_an_unknown_dtype_is_refused(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--dtypes", "float32,int8"])
    err = capsys.readouterr().err
    assert "--dtypes" in err and "float32,int8" in err  # argparse's own message, naming what was given
