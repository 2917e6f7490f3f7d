"""``session``: what the graphs of one set of settings share, and which resident copies each
keeps beside the others."""

from __future__ import annotations

import functools
import types
from typing import Any

import pytest
import torch

from tensortorrent_dynamo.errors import PlanInfeasible, StalePlanError
from tensortorrent_dynamo.plan.planner import GraphPlan, Keep, resident_set
from tensortorrent_dynamo.plan.residency import Residency, Tier
from tensortorrent_dynamo.session import Session
from tensortorrent_dynamo.settings import parse_options


def _plan(
    residency: dict[str, Residency],
    index: int = 0,
    follows: int | None = None,
    chunk_bytes: int | None = None,
) -> Any:
    params = tuple(
        types.SimpleNamespace(fqn=fqn, nbytes=100, arg_index=i) for i, fqn in enumerate(residency)
    )
    devices = sorted({r.device for r in residency.values()} | {"cpu"})
    plan = types.SimpleNamespace(
        cost=types.SimpleNamespace(params=params),
        devices=tuple(types.SimpleNamespace(name=d) for d in devices),
        residency=tuple(residency.values()),
        graph_index=index,
        follows=follows,
        chunk_bytes=chunk_bytes,
    )
    plan.kept_bytes = functools.partial(GraphPlan.kept_bytes, plan)
    return plan


def _graph(frame: int | None, residency: dict[str, Residency], index: int = 0) -> Any:
    """A compiled graph as the session sees it: its frame, its plan's residencies, its
    calls so far and its hook to plan it again."""
    return types.SimpleNamespace(
        frame=frame,
        plan=_plan(residency, index),
        calls=0,
        replan=None,
        followed=False,
        stale=None,
        lean=False,
        lean_pending=False,
        replaced=None,
        chunks=None,
    )


ON_ACCELERATOR = Residency("virtual:0", streams=False, tier=Tier.HOST)
STREAMED = Residency("virtual:0", streams=True, tier=Tier.HOST)
ON_HOST = Residency("cpu", streams=False, tier=Tier.HOST)
READ_ONCE = Residency("cpu", streams=False, tier=Tier.DISK)


def test_a_plan_keeps_copies_on_accelerators_and_of_disk_weights_in_ram() -> None:
    graph = _graph(0, {"a": ON_ACCELERATOR, "b": STREAMED, "c": ON_HOST, "d": READ_ONCE})
    assert resident_set(graph.plan) == {("a", "virtual:0"), ("d", "cpu")}


def test_graphs_of_other_frames_keep_their_copies_beside_a_graph() -> None:
    session = Session.of(parse_options(budgets={"virtual:0": "1MiB"}))
    assert set(session.virtual) == {"virtual:0"}
    first_break = _graph(1, {"a": ON_ACCELERATOR})
    second_break = _graph(2, {"b": ON_ACCELERATOR})
    recompile = _graph(1, {"c": ON_ACCELERATOR})
    session.graphs.extend([first_break, second_break, recompile])
    # a graph of frame 1 runs beside frame 2's copies, not beside its alternatives'
    assert session.kept_beside(1) == {("b", "virtual:0")}
    assert session.kept_beside(2) == {("a", "virtual:0"), ("c", "virtual:0")}
    assert session.kept_beside(None) == {(f, "virtual:0") for f in "abc"}


def test_entering_a_graph_drops_the_copies_only_its_alternatives_keep() -> None:
    session = Session.of(parse_options(budgets={"virtual:0": "1MiB"}))
    first, other_frame, alternative = (
        _graph(1, {"a": ON_ACCELERATOR}),
        _graph(2, {"b": ON_ACCELERATOR}),
        _graph(1, {"c": ON_ACCELERATOR}),
    )
    session.graphs.extend([first, other_frame, alternative])
    params = {fqn: torch.zeros(4) for fqn in "abc"}
    for fqn, param in params.items():
        session.resident.put(fqn, param, "virtual:0", param.clone())
    session.enter(first)
    assert sorted(fqn for fqn, _ in session.resident.copies()) == ["a", "b"]
    assert session.current is first
    session.enter(first)  # already current: nothing to do
    assert sorted(fqn for fqn, _ in session.resident.copies()) == ["a", "b"]


