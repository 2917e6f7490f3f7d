"""Whole models through the backend, compared with eager, resident and streamed."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch

import tensortorrent as tt
from tests.models import TransformerBlock, TwoBreaks, mlp, param_bytes

FAST_VIRTUAL = {"virtual:0": {"flops": "2T", "bandwidth": "16GB", "latency": 1e-6}}


def _options(budget: int | str) -> dict[str, Any]:
    return {
        "budgets": {"virtual:0": budget, "cpu": "16GiB"},
        "virtual_devices": FAST_VIRTUAL,
        "compiler": "eager",
    }


# model, input, and a budget (as a fraction of the parameters) that forces streaming
MODELS = {
    "mlp": (lambda: mlp(128, 6), lambda: torch.randn(16, 128), 0.5),
    "transformer_block": (lambda: TransformerBlock(64, 4), lambda: torch.randn(1, 4, 64), 0.75),
    "two_breaks": (lambda: TwoBreaks(96, depth=4), lambda: torch.randn(8, 96), 0.3),
}


def _run(name: str, budget_fraction: float) -> tuple[tt.CompiledModule, torch.Tensor, int]:
    make_model, make_input, _ = MODELS[name]
    model, x = make_model(), make_input()
    budget = int(param_bytes(model) * budget_fraction)
    compiled = tt.compile(model, example_inputs=(x,), **_options(budget))
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        x2 = make_input()
        torch.testing.assert_close(compiled(x2), model(x2))
    return compiled, x, budget


@pytest.mark.parametrize("name", list(MODELS))
def test_everything_resident(name: str) -> None:
    compiled, _, budget = _run(name, 4.0)
    graphs = compiled.graphs
    assert len(graphs) == (3 if name == "two_breaks" else 1)
    for graph in graphs:
        assert not any(graph.plan.native.param_streamed), "a roomy budget should stream nothing"
        assert "virtual:0" in {d for _, d in graph.compilers_by_device()}
    assert 0 < compiled.measured_peaks()["virtual:0"] <= budget


@pytest.mark.parametrize("name", list(MODELS))
def test_streaming_under_a_small_budget(name: str) -> None:
    compiled, _, budget = _run(name, MODELS[name][2])
    streamed = [p for g in compiled.graphs for p in g.plan.native.param_streamed if p]
    assert streamed, "parameters larger than the budget must stream"
    assert "prefetch" in compiled.graphs[0].module.code
    peak = compiled.measured_peaks()["virtual:0"]
    assert 0 < peak <= budget, f"measured peak {peak} over budget {budget}"


def test_three_graphs_share_one_ledger() -> None:
    model, x = TwoBreaks(96, depth=4), torch.randn(8, 96)
    per_graph = param_bytes(model.a)
    budget = int(per_graph * 1.6)  # room for one graph's weights, not two
    compiled = tt.compile(model, example_inputs=(x,), **_options(budget))
    # the graphs' runtimes share one set of resident copies
    assert len({id(g.runtime.resident) for g in compiled.graphs}) == 1
    resident_total = compiled.graphs[0].runtime.resident_bytes("virtual:0")
    assert resident_total <= budget
    assert any(any(g.plan.native.param_streamed) for g in compiled.graphs[1:])
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))


def test_torch_compile_by_name_with_options() -> None:
    model, x = mlp(64, 3), torch.randn(4, 64)
    compiled = torch.compile(model, backend="tensortorrent", options=_options("40KiB"))
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    assert tt.tensortorrent_backend.graphs, "the registered backend object did the work"


def test_plan_is_deterministic() -> None:
    hashes = []
    for _ in range(2):
        torch._dynamo.reset()
        compiled, _, _ = _run("mlp", 0.5)
        hashes.append(compiled.plan_hashes())
    assert hashes[0] == hashes[1]
    other, _, _ = _run("mlp", 4.0)
    assert other.plan_hashes() != hashes[0]


def test_infeasible_budget_names_the_smallest_workable_one() -> None:
    model, x = mlp(64, 3), torch.randn(4, 64)
    options = _options("1KiB") | {"devices": ["virtual:0"]}
    with pytest.raises(tt.PlanInfeasible) as info:
        tt.compile(model, example_inputs=(x,), **options)
    needed = info.value.min_budgets["virtual:0"]
    assert needed > 1024
    assert "virtual:0" in str(info.value)
    torch._dynamo.reset()
    compiled = tt.compile(
        model, example_inputs=(x,), **(options | {"budgets": {"virtual:0": needed}})
    )
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    assert compiled.measured_peaks()["virtual:0"] <= needed


def test_slow_accelerator_is_not_used() -> None:
    model, x = mlp(64, 3), torch.randn(4, 64)
    options = _options("1MiB")
    options["virtual_devices"] = {"virtual:0": {"flops": 1e6, "bandwidth": 1e6}}
    compiled = tt.compile(model, example_inputs=(x,), **options)
    (graph,) = compiled.graphs
    assert {d for _, d in graph.compilers_by_device()} == {"cpu"}


def test_uncostable_node_falls_back_to_cpu_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    from tensortorrent_dynamo import cost_graph

    real = cost_graph._count_flops

    def flaky(node: torch.fx.Node, sizes: Any = None) -> float:
        if "relu" in str(node.target):
            raise RuntimeError("no fake kernel")
        return real(node, sizes)

    monkeypatch.setattr(cost_graph, "_count_flops", flaky)
    model, x = mlp(64, 2), torch.randn(4, 64)
    with pytest.warns(tt.TensorTorrentWarning, match="no fake kernel"):
        compiled = tt.compile(model, example_inputs=(x,), **_options("1MiB"))
    (graph,) = compiled.graphs
    relus = [i for i, n in enumerate(graph.plan.cost.nodes) if "relu" in n.target]
    assert relus and all(graph.plan.node_device(i) == "cpu" for i in relus)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    torch._dynamo.reset()
    with pytest.raises(tt.UnsupportedNodeError, match="no fake kernel"):
        tt.compile(model, example_inputs=(x,), strict=True, **_options("1MiB"))


def test_bad_options_fail_before_tracing() -> None:
    with pytest.raises(tt.OptionsError, match="valid options"):
        tt.compile(mlp(8, 1), example_inputs=(torch.randn(1, 8),), budget="1GB")


def test_grad_enabled_call_warns_and_still_matches() -> None:
    model, x = mlp(32, 2), torch.randn(4, 32)
    compiled = tt.compile(model, example_inputs=(x,), **_options("1MiB"))
    with pytest.warns(tt.TensorTorrentWarning, match="inference only"):
        out = compiled(x)
    torch.testing.assert_close(out, model(x).detach())


def test_device_map_in_accelerate_form() -> None:
    compiled, _, _ = _run("mlp", MODELS["mlp"][2])
    device_map = compiled.to_device_map()
    assert set(device_map) == {"0", "2", "4", "6", "8", "10"}
    (graph,) = compiled.graphs
    for pid, param in enumerate(graph.plan.cost.params):
        module = param.fqn.rpartition(".")[0]
        if graph.plan.residency[pid].streams:
            assert device_map[module] == "cpu"
    assert set(device_map.values()) <= {"cpu", "virtual:0"}


def test_dynamic_shapes_plan_states_the_sizes_it_assumed() -> None:
    model = mlp(64, 3)
    compiled = torch.compile(model, backend="tensortorrent", options=_options("1MiB"), dynamic=True)
    with torch.no_grad():
        for batch in (5, 7):
            x = torch.randn(batch, 64)
            torch.testing.assert_close(compiled(x), model(x))
    (graph,) = tt.tensortorrent_backend.graphs  # one dynamic graph serves both sizes
    # planned for the range holding the traced size, costed at its bound
    assert list(graph.plan.cost.assumed_sizes.values()) == [8]
    from tensortorrent_dynamo.report.explain import explain_graph

    assert "dynamic sizes planned for: s" in explain_graph(graph)
    assert "<= 8" in explain_graph(graph)


def test_dynamic_shapes_reuse_a_plan_within_its_range_and_plan_again_beyond(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model, width = mlp(256, 4), 256
    budget = int(param_bytes(model) * 0.6)  # some weights stream
    compiled = torch.compile(model, backend="tensortorrent", options=_options(budget), dynamic=True)
    peaks = []
    with caplog.at_level("INFO", logger="tensortorrent_dynamo"), torch.no_grad():
        for batch in (5, 7, 12, 30, 6):
            x = torch.randn(batch, width)
            torch.testing.assert_close(compiled(x), model(x))
            graphs = tt.tensortorrent_backend.graphs
            peaks.append(max(g.runtime.virtual["virtual:0"].ledger.peak for g in graphs))
            for g in graphs:
                g.runtime.virtual["virtual:0"].ledger.reset_peak()
    graphs = tt.tensortorrent_backend.graphs
    # 5 and 7 share the plan for sizes up to 8, 6 reuses it; 12 and 30 are planned anew
    assert [list(g.plan.cost.assumed_sizes.values()) for g in graphs] == [[8], [16], [32]]
    assert [g.calls for g in graphs] == [3, 1, 1]
    assert caplog.text.count("beyond the ranges planned for") == 2
    assert any(g.plan.native.param_streamed[i] for g in graphs for i in range(8))
    assert all(0 < peak <= budget for peak in peaks), (peaks, budget)


def test_resident_copies_follow_in_place_changes_of_the_weights() -> None:
    model, x = mlp(64, 3), torch.randn(4, 64)
    compiled = tt.compile(model, example_inputs=(x,), **_options("1MiB"))
    (graph,) = compiled.graphs
    assert not any(graph.plan.native.param_streamed)
    with torch.no_grad():
        model[0].weight.mul_(-2.0)
        torch.testing.assert_close(compiled(x), model(x))


def test_a_recompile_of_the_same_graph_reuses_its_plan(caplog: pytest.LogCaptureFixture) -> None:
    model, x = mlp(64, 3), torch.randn(4, 64)
    compiled = tt.compile(model, example_inputs=(x,), **_options("1MiB"))
    with caplog.at_level("INFO", logger="tensortorrent_dynamo"):
        with pytest.warns(tt.TensorTorrentWarning, match="inference only"):
            compiled(x)  # grad mode changed: Dynamo recompiles the same graph
        with torch.no_grad():
            compiled(torch.randn(6, 64))  # other shapes: a new graph, planned anew
    assert "reusing plan" in caplog.text
    assert len(compiled.graphs) == 2


def test_two_unequal_virtual_devices_share_the_model_unequally() -> None:
    model, x = mlp(128, 8), torch.randn(16, 128)
    budgets = {
        "virtual:0": int(param_bytes(model) * 0.7),
        "virtual:1": int(param_bytes(model) * 0.4),
    }
    compiled = tt.compile(
        model,
        example_inputs=(x,),
        budgets=budgets,
        virtual_devices={
            "virtual:0": {"flops": "2T", "bandwidth": "16GB", "latency": 1e-6},
            "virtual:1": {"flops": "1T", "bandwidth": "16GB", "latency": 1e-6},
        },
        devices=["virtual:0", "virtual:1"],
        compiler="eager",
    )
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    (graph,) = compiled.graphs
    nodes_on = {
        d: sum(graph.plan.node_device(i) == d for i in range(len(graph.plan.cost.nodes)))
        for d in budgets
    }
    assert nodes_on["virtual:0"] > nodes_on["virtual:1"] > 0
    peaks = compiled.measured_peaks()
    assert all(0 < peaks[d] <= budgets[d] for d in budgets), (peaks, budgets)


class _SharedAcrossABreak(torch.nn.Module):
    """One weight used by two graphs (a graph break between its two uses), as prefill and
    decode graphs share a model's weights."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(256, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.lin(x))
        torch._dynamo.graph_break()
        return self.lin(x)


