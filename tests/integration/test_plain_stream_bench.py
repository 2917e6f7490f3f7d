"""``bench.plain_stream`` runs on a tiny model and writes valid JSON: the plain loop reads as
many bytes as the plan, in the plan's chunks, and both outputs match eager (no timing is
asserted: benchmarks are not tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench import plain_stream
from tests.models import mlp


def test_the_plain_loop_computes_the_model_from_its_chunks(tmp_path: Path) -> None:
    """Every chunk of the last ones read from the file, the rest kept: the loop's output is
    the model's, whichever part is streamed (none, some, all)."""
    model = mlp(64, 3, seed=1)
    x = torch.randn(4, 64)
    with torch.no_grad():
        expected = model(x)
        for streamed in (0, 5, 12):
            loop = plain_stream.PlainStream(model, 16, streamed, tmp_path / f"c{streamed}.bin")
            try:
                torch.testing.assert_close(loop(x), expected)
                assert (tmp_path / f"c{streamed}.bin").stat().st_size == streamed * 16 * 64 * 4
            finally:
                loop.close()


@pytest.mark.slow
def test_plain_stream_bench_writes_its_figures(tmp_path: Path) -> None:
    tiny = ["--layers", "4", "--width", "512", "--batches", "4", "--pairs", "2"]
    plain_stream.main([*tiny, "--dir", str(tmp_path), "--results", str(tmp_path)])
    data = json.loads((tmp_path / "plain_stream.json").read_text())
    (regime,) = data["regimes"]
    assert regime["batch"] == 4
    tt, plain = regime["tensortorrent"], regime["plain"]
    assert len(tt["calls_ms"]) == len(plain["calls_ms"]) == 2
    assert tt["disk_bytes_read"] > 0
    # as many bytes, rounded up to a whole chunk
    assert tt["disk_bytes_read"] <= plain["disk_bytes_read"]
    assert plain["disk_bytes_read"] - tt["disk_bytes_read"] < regime["chunk_bytes"]
    low, high = regime["tensortorrent_over_plain_quartiles"]
    assert 0 < low <= regime["tensortorrent_over_plain"] <= high
