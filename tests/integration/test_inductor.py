"""Host segments compiled by Inductor (cold compiles take tens of seconds on 2 cores)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

import tensortorrent as tt
from tests.models import mlp


@pytest.mark.inductor
def test_cpu_segments_compile_with_inductor() -> None:
    model, x = mlp(64, 2), torch.randn(8, 64)
    compiled = tt.compile(model, example_inputs=(x,), compiler="inductor", devices=["cpu"])
    (graph,) = compiled.graphs
    (name,) = graph.compilers
    segment = getattr(graph.module, name)
    assert segment.fn is not segment.eager_fn, "Inductor compiled the host segment"
    # both versions were timed and the faster one kept, as explain() says
    assert graph.compiler_note is not None and " kept: " in graph.compiler_note
    assert graph.compilers[name] == ("eager" if segment.use_eager else "inductor")
    assert f"compiler: {graph.compiler_note}" in compiled.explain()
    for use_eager in (False, True):
        segment.use_eager = use_eager
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x))


class _Counting(torch.nn.Module):
    """Writes to its buffers on every call, as a static KV cache's position counter and a
    train-mode BatchNorm do, and to a parameter (a step count kept as one, which scales the
    output)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)
        self.norm = torch.nn.BatchNorm1d(16)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))
        self.steps = torch.nn.Parameter(torch.zeros(()), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        self.steps.add_(1)
        return self.norm(self.linear(x)) * self.steps


@pytest.mark.inductor
def test_compiling_never_runs_the_graph_on_the_users_tensors() -> None:
    """The compiler race times the graph on copies of its inputs: compiling plus one call
    writes the model's buffers and the parameter it updates exactly once, and every later
    call as eager would. (The parameter was timed on as it was, 200 writes more, and every
    output scaled by them, until the race copied every input but the weights only read.)"""
    torch.manual_seed(0)
    model = _Counting().train()
    reference = copy.deepcopy(model)
    xs = [torch.randn(32, 16) for _ in range(3)]
    compiled = tt.compile(model, example_inputs=(xs[0],), compiler="inductor", devices=["cpu"])
    assert compiled.graphs[0].compiler_note is not None, "the race ran"
    with torch.no_grad():
        reference(xs[0])
    assert int(model.calls) == 1 and int(model.norm.num_batches_tracked) == 1
    assert float(model.steps) == 1
    for x in xs[1:]:
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), reference(x))
    for (name, tensor), (_, expected) in zip(
        [*model.named_buffers(), *model.named_parameters()],
        [*reference.named_buffers(), *reference.named_parameters()],
        strict=True,
    ):
        torch.testing.assert_close(tensor, expected, msg=name)


@pytest.mark.inductor
def test_segments_compile_without_a_second_aotautograd(monkeypatch: pytest.MonkeyPatch) -> None:
    """The functional graph's segments go to Inductor's inner compiler, decomposed as it
    expects: not through ``compile_fx``, whose own AOTAutograd would wrap every call."""
    import torch._inductor.compile_fx as inductor

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("compile_fx was called")

    monkeypatch.setattr(inductor, "compile_fx", refused)
    model, x = mlp(64, 2), torch.randn(8, 64)
    with torch.no_grad():
        expected = model(x)
    compiled = tt.compile(
        model, example_inputs=(x,), compiler="inductor", devices=["cpu"], strict=True
    )
    (graph,) = compiled.graphs
    (name,) = graph.compilers
    segment = getattr(graph.module, name)
    assert segment.fn is not segment.eager_fn, "Inductor compiled the host segment"
    segment.use_eager = False
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), expected)


class _Convolutions(torch.nn.Module):
    """Residual convolution blocks (GroupNorm, SiLU, a 3x3 convolution), a UNet's shape."""

    def __init__(self, channels: int = 64, blocks: int = 8) -> None:
        super().__init__()
        self.inp = torch.nn.Conv2d(4, channels, 3, padding=1)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(
                torch.nn.GroupNorm(8, channels),
                torch.nn.SiLU(),
                torch.nn.Conv2d(channels, channels, 3, padding=1),
            )
            for _ in range(blocks)
        )
        self.out = torch.nn.Conv2d(channels, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h)
        return self.out(h)


@pytest.mark.inductor
def test_segments_of_convolutions_pass_each_other_their_outputs_as_traced(
    tmp_path: Path,
) -> None:
    """A convolution net streamed from disk, its segments compiled by Inductor: each segment
    returns its outputs in the layout they were traced with, which the next one was compiled
    for. (Inductor returned a convolution's output channels-last, and the next segment
    failed on its input's strides, until its outputs were marked as the graph's.)"""
    torch.manual_seed(0)
    model = _Convolutions().eval()
    reference = copy.deepcopy(model)
    x = torch.randn(2, 4, 8, 8)
    budget = sum(p.numel() * p.element_size() for p in model.parameters()) // 3
    compiled = tt.compile(model, budgets={"cpu": budget}, offload_dir=str(tmp_path))
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(compiled(x), reference(x))
    (graph,) = compiled.graphs
    assert len(graph.compilers) > 1 and set(graph.compilers.values()) == {"inductor"}


class _Scaled(torch.nn.Module):
    """Elementwise ops only: the functional graph is the same whatever its input's layout."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.randn(16))
        self.shift = torch.nn.Parameter(torch.randn(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * self.scale + self.shift)


@pytest.mark.inductor
def test_a_recompile_for_another_input_layout_gets_segments_of_its_own() -> None:
    """Called with a transposed view, then with a contiguous tensor of the same shape:
    Dynamo recompiles (its guards check strides) into the same graph code and costs, whose
    Inductor segments assert the layout they were traced with. The second is compiled
    anew, not given the first's segments. (generate() passes its KV cache first as the
    prompt's transposed projections, then as concatenated tensors: the first decode graph's
    segments were reused for the second layout, and failed on its strides.)"""
    torch.manual_seed(0)
    model = _Scaled().eval()
    compiled = torch.compile(model, backend="tensortorrent", options={"compiler": "inductor"})
    transposed = torch.randn(2, 16, 8).transpose(1, 2)
    contiguous = torch.randn(2, 8, 16)
    with torch.no_grad():
        for x in (transposed, contiguous, transposed):
            torch.testing.assert_close(compiled(x), model(x))
    from tensortorrent_dynamo import tensortorrent_backend

    assert len(tensortorrent_backend.graphs) == 2
