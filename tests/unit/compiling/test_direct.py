"""``compiling.direct``: an eager segment calls each ATen op's C++ entry point, not
``OpOverload.__call__``, and computes the same values."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tensortorrent_dynamo.compiling.direct import direct_calls


def _graph() -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    def f(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.nn.functional.linear(x, w).view(2, -1).softmax(-1)
        return h + torch.arange(h.shape[-1]), h.t()

    args = [torch.randn(2, 3, 4), torch.randn(5, 4)]
    return make_fx(f)(*args), args


def test_direct_calls_compute_the_same_through_the_ops_entry_points() -> None:
    gm, args = _graph()
    before = gm.code
    direct = direct_calls(gm)
    calls = [n for n in direct.graph.nodes if n.op == "call_function"]
    assert calls and not [n for n in calls if isinstance(n.target, torch._ops.OpOverload)]
    assert "torch.ops.aten" not in direct.code
    assert gm.code == before, "the segment's own graph is unchanged"
    assert [n.name for n in direct.graph.nodes] == [n.name for n in gm.graph.nodes]
    for got, want in zip(direct(*args), gm(*args), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        # a view stays a view, with the same layout
        assert got.stride() == want.stride()
