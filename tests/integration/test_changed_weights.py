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


def test_a_weight_read_from_disk_written_through_data_is_planned_again_with_its_bytes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its bytes on disk are the old ones, and its new ones are pages copied out of the
    file's mapping: every weight so written takes its bytes into RAM of its own, and the
    graph is planned again with them (once), within the host budget."""
    model, compiled, x = _compiled("disk", tmp_path)
    released = [n for n, p in model.named_parameters() if holds_its_file(p) and p.dim() == 2]
    assert released
    _merge_in_place(model)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="tensortorrent_dynamo"):
        torch.testing.assert_close(compiled(x), model(x))
        torch.testing.assert_close(compiled(x), model(x))
    planned_again = [r.getMessage() for r in caplog.records if "planned again" in r.getMessage()]
    assert len(planned_again) == 1 and "written in place" in planned_again[0], planned_again
    assert compiled.graphs[0].plan.predicted_peak("cpu") <= param_bytes(model) // 3


def test_state_dict_has_the_models_keys_also_as_a_child() -> None:
    """A checkpoint saved from the compiled module loads into the model, and the model's
    into it, as with the model itself; the same where the compiled module is another's
    child. Missing and unexpected keys are named as given."""
    model = mlp(64, 3)
    compiled = tt.compile(model, example_inputs=(torch.randn(2, 64),), compiler="eager")
    assert list(compiled.state_dict()) == list(model.state_dict())
    mlp(64, 3, seed=1).load_state_dict(compiled.state_dict())
    compiled.load_state_dict(model.state_dict())

    def parent(child: torch.nn.Module) -> torch.nn.Module:
        return torch.nn.ModuleDict({"head": torch.nn.Linear(4, 4), "body": child})

    assert list(parent(compiled).state_dict()) == list(parent(model).state_dict())
    parent(compiled).load_state_dict(parent(mlp(64, 3, seed=1)).state_dict())

    partial = model.state_dict()
    first = next(iter(partial))
    del partial[first]
    partial["extra"] = torch.zeros(1)
    keys = compiled.load_state_dict(partial, strict=False)
    assert (keys.missing_keys, keys.unexpected_keys) == ([first], ["extra"])


@pytest.mark.parametrize("assign", [False, True])
@pytest.mark.parametrize("budget", BUDGETS)
def test_weights_loaded_into_the_compiled_module_are_computed_with(
    budget: str, assign: bool, tmp_path: Path
) -> None:
    """``compiled.load_state_dict(other)`` (a fine-tune of the model): the next calls run on
    the loaded weights, wherever the plan keeps them; on the disk tier the graph is planned
    again with them. Loading the first ones back runs on those."""
    _, compiled, x = _compiled(budget, tmp_path)
    first = mlp(256, 6)
    other = mlp(256, 6, seed=1)
    with torch.no_grad():
        compiled.load_state_dict(other.state_dict(), assign=assign)
        torch.testing.assert_close(compiled(x), other(x))
        compiled.load_state_dict(first.state_dict())
        torch.testing.assert_close(compiled(x), first(x))


def test_a_load_that_fails_for_one_weight_leaves_the_compiled_module_on_the_models_bytes(
    tmp_path: Path,
) -> None:
    """A state dict with one weight of the wrong shape is refused by torch after it copied
    the others: the compiled module computes with what the model now holds, the loaded
    weights and the first bytes of the refused one (read from disk), never with memory
    nothing was copied into."""
    model, compiled, x = _compiled("disk", tmp_path)
    other = mlp(256, 6, seed=1).state_dict()
    bad = next(k for k, v in other.items() if v.dim() == 2)
    other[bad] = torch.zeros(3, 3)
    with pytest.raises(RuntimeError, match="size mismatch"):
        compiled.load_state_dict(other)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))


def test_loading_weights_again_and_again_keeps_one_store_on_disk(tmp_path: Path) -> None:
    """Each load into a model planned on the disk tier writes the new weights' store; the
    store of the weights before, which none of the process's tensors maps any more, is
    deleted, so a process that swaps weights does not fill the disk. A store another
    model's tensors still map stays."""
    _, compiled, x = _compiled("disk", tmp_path)
    (first,) = tmp_path.iterdir()
    for seed in (1, 2, 0):
        other = mlp(256, 6, seed=seed)
        compiled.load_state_dict(other.state_dict())
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), other(x))
        assert len(list(tmp_path.iterdir())) == 1, list(tmp_path.iterdir())
    assert list(tmp_path.iterdir()) == [first]

    twin = mlp(256, 6)
    twin_compiled = tt.compile(twin, **_options("disk", twin, tmp_path))
    with torch.no_grad():
        torch.testing.assert_close(twin_compiled(x), twin(x))
        compiled.load_state_dict(mlp(256, 6, seed=3).state_dict())
        compiled(x)
    assert first in list(tmp_path.iterdir()) and len(list(tmp_path.iterdir())) == 2
