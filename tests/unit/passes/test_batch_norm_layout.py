"""The batch-norm layout pass: a batch norm over a transposed input gives the graph the
layout it was traced with (torch's CPU kernel returns a contiguous output where its meta
function keeps the input's strides, and the graph's later ``view`` then fails)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import tensortorrent as tt
from tensortorrent_dynamo.functional import capture
from tensortorrent_dynamo.passes.batch_norm_layout import BatchNormLayout

aten = torch.ops.aten


class NormOverPatches(nn.Module):
    """PatchTST's shape of it: a batch norm over the channels of (batch, patches, d),
    transposed in and out, then flattened with a view."""

    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x.transpose(1, 2)).transpose(1, 2)
        return self.proj(y.reshape(-1, y.shape[-1]))


def _copies(gm: torch.fx.GraphModule) -> int:
    return sum(n.target is aten.copy.default for n in gm.graph.nodes)


def test_a_transposed_batch_norm_is_laid_out_as_traced() -> None:
    model, x = NormOverPatches().eval(), torch.randn(3, 5, 8)
    # capture runs the pass
    ((gm, inputs),) = capture(model, x)
    assert _copies(gm) == 1
    with torch.no_grad():
        (got,) = gm(*inputs.values)
        torch.testing.assert_close(got, model(x))
    # nothing left to lay out: a second run changes nothing more
    BatchNormLayout()(gm)
    assert _copies(gm) == 1


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_inputs_the_kernel_lays_out_as_traced_are_left(memory_format: torch.memory_format) -> None:
    model = nn.Sequential(nn.BatchNorm2d(4), nn.Conv2d(4, 4, 1)).eval()
    x = torch.randn(2, 4, 5, 5).contiguous(memory_format=memory_format)
    ((gm, _),) = capture(model, x)
    assert _copies(gm) == 0


def test_a_model_with_a_transposed_batch_norm_matches_eager() -> None:
    """Compiled at no budget with eager segments: it used to fail with "view size is not
    compatible with input tensor's size and stride"."""
    model, x = NormOverPatches().eval(), torch.randn(3, 5, 8)
    with torch.no_grad():
        expected = model(x)
        got = tt.compile(model, example_inputs=(x,), compiler="eager")(x)
    torch.testing.assert_close(got, expected)
