"""Every corpus entry planned for a host with ``cuda:0`` (no GPU needed), at no budget and at
a third of its parameters' bytes: each segment on ``cuda:0`` runs on the fake tensors it
is compiled for without mixing devices, and what it returns is on ``cuda:0``. A model
traced on the host makes tensors of its own there (positions, mask fill values): run on
an accelerator, each must be made where its segment runs."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tensortorrent_dynamo.functional import capture
from tests.fake_cuda import CUDA, cuda_segments, plan_on_cuda, run_on_fake_cuda

from .harness import param_bytes
from .models import BUDGETS, ENTRIES, Entry


def _cases() -> list[Any]:
    cases = []
    for entry in ENTRIES:
        for budget in BUDGETS:
            marks: list[Any] = [pytest.mark.corpus]
            if not entry.quick:
                marks.append(pytest.mark.corpus_full)
            cases.append(pytest.param(entry, budget, id=f"{entry.name}-{budget}", marks=marks))
    return cases


@pytest.mark.parametrize(("entry", "budget"), _cases())
def test_entry_segments_run_on_cuda(entry: Entry, budget: str) -> None:
    model = entry.build()
    graphs = capture(lambda kwargs: model(**kwargs), entry.inputs(0))
    limit = None if budget == "none" else param_bytes(model) // 3
    planned = 0
    for index, (gm, inputs) in enumerate(graphs):
        rewritten = plan_on_cuda(index, gm, inputs, limit)
        for name in cuda_segments(rewritten):
            planned += 1
            for i, out in enumerate(run_on_fake_cuda(rewritten, name)):
                if isinstance(out, torch.Tensor):
                    assert out.device == torch.device(CUDA), f"graph {index} {name} output {i}"
    assert planned, f"no segment of {entry.name} was planned on {CUDA}"
