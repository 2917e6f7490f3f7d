"""What the corpus tests share: the backend's options per budget, output comparison,
and what the plans of a compiled model did."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import torch
from torch import nn

import tensortorrent as tt

DEVICE = "virtual:0"
NO_BUDGET_CAPACITY = 1 << 30  # "none": the virtual device holds 1 GiB, far more than any entry
VIRTUAL_SPEC = {"flops": "2T", "bandwidth": "16GB", "latency": 1e-6}


# the context of a model's first and second call: both ways people run a model without
# autograd (a buffer made under one and written under the other must work)
INFERENCE_CONTEXTS = (torch.no_grad, torch.inference_mode)


def param_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def budget_bytes(budget: str, model: nn.Module) -> int:
    """The virtual device's memory for a budget name: ``"none"`` or ``"third"`` (1/3 of
    the parameters' bytes, so that the parameters cannot all stay resident)."""
    if budget == "none":
        return NO_BUDGET_CAPACITY
    if budget == "third":
        return param_bytes(model) // 3
    raise ValueError(f"unknown budget {budget!r}")


def options(budget: str, model: nn.Module) -> dict[str, Any]:
    """Options of ``tt.compile`` / ``torch.compile(options=...)``: every node that can runs
    on ``virtual:0``; ``"none"`` gives it no budget (a large capacity), ``"third"`` a
    budget of a third of the parameters."""
    spec: dict[str, Any] = dict(VIRTUAL_SPEC)
    opts: dict[str, Any] = {
        "virtual_devices": {DEVICE: spec},
        "devices": [DEVICE],
        "compiler": "eager",
    }
    if budget == "none":
        spec["capacity"] = NO_BUDGET_CAPACITY
    else:
        opts["budgets"] = {DEVICE: budget_bytes(budget, model)}
    return opts


def disk_options(model: nn.Module, offload_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Options with no accelerator and a host budget of a third of the parameters' bytes:
    what fits stays in RAM, the rest is read from the disk tier in ``offload_dir``."""
    return {
        "budgets": {"cpu": param_bytes(model) // 3},
        "offload_dir": str(offload_dir),
        "compiler": "eager",
    }


def leaves(obj: Any, path: str = "out") -> Iterator[tuple[str, Any]]:
    """Every leaf of a model's output with its path: ModelOutput / BaseOutput (mappings),
    tuples, lists, tensors and plain values; anything else fails the test."""
    if isinstance(obj, torch.Tensor) or obj is None or isinstance(obj, (bool, int, float, str)):
        yield path, obj
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            yield from leaves(value, f"{path}.{key}")
    elif isinstance(obj, (tuple, list)):
        for i, value in enumerate(obj):
            yield from leaves(value, f"{path}[{i}]")
    else:
        raise TypeError(f"{path}: cannot compare a {type(obj).__qualname__}")


def assert_same(got: Any, expected: Any, what: str = "") -> None:
    """Every tensor of ``got`` is close to the one at the same place in ``expected``."""
    got_leaves, expected_leaves = dict(leaves(got)), dict(leaves(expected))
    assert list(got_leaves) == list(expected_leaves), f"{what}: output structure differs"
    for path, want in expected_leaves.items():
        value = got_leaves[path]
        if isinstance(want, torch.Tensor):
            torch.testing.assert_close(value, want, msg=lambda m, p=path: f"{what} {p}: {m}")
        else:
            assert value == want, f"{what} {path}: {value!r} != {want!r}"


def assert_tensors_equal(model: nn.Module, reference: nn.Module) -> None:
    """The model's buffers and parameters equal the reference copy's, exactly."""
    for kind in ("buffer", "parameter"):
        got = dict(getattr(model, f"named_{kind}s")())
        want = dict(getattr(reference, f"named_{kind}s")())
        assert list(got) == list(want), f"the model's {kind}s changed"
        for name, tensor in want.items():
            torch.testing.assert_close(
                got[name], tensor, rtol=0, atol=0, msg=lambda m, n=name, k=kind: f"{k} {n}: {m}"
            )


@dataclasses.dataclass
class PlanSummary:
    graphs: int
    params: int
    streamed: int
    on_device: bool  # some segment of some graph runs on the virtual device


def summarize(graphs: list[Any]) -> PlanSummary:
    params = sum(len(g.plan.cost.params) for g in graphs)
    streamed = sum(
        g.plan.residency[i].streams for g in graphs for i in range(len(g.plan.cost.params))
    )
    on_device = any(d == DEVICE for g in graphs for _, d in g.compilers_by_device())
    return PlanSummary(len(graphs), params, streamed, on_device)


def check_plans(graphs: list[Any], budget: str) -> None:
    """At no budget nothing streams; at a third some parameter must stream; either way
    some of the model runs on the virtual device. What each plan says the virtual device
    holds at its peak adds up to its predicted peak, streamed weights among it only where
    some stream."""
    summary = summarize(graphs)
    assert summary.graphs > 0, "the backend planned no graph"
    assert summary.on_device, f"nothing ran on {DEVICE}: {summary}"
    if budget == "none":
        assert summary.streamed == 0, f"a roomy device should stream nothing: {summary}"
    else:
        assert summary.streamed > 0, f"a third of the parameters' bytes must stream: {summary}"
    for graph in graphs:
        plan = graph.plan
        (peak,) = [p for p in plan.peaks if p.device == DEVICE]
        pieces = [*peak.resident, *peak.streamed, *peak.reading, *peak.activations]
        assert sum(size for _, size in pieces) == peak.bytes == plan.predicted_peak(DEVICE)
        assert not peak.streamed or any(r.streams for r in plan.residency)


def peak(compiled: tt.CompiledModule) -> int:
    return compiled.measured_peaks().get(DEVICE, 0)


def _exception_types() -> dict[str, type[BaseException]]:
    return {
        "AssertionError": AssertionError,
        "BackendCompilerFailed": torch._dynamo.exc.BackendCompilerFailed,
        "PlanInfeasible": tt.PlanInfeasible,
        "VirtualDeviceOutOfMemory": tt.VirtualDeviceOutOfMemory,
    }


def entry_cases(entries: Any, budgets: Any, known_failures: bool = True) -> list[Any]:
    """One ``pytest.param(entry, budget)`` per entry and budget, marked ``corpus`` (and
    ``corpus_full`` outside the quick subset); with ``known_failures``, an entry's known
    failure at a budget is its strict xfail."""
    cases = []
    for entry in entries:
        for budget in budgets:
            marks: list[Any] = [pytest.mark.corpus]
            if not entry.quick:
                marks.append(pytest.mark.corpus_full)
            if known_failures and budget in entry.xfail:
                marks.append(known_failure(entry.xfail[budget]))
            cases.append(pytest.param(entry, budget, id=f"{entry.name}-{budget}", marks=marks))
    return cases


def quick_only(cases: list[Any], quick: set[str]) -> list[Any]:
    """``cases`` with only those whose id is in ``quick`` left in the quick subset (the rest
    marked ``corpus_full``): a check whose every case would cost ``make check`` too much."""
    return [
        case
        if case.id in quick
        else pytest.param(*case.values, id=case.id, marks=[*case.marks, pytest.mark.corpus_full])
        for case in cases
    ]


def known_failure(reason: str) -> pytest.MarkDecorator:
    """The strict xfail of a known failure; the reason's first word names the exception it
    must raise, so that a different failure is not taken for it."""
    name = re.match(r"\w+", reason)
    types = _exception_types()
    assert name is not None and name.group() in types, f"name the exception first: {reason!r}"
    return pytest.mark.xfail(strict=True, raises=types[name.group()], reason=reason)
