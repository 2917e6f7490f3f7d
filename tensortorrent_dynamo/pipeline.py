"""The stages one functional graph goes through, in order: state updates in place → cost
graph → chunked alternative → plan → weights → rewrite → resident copies → compile.

:func:`plan_and_compile` is the whole pipeline; each stage is a call into its package
(``cost_graph``, ``passes``, ``plan``, ``weights``, ``run``, ``compiling``, ``report``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar

import torch
import torch.fx

from ._logs import PLAN_ARTIFACT
from .compiling.segments import compile_segments, keep_faster, traced_layouts
from .cost_graph import CostGraph, build_cost_graph
from .errors import (
    PlanInfeasible,
    StalePlanError,
    TensorTorrentWarning,
    UnsavedGraphError,
    UnsupportedNodeError,
)
from .functional import GraphInputs
from .io.files import digest
from .passes.chunk_weights import ChunkedGraph, chunk_weights
from .passes.rewrite import rewrite
from .passes.state_in_place import StateInPlace, copy_module
from .plan.chunk_sizes import chunk_sizes
from .plan.decisions import Decisions
from .plan.kv_cache import KvCache, explain_infeasible
from .plan.planner import GraphPlan, Keep, Split, plan_graph
from .profile import HostProfile, host_profile
from .run.runtime import Runtime
from .session import CompiledGraph, Session, make_resident, share_resident, shared_names
from .units import format_bytes
from .weights.disk import place_on_disk, released_weights, whole_weights
from .weights.pinning import pin_streamed_weights
from .weights.released import own_written_bytes, released_location

log = logging.getLogger(__name__)
plan_log = torch._logging._internal.getArtifactLogger(__name__, PLAN_ARTIFACT)

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _keeps_user_rng(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """``fn`` with torch's random generators (the CPU's and each CUDA device's) as they were
    before it. Planning draws random numbers of its own (the profile's probes) and times a
    graph by running it (``keep_faster``), and it runs at calls too, where Dynamo's own
    guard of the generators is not around it: a graph for a new range of sizes, a new
    module's weights, a graph planned again. Each draw moved the user's generator, so
    ``generate(do_sample=True)`` after ``torch.manual_seed`` gave other tokens than eager."""

    @functools.wraps(fn)
    def kept(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=cuda):
            return fn(*args, **kwargs)

    return kept


@_keeps_user_rng
def plan_and_compile(
    session: Session,
    gm: torch.fx.GraphModule,
    graph_inputs: GraphInputs,
    frame: int | None,
    sizes: Mapping[str, int] | None = None,
    replacing: CompiledGraph | None = None,
    keep: Keep | None = None,
) -> CompiledGraph:
    """Plan, rewrite and compile one functional graph of ``session`` (captured from Dynamo
    frame ``frame``; with ``sizes``, costed at those values of its symbolic sizes).

    With ``replacing`` (a graph of the session compiled from ``gm`` before), the graph is
    planned again, keeping the resident copies ``keep`` names where they fit
    (``plan_graph``), and ``replacing`` becomes the new graph: Dynamo keeps calling it."""
    settings = session.settings
    example_inputs = graph_inputs.values
    session.forget_gone()  # a deleted model's graphs hold nothing a new plan must leave
    profile = _profile(session)
    reference = copy_module(gm) if settings.verify and graph_inputs.state else gm
    StateInPlace(graph_inputs.state)(gm)
    cost = build_cost_graph(gm, example_inputs, graph_inputs.params, sizes, graph_inputs.state)
    # the plan is made for these tensors: another module's, of the same code and costs,
    # are another instance (``instances.py``)
    tensors = [example_inputs[p.arg_index] for p in cost.params]
    # weights written in place since they were released (a recompile after an adapter was
    # merged) take those bytes into RAM first: planned where they are, not read from disk
    own_written_bytes(tensors)
    # Inductor's segments assert the input layouts they were traced with
    layouts = traced_layouts(gm) if settings.compiler == "inductor" else ""
    source = (digest(gm.code, 64), cost.digest(), layouts)
    again = session.by_source.get(tensors, source) if replacing is None else None
    if again is not None:
        # A recompile (a guard failed) that produced the same graph with the same
        # costs and weights (and input layouts, for Inductor's segments): its plan's
        # assumptions still hold.
        log.info(
            "recompiled graph is graph %d again (same code and costs): reusing plan %s",
            again.plan.graph_index,
            again.plan.plan_hash,
        )
        return again
    check_fallbacks(cost, settings.strict)
    try:
        plan, chunked = _plan_chunked(
            session, gm, graph_inputs, cost, profile, frame, replacing, keep
        )
    except PlanInfeasible as exc:
        if replacing is not None:
            raise
        plan, chunked = _plan_beside_leaner(
            session,
            frame,
            lambda: _plan_chunked(session, gm, graph_inputs, cost, profile, frame, None, keep),
            exc,
        )
    module = gm
    if plan.split and chunked is not None:
        module, weights = chunked.module, chunked.weights(plan.cost, example_inputs)
        inputs = None  # the chunks as the weights are once some are released, below
    else:
        weights, inputs = whole_weights(plan.cost, example_inputs), list(example_inputs)
    locations = place_on_disk(plan, weights, settings)
    session.released(plan.graph_index, released_weights(plan, weights))
    if inputs is None:
        assert chunked is not None
        inputs = chunked.expand(example_inputs)
    if torch.cuda.is_available():
        pin_streamed_weights(plan, inputs)
    disk = session.disk_tier(plan, locations)
    runtime = Runtime(session.virtual, disk, session.resident, settings.io_timeout_s)
    rewritten = rewrite(module, plan, runtime)
    session.make_room(plan, frame)
    make_resident(plan, runtime, inputs)
    compilers = compile_segments(rewritten, runtime, settings)
    compiler_note = None
    if disk is None:  # re-reading weights from disk only to time a graph costs too much
        read_only = {p.arg_index for p in plan.cost.params}
        compiler_note = keep_faster(rewritten.module, compilers, inputs, read_only)
    compiled = CompiledGraph(
        plan=plan,
        module=rewritten.module,
        runtime=runtime,
        compilers=compilers,
        compiler_note=compiler_note,
        settings=settings,
        profile=profile,
        chunks=chunked.feed() if plan.split and chunked is not None else None,
        lock=session.lock,
        reference=reference if settings.verify else None,
        frame=frame,
        enter=session.enter,
        weights=tuple(weakref.ref(t) for t in tensors),
    )
    if replacing is not None:
        replacing.become(compiled)
        compiled = replacing
    else:
        session.graphs.append(compiled)
        session.planned += 1
    session.current = compiled  # its resident copies are the ones held now
    session.by_source.put(tensors, compiled, source)
    if plan_log.isEnabledFor(logging.DEBUG) or log.isEnabledFor(logging.INFO):
        from .report.explain import explain_graph

        plan_log.debug("%s", explain_graph(compiled))
        # every graph after the first is a graph break or a recompile with other code
        # or shapes (the same graph again reuses its plan, above)
        log.info("graph %d planned: %s", plan.graph_index, plan.native.chosen)
        log.debug("schedule of graph %d:\n%s", plan.graph_index, rewritten.module.code)
    return compiled


# why a saved plan's graph planned again (``Session.plan_again``) was searched
STALE_SAVED = (
    "planned again, as a later graph's plan released weights its saved plan keeps in RAM or "
    "needed the room its copies held"
)


# why a graph whose saved decisions are at other sizes was planned lean instead
LEAN_NOT_SAVED = (
    "they keep weights resident where the model's other graphs need the room: planned to keep none"
)


def _profile(session: Session) -> HostProfile:
    """The figures a graph is planned with: a saved plan's own on the hardware it was saved
    on (figures measured again, or another cached profile, would make other plans than the
    saved ones), else those the ``profile`` option names."""
    saved = session.saved_plan().figures() if session.settings.plan is not None else None
    if saved is None:
        return host_profile(session.settings)
    return host_profile(session.settings, saved, f"saved with the plan {session.settings.plan}")


def _plan_beside_leaner(
    session: Session,
    frame: int | None,
    plan: Callable[[], tuple[GraphPlan, ChunkedGraph | None]],
    error: PlanInfeasible,
) -> tuple[GraphPlan, ChunkedGraph | None]:
    """``plan()`` once the graphs of other frames keep less: a new graph did not fit
    (``error``) beside what they keep, which they planned without knowing of it. The one
    keeping the most is made lean (``Session.make_lean_beside``: it keeps nothing from
    now on), then the next two, four, ..., until the new graph fits or none is left to
    make lean (then the last ``PlanInfeasible`` is raised)."""
    count = 1
    while session.make_lean_beside(frame, count):
        try:
            return plan()
        except PlanInfeasible as exc:
            error, count = exc, 2 * count
    raise error


class Replanner:
    """What plans a graph again for ``CompiledGraph.replan``: its traced graph, planned with
    the arguments of the call that asks (not the tensors it was compiled with, which are
    not kept: a KV cache the caller replaced would otherwise stay alive). The traced graph
    is kept for as long as the graph lives, as Dynamo's callable (``instances.Instances``)
    holds it anyway."""

    def __init__(
        self,
        session: Session,
        gm: torch.fx.GraphModule,
        graph_inputs: GraphInputs,
        frame: int | None,
        sizes: Mapping[str, int] | None = None,
    ) -> None:
        self.session = session
        self.gm = gm
        self.shape = dataclasses.replace(graph_inputs, values=())
        self.frame = frame
        self.sizes = sizes

    def __call__(self, graph: CompiledGraph, args: Sequence[Any], keep: Keep | None) -> None:
        inputs = dataclasses.replace(self.shape, values=tuple(args))
        plan_and_compile(
            self.session, self.gm, inputs, self.frame, self.sizes, replacing=graph, keep=keep
        )


def _plan_chunked(
    session: Session,
    gm: torch.fx.GraphModule,
    graph_inputs: GraphInputs,
    cost: CostGraph,
    profile: HostProfile,
    frame: int | None,
    replacing: CompiledGraph | None,
    keep: Keep | None,
) -> tuple[GraphPlan, ChunkedGraph | None]:
    """The plan of ``cost`` (:func:`_plan`) with its large weights cut in row chunks of each
    size ``plan.chunk_sizes`` names, in turn, and the chunked graph it plans: the one
    predicted fastest. A size after the first counts only where its plan reads chunks from
    disk (the first is planned with the weights whole too), and is not planned where the
    first's plan reads nothing from disk; where none fits, the first size's error."""
    example_inputs = graph_inputs.values
    # a saved plan is replayed, and a plan keeping another graph's copies made, in the
    # chunks that plan was in
    pinned = session.settings.plan is not None or keep is not None
    pinned_size = keep.chunk_bytes if keep is not None else None
    if session.settings.plan is not None:
        record = session.saved_plan().record_for(cost)
        pinned_size = record["decisions"].get("chunk_bytes") if record is not None else None
    found: list[tuple[GraphPlan, ChunkedGraph | None, int]] = []
    others: list[tuple[int, float | None]] = []
    failed: tuple[PlanInfeasible, ChunkedGraph | None, int] | None = None
    sizes = chunk_sizes(session.settings, profile, pinned, pinned_size)
    for i, size in enumerate(sizes or [0]):
        if i > 0 and found and not any(r.on_disk for r in found[0][0].residency):
            break
        chunked = (
            chunk_weights(gm, example_inputs, cost, size, graph_inputs.params, graph_inputs.state)
            if size
            else None
        )
        if i > 0 and chunked is None:
            continue
        try:
            plan = _plan(
                session, cost, chunked, size, example_inputs, profile, frame, replacing, keep
            )
        except PlanInfeasible as error:
            failed = failed or (error, chunked, size)
            others.append((size, None))
            continue
        if i > 0 and not plan.split:
            others.append((size, None))
            continue
        found.append((plan, chunked, size))
    if not found:
        assert failed is not None
        first, chunked, size = failed
        raise _infeasible(
            first, session, gm, cost, chunked, size, example_inputs, profile, frame
        ) from None
    plan, chunked, _ = min(found, key=lambda f: f[0].predicted_time_s)
    others += [(size, p.predicted_time_s) for p, _, size in found if p is not plan]
    if others:
        plan = dataclasses.replace(plan, other_chunk_plans=tuple(others))
    return plan, chunked


def _plan(
    session: Session,
    cost: CostGraph,
    chunked: ChunkedGraph | None,
    chunk_bytes: int,
    example_inputs: Sequence[Any],
    profile: HostProfile,
    frame: int | None,
    replacing: CompiledGraph | None = None,
    keep: Keep | None = None,
) -> GraphPlan:
    """The plan of ``cost`` beside what the session's other graphs keep resident: replayed
    from the saved plan's decisions when the settings name one, else searched; keeping the
    copies of ``keep`` where they fit. A graph planned again (``replacing``) keeps its
    index."""
    settings = session.settings
    index = session.planned if replacing is None else replacing.plan.graph_index
    on_disk = frozenset(
        p.fqn for p in cost.params if released_location(example_inputs[p.arg_index])
    )
    split = None
    if chunked is not None:
        assert chunked.cost is not None
        split = Split(chunked.cost, chunked.rows(), chunk_bytes)
    names = shared_names(session, cost)
    shared = share_resident(session, cost, example_inputs, profile, frame)
    room = session.working_room(frame)
    in_ram = session.in_ram_for_good(index)
    # planned again lean (``Session.make_lean``): it keeps nothing for good
    lean = replacing is not None and replacing.lean

    # a saved plan's graph planned again (stale: ``Session.plan_again``) is searched
    replays = settings.plan is not None and replacing is None
    saved_for: dict[int, Decisions | None] = {}  # by id of the graph: looked up (warned) once

    def saved_decisions(graph: CostGraph) -> Decisions | None:
        if id(graph) not in saved_for:
            saved_for[id(graph)] = _saved_decisions(session, graph, profile) if replays else None
        return saved_for[id(graph)]

    def as_saved(graph: CostGraph) -> bool:
        """Whether ``graph`` replays the plan the file holds for it as traced (which fit
        beside the others in the saving session), not one the file lacks or holds for it at
        other sizes (planned now, as in any session)."""
        saved = saved_decisions(graph)
        return saved is not None and bool(saved.plan_hash)

    def plan_with(graph: CostGraph, held: Mapping[str, int], lean: bool = False) -> GraphPlan:
        saved = None if lean else saved_decisions(graph)
        plan = plan_graph(
            index, graph, profile, settings, held, on_disk, split, saved, keep, in_ram, lean
        )
        if lean and saved_decisions(graph) is not None:
            plan = dataclasses.replace(plan, replay_refused=LEAN_NOT_SAVED)
        return plan

    def checked(graph: CostGraph, plan: GraphPlan) -> GraphPlan:
        """The plan chosen for ``graph``, held to the saved plan's decisions for it (those
        of the plans not chosen never run)."""
        if replays:
            _check_saved(session, plan, saved_decisions(graph))
        elif settings.plan is not None:
            plan = dataclasses.replace(plan, replay_refused=STALE_SAVED)
        return plan

    def leaves_room(plan: GraphPlan) -> bool:
        return all(
            plan.kept_bytes(d.name) + room.get(d.name, 0) <= d.budget_bytes for d in plan.devices
        )

    def plan_beside(graph: CostGraph, held: Mapping[str, int]) -> GraphPlan:
        """The plan of ``graph`` beside what the other graphs keep (``held``), leaving the
        graphs of other frames the room their runs need (``room``) beside what it keeps.
        Its own runs share that room (the graphs run one after another), so it is first
        planned without it; where that plan keeps too much, the faster of a plan keeping as
        little as it can (reading every weight from disk as it runs) and a plan with the
        room held."""
        try:
            plan = plan_with(graph, held, lean=lean)
            if leaves_room(plan):
                return plan
            plans = []
            if not lean and not as_saved(graph):
                with contextlib.suppress(PlanInfeasible):
                    plans = [p for p in [plan_with(graph, held, lean=True)] if leaves_room(p)]
            try:
                plans.append(plan_with(graph, _per_device_sum(held, room)))
            except PlanInfeasible:
                if not plans:
                    raise
            return min(plans, key=lambda p: p.native.predicted_time_s)
        except PlanInfeasible as exc:
            # the budget it names holds the room too: enough for the second plan
            raise _beside_other_graphs(
                exc, session, index, frame, held, room, in_ram & names
            ) from None

    try:
        return checked(shared, plan_beside(shared, session.resident_bytes(frame, names)))
    except PlanInfeasible:
        if shared is cost:
            raise
        # Graph by graph, the earlier graphs' resident sets may leave this one too
        # little; it then plans as if its shared parameters were not yet resident. That
        # is right only where it keeps the same ones resident (planning the graphs of a
        # model together would settle it).
        log.warning(
            "graph %d does not fit beside the parameters earlier graphs keep resident; "
            "planning it as if it kept the same ones resident",
            index,
        )
    return checked(cost, plan_beside(cost, session.resident_bytes(frame, names, everywhere=True)))


def _per_device_sum(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    """Bytes per device: ``a``'s and ``b``'s together."""
    return {d: a.get(d, 0) + b.get(d, 0) for d in {*a, *b}}


def _beside_other_graphs(
    error: PlanInfeasible,
    session: Session,
    index: int,
    frame: int | None,
    held: Mapping[str, int],
    room: Mapping[str, int],
    in_ram: frozenset[str],
) -> PlanInfeasible:
    """``error`` in the user's terms where the model's other graphs hold part of a budget it
    finds too small: the planner saw each budget less what they keep (``held``), and less
    the room their runs need beside it (``room``) where it kept too much, so the budget to
    set is the smallest it names plus both, and the message says which graphs hold how
    much; and it names the weights of the graph that had to stay in RAM (``in_ram``, see
    ``Session.in_ram_for_good``). ``error`` itself where neither applies."""
    beside = _per_device_sum(held, room)
    short = {device: need for device, need in error.min_budgets.items() if beside.get(device)}
    kept = ""
    if in_ram:
        listed = ", ".join(sorted(in_ram)[:3]) + (", ..." if len(in_ram) > 3 else "")
        kept = (
            f" It keeps {len(in_ram)} weights in RAM ({listed}): the model's earlier graphs "
            "read them from there, and their plans cannot change."
        )
    if not short:
        return PlanInfeasible(f"{error}{kept}", error.min_budgets, error.peaks) if kept else error
    notes = []
    for device, need in short.items():
        holders = session.holders(frame, device)
        what = "the weights they keep in RAM" if device == "cpu" else "the copies they keep there"
        holds = []
        if held.get(device):
            holds.append(f"hold {format_bytes(held[device])} of the budget ({what})")
        if room.get(device):
            holds.append(f"need {format_bytes(room[device])} beside that to run")
        notes.append(
            f"on {device} the model's other graphs ({', '.join(map(str, holders))}) "
            f"{' and '.join(holds)}, so a budget of "
            f"{format_bytes(beside[device] + need)} there is enough"
        )
    return PlanInfeasible(
        f"{error} Graph {index} was planned beside the weights the model's graphs planned "
        f"before it keep (a graph break, or another input shape, makes a graph of its own): "
        + "; ".join(notes)
        + "."
        + kept,
        {device: beside.get(device, 0) + need for device, need in error.min_budgets.items()},
        error.peaks,
    )


def _infeasible(
    error: PlanInfeasible,
    session: Session,
    gm: torch.fx.GraphModule,
    cost: CostGraph,
    chunked: ChunkedGraph | None,
    chunk_bytes: int,
    example_inputs: Sequence[Any],
    profile: HostProfile,
    frame: int | None,
) -> PlanInfeasible:
    """``error``, or for a graph holding a static KV cache, the error naming the cache's
    size and the largest length that fits (``plan.kv_cache``; ``chunked``: the graph in row
    chunks of at most ``chunk_bytes`` that was planned too)."""
    cache = KvCache.find(gm, cost)
    if cache is None:
        return error
    quiet = dataclasses.replace(session.settings, plan_cache=False, plan=None)
    trial = dataclasses.replace(session, settings=quiet, graphs=list(session.graphs))
    split_cache = (
        KvCache.find(chunked.module, chunked.cost)
        if chunked is not None and chunked.cost is not None
        else None
    )

    def fits(length: int) -> bool:
        split = None
        if chunked is not None and chunked.cost is not None:
            split_cost = chunked.cost
            if split_cache is not None:
                split_cost = split_cache.shortened(chunked.module, chunked.cost, length)
            split = dataclasses.replace(chunked, cost=split_cost)
        try:
            _plan(
                trial,
                cache.shortened(gm, cost, length),
                split,
                chunk_bytes,
                example_inputs,
                profile,
                frame,
            )
        except PlanInfeasible:
            return False
        return True

    return explain_infeasible(error, cache, fits)


def _saved_decisions(session: Session, cost: CostGraph, profile: HostProfile) -> Decisions | None:
    """The decisions the saved plan (the ``plan`` option) holds for ``cost``; ``None`` without
    one, and, with a warning, for a graph the file lacks of the model it was saved for
    (``replan="new"``, the default) or one it no longer applies to (``replan="auto"``)."""
    settings = session.settings
    if settings.plan is None:
        return None
    try:
        return session.saved_plan().check(cost, profile)
    except UnsavedGraphError as exc:
        if settings.replan == "error":
            raise UnsavedGraphError(
                f'{exc}. Load with replan="new" (the default) to plan such a graph when it '
                "is traced"
            ) from None
        _warn_planned_now(f"{exc}.", settings.replan)
        return None
    except StalePlanError as exc:
        if settings.replan != "auto":
            raise
        warnings.warn(f"{exc}; planned again (replan='auto')", TensorTorrentWarning, stacklevel=4)
        return None


def _warn_planned_now(why: str, replan: str) -> None:
    """Warn that a graph whose saved plan the file lacks or that does not apply (``why``)
    is planned now, as ``replan`` allows."""
    warnings.warn(
        f"{why} Planned now (replan={replan!r}): save the model again "
        "(CompiledModule.save) to keep its plan",
        TensorTorrentWarning,
        stacklevel=5,  # the caller's caller: the planning of the graph, as before
    )


def _check_saved(session: Session, plan: GraphPlan, saved: Decisions | None) -> None:
    """Refuse (or warn about) a saved plan whose decisions did not replay to the plan they
    were saved with: those of the graph at other sizes that do not apply at these are
    refused with ``replan="error"`` (the file has no plan for these sizes: planned now, as
    a graph it lacks, else), those of the graph as saved unless ``replan="auto"``."""
    if saved is None:  # already warned about
        return
    path = session.saved_plan().path
    replan = session.settings.replan
    if not saved.plan_hash:  # saved for this graph at other sizes
        made = Decisions.of(plan.native, plan.split, plan.chunk_bytes)
        if dataclasses.replace(made, plan_hash="") == saved:
            log.info(
                "graph %d: plan %s made from %s's decisions for this graph at other sizes",
                plan.graph_index,
                plan.plan_hash,
                path,
            )
            return
        why = plan.replay_refused.rstrip() or "they give other decisions at these sizes"
        exc = StalePlanError(
            f"{path} has this graph's plan at other sizes (a model called with other shapes "
            "than before saving, a prompt of another length, traces it at these), and its "
            f"decisions do not apply at these sizes: {why.removesuffix('.')}."
        )
        if replan == "error":
            raise StalePlanError(
                f"{exc} Call it with the shapes it was saved with, or load with "
                'replan="new" (the default) to plan it now'
            )
        _warn_planned_now(str(exc), replan)
        return
    if saved.plan_hash != plan.plan_hash:
        # Its decisions are replayed beside what the session's other graphs keep: those
        # planned since loading (graphs the file lacks, saved ones planned again) may keep
        # other weights than the saving session's did, and the same decisions then make
        # another plan (a server given a prompt shorter than any saved made the graph of
        # the saved length differ at its next call).
        kept = session.saved_plan().plan_hashes()
        since = [g.plan.graph_index for g in session.graphs if g.plan.plan_hash not in kept]
        if since:
            exc = StalePlanError(
                f"{path}: its decisions for this graph give plan {plan.plan_hash} here, not "
                f"{saved.plan_hash} as saved: graphs {', '.join(map(str, since))} were planned "
                "since loading, and keep other weights resident than the saving session's did"
            )
            if replan == "error":
                raise StalePlanError(
                    f'{exc}. Load with replan="new" (the default) to plan such a graph now'
                )
            _warn_planned_now(f"{exc}.", replan)
            return
        exc = StalePlanError(
            f"{path}: its decisions for this graph no longer give plan {saved.plan_hash} "
            f"(planning again gives {plan.plan_hash}): the settings or the planner changed, "
            "or the saving session made this plan again after other graphs' plans changed "
            "(keeping nothing resident, or another graph's copies), beside plans this "
            "session's first calls do not make"
        )
        if replan != "auto":
            raise exc
        warnings.warn(f"{exc}; planned again (replan='auto')", TensorTorrentWarning, stacklevel=4)
        return
    log.info("graph %d: plan %s reproduced from %s", plan.graph_index, plan.plan_hash, path)


def check_fallbacks(cost: CostGraph, strict: bool) -> None:
    """Refuse (``strict``) or warn about nodes that cannot be costed or placed."""
    fallbacks = cost.fallbacks
    if not fallbacks:
        return
    listing = "; ".join(f"{n.name} ({n.target}): {n.fallback}" for n in fallbacks)
    if strict:
        raise UnsupportedNodeError(
            f"{len(fallbacks)} node(s) cannot be costed or placed: {listing}. "
            "Pass strict=False to run them on the CPU instead."
        )
    warnings.warn(
        f"TensorTorrent runs {len(fallbacks)} node(s) on the CPU because they cannot be "
        f"costed or placed: {listing}",
        TensorTorrentWarning,
        stacklevel=4,
    )