def test_resident_bytes_count_the_other_frames_copies_and_the_weights_in_ram() -> None:
    session = Session.of(parse_options(budgets={"virtual:0": "1MiB"}))
    graph = _graph(1, {"a": ON_ACCELERATOR, "w": ON_HOST})
    graph.plan.cost.params[1].nbytes = 64
    graph.plan.devices = (
        types.SimpleNamespace(name="cpu"),
        types.SimpleNamespace(name="virtual:0"),
    )
    graph.runtime = types.SimpleNamespace(owner=lambda copy: "virtual:0")
    graph.plan.cost.params[0].nbytes = 16
    # its runs need 24 bytes on the accelerator beside its own copy of "a" (16)
    peaks = {"cpu": 1000, "virtual:0": 40}
    graph.plan.predicted_peak = peaks.__getitem__
    session.graphs.append(graph)
    param = torch.zeros(4)  # 16 bytes
    session.resident.put("a", param, "virtual:0", param.clone())
    # beside a graph of another frame: the copy counts, and both weights the host holds
    # (the model's own tensor stays in RAM beside its copy on the accelerator)
    assert session.resident_bytes(2) == {"cpu": 80, "virtual:0": 16}
    # and that graph's runs need room beside them: its peaks less what it keeps
    assert session.working_room(2) == {"cpu": 1000 - 80, "virtual:0": 40 - 16}
    # an alternative of the graph: its copy does not count, nor its room (one of them
    # runs at a time); the RAM weights do
    assert session.resident_bytes(1) == {"cpu": 80, "virtual:0": 0}
    assert session.working_room(1) == {}
    # a new graph that uses "w" counts it itself
    assert session.resident_bytes(2, exclude=frozenset({"w"})) == {"cpu": 16, "virtual:0": 16}


def test_the_copies_an_alternative_makes_again_when_it_runs_count_beside_other_frames() -> None:
    # frame 1's alternatives keep "a" (16 bytes) and "b" (32): "b"'s graph ran last, and
    # dropped "a". A graph of frame 2 planned now must leave room for "a" too: "a"'s graph
    # makes it again when it runs, and it stays. Uncounted, ctrl's next call ran out of the
    # virtual device's memory after a saved plan's graph of another size range was planned.
    session = Session.of(parse_options(budgets={"virtual:0": "1MiB"}))
    first = _graph(1, {"a": ON_ACCELERATOR}, index=0)
    second = _graph(1, {"b": ON_ACCELERATOR}, index=1)
    third = _graph(1, {"a": ON_ACCELERATOR, "c": ON_ACCELERATOR}, index=2)
    for g, sizes in ((first, [16]), (second, [32]), (third, [16, 8])):
        g.runtime = types.SimpleNamespace(owner=lambda copy: "virtual:0")
        for p, nbytes in zip(g.plan.cost.params, sizes, strict=True):
            p.nbytes = nbytes
    session.graphs.extend([first, second, third])
    b = torch.zeros(8)  # 32 bytes
    session.resident.put("b", b, "virtual:0", b.clone())
    # "b" is there; of the others one alternative runs per call: the most either lacks
    assert session.resident_bytes(2)["virtual:0"] == 32 + 24
    # a graph made lean keeps nothing: it makes nothing again
    third.lean_pending = True
    assert session.resident_bytes(2)["virtual:0"] == 32 + 16
    # beside its own frame, its alternatives count for nothing
    assert session.resident_bytes(1)["virtual:0"] == 0


def test_the_host_holds_a_disk_weight_kept_in_ram_as_the_tensor_until_it_is_released() -> None:
    session = Session.of(parse_options())
    graph = _graph(1, {"d": READ_ONCE, "w": ON_HOST})
    graph.plan.cost.params[0].nbytes, graph.plan.cost.params[1].nbytes = 32, 64
    graph.plan.devices = (types.SimpleNamespace(name="cpu"),)
    graph.runtime = types.SimpleNamespace(owner=lambda copy: "cpu")
    session.graphs.append(graph)
    # "d" is the model's own tensor while no plan released it: held beside any graph
    assert session.resident_bytes(1) == session.resident_bytes(2) == {"cpu": 96}
    # released, the copy read from disk is a resident copy, held beside the graphs of
    # other frames only (an alternative of its graph drops it when it runs)
    session.released(5, frozenset({"d"}))
    param = torch.zeros(8)  # 32 bytes
    session.resident.put("d", param, "cpu", param.clone())
    assert session.resident_bytes(1) == {"cpu": 64}
    assert session.resident_bytes(2) == {"cpu": 96}
    # a RAM weight a later plan released is no longer held: its graph is stale
    session.released(5, frozenset({"w"}))
    assert session.resident_bytes(2) == {"cpu": 32}


