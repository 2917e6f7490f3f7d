"""The compiler race never runs the graph where it cannot be timed honestly."""

from __future__ import annotations

from typing import Any

import torch

from tensortorrent_dynamo.compiling.segments import keep_faster


class _MustNotRun(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.segment = torch.nn.Identity()

    def forward(self, *args: Any) -> Any:
        raise AssertionError("the graph was run")


def test_a_graph_with_symbolic_sizes_is_not_timed() -> None:
    # after a dynamic-shape recompile Dynamo's example inputs hold SymInts (ints here)
    note = keep_faster(_MustNotRun(), {"segment": "inductor"}, [torch.randn(2, 3), 3])
    assert note is not None and "not timed" in note and "symbolic sizes" in note