def test_graphs_share_a_resident_copy_instead_of_copying_again() -> None:
    model, x = _SharedAcrossABreak(), torch.randn(4, 256)
    with torch.no_grad():
        expected = model(x)
    budget = param_bytes(model) * 3 // 2  # room for one resident copy, not two
    compiled = tt.compile(model, (x,), devices=["virtual:0"], **_options(budget))
    assert len(compiled.graphs) == 2
    assert all(g.plan.native.chosen == "all-on-virtual:0" for g in compiled.graphs)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), expected)
    assert compiled.measured_peaks()["virtual:0"] <= budget
    assert compiled.graphs[0].runtime.resident_bytes("virtual:0") == param_bytes(model)


class _TwoLayersAcrossABreak(torch.nn.Module):
    """Two weights, one each side of a graph break."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = torch.nn.Linear(256, 256, bias=False)
        self.second = torch.nn.Linear(256, 256, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.first(x))
        torch._dynamo.graph_break()
        return self.second(x)


def test_a_graph_that_does_not_fit_beside_the_others_copies_has_them_keep_nothing() -> None:
    # The first graph keeps its weight resident in a budget of 1.1 weights; the second
    # then has a tenth of a weight left, less than the one it must read. The first graph
    # is planned again before its next call, keeping nothing (its copy is dropped now), and
    # the second is planned beside none of its copies: both stream, within the budget.
    model, x = _TwoLayersAcrossABreak(), torch.randn(4, 256)
    weight = 256 * 256 * 4
    budget = weight * 11 // 10
    compiled = tt.compile(model, (x,), devices=["virtual:0"], **_options(budget))
    first, second = compiled.graphs
    assert first.lean_pending and not first.plan.residency[0].streams
    assert second.plan.residency[0].streams
    for _ in range(2):
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x))
    assert not first.lean_pending and first.plan.residency[0].streams
    assert compiled.measured_peaks()["virtual:0"] <= budget


def test_a_graph_that_does_not_fit_at_all_says_what_the_others_need() -> None:
    # Half a weight: the second graph cannot read its weight even beside nothing kept; the
    # error says the budget to set, and it is enough.
    model, x = _TwoLayersAcrossABreak(), torch.randn(4, 256)
    weight = 256 * 256 * 4
    with pytest.raises(tt.PlanInfeasible) as caught:
        tt.compile(model, (x,), devices=["virtual:0"], **_options(weight // 2))
    (needed,) = caught.value.min_budgets.values()
    assert needed > weight
    # what the device holds at the peak of the graph refused: its weight, streamed whole
    (peak,) = caught.value.peaks
    assert peak.device == "virtual:0" and peak.streamed == (("first.weight", weight),)
    assert "first.weight alone" in str(caught.value)
    torch._dynamo.reset()
    compiled = tt.compile(model, (x,), devices=["virtual:0"], **_options(needed))
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))


class _WideThenNarrowAcrossABreak(_TwoLayersAcrossABreak):
    """A graph with large activations (three 256 KiB values at a batch of 256), then, past a
    graph break, one with a single row."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.first(x)).sum(0, keepdim=True)
        torch._dynamo.graph_break()
        return self.second(x)