def test_a_graph_is_stale_once_another_plan_releases_a_weight_it_reads_from_ram() -> None:
    session = Session.of(parse_options())
    earlier = _graph(0, {"w": ON_HOST, "d": READ_ONCE}, index=0)
    final = _graph(1, {"v": ON_HOST}, index=1)
    final.replan = None  # it can no longer be planned again
    earlier.replan = object()
    session.graphs.extend([earlier, final])
    # the weights a new plan must leave in RAM: those of the plans that cannot change
    assert session.in_ram_for_good() == {"v"}
    assert session.in_ram_for_good(replacing=1) == frozenset()
    session.released(2, frozenset({"x"}))
    assert earlier.stale is None
    session.released(2, frozenset({"d", "x"}))  # "d" kept in RAM as the tensor itself
    assert earlier.stale == 2
    earlier.stale = None
    session.released(3, frozenset({"d"}))  # released before: nothing new
    assert earlier.stale is None
    session.released(0, frozenset({"w"}))  # by its own plan
    assert earlier.stale is None


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("stale", 3, r"graph 3's plan"),  # a later graph released weights its plan keeps
        ("replaced", "w: given other bytes", r"a weight its plan reads from disk changed"),
    ],
)
def test_a_graph_whose_plan_no_longer_holds_is_planned_again_before_it_runs(
    field: str, value: Any, why: str
) -> None:
    session = Session.of(parse_options())
    graph = _graph(0, {"w": ON_HOST if field == "stale" else READ_ONCE})
    session.graphs.append(graph)
    asked: list[Any] = []
    graph.replan = lambda g, args, keep: asked.append((g, args, keep))
    setattr(graph, field, value)
    session.enter(graph, ("x",))
    assert asked == [(graph, ("x",), None)] and getattr(graph, field) is None
    # one that can no longer be planned again is a clear error, not an empty tensor
    graph.replan, session.current = None, None
    setattr(graph, field, value)
    with pytest.raises(StalePlanError, match=rf"graph 0 must be planned again \({why}"):
        session.enter(graph, ("x",))


@pytest.mark.parametrize(
    ("field", "value"), [("stale", 3), ("lean_pending", True), ("replaced", "other bytes")]
)
def test_a_graph_that_no_longer_fits_when_planned_again_is_refused_at_each_call(
    field: str, value: Any
) -> None:
    # its old plan must not run (its copies were dropped, or it reads what is no longer
    # there): the next call ran it without planning it again
    session = Session.of(parse_options())
    graph = _graph(0, {"w": READ_ONCE}, index=5)
    session.graphs.append(graph)
    tries: list[Any] = []

    def replan(g: Any, args: Any, keep: Any) -> None:
        tries.append(args)
        raise PlanInfeasible("virtual:0 needs at least 2 KiB (budget is 1 KiB)")

    graph.replan = replan
    setattr(graph, field, value)
    for call in ("x", "y"):
        with pytest.raises(PlanInfeasible, match=r"graph 5 was planned again, as .* no longer"):
            session.enter(graph, (call,))
        assert getattr(graph, field) == value
    assert tries == [("x",), ("y",)]


def test_a_copy_goes_when_its_parameter_does() -> None:
    session = Session.of(parse_options())
    param = torch.zeros(4)
    session.resident.put("a", param, "virtual:0", param.clone())
    assert session.resident.get(param, "virtual:0") is not None
    param.add_(1)  # changed in place: the copy is stale
    assert session.resident.get(param, "virtual:0") is None
    del param
    assert session.resident.copies() == []


