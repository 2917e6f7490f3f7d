"""The chunking pass: large linear weights split into row chunks, each a parameter of its own
(on the functional graph the backend plans)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tensortorrent_dynamo.cost_graph import build_cost_graph
from tensortorrent_dynamo.functional import GraphInputs, capture
from tensortorrent_dynamo.io.pool import HostBufferPool
from tensortorrent_dynamo.io.reader import DiskReader
from tensortorrent_dynamo.io.safetensors import write_safetensors
from tensortorrent_dynamo.passes.chunk_weights import chunk_key, chunk_weights, row_ranges, rows_of
from tensortorrent_dynamo.weights.released import release, released_location


def _captured(model: Callable[..., Any], *args: torch.Tensor) -> tuple[Any, GraphInputs]:
    """The functional graph the backend plans for ``model(*args)``, and its inputs."""
    ((gm, inputs),) = capture(model, *args)
    return gm, inputs


def test_row_ranges_are_even_cover_every_row_and_respect_the_size() -> None:
    assert row_ranges(4096, 16384, 16 * 2**20) == [
        (0, 1024),
        (1024, 2048),
        (2048, 3072),
        (3072, 4096),
    ]
    ranges = row_ranges(1000, 12, 3600)  # at most 300 rows each: 4 chunks of 250
    assert ranges == [(0, 250), (250, 500), (500, 750), (750, 1000)]
    ranges = row_ranges(7, 10, 25)  # 2 rows each at most: 4 chunks, the first 3 of 2 rows
    assert ranges == [(0, 2), (2, 4), (4, 6), (6, 7)]
    assert row_ranges(3, 100, 10) == [(0, 1), (1, 2), (2, 3)]  # a row larger than a chunk


@pytest.mark.parametrize("bias", [True, False])
def test_linear_weights_on_disk_are_split_and_compute_the_same(bias: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 48, bias=bias), nn.ReLU(), nn.Linear(48, 8, bias=bias))
    x = torch.randn(5, 32)
    gm, inputs = _captured(model, x)
    cost = build_cost_graph(gm, inputs.values, inputs.params)
    chunk_bytes = 32 * 4 * 16  # 16 rows of the first weight; the second (1.5 KiB) is smaller
    chunked = chunk_weights(gm, inputs.values, cost, chunk_bytes, inputs.params)
    assert chunked is not None and chunked.cost is not None
    chunked_cost = chunked.cost
    names = [p.fqn for p in chunked_cost.params]
    assert [n for n in names if "[" in n] == [chunk_key("0.weight", a, a + 16) for a in (0, 16, 32)]
    assert "2.weight" in names  # not larger than a chunk: kept whole
    targets = [str(n.target) for n in chunked.module.graph.nodes if n.op == "call_function"]
    matmul = "aten.addmm.default" if bias else "aten.mm.default"
    assert targets.count("aten.cat.default") == 1 and targets.count(matmul) == 4

    with torch.no_grad():
        expected = model(x)
        (got,) = chunked.module(*chunked.expand(inputs.values))
    torch.testing.assert_close(got, expected)

    # each chunk's weight names the whole parameter and its rows
    weights = chunked.weights(chunked_cost, inputs.values)
    first = next(w for w, p in zip(weights, chunked_cost.params, strict=True) if "[" in p.fqn)
    assert first.fqn == "0.weight" and first.rows == (0, 16) and first.tensor is model[0].weight
    # the rows each parameter stands for, as the plan's residencies name them
    rows = dict(zip(names, chunked.rows(), strict=True))
    assert rows[chunk_key("0.weight", 16, 32)] == (16, 32) and rows["2.weight"] is None


def test_a_weight_used_other_than_by_linear_layers_stays_whole() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(32, 32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x) + x @ self.proj.weight  # the weight is also a matmul operand

    model = Tied()
    gm, inputs = _captured(model, torch.randn(3, 32))
    cost = build_cost_graph(gm, inputs.values, inputs.params)
    assert chunk_weights(gm, inputs.values, cost, 256, inputs.params) is None


def test_a_transposed_weight_stays_whole() -> None:
    model = nn.Linear(64, 64)
    model.weight.data = model.weight.data.t().contiguous().t()  # the same values, column-major
    gm, inputs = _captured(model, torch.randn(2, 64))
    cost = build_cost_graph(gm, inputs.values, inputs.params)
    assert chunk_weights(gm, inputs.values, cost, 4096, inputs.params) is None


def test_a_chunk_is_the_same_tensor_until_its_weight_is_released(tmp_path: Path) -> None:
    weight = nn.Parameter(torch.randn(8, 4))
    view = rows_of(weight, 2, 6)
    assert rows_of(weight, 2, 6) is view
    torch.testing.assert_close(view, weight.detach()[2:6])
    assert not view.requires_grad
    # released to disk: the chunk is a released tensor of its own at its rows' bytes, with
    # no storage (only the compiled graph uses it; the runtime reads its bytes)
    (location,) = write_safetensors(tmp_path / "w.safetensors", {"w": weight.detach()}).values()
    release(weight, location)
    placeholder = rows_of(weight, 2, 6)
    assert placeholder is not view and rows_of(weight, 2, 6) is placeholder
    assert placeholder.shape == (4, 4) and placeholder.untyped_storage().nbytes() == 0
    assert released_location(placeholder) == location.rows(2, 6)


@pytest.mark.parametrize("direct", [None, False])
def test_rows_of_a_stored_tensor_read_from_an_unaligned_range(
    tmp_path: Path, direct: bool | None
) -> None:
    # rows of 3 floats (12 bytes): every chunk but the first starts inside a page, off any
    # 4 KiB boundary; O_DIRECT reads the enclosing aligned range
    tensor = torch.randn(1001, 3)
    locations = write_safetensors(tmp_path / "t.safetensors", {"a": torch.ones(5), "w": tensor})
    with DiskReader(HostBufferPool(), direct=direct, chunk_bytes=4096) as reader:
        for start, stop in [(0, 1), (1, 400), (341, 342), (400, 1001)]:
            location = locations["w"].rows(start, stop)
            assert location.key == "w" and location.shape == (stop - start, 3)
            read = reader.submit(location).result()
            torch.testing.assert_close(read.tensor, tensor[start:stop])
            reader.pool.give(read.buffer)
    with pytest.raises(ValueError, match="no rows"):
        locations["w"].rows(5, 5)
