"""The param-views pass: each reader of a view of a parameter gets a view of its own (its
graph dumps are tested with the other log names, tests/integration/test_registration.py)."""

from __future__ import annotations

import torch
from torch import nn

from tensortorrent_dynamo.cost_graph import param_view_nodes
from tensortorrent_dynamo.functional import capture
from tensortorrent_dynamo.passes.param_views import OneReaderPerParamView


class TwoReaders(nn.Module):
    """One weight read twice through its transpose (``t(W)`` feeds two matmuls)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.w.t()
        return x @ w + (x * 2) @ w


def test_each_reader_gets_its_own_view_and_values_are_unchanged() -> None:
    model, x = TwoReaders(), torch.randn(3, 8)
    # capture runs the pass: every view of the weight has one reader
    ((gm, inputs),) = capture(model, x)
    views = param_view_nodes(gm, inputs.params)
    assert len(views) >= 2 and all(len(v.users) == 1 for v in views)
    with torch.no_grad():
        (got,) = gm(*inputs.values)
        torch.testing.assert_close(got, model(x))
    # nothing left to copy: the pass changes nothing a second time
    result = OneReaderPerParamView(inputs.params)(gm)
    assert result is not None and not result.modified