def test_an_alternative_called_less_is_planned_again_once_keeping_the_copies_of_the_other() -> None:
    session = Session.of(parse_options(budgets={"virtual:0": "1MiB"}))
    prefill = _graph(1, {"a": ON_ACCELERATOR, "b": STREAMED}, index=0)
    decode = _graph(1, {"a": STREAMED, "b": ON_ACCELERATOR}, index=1)
    decode.plan.chunk_bytes = 4 * 2**20  # planned in 4 MiB row chunks
    session.graphs.extend([prefill, decode])
    asked: list[tuple[Any, tuple[Any, ...], Keep]] = []

    class Replan:
        def __call__(self, graph: Any, args: tuple[Any, ...], keep: Keep) -> None:
            asked.append((graph, args, keep))
            kept = {fqn: ON_ACCELERATOR for fqn, _ in keep.copies}
            graph.plan = _plan({"a": STREAMED, **kept}, graph.plan.graph_index, keep.graph_index)

    prefill.replan, decode.replan = Replan(), Replan()
    hooks = [prefill.replan, decode.replan]
    prefill.calls, decode.calls = 1, 1
    session.enter(decode, ("x",))
    session.enter(prefill, ("x",))
    assert asked == [], "called as often: each keeps its own set"
    decode.calls = 7
    session.enter(decode, ("x",))
    assert asked == [], "the graph called most is never planned again for another"
    session.enter(prefill, ("y",))
    # the copies, and the size of the row chunks they are named by
    assert asked == [(prefill, ("y",), Keep(1, frozenset({("b", "virtual:0")}), 4 * 2**20))]
    assert resident_set(prefill.plan) == resident_set(decode.plan)
    assert prefill.followed and decode.followed, "the frame is planned again once"
    assert prefill.replan is hooks[0] and decode.replan is hooks[1], "either can be, if stale"
    session.enter(decode, ())
    session.enter(prefill, ())
    assert len(asked) == 1
    assert session.leader(prefill) is None, "it keeps the copies of the one called most"


def test_a_name_two_tensors_have_is_given_apart() -> None:
    """Graphs name weights from their own frame's module: the session names each tensor
    apart, the same tensor always alike."""
    session = Session.of(parse_options())
    first, second, third = torch.zeros(2), torch.zeros(2), torch.zeros(2)
    assert session.weight_name("dense.weight", first) == "dense.weight"
    assert session.weight_name("dense.weight", second) == "dense.weight@1"
    assert session.weight_name("dense.weight", first) == "dense.weight"
    assert session.weight_name("dense.weight", third) == "dense.weight@2"
    assert session.weight_name("other.weight", second) == "other.weight"
    del first
    # a name whose tensor is gone is free again
    assert session.weight_name("dense.weight", torch.ones(2)) == "dense.weight"


def test_each_modules_weights_are_an_instance_of_the_frame_with_a_frame_of_its_own() -> None:
    session = Session.of(parse_options(budgets={"virtual:0": "1MiB"}))
    layers = [[torch.zeros(2), torch.zeros(2)] for _ in range(3)]
    assert [session.instance_of(7, layer) for layer in layers] == [0, 1, 2]
    assert session.instance_of(7, layers[1]) == 1  # the same weights, the same instance
    assert session.instance_of(8, layers[1]) == 0  # another frame counts its own
    # a graph of the frame that reads part of a module's weights (a decode step) runs for
    # that module; one sharing a single tensor of three with it runs for another
    assert session.instance_of(7, layers[2][:1]) == 2
    shared = torch.zeros(2)
    three = [[shared, torch.zeros(2), torch.zeros(2)] for _ in range(2)]
    assert [session.instance_of(9, weights) for weights in three] == [0, 1]
    assert session.instance_of(7, []) == 0
    frames = [session.instance_frame(7, k) for k in range(3)]
    assert frames[0] == 7 and len(set(frames)) == 3 and all(f < 0 for f in frames[1:])
    assert session.instance_frame(7, 1) == frames[1]
    assert session.instance_frame(8, 1) not in frames