def test_host_ram_keeps_the_room_an_earlier_graph_runs_in(tmp_path: Any) -> None:
    # The first graph keeps its weight in RAM and needs 768 KiB to run (its weight and
    # three activations); the second then has 8 KiB more than its own weight in a budget
    # of 776 KiB, enough to keep that weight too, which the first graph's next run would
    # find in the way: 1 MiB in a budget of 776 KiB. The second graph must leave that room:
    # it reads its weight from disk as it runs instead.
    model, x = _WideThenNarrowAcrossABreak(), torch.randn(256, 256)
    with torch.no_grad():
        expected = model(x)  # the weights a plan puts on disk leave the model's tensors
    options: dict[str, Any] = {"offload_dir": str(tmp_path), "compiler": "eager"}
    budget = 776 * 1024
    compiled = tt.compile(model, (x,), budgets={"cpu": budget}, **options)
    with torch.no_grad():  # bit for bit: the weight read from disk is aligned as eager's was
        torch.testing.assert_close(compiled(x), expected, atol=0, rtol=0)
        torch.testing.assert_close(compiled(x), expected, atol=0, rtol=0)
    assert compiled.graphs[1].plan.residency[0].reads_from_disk
    _fit_beside_each_other(compiled.graphs, budget)
    # Where the second graph needs that room itself (as many rows as the first), it fits
    # beside the first only once that keeps nothing: the first graph is planned again
    # before its next call, reading its weight from disk as it runs, and both fit.
    torch._dynamo.reset()
    model, x = _TwoLayersAcrossABreak(), torch.randn(256, 256)
    with torch.no_grad():
        expected = model(x)
    compiled = tt.compile(model, (x,), budgets={"cpu": budget}, **options)
    assert compiled.graphs[0].lean_pending
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), expected)
        torch.testing.assert_close(compiled(x), expected)
    assert all(g.plan.residency[0].reads_from_disk for g in compiled.graphs)
    _fit_beside_each_other(compiled.graphs, budget)


