"""Every corpus entry planned for a host with ``cuda:0`` (no GPU needed), at no budget and at
a third of its parameters' bytes, and the graphs ``generate()`` calls (prefill and decode,
with either cache) at a third: each segment on ``cuda:0`` runs on the fake tensors it
is compiled for without mixing devices, and what it returns is on ``cuda:0``. A model
traced on the host makes tensors of its own there (positions, mask fill values): run on
an accelerator, each must be made where its segment runs."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tensortorrent_dynamo.functional import GraphInputs, capture, functional
from tests.fake_cuda import CUDA, cuda_segments, plan_on_cuda, run_on_fake_cuda

from .harness import entry_cases, param_bytes
from .models import BUDGETS, BY_NAME, ENTRIES, GENERATE_MODELS, Entry


def _check_on_cuda(
    graphs: list[tuple[torch.fx.GraphModule, GraphInputs]], limit: int | None
) -> int:
    """Plans each graph, runs its CUDA segments on fake tensors; returns how many there were."""
    planned = 0
    for index, (gm, inputs) in enumerate(graphs):
        rewritten = plan_on_cuda(index, gm, inputs, limit)
        for name in cuda_segments(rewritten):
            planned += 1
            for i, out in enumerate(run_on_fake_cuda(rewritten, name)):
                if isinstance(out, torch.Tensor):
                    assert out.device == torch.device(CUDA), f"graph {index} {name} output {i}"
    return planned


# nothing runs for real here: the known failures of the forward test (peaks) do not apply
@pytest.mark.parametrize(("entry", "budget"), entry_cases(ENTRIES, BUDGETS, known_failures=False))
def test_entry_segments_run_on_cuda(entry: Entry, budget: str) -> None:
    model = entry.build()
    graphs = capture(lambda kwargs: model(**kwargs), entry.inputs(0))
    limit = None if budget == "none" else param_bytes(model) // 3
    assert _check_on_cuda(graphs, limit), f"no segment of {entry.name} was planned on {CUDA}"


def _generate_cases() -> list[Any]:
    cases = []
    for name in GENERATE_MODELS:
        for cache in ("dynamic", "static"):
            marks: list[Any] = [pytest.mark.corpus]
            if (name, cache) != (GENERATE_MODELS[0], "dynamic"):
                marks.append(pytest.mark.corpus_full)
            cases.append(pytest.param(name, cache, id=f"{name}-{cache}-third", marks=marks))
    return cases


@pytest.mark.parametrize(("name", "cache"), _generate_cases())
def test_generate_segments_run_on_cuda(name: str, cache: str) -> None:
    model = BY_NAME[name].build()
    graphs: list[tuple[torch.fx.GraphModule, GraphInputs]] = []

    def keep(gm: torch.fx.GraphModule, inputs: GraphInputs) -> Any:
        graphs.append((gm, inputs))
        return gm.forward

    model.forward = torch.compile(
        model.forward, backend=lambda gm, example: functional(gm, example, keep)
    )
    kwargs: dict[str, Any] = {"max_new_tokens": 3, "do_sample": False, "pad_token_id": 0}
    if cache == "static":
        kwargs["cache_implementation"] = "static"
    with torch.no_grad():
        for shape in ((1, 5), (2, 9)):  # the second prompt: graphs with symbolic sizes
            model.generate(torch.randint(3, 100, shape), disable_compile=True, **kwargs)
    assert len(graphs) >= 2, "generate() made a prefill and a decode graph"
    assert _check_on_cuda(graphs, param_bytes(model) // 3)
