"""Weights the plan puts on disk: written once to the offload store, their RAM released;
where a planned parameter's bytes are (whole, or a row chunk's rows)."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest
import torch

from tensortorrent_dynamo.cost_graph import CostGraph, build_cost_graph
from tensortorrent_dynamo.errors import OffloadCorruptError
from tensortorrent_dynamo.functional import capture
from tensortorrent_dynamo.io.locations import TensorLocation
from tensortorrent_dynamo.io.safetensors import safetensors_locations, write_safetensors
from tensortorrent_dynamo.plan.planner import plan_graph
from tensortorrent_dynamo.plan.residency import Residency, Tier
from tensortorrent_dynamo.profile import host_profile
from tensortorrent_dynamo.settings import Settings, parse_options
from tensortorrent_dynamo.weights.disk import Weight, place_on_disk, whole_weights
from tensortorrent_dynamo.weights.released import release, released_location
from tests.mapped import holds_its_file
from tests.models import mlp, param_bytes


def _captured(width: int = 64, depth: int = 4) -> tuple[CostGraph, list[Any]]:
    model, x = mlp(width, depth), torch.randn(4, width)
    ((gm, inputs),) = capture(model, x)
    return build_cost_graph(gm, inputs.values, inputs.params), list(inputs.values)


def _settings(tmp_path: Path, budget: int) -> Settings:
    return parse_options(budgets={"cpu": budget}, offload_dir=str(tmp_path / "offload"))


def _stored_keys(directory: Path) -> set[str]:
    """Every tensor in every shard under ``directory``."""
    return {k for shard in directory.rglob("*.safetensors") for k in safetensors_locations(shard)}


def _file_bytes(location: TensorLocation) -> bytes:
    with open(location.path, "rb") as f:
        f.seek(location.offset)
        return f.read(location.nbytes)


def _hand_plan(cost: CostGraph, residency: dict[str, Residency]) -> Any:
    """A plan of ``cost`` with the given residencies (host RAM, used on the host, for the
    parameters not named)."""
    default = Residency("cpu", streams=False, tier=Tier.HOST)
    return types.SimpleNamespace(
        graph_index=0,
        cost=cost,
        residency=tuple(residency.get(p.fqn, default) for p in cost.params),
    )


def test_whole_weights_are_the_graph_inputs_themselves() -> None:
    cost, inputs = _captured(16, 2)
    weights = whole_weights(cost, inputs)
    assert [w.fqn for w in weights] == [p.fqn for p in cost.params]
    assert all(w.tensor is inputs[p.arg_index] for w, p in zip(weights, cost.params, strict=True))
    assert all(w.rows is None for w in weights)


def test_a_planned_disk_tier_writes_the_streamed_weights_and_releases_them(
    tmp_path: Path,
) -> None:
    cost, inputs = _captured()
    settings = _settings(tmp_path, param_bytes(mlp(64, 4)) // 2)
    plan = plan_graph(0, cost, host_profile(settings), settings, {})
    streamed = {p.fqn for p, r in zip(cost.params, plan.residency, strict=True) if r.streams}
    kept = {p.fqn for p, r in zip(cost.params, plan.residency, strict=True) if not r.streams}
    assert all(r.on_disk for r in plan.residency) and streamed and kept
    weights = whole_weights(plan.cost, inputs)
    before = {w.fqn: w.tensor.detach().clone() for w in weights}
    ids = {w.fqn: id(w.tensor) for w in weights}

    locations = place_on_disk(plan, weights, settings)

    assert set(locations) == streamed  # kept in RAM: not in the result, nothing written
    assert _stored_keys(tmp_path / "offload") == streamed
    for weight in weights:
        assert id(weight.tensor) == ids[weight.fqn]
        assert weight.tensor.shape == before[weight.fqn].shape
        if weight.fqn in streamed:
            location = released_location(weight.tensor)
            assert location is not None and locations[weight.fqn] == location
            assert (tmp_path / "offload") in location.path.parents
            assert location.key == weight.fqn
            assert _file_bytes(location) == before[weight.fqn].numpy().tobytes()
            # no RAM of its own: the tensor's bytes are its file's, mapped; writing to it
            # copies the page, and the file keeps the stored bytes
            assert holds_its_file(weight.tensor)
            assert torch.equal(weight.tensor, before[weight.fqn])
            weight.tensor.data.add_(1.0)
            assert _file_bytes(location) == before[weight.fqn].numpy().tobytes()
        else:
            assert released_location(weight.tensor) is None
            assert torch.equal(weight.tensor, before[weight.fqn])


def test_only_disk_tier_weights_are_touched(tmp_path: Path) -> None:
    cost, inputs = _captured(16, 2)
    plan = _hand_plan(
        cost,
        {
            "0.weight": Residency("cpu", streams=True, tier=Tier.DISK),
            "0.bias": Residency("cpu", streams=False, tier=Tier.DISK),
            "2.weight": Residency("virtual:0", streams=True, tier=Tier.HOST),
            "2.bias": Residency("virtual:0", streams=False, tier=Tier.HOST),
        },
    )
    weights = whole_weights(cost, inputs)
    by_name = {w.fqn: w.tensor for w in weights}
    ptrs = {k: t.data_ptr() for k, t in by_name.items()}

    locations = place_on_disk(plan, weights, _settings(tmp_path, 1 << 30))

    assert set(locations) == {"0.weight"}
    assert _stored_keys(tmp_path / "offload") == {"0.weight"}
    assert holds_its_file(by_name["0.weight"])
    for fqn in ("0.bias", "2.weight", "2.bias"):
        assert released_location(by_name[fqn]) is None, fqn
        assert by_name[fqn].data_ptr() == ptrs[fqn], fqn
        assert by_name[fqn].untyped_storage().nbytes() > 0, fqn


def test_disk_tier_weights_already_released_are_named_and_not_written(tmp_path: Path) -> None:
    cost, inputs = _captured(16, 2)
    plan = _hand_plan(
        cost,
        {
            "0.weight": Residency("cpu", streams=True, tier=Tier.DISK),
            "0.bias": Residency("cpu", streams=False, tier=Tier.DISK),
        },
    )
    weights = whole_weights(cost, inputs)
    by_name = {w.fqn: w.tensor for w in weights}
    # the bias's bytes are in a checkpoint already (as for a model bound to one)
    checkpoint = write_safetensors(tmp_path / "ckpt.safetensors", {"0.bias": by_name["0.bias"]})
    release(by_name["0.bias"], checkpoint["0.bias"])

    locations = place_on_disk(plan, weights, _settings(tmp_path, 1 << 30))

    assert set(locations) == {"0.weight", "0.bias"}
    assert locations["0.bias"] == checkpoint["0.bias"]
    assert _stored_keys(tmp_path / "offload") == {"0.weight"}


def test_placing_again_writes_nothing(tmp_path: Path) -> None:
    cost, inputs = _captured(16, 2)
    residency = {
        "0.weight": Residency("cpu", streams=True, tier=Tier.DISK),
        "2.weight": Residency("cpu", streams=True, tier=Tier.DISK),
    }
    plan = _hand_plan(cost, residency)
    settings = _settings(tmp_path, 1 << 30)
    weights = whole_weights(cost, inputs)
    copies = [Weight(w.fqn, w.tensor.detach().clone()) for w in weights]
    first = place_on_disk(plan, weights, settings)
    shards = sorted((tmp_path / "offload").rglob("*"))
    stamps = {p: p.stat().st_mtime_ns for p in shards}

    # the same tensors, released already: the same locations
    assert place_on_disk(plan, weights, settings) == first
    # the same weights held by other tensors (the model built again): the store has them
    again = place_on_disk(plan, copies, settings)
    assert again == first
    assert all(released_location(w.tensor) == first[w.fqn] for w in copies if w.fqn in first)
    assert sorted((tmp_path / "offload").rglob("*")) == shards
    assert {p: p.stat().st_mtime_ns for p in shards if p.is_file()} == {
        p: t for p, t in stamps.items() if p.is_file()
    }


def test_a_damaged_store_is_found_before_its_weights_are_used_again(tmp_path: Path) -> None:
    cost, inputs = _captured(16, 2)
    plan = _hand_plan(cost, {"0.weight": Residency("cpu", streams=True, tier=Tier.DISK)})
    settings = _settings(tmp_path, 1 << 30)
    weights = whole_weights(cost, inputs)
    location = place_on_disk(plan, weights, settings)["0.weight"]
    data = bytearray(location.path.read_bytes())
    data[location.offset] ^= 0xFF
    location.path.write_bytes(bytes(data))
    # its only copy is on disk now: a second compile must not feed it to the model
    with pytest.raises(OffloadCorruptError):
        place_on_disk(plan, weights, settings)


def test_a_row_chunk_is_the_byte_range_of_its_rows(tmp_path: Path) -> None:
    full = torch.arange(8 * 4, dtype=torch.float32).reshape(8, 4)
    (stored,) = write_safetensors(tmp_path / "w.safetensors", {"w": full.clone()}).values()
    tensor = full.clone()
    assert Weight("w[2:5]", tensor, rows=(2, 5)).location() is None  # holds its bytes

    release(tensor, stored)
    assert Weight("w", tensor).location() == stored
    chunk = Weight("w[2:5]", tensor, rows=(2, 5)).location()
    assert chunk is not None
    row_bytes = 4 * 4
    assert chunk.key == "w" and chunk.path == stored.path
    assert (chunk.offset, chunk.nbytes) == (stored.offset + 2 * row_bytes, 3 * row_bytes)
    assert chunk.shape == (3, 4) and chunk.dtype == torch.float32
    assert _file_bytes(chunk) == full[2:5].numpy().tobytes()
    last = Weight("w[7:8]", tensor, rows=(7, 8)).location()
    assert last is not None and last.offset + last.nbytes == stored.offset + stored.nbytes