class _FirstOnBothSides(torch.nn.Module):
    """``first`` on a few rows; past a graph break (while ``deep``), ``first`` again, then
    two more layers, on many rows (128 KiB activations)."""

    deep = True

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second, self.third = (
            torch.nn.Linear(256, 256, bias=False) for _ in range(3)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.first(x[:8])
        if self.deep:
            torch._dynamo.graph_break()
            x = self.third(self.second(self.first(x.repeat(16, 1))))
        return x


def test_a_graph_whose_ram_weights_a_later_graph_puts_on_disk_is_planned_again(
    tmp_path: Any,
) -> None:
    # The first graph keeps `first` in RAM. The second, short of room, reads the weights
    # from disk in row chunks, `first`'s too, and releases their RAM: the first graph's next
    # call read an empty tensor (an error from deep inside torch). It is planned again
    # before that call, reading `first` from disk too, and both graphs fit beside each other.
    model, x = _FirstOnBothSides(), torch.randn(64, 256)
    with torch.no_grad():
        expected = model(x)
    budget = 544 * 1024
    options: dict[str, Any] = {"offload_dir": str(tmp_path), "compiler": "eager"}
    compiled = tt.compile(model, budgets={"cpu": budget}, stream_chunk_bytes="64KiB", **options)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), expected)
        first, second = compiled.graphs
        assert not any(r.on_disk for r in first.plan.residency)
        assert any(
            r.reads_from_disk and p.fqn.startswith("first.weight")
            for p, r in zip(second.plan.cost.params, second.plan.residency, strict=True)
        )
        torch.testing.assert_close(compiled(x), expected)
        torch.testing.assert_close(compiled(x), expected)
    assert compiled.graphs == [first, second]
    assert all(r.reads_from_disk for r in first.plan.residency)
    _fit_beside_each_other(compiled.graphs, budget)


