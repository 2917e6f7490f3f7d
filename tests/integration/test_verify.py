"""``verify=True`` checks the first call segment by segment against eager and names the
first segment whose outputs differ."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import tensortorrent as tt
from tensortorrent_dynamo import pipeline
from tensortorrent_dynamo.compiling.segments import compile_segments
from tests.models import mlp, param_bytes

FAST_VIRTUAL = {"virtual:0": {"flops": "2T", "bandwidth": "16GB", "latency": 1e-6}}


def _streamed(model: torch.nn.Module, x: torch.Tensor, **options: Any) -> Any:
    """``model`` compiled (not yet called) with a third of its weights' room on virtual:0."""
    compiled = tt.compile(
        model,
        compiler="eager",
        budgets={"virtual:0": param_bytes(model) // 3},
        virtual_devices=FAST_VIRTUAL,
        devices=["virtual:0"],
        verify=True,
        **options,
    )
    return compiled


class _OffByOne(torch.nn.Module):
    """A segment that computes the wrong thing: what a lost write or a bad layout gives."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any) -> Any:
        out = self.inner(*args)
        if isinstance(out, tuple):
            return (out[0] + 1, *out[1:])
        return out + 1


def test_a_right_plan_verifies_and_returns_the_answer() -> None:
    model, x = mlp(128, 8), torch.randn(8, 128)
    with torch.no_grad():
        expected = model(x)
        compiled = _streamed(model, x)
        torch.testing.assert_close(compiled(x), expected)  # checked on this first call
        torch.testing.assert_close(compiled(x), expected)
    (graph,) = compiled.graphs
    assert graph.reference is None, "only the first call is checked"
    plan = graph.plan
    assert any(plan.residency[i].streams for i in range(len(plan.cost.params)))


def test_a_wrong_segment_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    model, x = mlp(128, 8), torch.randn(8, 128)
    broken: list[tuple[str, str]] = []

    def compile_then_break(rewritten: Any, runtime: Any, settings: Any) -> dict[str, str]:
        used = compile_segments(rewritten, runtime, settings)
        names = list(used)
        assert len(names) >= 2, "the plan has several segments"
        segment = getattr(rewritten.module, names[1])
        segment.fn = _OffByOne(segment.fn)
        broken.append((names[1], segment.device))
        return used

    monkeypatch.setattr(pipeline, "compile_segments", compile_then_break)
    with pytest.raises(tt.VerifyMismatch) as raised, torch.no_grad():
        _streamed(model, x)(x)
    ((name, device),) = broken
    assert raised.value.segment == name
    message = str(raised.value)
    assert f"segment {name} on {device}" in message and "differs from eager at node" in message
    assert "nodes " in message


def test_verify_is_a_boolean_option() -> None:
    with pytest.raises(tt.OptionsError, match="option 'verify'"):
        tt.compile(mlp(16, 2), verify="yes")
