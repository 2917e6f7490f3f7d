"""The registered backend: options → settings → functional graph → profile → cost graph →
plan → rewrite → compile.

``torch.compile(model, backend="tensortorrent")`` finds :data:`tensortorrent_backend`
through the ``torch_dynamo_backends`` entry point. Dynamo calls it once per
captured graph; graphs compiled with the same settings share one set of devices
(one memory ledger per virtual device), and each graph is planned knowing what
earlier graphs keep resident.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx

from ._logs import PLAN_ARTIFACT, register
from .compiling.segments import compile_segments, keep_faster
from .compiling.verify import eager_values, verified_call
from .cost_graph import CostGraph, build_cost_graph
from .errors import (
    OptionsError,
    PlanInfeasible,
    StalePlanError,
    TensorTorrentWarning,
    UnsupportedNodeError,
)
from .functional import GraphInputs, functional
from .io.offload import DiskReader, HostBufferPool, TensorLocation, read_buffer_bytes
from .passes.chunk_weights import ChunkedGraph, WeightChunker
from .passes.rewrite import rewrite
from .plan import files as saved_plan
from .plan.planner import GraphPlan, plan_graph
from .profile import HostProfile, host_profile
from .run.record import RssSampler
from .run.residents import DiskTier, ResidentCopies
from .run.runtime import Runtime
from .run.virtual import VirtualDevice
from .settings import Settings, parse_options
from .shapes import SizeRanges, SymbolicSizes
from .weights.homes import (
    pin_streamed_weights,
    place_on_disk,
    released_location,
    whole_weights,
)

register()  # torch normally did this through the entry point; cheap and idempotent
log = logging.getLogger(__name__)
plan_log = torch._logging._internal.getArtifactLogger(__name__, PLAN_ARTIFACT)


@dataclasses.dataclass
class CompiledGraph:
    """One captured graph, planned, rewritten and compiled: what Dynamo calls."""

    plan: GraphPlan
    module: torch.fx.GraphModule
    runtime: Runtime
    compilers: dict[str, str]
    settings: Settings
    profile: HostProfile
    # the measured compiler choice for the host segments (``compiler.keep_faster``)
    compiler_note: str | None = None
    calls: int = 0
    last_call_s: float | None = None
    # peak RSS of the process during the last call, when the host's memory is planned
    # (a host budget or a disk tier); ``None`` otherwise
    last_rss_peak: int | None = None
    # the graph with large weights in row chunks that the plan was made for, when it was
    chunks: ChunkedGraph | None = None
    # held around each call: the graphs of one session share devices, pools and budgets
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    # with ``verify``: the captured graph, until the first call has been checked against it
    reference: torch.fx.GraphModule | None = None
    # the Dynamo frame the graph was captured from (``None`` outside Dynamo): the graphs of
    # one frame are alternatives, one of them runs per call (``Session.kept_beside``)
    frame: int | None = None
    # run before each call: makes this graph's resident copies the ones held
    enter: Callable[[CompiledGraph], None] | None = None

    def compilers_by_device(self) -> list[tuple[str, str]]:
        """(segment name, device) in execution order."""
        return [(name, getattr(self.module, name).device) for name in self.compilers]

    def __call__(self, *args: Any) -> Any:
        # One call at a time per session: a call takes the plan's buffers and budgets whole,
        # so a second thread waits for it rather than both running over the budget.
        with self.lock:
            if self.reference is not None:
                reference, self.reference = self.reference, None
                expected = eager_values(reference, args)
                segments = [getattr(self.module, name) for name in self.compilers]
                return verified_call(
                    segments, expected, lambda: self._run(args), self.plan.graph_index
                )
            return self._run(args)

    def _run(self, args: Sequence[Any]) -> Any:
        if self.enter is not None:
            self.enter(self)
        if self.chunks is not None:
            args = tuple(self.chunks.expand(args))
        self.calls += 1
        self.runtime.begin_call()
        try:
            if "cpu" in self.settings.budgets or self.runtime.disk is not None:
                with RssSampler() as rss, torch.no_grad():
                    out = self.module(*args)
                self.last_rss_peak = rss.peak
            else:
                with torch.no_grad():
                    out = self.module(*args)
        except BaseException as exc:
            self.runtime.abandon(exc)
            raise
        self.last_call_s = self.runtime.recorder.now()
        return out


@dataclasses.dataclass
class Session:
    """What graphs compiled with the same settings share: devices and their ledgers."""

    settings: Settings
    virtual: dict[str, VirtualDevice]
    graphs: list[CompiledGraph] = dataclasses.field(default_factory=list)
    disk: DiskTier | None = None
    resident: ResidentCopies = dataclasses.field(default_factory=ResidentCopies)
    # (hash of the graph's code, hash of its costs) -> the graph compiled from it
    by_source: dict[tuple[str, str], CompiledGraph] = dataclasses.field(default_factory=dict)
    # one call of one of the session's graphs at a time
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    # the graph whose resident copies are held now
    current: CompiledGraph | None = None

    def kept_beside(self, frame: int | None) -> frozenset[tuple[str, str]]:
        """(fqn, device) of the resident copies held whatever graph of ``frame`` runs: those
        of the graphs of other frames. Graph breaks are frames of their own and run one
        after the other, so each keeps its copies. The graphs of one frame (recompiles for
        other guards or shapes, the size ranges of a dynamic graph) are alternatives, one
        of them runs per call: when one runs, the copies only the others keep are dropped
        (:meth:`enter`), and each is planned as if they were not there."""
        return frozenset().union(
            *(resident_set(g.plan) for g in self.graphs if frame is None or g.frame != frame)
        )

    def enter(self, graph: CompiledGraph) -> None:
        """Before ``graph`` runs: drop the resident copies that only the other graphs of its
        frame keep (``graph`` makes its own again as it runs, if one was dropped)."""
        if self.current is graph:
            return
        self.current = graph
        self.make_room(graph.plan, graph.frame)

    def make_room(self, plan: GraphPlan, frame: int | None) -> None:
        """Drop the resident copies neither ``plan`` nor a graph of another frame keeps."""
        keep = resident_set(plan) | self.kept_beside(frame)
        dropped = self.resident.evict(lambda fqn, device: (fqn, device) in keep)
        if dropped:
            log.info(
                "graph %d runs: %d resident copies only other graphs of its frame keep "
                "were dropped",
                plan.graph_index,
                len(dropped),
            )

    def resident_bytes(
        self,
        frame: int | None,
        exclude: frozenset[str] = frozenset(),
        everywhere: bool = False,
    ) -> dict[str, int]:
        """Bytes held for good per device beside a new graph of ``frame``: the resident
        copies of the graphs of other frames (:meth:`kept_beside`) and, on the host, the
        weights the plans keep in RAM as they are, less those of the parameters named in
        ``exclude`` on the host (a new graph that uses them counts them itself). A model of
        several graphs thus fits its budgets as a whole, graph by graph. Those resident
        copies on an accelerator all count, as they stay there whatever the new graph
        decides (see :func:`_share_resident`); with ``everywhere``, those named in
        ``exclude`` are left out there too, as if the new graph's plan were to keep the
        same ones resident."""
        if not self.graphs:
            return {}
        runtime = self.graphs[0].runtime
        keep = self.kept_beside(frame)
        held = {name: 0 for g in self.graphs for name in (d.name for d in g.plan.devices)}
        for fqn, copy in self.resident.copies():
            device = runtime.owner(copy)
            if (fqn, device) not in keep:
                continue
            if fqn in exclude and (device == "cpu" or everywhere):
                continue
            held[device] = held.get(device, 0) + copy.untyped_storage().nbytes()
        in_ram: dict[str, int] = {}
        for g in self.graphs:
            for i, p in enumerate(g.plan.cost.params):
                if not g.plan.on_disk(i) and p.fqn not in exclude:
                    in_ram[p.fqn] = max(in_ram.get(p.fqn, 0), p.nbytes)
        held["cpu"] = held.get("cpu", 0) + sum(in_ram.values())
        return held

    def disk_tier(
        self, plan: GraphPlan, locations: Mapping[str, TensorLocation]
    ) -> DiskTier | None:
        """The session's disk tier (one reader and host buffer pool for every graph),
        knowing ``locations`` too; ``None`` while no parameter lives on disk.

        Idle read buffers are kept for reuse up to the size of the largest tensor the plans
        stream from disk: enough for a double buffer to reuse its buffers call after call,
        and at most that much RAM beyond the plan's.
        """
        if not locations and self.disk is None:
            return None
        if self.disk is None:
            pin = torch.cuda.is_available() and any(
                d.startswith("cuda") for d in self.settings.devices or ["cuda"]
            )
            pool = HostBufferPool(pin=pin, max_idle_bytes=0)
            self.disk = DiskTier(
                locations={},
                reader=DiskReader(pool),
                pool=pool,
                timeout_s=self.settings.io_timeout_s,
            )
        self.disk.add(locations)
        streamed = [
            p.nbytes
            for i, p in enumerate(plan.cost.params)
            if plan.on_disk(i) and plan.is_streamed(i)
        ]
        if streamed:
            largest = read_buffer_bytes(max(streamed))
            pool = self.disk.pool
            pool.max_idle_bytes = max(pool.max_idle_bytes or 0, largest)
        return self.disk


def _names_and_chunks(session: Session, cost: CostGraph) -> frozenset[str]:
    """The fqns of ``cost``'s parameters and the keys of the row chunks earlier graphs cut
    them into: a graph shares the resident copies of both."""
    names = {p.fqn for p in cost.params}
    for graph in session.graphs:
        if graph.chunks is not None:
            names |= {p.fqn for p in graph.plan.cost.params if graph.chunks.parent(p) in names}
    return frozenset(names)


def _share_resident(
    session: Session,
    cost: CostGraph,
    example_inputs: Sequence[Any],
    profile: HostProfile,
    frame: int | None,
) -> CostGraph:
    """``cost`` with the parameters an earlier graph already keeps resident on the one
    accelerator counted as 0 bytes: their copies stay there and are already in the budget
    held (``Session.resident_bytes``), so keeping them costs the new graph nothing, and the
    runtime uses the copy where the plan would stream them (``Runtime.prefetch``). With
    several accelerators a plan could place such a parameter on another one, unaccounted,
    so nothing is shared then."""
    accelerators = [d.name for d in profile.devices if d.name != "cpu"]
    if len(accelerators) != 1 or not session.graphs:
        return cost
    (device,) = accelerators
    kept = session.kept_beside(frame)
    shared = [
        i
        for i, p in enumerate(cost.params)
        if (p.fqn, device) in kept
        and session.resident.get(example_inputs[p.arg_index], device) is not None
    ]
    if not shared:
        return cost
    log.info(
        "graph %d shares %d parameters earlier graphs keep resident on %s",
        len(session.graphs),
        len(shared),
        device,
    )
    params = list(cost.params)
    for i in shared:
        params[i] = dataclasses.replace(params[i], nbytes=0)
    return dataclasses.replace(cost, params=tuple(params))


def _check_fallbacks(cost: CostGraph, strict: bool) -> None:
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
        stacklevel=3,
    )


def _resident_params(plan: GraphPlan) -> list[tuple[int, str]]:
    """(parameter index, device) of each resident copy the plan keeps: on an accelerator,
    or in RAM for a parameter whose home is disk."""
    kept = []
    for pid in range(len(plan.cost.params)):
        device = plan.param_device(pid)
        if (device != "cpu" or plan.on_disk(pid)) and not plan.is_streamed(pid):
            kept.append((pid, device))
    return kept


def resident_set(plan: GraphPlan) -> frozenset[tuple[str, str]]:
    """(fqn, device) of each resident copy the plan keeps."""
    return frozenset((plan.cost.params[pid].fqn, device) for pid, device in _resident_params(plan))


def _make_resident(plan: GraphPlan, runtime: Runtime, example_inputs: Sequence[Any]) -> None:
    """Copy every resident parameter to its device now (reading those that live on disk),
    so later graphs plan around it; one an earlier graph of the session already holds there
    is shared, as the plan assumed, not copied again."""
    for pid, device in _resident_params(plan):
        param = plan.cost.params[pid]
        runtime.resident_copy(param.fqn, example_inputs[param.arg_index], device)


class TensorTorrentBackend:
    """The callable registered as ``"tensortorrent"``; holds per-settings sessions."""

    def __init__(self, default_options: Mapping[str, Any] | None = None) -> None:
        self.default_options: dict[str, Any] = dict(default_options or {})
        self.sessions: dict[str, Session] = {}
        self.saved_plans: dict[str, saved_plan.SavedPlan] = {}

    @property
    def graphs(self) -> list[CompiledGraph]:
        return [g for s in self.sessions.values() for g in s.graphs]

    def reset(self) -> None:
        """Drop every plan, resident copy and ledger (``torch._dynamo.reset()`` calls this)."""
        for session in self.sessions.values():
            if session.disk is not None:
                session.disk.reader.close()
        self.sessions.clear()
        self.saved_plans.clear()

    def _session(self, settings: Settings) -> Session:
        key = settings.fingerprint()
        if key not in self.sessions:
            virtual = {
                name: VirtualDevice(name, spec.capacity_bytes, settings.io_timeout_s)
                for name, spec in settings.virtual_devices.items()
            }
            self.sessions[key] = Session(settings=settings, virtual=virtual)
        return self.sessions[key]

    def _check_saved(
        self, settings: Settings, cost: CostGraph, profile: HostProfile, plan: GraphPlan
    ) -> None:
        """Refuse (or, with ``replan="auto"``, warn about) a saved plan that no longer holds."""
        assert settings.plan is not None
        saved = self.saved_plans.get(settings.plan)
        if saved is None:
            saved = self.saved_plans[settings.plan] = saved_plan.load(settings.plan)
        try:
            record = saved.check(cost, profile)
            if record["plan_hash"] != plan.plan_hash:
                raise StalePlanError(
                    f"{saved.path}: planning this graph again gives plan {plan.plan_hash}, "
                    f"the file has {record['plan_hash']} (the settings or the planner changed)"
                )
        except StalePlanError as exc:
            if settings.replan == "error":
                raise
            warnings.warn(
                f"{exc}; planned again (replan='auto')", TensorTorrentWarning, stacklevel=3
            )
            return
        log.info(
            "graph %d: plan %s reproduced from %s", plan.graph_index, plan.plan_hash, saved.path
        )

    def __call__(
        self,
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        *,
        options: Mapping[str, Any] | None = None,
        mode: str | None = None,
    ) -> Callable[..., Any]:
        if mode is not None:
            raise OptionsError(
                f"tensortorrent does not use mode={mode!r}; pass options={{...}} instead "
                "(see tensortorrent_dynamo.settings.OPTION_HELP)"
            )
        settings = parse_options({**self.default_options, **(options or {})})
        return functional(gm, example_inputs, lambda g, i: self.compile_graph(g, i, settings))

    def compile_graph(
        self, gm: torch.fx.GraphModule, graph_inputs: GraphInputs, settings: Settings
    ) -> CompiledGraph | SizeRanges:
        """Plan, rewrite and compile one functional graph (see :mod:`.functional`); a
        graph with symbolic sizes gets one plan per range of sizes (:mod:`.shapes`)."""
        compile_id = torch._guards.CompileContext.current_compile_id()
        frame = compile_id.frame_id if compile_id is not None else None
        sizes = SymbolicSizes.of(gm)
        if not sizes:
            return self._plan_and_compile(gm, graph_inputs, settings, frame)
        session = self._session(settings)

        def build(bounds: dict[str, int]) -> CompiledGraph:
            # at call time too: under the session's lock, as no call may run meanwhile
            with session.lock:
                return self._plan_and_compile(gm, graph_inputs, settings, frame, bounds)

        return SizeRanges(sizes, build)

    def _plan_and_compile(
        self,
        gm: torch.fx.GraphModule,
        graph_inputs: GraphInputs,
        settings: Settings,
        frame: int | None,
        sizes: Mapping[str, int] | None = None,
    ) -> CompiledGraph:
        example_inputs = graph_inputs.values
        session = self._session(settings)
        profile = host_profile(settings)
        cost = build_cost_graph(gm, example_inputs, graph_inputs.params, sizes)
        source = (hashlib.sha256(gm.code.encode()).hexdigest(), saved_plan.graph_hash(cost))
        if source in session.by_source:
            # A recompile (a guard failed) that produced the same graph with the same
            # costs: its plan's assumptions still hold.
            again = session.by_source[source]
            log.info(
                "recompiled graph is graph %d again (same code and costs): reusing plan %s",
                again.plan.graph_index,
                again.plan.plan_hash,
            )
            return again
        _check_fallbacks(cost, settings.strict)
        original = gm  # the graph as captured (row chunking replaces ``gm`` below)
        on_disk = frozenset(
            p.fqn for p in cost.params if released_location(example_inputs[p.arg_index])
        )
        names = _names_and_chunks(session, cost)
        chunker: WeightChunker | None = None

        def plan_with(cost: CostGraph, held: Mapping[str, int]) -> GraphPlan:
            nonlocal chunker
            chunker = (
                WeightChunker(
                    gm, example_inputs, cost, settings.stream_chunk_bytes, graph_inputs.params
                )
                if settings.stream_chunk_bytes
                else None
            )
            return plan_graph(len(session.graphs), cost, profile, settings, held, on_disk, chunker)

        shared = _share_resident(session, cost, example_inputs, profile, frame)
        try:
            plan = plan_with(shared, session.resident_bytes(frame, names))
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
                len(session.graphs),
            )
            plan = plan_with(cost, session.resident_bytes(frame, names, everywhere=True))
        chunked = chunker.graph_for(plan.cost) if chunker is not None else None
        if settings.plan is not None:
            self._check_saved(settings, plan.cost, profile, plan)
        if chunked is None:
            weights = whole_weights(plan.cost, example_inputs)
        else:
            gm, weights = chunked.module, chunked.weights(plan.cost, example_inputs)
        locations = place_on_disk(plan, weights, settings)
        # the chunks as the weights are now, some released to disk
        inputs = example_inputs if chunked is None else chunked.expand(example_inputs)
        if torch.cuda.is_available():
            pin_streamed_weights(plan, inputs)
        disk = session.disk_tier(plan, locations)
        runtime = Runtime(session.virtual, disk, session.resident, settings.io_timeout_s)
        rewritten = rewrite(gm, plan, runtime)
        session.make_room(plan, frame)
        _make_resident(plan, runtime, inputs)
        compilers = compile_segments(rewritten, runtime, settings)
        compiler_note = None
        if disk is None:  # re-reading weights from disk only to time a graph costs too much
            compiler_note = keep_faster(rewritten.module, compilers, inputs)
        compiled = CompiledGraph(
            plan=plan,
            module=rewritten.module,
            runtime=runtime,
            compilers=compilers,
            compiler_note=compiler_note,
            settings=settings,
            profile=profile,
            chunks=chunked,
            lock=session.lock,
            reference=original if settings.verify else None,
            frame=frame,
            enter=session.enter,
        )
        session.graphs.append(compiled)
        session.current = compiled  # its resident copies are the ones held now
        session.by_source[source] = compiled
        if plan_log.isEnabledFor(logging.DEBUG) or log.isEnabledFor(logging.INFO):
            from .report.explain import explain_graph

            text = explain_graph(compiled)
            plan_log.debug("%s", text)
            # every graph after the first is a graph break or a recompile with other code
            # or shapes (the same graph again reuses its plan, above)
            log.info("graph %d planned: %s", plan.graph_index, plan.native.chosen)
            log.debug("schedule of graph %d:\n%s", plan.graph_index, rewritten.module.code)
        return compiled


tensortorrent_backend = TensorTorrentBackend()
"""The backend object the ``torch_dynamo_backends`` entry point names."""
