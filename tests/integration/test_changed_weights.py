"""Weights changed after compiling: given other bytes (``p.data = ...``, as merging an
adapter with ``safe_merge`` does), written through ``.data`` (``p.data += delta``, as
merging one in place does), or converted (``model.to(dtype)``, which gives each parameter
other bytes). The compiled model either computes with the weights as they are now or
refuses, naming the weight; it never runs on the old ones."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

import tensortorrent as tt
from tests.mapped import holds_its_file
from tests.models import mlp, param_bytes

FAST_VIRTUAL = {"virtual:0": {"flops": "2T", "bandwidth": "16GB", "latency": 1e-6}}
BUDGETS = ["none", "half", "disk"]


def _options(budget: str, model: torch.nn.Module, tmp_path: Path) -> dict[str, Any]:
    """``none``: every weight kept on ``virtual:0``; ``half``: half of them fit there, the
    rest is copied on each call; ``disk``: a host budget of a third, the rest is read from
    disk."""
    if budget == "disk":
        third = param_bytes(model) // 3
        return {"budgets": {"cpu": third}, "offload_dir": str(tmp_path), "compiler": "eager"}
    room = param_bytes(model) // 2 if budget == "half" else 64 << 20
    return {
        "budgets": {"virtual:0": room},
        "virtual_devices": FAST_VIRTUAL,
        "devices": ["virtual:0"],
        "compiler": "eager",
    }


def _compiled(budget: str, tmp_path: Path) -> tuple[torch.nn.Module, Any, torch.Tensor]:
    """A model of six linear layers compiled at ``budget``, called once."""
    model = mlp(256, 6)
    x = torch.randn(16, 256)
    compiled = tt.compile(model, **_options(budget, model, tmp_path))
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    return model, compiled, x


@pytest.mark.parametrize("budget", ["none", "half"])
def test_weights_given_other_bytes_are_copied_again(budget: str, tmp_path: Path) -> None:
    """The copies kept on the accelerator are of the weights as they were: a weight given
    other bytes (no version counter moves) is copied again, not read from its old copy."""
    model, compiled, x = _compiled(budget, tmp_path)
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data * 1.5
        torch.testing.assert_close(compiled(x), model(x))
    assert (
        compiled.measured_peaks()["virtual:0"]
        <= _options(budget, model, tmp_path)["budgets"]["virtual:0"]
    )


def test_a_weight_read_from_disk_given_other_bytes_is_read_from_where_they_are(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its plan reads it from disk, where the old bytes are: the graph is planned again
    with the weight as it is now (it holds its bytes in RAM, within the host budget or
    written to disk anew), and the call is made with that plan."""
    model, compiled, x = _compiled("disk", tmp_path)
    name, weight = next((n, p) for n, p in model.named_parameters() if holds_its_file(p))
    weight.data = weight.data * 1.5
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="tensortorrent_dynamo"):
        torch.testing.assert_close(compiled(x), model(x))
        torch.testing.assert_close(compiled(x), model(x))
    planned_again = [r.getMessage() for r in caplog.records if "planned again" in r.getMessage()]
    assert len(planned_again) == 1 and name in planned_again[0], planned_again
    assert compiled.graphs[0].plan.predicted_peak("cpu") <= param_bytes(model) // 3


@pytest.mark.parametrize("budget", BUDGETS)
def test_a_model_converted_to_another_dtype_after_compiling_matches_eager(
    budget: str, tmp_path: Path
) -> None:
    """``model.to(bfloat16)`` keeps each parameter object and gives it new bytes; Dynamo
    compiles again for the new dtype, and that graph is planned with the new bytes (on the
    disk tier, written anew). Converted back, the first graph runs again."""
    model, compiled, x = _compiled(budget, tmp_path)
    with torch.no_grad():
        for dtype in (torch.bfloat16, torch.float32):
            model.to(dtype)
            got = compiled(x.to(dtype))
            assert got.dtype == dtype
            torch.testing.assert_close(got, model(x.to(dtype)))


def _merge_in_place(model: torch.nn.Module) -> None:
    """Add a rank-4 product to every weight matrix through ``.data``, as an adapter merged in
    place does: no version counter moves, no address changes."""
    generator = torch.Generator().manual_seed(1)
    for p in model.parameters():
        if p.dim() == 2:
            b = torch.randn(p.shape[0], 4, generator=generator)
            a = torch.randn(4, p.shape[1], generator=generator)
            p.data += 0.01 * (b @ a)


@pytest.mark.parametrize("budget", ["none", "half"])
def test_weights_written_through_data_are_copied_again(budget: str, tmp_path: Path) -> None:
    model, compiled, x = _compiled(budget, tmp_path)
    versions = [p._version for p in model.parameters()]
    _merge_in_place(model)
    assert [p._version for p in model.parameters()] == versions
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))


def test_a_weight_read_from_disk_written_through_data_is_refused(tmp_path: Path) -> None:
    """Its bytes on disk are the old ones, and its new ones are pages copied out of the
    file's mapping: the call refuses, naming the weight."""
    model, compiled, x = _compiled("disk", tmp_path)
    released = [n for n, p in model.named_parameters() if holds_its_file(p) and p.dim() == 2]
    assert released
    _merge_in_place(model)
    with torch.no_grad(), pytest.raises(tt.OffloadError, match="written in place") as raised:
        compiled(x)
    assert any(name in str(raised.value) for name in released), raised.value