def test_graphs_made_lean_drop_their_copies_now_and_are_planned_again_before_they_run() -> None:
    """A graph that does not fit beside the copies of the graphs of other frames makes them
    lean: their copies go at once, they no longer count as kept, and each is planned again
    before its next call."""
    session = Session.of(parse_options(budgets={"virtual:0": "1MiB"}))
    asked: list[Any] = []
    first = _graph(1, {"a": ON_ACCELERATOR}, index=0)
    first.replan = lambda g, args, keep: asked.append((g, args, keep))
    final = _graph(2, {"b": ON_ACCELERATOR}, index=1)  # can no longer be planned again
    session.graphs.extend([first, final])
    params = {"a": torch.zeros(4), "b": torch.zeros(4)}
    for fqn, param in params.items():
        session.resident.put(fqn, param, "virtual:0", param.clone())

    assert session.make_lean_beside(3, 1) == 1
    assert first.lean and first.lean_pending and not final.lean
    assert [fqn for fqn, _ in session.resident.copies()] == ["b"]
    assert session.kept_beside(3) == {("b", "virtual:0")}
    assert session.make_lean_beside(3, 4) == 0  # none left that can be

    session.enter(first, ("x",))
    assert asked == [(first, ("x",), None)] and first.lean and not first.lean_pending


def test_the_graphs_keeping_the_most_are_made_lean_first() -> None:
    """Made lean as a new graph needs: the ``count`` graphs of other frames keeping the most,
    not the graphs of the new graph's own frame."""
    session = Session.of(parse_options(budgets={"virtual:0": "1MiB"}))
    small = _graph(1, {"a": ON_ACCELERATOR}, index=0)
    large = _graph(2, {"b": ON_ACCELERATOR, "c": ON_ACCELERATOR}, index=1)
    own = _graph(3, {"d": ON_ACCELERATOR, "e": ON_ACCELERATOR, "f": ON_ACCELERATOR}, index=2)
    for g in (small, large, own):
        g.replan = lambda g, args, keep: None
    session.graphs.extend([small, large, own])
    assert session.make_lean_beside(3, 1) == 1
    assert large.lean and not small.lean and not own.lean
    assert session.make_lean_beside(3, 2) == 1
    assert small.lean and not own.lean


def test_compile_garbage_is_collected_at_once_for_large_inputs_else_at_most_a_fifth_of_the_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A full collection after each graph compiled costs a burst of compiles (a model whose
    layers break the graph) a collection per graph: the next is put off until the time since
    the last is ``RATIO`` times what it took, and made at a later call. A graph traced with
    large inputs (a KV cache the garbage would keep alive) is collected for at once."""
    import gc

    from tensortorrent_dynamo import session

    collections: list[int] = []
    clock = [100.0]
    monkeypatch.setattr(session.time, "perf_counter", lambda: clock[0])
    garbage = session._CompileGarbage()

    def collect_taking(seconds: float) -> None:
        def collect(*args: Any) -> int:
            collections.append(1)
            clock[0] += seconds
            return 0

        monkeypatch.setattr(gc, "collect", collect)

    collect_taking(1.0)
    garbage.after_compile(0, 1024)  # the first: made
    assert len(collections) == 1 and not garbage.owed
    clock[0] += 2.0
    garbage.after_compile(1, 1024)  # 2 s since one that took 1 s: put off
    assert len(collections) == 1 and garbage.owed
    garbage.after_compile(2, garbage.BIG_INPUTS)  # large inputs: made at once
    assert len(collections) == 2 and not garbage.owed
    garbage.after_compile(3, 0)
    assert garbage.owed
    clock[0] += 3.9
    garbage.pay(3)
    assert len(collections) == 2 and garbage.owed
    clock[0] += 0.1
    garbage.pay(3)  # 4 s since it ended: made
    assert len(collections) == 3 and not garbage.owed


def test_input_bytes_counts_the_tensors_that_are_not_weights() -> None:
    from tensortorrent_dynamo.cost_graph import ParamRef
    from tensortorrent_dynamo.session import input_bytes

    weight = ParamRef("w", 1, "w", 64, "float32", (16,), ())
    cost: Any = types.SimpleNamespace(params=(weight,))
    args = [torch.zeros(8), torch.zeros(16), 3, torch.empty(4, device="meta")]
    assert input_bytes(args, cost) == 32