def test_a_graph_called_many_times_alone_is_planned_again_for_a_later_graph(
    tmp_path: Any,
) -> None:
    # The shallow graph, called twice alone, keeps `first` in RAM. The deep graph, compiled
    # later, needs that room: its plan reads `first` from disk in row chunks and releases
    # its RAM, and the shallow graph is planned again before its next call, reading it from
    # disk too. Before, a graph alone in its frame after its second call could no longer be
    # planned again, so the later plan had to leave `first` in RAM, and at this budget it
    # was PlanInfeasible (a model used one way, then another: a forward, then with labels).
    model, x = _FirstOnBothSides(), torch.randn(64, 256)
    with torch.no_grad():
        deep = model(x)
        model.deep = False
        shallow = model(x)
    options: dict[str, Any] = {"offload_dir": str(tmp_path), "compiler": "eager"}
    budget = 700 * 1024
    compiled = tt.compile(model, budgets={"cpu": budget}, stream_chunk_bytes="64KiB", **options)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), shallow)
        torch.testing.assert_close(compiled(x), shallow)
        first = compiled.graphs[0]
        assert not any(r.on_disk for r in first.plan.residency), "alone, it keeps `first`"
        model.deep = True
        torch.testing.assert_close(compiled(x), deep)
        model.deep = False
        torch.testing.assert_close(compiled(x), shallow)
        model.deep = True
        torch.testing.assert_close(compiled(x), deep)
    shallow_graph, deep_graph = compiled.graphs[0], compiled.graphs[-1]
    assert shallow_graph is first and first.stale is None
    assert all(r.on_disk for r in first.plan.residency), "planned again: its home is disk"
    assert any(
        r.reads_from_disk and p.fqn.startswith("first.weight")
        for p, r in zip(deep_graph.plan.cost.params, deep_graph.plan.residency, strict=True)
    )
    _fit_beside_each_other([shallow_graph, deep_graph], budget)


def _fit_beside_each_other(graphs: list[Any], budget: int) -> None:
    """Whichever of two graphs runs, it runs beside what the other keeps in RAM, within
    the host budget (a copy both keep is one copy, counted in the peak of each)."""
    kept = [
        {
            p.fqn: p.nbytes
            for p, r in zip(g.plan.cost.params, g.plan.residency, strict=True)
            if (r.keeps_copy and r.device == "cpu") or not r.on_disk
        }
        for g in graphs
    ]
    for g, own, other in ((graphs[0], kept[0], kept[1]), (graphs[1], kept[1], kept[0])):
        beside = sum(size for fqn, size in other.items() if fqn not in own)
        assert g.plan.predicted_peak("cpu") + beside <= budget, (g.plan.graph_index, kept)


def test_planning_leaves_the_callers_random_generator_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Planning draws random numbers of its own (the profile's probes, a graph timed to choose
    # its compiler), at compile time and at calls: a graph of symbolic sizes is planned for
    # each new range of them when a call first needs it, where Dynamo's own guard of the
    # generators is not around it. A draw in a stage of every plan stands in for those.
    from tensortorrent_dynamo import pipeline

    costed = pipeline.build_cost_graph
    at_calls = []

    def drawing(*args: Any, **kwargs: Any) -> Any:
        torch.rand(16)
        at_calls.append(not any(f.function == "_compile" for f in inspect.stack()))
        return costed(*args, **kwargs)

    monkeypatch.setattr(pipeline, "build_cost_graph", drawing)
    model = mlp(32, 2)
    compiled = torch.compile(model, backend="tensortorrent", options=_options(1 << 30))
    for rows in (2, 3, 5, 9, 17, 33):
        x = torch.randn(rows, 32)
        torch.manual_seed(rows)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x))
        drawn = torch.rand(4)  # what a sampler draws next: as though nothing was planned
        torch.manual_seed(rows)
        torch.testing.assert_close(drawn, torch.rand(4), rtol=0, atol=0, msg=f"{rows} rows")
    assert any(at_calls), at_calls
