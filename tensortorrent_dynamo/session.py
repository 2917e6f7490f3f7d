"""What the graphs compiled with the same settings share: a :class:`Session` (devices and
their ledgers, the resident copies, the disk tier) and the :class:`CompiledGraph` each
captured graph becomes.

Graphs of different Dynamo frames (graph breaks) run one after the other and keep their
resident copies side by side; graphs of one frame (recompiles, size ranges) are
alternatives, one of which runs per call (:meth:`Session.kept_beside`).
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import torch
import torch.fx

from .compiling.verify import eager_values, verified_call
from .cost_graph import CostGraph, ParamRef
from .errors import PlanInfeasible, ReplacedWeightError, StalePlanError
from .instances import ByIdentity
from .io.locations import TensorLocation
from .io.pool import (
    HostBufferPool,
    bound_heap_retention,
    keep_heap_for_calls,
    read_buffer_bytes,
    release_free_heap,
)
from .io.reader import DiskReader
from .passes.chunk_weights import ChunkedInputs
from .plan.files import SavedPlan
from .plan.files import load as load_plan
from .plan.planner import GraphPlan, Keep, resident_set
from .plan.residency import Residency
from .profile import HostProfile
from .run.ops import DirectCall, direct_segment
from .run.record import RssSampler
from .run.residents import DiskTier, ResidentCopies
from .run.runtime import Runtime
from .run.virtual import VirtualDevice
from .settings import Settings

log = logging.getLogger(__name__)


class Replan(Protocol):
    """Plans a graph again with a call's arguments, keeping another graph's resident copies
    where they fit, and makes the graph that plan (``pipeline.Replanner``)."""

    def __call__(self, graph: CompiledGraph, args: Sequence[Any], keep: Keep | None) -> None: ...


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
    # how to feed the graph with large weights in row chunks that the plan was made for,
    # when it was
    chunks: ChunkedInputs | None = None
    # held around each call: the graphs of one session share devices, pools and budgets
    lock: threading.RLock = dataclasses.field(default_factory=threading.RLock)
    # with ``verify``: the captured graph, until the first call has been checked against it
    reference: torch.fx.GraphModule | None = None
    # the Dynamo frame the graph was captured from (``None`` outside Dynamo): the graphs of
    # one frame are alternatives, one of them runs per call (``Session.kept_beside``)
    frame: int | None = None
    # run before each call, with its arguments: makes this graph's resident copies the
    # ones held (``Session.enter``)
    enter: Callable[[CompiledGraph, Sequence[Any]], None] | None = None
    # plans the graph again (with a call's arguments) keeping another graph's resident
    # copies where they fit, and makes this graph that plan (``Session.enter``); ``None``
    # for a graph that cannot be (one compiled outside the backend)
    replan: Replan | None = None
    # its frame was planned again to share the resident copies of the graph called most
    # (``Session.follow``): that is done once
    followed: bool = False
    # the module's one segment, when the schedule only calls it (see ``direct_segment``)
    direct: DirectCall | None = dataclasses.field(init=False, default=None)
    # the index of a later graph whose plan put on disk (and released) weights this
    # graph's plan keeps in RAM: it is planned again before its next call (``Session.enter``)
    stale: int | None = None
    # its plan keeps nothing for good (``Session.make_lean``): a later graph needed the
    # room its copies held
    lean: bool = False
    # planned again, lean, before its next call (its copies were dropped meanwhile)
    lean_pending: bool = False
    # a weight its plan reads from disk was given other bytes (``ReplacedWeightError``): it
    # is planned again before the call is made again (``Session.enter``)
    replaced: str | None = None
    # weak references to the weights it was planned for: it runs with those only
    # (``instances.py``), so once one of them died it never runs again (:attr:`gone`)
    weights: tuple[weakref.ref[torch.Tensor], ...] = ()

    @property
    def gone(self) -> bool:
        """Whether a weight it was planned for died (its model was deleted): it never runs
        again, and holds nothing (``Session.forget_gone``)."""
        return any(ref() is None for ref in self.weights)

    def __post_init__(self) -> None:
        self.direct = direct_segment(self.module)

    def become(self, other: CompiledGraph) -> None:
        """Take ``other``'s plan and all that was made from it (this graph planned again):
        Dynamo keeps calling this object, its calls so far kept."""
        for name in ("plan", "module", "runtime", "compilers", "compiler_note", "chunks"):
            setattr(self, name, getattr(other, name))
        self.reference = other.reference  # with ``verify``, the new plan is checked too
        self.direct = other.direct

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
        if self.calls == 0:
            _compile_garbage.after_compile(self.plan.graph_index, input_bytes(args, self.plan.cost))
            if self.settings.keep_heap and self.runtime.disk is None:
                keep_heap_for_calls()
        elif _compile_garbage.owed:
            _compile_garbage.pay(self.plan.graph_index)
        try:
            return self._run_once(args)
        except ReplacedWeightError as exc:
            # a weight read from disk was given other bytes (``model.to(dtype)`` and back):
            # planned again, the graph uses them where they are now. Nothing the call wrote
            # reached its inputs: a graph writes them back once it has returned.
            if self.replan is None or self.enter is None or self.settings.plan is not None:
                raise  # a saved plan's graph is planned as saved, or refused
            self.replaced = str(exc)
            self.calls -= 1  # the call is made again: counted once
            return self._run_once(args)

    def _run_once(self, args: Sequence[Any]) -> Any:
        if self.enter is not None:
            self.enter(self, args)
        if self.chunks is not None:
            args = tuple(self.chunks.expand(args))
        self.calls += 1
        self.runtime.begin_call()
        try:
            if "cpu" in self.settings.budgets or self.runtime.disk is not None:
                with RssSampler() as rss, torch.no_grad():
                    out = self._call(args)
                self.last_rss_peak = rss.peak
            elif torch.is_grad_enabled():
                with torch.no_grad():
                    out = self._call(args)
            else:
                out = self._call(args)
        except BaseException as exc:
            self.runtime.abandon(exc)
            raise
        self.last_call_s = self.runtime.recorder.now()
        return out

    def _call(self, args: Sequence[Any]) -> Any:
        if self.direct is None:
            return self.module(*args)
        return self.direct(args)


def whole_name(graph: CompiledGraph, param: ParamRef) -> str:
    """The fqn of the whole weight ``param`` of ``graph``'s plan is (rows of)."""
    return graph.chunks.parent(param) if graph.chunks is not None else param.fqn


def uses_model_tensor(residency: Residency) -> bool:
    """Whether a plan may use the model's own tensor of a weight in RAM: its tier is RAM
    (kept there, or copied from there), or its tier is disk and the plan keeps it in RAM,
    which is the model's tensor itself until a plan releases that to disk."""
    return not residency.on_disk or (residency.keeps_copy and residency.device == "cpu")


def weights_in_ram(graph: CompiledGraph) -> frozenset[str]:
    """The weights (whole, by fqn) ``graph``'s plan may use from the model's tensors
    (:func:`uses_model_tensor`)."""
    return frozenset(
        whole_name(graph, p)
        for p, r in zip(graph.plan.cost.params, graph.plan.residency, strict=True)
        if uses_model_tensor(r)
    )


def runs_beside(graph: CompiledGraph, frame: int | None) -> bool:
    """Whether ``graph`` keeps its resident copies while a graph of ``frame`` runs: it is
    of another frame (every graph, outside Dynamo). The graphs of one frame are
    alternatives: one of them runs per call."""
    return frame is None or graph.frame != frame


class _CompileGarbage:
    """Freeing the garbage Dynamo's tracing left, after a graph is compiled (or planned
    again).

    The objects Dynamo builds while it traces a frame (its variable trackers, side-effect
    records) refer to the real objects the frame was traced with and to each other, so they
    are freed only by a cyclic collection, which a process of a million objects runs
    seldom. Until then they keep those objects alive: for ``generate()``, the KV cache of the
    call that compiled, as large as the cache itself (282 MiB at batch 16 in the generate
    bench, where the next ``generate()`` then held two caches at once and went over its
    memory limit). A graph's first call comes after its frame's trace, so the garbage is
    collectable then. The memory freed is then given back to the system
    (:func:`release_free_heap`).

    A full collection costs time in proportion to the objects the process holds (0.2 s once
    transformers is imported, over a second in a long test run), and a model whose layers
    break the graph traces dozens of graphs in its first calls: one collection each made
    compiling a 4-layer model of 24 graphs, three times, take 17 s alone and 84 s in the
    test run (4 s without them). So a graph whose tensor inputs other than its weights (the
    activations, a KV cache: what the garbage would keep alive) come to ``BIG_INPUTS`` bytes
    or more is collected for at once; for others, a collection is made only when the time
    since the last one is at least ``RATIO`` times what that one took (collecting takes at
    most a fifth of a burst of compiles), and one not made then is owed: made at the first
    call of any graph once that holds again."""

    RATIO = 4.0
    BIG_INPUTS = 32 * 2**20

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ended = -float("inf")  # when the last collection ended (perf_counter)
        self._took = 0.0  # what it took
        self.owed = False  # a collection was put off

    def after_compile(self, graph_index: int, input_bytes: int) -> None:
        """A graph traced with ``input_bytes`` of tensor inputs other than its weights was
        just compiled or planned again: collect, or owe it."""
        if input_bytes >= self.BIG_INPUTS:
            self._collect(graph_index, "before its first call, as its inputs are large")
        elif self._due():
            self._collect(graph_index, "before its first call")
        else:
            self.owed = True

    def pay(self, graph_index: int) -> None:
        """Make the collection put off earlier, once enough time has passed."""
        if self._due():
            self._collect(graph_index, "owed since an earlier compile")

    def _due(self) -> bool:
        return time.perf_counter() - self._ended >= self.RATIO * self._took

    def _collect(self, graph_index: int, why: str) -> None:
        with self._lock:
            self.owed = False
            started = time.perf_counter()
            found = gc.collect()
            collected = time.perf_counter()
            released = release_free_heap()
            self._ended = time.perf_counter()
            self._took = self._ended - started
        log.debug(
            "graph %d: collected %d unreachable objects %s (%.0f ms); free heap memory %s "
            "(%.0f ms)",
            graph_index,
            found,
            why,
            1e3 * (collected - started),
            "given back to the system" if released else "not given back (none, or not glibc)",
            1e3 * (self._ended - collected),
        )


def input_bytes(args: Sequence[Any], cost: CostGraph) -> int:
    """Bytes of the tensors among a graph's arguments ``args`` that are not its weights."""
    weights = {p.arg_index for p in cost.params}
    return sum(
        a.untyped_storage().nbytes()
        for i, a in enumerate(args)
        if i not in weights and isinstance(a, torch.Tensor) and a.device.type != "meta"
    )


_compile_garbage = _CompileGarbage()


@dataclasses.dataclass
class Session:
    """What graphs compiled with the same settings share: devices and their ledgers."""

    settings: Settings
    virtual: dict[str, VirtualDevice]
    graphs: list[CompiledGraph] = dataclasses.field(default_factory=list)
    disk: DiskTier | None = None
    resident: ResidentCopies = dataclasses.field(default_factory=ResidentCopies)
    # the graph compiled from a graph's weights and (key) the hashes of its code and costs
    by_source: ByIdentity[CompiledGraph] = dataclasses.field(default_factory=ByIdentity)
    # one call of one of the session's graphs at a time, or one plan made at call time
    lock: threading.RLock = dataclasses.field(default_factory=threading.RLock)

    # the graph whose resident copies are held now
    current: CompiledGraph | None = None
    # how many graphs were planned: the index of the next one
    planned: int = 0
    # the plan file the settings name, once read
    saved: SavedPlan | None = None
    # the weights (whole, by fqn) the plans read from disk whose RAM is released
    on_disk: frozenset[str] = frozenset()
    # Dynamo frame -> the weights of each instance of its graphs (``instances.py``), by id
    # (with a weak reference to tell a reused id), in the order calls first passed them
    _instances: dict[int | None, list[dict[int, weakref.ref[torch.Tensor]]]] = dataclasses.field(
        default_factory=dict
    )
    # (Dynamo frame, instance) -> the frame the graphs of that instance are of
    _instance_frames: dict[tuple[int | None, int], int] = dataclasses.field(default_factory=dict)
    # the name of each weight the plans name -> the tensor it names (``weight_name``)
    _names: dict[str, weakref.ref[torch.Tensor]] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, settings: Settings) -> Session:
        """A new session: a virtual device (and its ledger) for each the settings name."""
        virtual = {
            name: VirtualDevice(name, spec.capacity_bytes, settings.io_timeout_s)
            for name, spec in settings.virtual_devices.items()
        }
        return cls(settings=settings, virtual=virtual)

    def close(self) -> None:
        """Stop the disk tier's reader threads."""
        if self.disk is not None:
            self.disk.reader.close()

    def saved_plan(self) -> SavedPlan:
        """The plan file the ``plan`` option names, read once."""
        assert self.settings.plan is not None
        if self.saved is None:
            self.saved = load_plan(self.settings.plan)
        return self.saved

    def forget_gone(self) -> None:
        """Drop the graphs of deleted models (``CompiledGraph.gone``): no later plan is
        made beside what they kept, or the room their runs needed."""
        gone = [g for g in self.graphs if g.gone]
        if not gone:
            return
        self.graphs = [g for g in self.graphs if not g.gone]
        if self.current is not None and self.current.gone:
            self.current = None
        self.by_source.prune()
        log.info(
            "graphs %s are let go: a weight they were planned for was deleted",
            ", ".join(str(g.plan.graph_index) for g in gone),
        )

    def weight_name(self, fqn: str, tensor: torch.Tensor) -> str:
        """The name the plans give ``tensor``, a weight its graph calls ``fqn``: ``fqn``, or
        where the session's plans already give that name to another tensor, ``fqn@1``,
        ``fqn@2``, ... A graph names its weights from its own frame's module, so two
        frames' weights, or two modules' weights in one frame's graph (``instances.py``),
        may have one name; the disk tier and the resident copies know a weight by its
        name, so each must have its own."""
        number = 0
        while True:
            name = fqn if number == 0 else f"{fqn}@{number}"
            ref = self._names.get(name)
            if ref is None or ref() is None:
                self._names[name] = weakref.ref(tensor)
                return name
            if ref() is tensor:
                return name
            number += 1

    def instance_of(self, frame: int | None, weights: Sequence[torch.Tensor]) -> int:
        """Which instance of the graphs of Dynamo frame ``frame`` runs with ``weights``
        (see :mod:`.instances`): 0 for the first weights any of them was given. Graphs of
        one frame run for the same module where over half the weights of one are the
        other's (a decode step reads fewer than the prompt's call: cross-attention's keys
        and values come from its cache); two modules' weights share a few tensors at most
        (a buffer they both hold)."""
        if not weights:
            return 0
        known = self._instances.setdefault(frame, [])
        given = {id(w): w for w in weights}
        best, most = 0, 0
        for number, refs in enumerate(known):
            shared = sum(1 for i, w in given.items() if i in refs and refs[i]() is w)
            if shared > most:
                best, most = number, shared
        if most and 2 * most > min(len(given), len(known[best])):
            known[best].update({i: weakref.ref(w) for i, w in given.items()})
            return best
        known.append({i: weakref.ref(w) for i, w in given.items()})
        return len(known) - 1

    def make_lean_beside(self, frame: int | None, count: int) -> int:
        """A new graph of ``frame`` does not fit beside what the graphs of other frames keep:
        the ``count`` of them that keep the most (on all devices) and can be planned again
        are made lean (:meth:`make_lean`), so that it is planned beside none of their
        copies. How many were: 0 when none is left."""
        candidates = [g for g in self.beside(frame) if not g.lean and g.replan is not None]
        candidates.sort(
            key=lambda g: sum(g.plan.kept_bytes(d.name) for d in g.plan.devices), reverse=True
        )
        chosen = candidates[:count]
        self.make_lean(chosen, "a later graph needed the room")
        return len(chosen)

    def make_lean(self, lean: Sequence[CompiledGraph], why: str) -> None:
        """``lean`` (graphs that can be planned again, a saved plan's too) keep nothing for
        good from now on: before they next run, they are planned again keeping nothing
        (:meth:`enter`), and the resident copies they keep are dropped now, so that a new
        graph is planned beside none of them; until then, the weights they keep in RAM are
        held beside the budget."""
        for g in lean:
            g.lean = g.lean_pending = True
        dropped = frozenset().union(*(resident_set(g.plan) for g in lean))
        kept = frozenset().union(*(resident_set(g.plan) for g in self.graphs if not g.lean))
        evicted = self.resident.evict(lambda fqn, d: (fqn, d) not in dropped or (fqn, d) in kept)
        if lean:
            log.info(
                "graphs %s are planned again before their next call, keeping nothing for "
                "good, as %s (%d resident copies dropped)",
                ", ".join(str(g.plan.graph_index) for g in lean),
                why,
                len(evicted),
            )

    def instance_frame(
        self, frame: int | None, instance: int, weights: Sequence[str] = ()
    ) -> int | None:
        """The frame the graphs of ``instance`` of Dynamo frame ``frame`` are of: ``frame``
        itself for the first instance, else a number of its own (negative, as Dynamo's are
        not), so that each instance keeps its resident copies beside the others'. The first
        time a frame has a second instance, a warning says what that costs (``weights``:
        the names of the graph's weights, to say which module repeats)."""
        if instance == 0:
            return frame
        key = (frame, instance)
        if key not in self._instance_frames:
            self._instance_frames[key] = -1 - len(self._instance_frames)
            if instance == 1:
                listed = ", ".join(weights[:3]) + (", ..." if len(weights) > 3 else "")
                log.warning(
                    "the graphs of Dynamo frame %s run for more than one module (a second "
                    "module's weights: %s): each module the model repeats (a layer) runs "
                    "graphs of its own, planned apart, which is slower than one graph for the "
                    "model when weights stream (a layer's reads cannot start during the layer "
                    "before). Either each layer was compiled on its own (module.compile() per "
                    "layer, diffusers' compile_repeated_blocks): compile the whole model "
                    "instead; or a graph break inside the layer makes a frame of it "
                    "(output_attentions=True makes one in many models): TORCH_LOGS=graph_breaks "
                    "shows where it breaks",
                    frame,
                    listed or "none",
                )
        return self._instance_frames[key]

    def kept_beside(self, frame: int | None) -> frozenset[tuple[str, str]]:
        """(fqn, device) of the resident copies held whatever graph of ``frame`` runs: those
        of the graphs of other frames. Graph breaks are frames of their own and run one
        after the other, so each keeps its copies. The graphs of one frame (recompiles for
        other guards or shapes, the size ranges of a dynamic graph) are alternatives, one
        of them runs per call: when one runs, the copies only the others keep are dropped
        (:meth:`enter`), and each is planned as if they were not there."""
        return frozenset().union(
            *(resident_set(g.plan) for g in self.beside(frame) if not g.lean_pending)
        )

    def beside(self, frame: int | None) -> list[CompiledGraph]:
        """The graphs whose resident copies a graph of ``frame`` runs beside: those of other
        frames (every graph, outside Dynamo)."""
        return [g for g in self.graphs if runs_beside(g, frame)]

    def enter(self, graph: CompiledGraph, args: Sequence[Any] = ()) -> None:
        """Before ``graph`` runs (with ``args``): drop the resident copies that only the
        other graphs of its frame keep (``graph`` makes its own again as it runs, if one
        was dropped).

        The alternatives of one frame share the resident copies of the one called most
        (:meth:`leader`: ``generate()``'s decode graph): the first time another of them
        runs after that one has been called more, it is planned again, once for the whole
        frame, keeping those copies where they fit (``plan.planner.Keep``), so that
        switching between them drops and reads again nothing (not a saved plan's graphs,
        which keep what it has them keep). Any graph is also planned again (a saved plan's
        searched) where it is stale, a later graph's plan having released weights its plan
        keeps in RAM (:meth:`released`), or lean, a later graph having needed the room its
        copies held (:meth:`make_lean`), and any but a saved plan's where a weight its plan
        reads from disk was given other bytes (``CompiledGraph.replaced``)."""
        if graph.stale is not None or graph.lean_pending or graph.replaced is not None:
            self.plan_again(graph, args)
        if self.current is graph:
            return
        follows = graph.replan is not None and not graph.followed and self.settings.plan is None
        leader = self.leader(graph) if follows else None
        if leader is not None:
            self.follow(graph, leader, args)
        self.current = graph
        self.make_room(graph.plan, graph.frame)

    def alternatives(self, graph: CompiledGraph) -> list[CompiledGraph]:
        """The graphs of ``graph``'s frame, ``graph`` among them (itself alone outside
        Dynamo)."""
        if graph.frame is None:
            return [graph]
        return [g for g in self.graphs if g.frame == graph.frame]

    def leader(self, graph: CompiledGraph) -> CompiledGraph | None:
        """The alternative of ``graph`` called more than any other and more than ``graph``,
        when its resident copies are not already the ones ``graph`` keeps; else ``None``."""
        others = sorted(self.alternatives(graph), key=lambda g: g.calls, reverse=True)
        if len(others) < 2 or others[0] is graph or others[0].calls == others[1].calls:
            return None
        leader = others[0]
        if leader.calls <= graph.calls or graph.plan.follows == leader.plan.graph_index:
            return None
        return leader if resident_set(leader.plan) != resident_set(graph.plan) else None

    def follow(self, graph: CompiledGraph, leader: CompiledGraph, args: Sequence[Any]) -> None:
        """Plan ``graph`` again with ``args``, keeping ``leader``'s resident copies where
        they fit; the frame is planned again only this once."""
        replan = graph.replan
        assert replan is not None
        for g in self.alternatives(graph):
            g.followed = True
        started = time.perf_counter()
        try:
            keep = Keep(leader.plan.graph_index, resident_set(leader.plan), leader.plan.chunk_bytes)
            replan(graph, args, keep)
        except PlanInfeasible as exc:  # it fit when first planned: keep that plan
            log.warning(
                "graph %d planned again does not fit (%s): its plan is kept",
                graph.plan.graph_index,
                exc,
            )
            return
        log.info(
            "graph %d planned again, %s graph %d's resident copies (called most: %d calls "
            "to its %d) in %.1f s",
            graph.plan.graph_index,
            "keeping"
            if graph.plan.follows is not None
            else "with a set of its own: it could not fit, or would cost more with,",
            leader.plan.graph_index,
            leader.calls,
            graph.calls,
            time.perf_counter() - started,
        )
        _compile_garbage.after_compile(graph.plan.graph_index, input_bytes(args, graph.plan.cost))

    def in_ram_for_good(self, replacing: int | None = None) -> frozenset[str]:
        """The weights (whole, by fqn) kept in RAM by the plans that cannot change (graphs
        that cannot be planned again; a saved plan's can be, where stale), but the one of
        graph ``replacing``:
        a new plan must leave them in RAM, as releasing one to disk would leave those
        graphs reading it through the page cache (its file mapped), unverified and unplanned,
        where their plans expect its bytes in RAM."""
        return frozenset(
            name
            for g in self.graphs
            if g.replan is None and g.plan.graph_index != replacing
            for name in weights_in_ram(g)
        )

    def released(self, index: int, names: frozenset[str]) -> None:
        """Graph ``index``'s plan released the weights ``names`` (whole, by fqn) to disk:
        the other graphs whose plans keep one of them in RAM are stale, and are planned
        again before they next run (:meth:`enter`). They all can be: the weights the plans
        that cannot change keep in RAM are never released (:meth:`in_ram_for_good`)."""
        new, self.on_disk = names - self.on_disk, self.on_disk | names
        for g in self.graphs:
            if g.plan.graph_index != index and not new.isdisjoint(weights_in_ram(g)):
                g.stale = index
                log.info(
                    "graph %d's plan put on disk weights graph %d's plan keeps in RAM: "
                    "graph %d is planned again before its next call",
                    index,
                    g.plan.graph_index,
                    g.plan.graph_index,
                )

    def plan_again(self, graph: CompiledGraph, args: Sequence[Any]) -> None:
        """Plan ``graph`` again with ``args``: stale, now that the weights another graph's
        plan released are on disk (see :meth:`released`), lean, keeping nothing for good
        now that a later graph needed the room (see :meth:`make_lean`), or because a weight
        its plan reads from disk was given other bytes (``CompiledGraph.replaced``)."""
        stale, graph.stale = graph.stale, None
        replaced, graph.replaced = graph.replaced, None
        pending, graph.lean_pending = graph.lean_pending, False
        index = graph.plan.graph_index
        if replaced is not None:
            why = f"a weight its plan reads from disk changed ({replaced})"
        elif stale is not None:
            why = f"graph {stale}'s plan put on disk weights its plan kept in RAM"
        else:
            why = "it keeps nothing for good from now on"
        # a saved plan's graph is planned again (searched, said in explain()) where it is
        # stale (replaying a later graph's saved decisions made it so, as they did where it
        # was saved, which planned it again at its next call) or lean (a graph the file
        # lacks needed the room); one given other weights never gets here (refused, as
        # saved, in ``CompiledGraph.__call__``)
        if graph.replan is None:
            raise StalePlanError(
                f"graph {index} must be planned again ({why}), and it can no longer be; "
                "torch._dynamo.reset() and compile the model again"
            )
        started = time.perf_counter()
        try:
            graph.replan(graph, args, None)
        except BaseException as exc:
            # its plan is still the old one, which must not run (its resident copies were
            # dropped, or it reads what is no longer there): the next call tries again
            graph.stale, graph.replaced, graph.lean_pending = stale, replaced, pending
            if not isinstance(exc, PlanInfeasible):
                raise
            raise PlanInfeasible(
                f"graph {index} was planned again, as {why}, and it no longer fits: {exc}",
                exc.min_budgets,
                exc.peaks,
            ) from None
        log.info(
            "graph %d planned again, as %s (%.1f s)", index, why, time.perf_counter() - started
        )
        _compile_garbage.after_compile(index, input_bytes(args, graph.plan.cost))

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
        model's tensors the plans use in RAM (:meth:`_holds_in_ram`), less those of the
        parameters named in ``exclude`` on the host (a new graph that uses them counts
        them itself). A model of several graphs thus fits its budgets as a whole, graph by
        graph. Those resident copies on an accelerator all count, as they stay there
        whatever the new graph decides (see :func:`_share_resident`); with ``everywhere``,
        those named in ``exclude`` are left out there too, as if the new graph's plan were
        to keep the same ones resident.

        The room the graphs of other frames need to run beside all that is
        :meth:`working_room`."""
        if not self.graphs:
            return {}
        runtime = self.graphs[0].runtime
        keep = self.kept_beside(frame)
        held = {name: 0 for g in self.graphs for name in (d.name for d in g.plan.devices)}
        present = set()
        for fqn, copy in self.resident.copies():
            device = runtime.owner(copy)
            present.add((fqn, device))
            if (fqn, device) not in keep:
                continue
            if fqn in exclude and (device == "cpu" or everywhere):
                continue
            held[device] = held.get(device, 0) + copy.untyped_storage().nbytes()
        # The copies a graph of another frame keeps that are not there now (an alternative
        # of its frame ran since, and dropped them): it makes them again as it runs, and
        # they stay. At most one alternative of a frame runs in a call: the most any of
        # them lacks. (Uncounted, a graph planned meanwhile filled their room, and the
        # model's next call ran out of the device's memory.)
        lacking: dict[tuple[int | None, str], int] = {}
        for g in self.beside(frame):
            if g.lean_pending:  # it keeps nothing once planned again
                continue
            per_device: dict[str, int] = {}
            for p, r in zip(g.plan.cost.params, g.plan.residency, strict=True):
                if not r.keeps_copy or (p.fqn, r.device) in present:
                    continue
                if r.device == "cpu" and self._holds_in_ram(g, p, r):
                    continue  # on the host it is the model's own tensor: counted below
                if p.fqn in exclude and (r.device == "cpu" or everywhere):
                    continue
                per_device[r.device] = per_device.get(r.device, 0) + p.nbytes
            for device, nbytes in per_device.items():
                key = (g.frame, device)
                lacking[key] = max(lacking.get(key, 0), nbytes)
        for (_, device), nbytes in lacking.items():
            held[device] = held.get(device, 0) + nbytes
        in_ram: dict[str, int] = {}
        for g in self.graphs:
            if g.lean_pending:  # it keeps nothing once planned again, before it next runs
                continue
            for p, r in zip(g.plan.cost.params, g.plan.residency, strict=True):
                if p.fqn not in exclude and self._holds_in_ram(g, p, r):
                    in_ram[p.fqn] = max(in_ram.get(p.fqn, 0), p.nbytes)
        held["cpu"] = held.get("cpu", 0) + sum(in_ram.values())
        return held

    def _holds_in_ram(self, graph: CompiledGraph, param: ParamRef, residency: Residency) -> bool:
        """Whether ``graph``'s plan holds ``param`` in host RAM as the model's own tensor,
        whatever graph runs: a weight whose tier is RAM, or one whose tier is disk that it
        keeps in RAM, while no plan released it to disk. (A released weight's copy in RAM
        is a resident copy, counted as such; a plan whose RAM weight another plan released
        is stale, and is planned again reading it from disk.)"""
        return uses_model_tensor(residency) and whole_name(graph, param) not in self.on_disk

    def working_room(self, frame: int | None) -> dict[str, int]:
        """Per device, the most a graph of another frame than ``frame`` needs there beyond
        what the graphs keep for good (its predicted peak less what it keeps there,
        ``GraphPlan.kept_bytes``): its activations and read buffers. Those graphs run in
        the same call as a new graph of ``frame``, beside what it keeps: a new graph that
        filled the rest of a budget with weights would leave them no room to run. Their
        runs come one after another, so the most any of them needs is enough; the new
        graph's own room shares it (see ``pipeline._plan``)."""
        room: dict[str, int] = {}
        for g in self.beside(frame):
            for device in g.plan.devices:
                name = device.name
                # one planned again lean keeps nothing: it reads what it kept as it runs
                kept = 0 if g.lean_pending else g.plan.kept_bytes(name)
                need = max(0, g.plan.predicted_peak(name) - kept)
                room[name] = max(room.get(name, 0), need)
        return room

    def holders(self, frame: int | None, device: str) -> list[int]:
        """The indices of the graphs whose holdings :meth:`resident_bytes` and
        :meth:`working_room` count on ``device`` beside a new graph of ``frame``: the
        graphs of other frames that use it and, in host RAM, every graph that keeps
        weights there."""
        return [
            g.plan.graph_index
            for g in self.graphs
            if (
                runs_beside(g, frame)
                and any(d.name == device for d in g.plan.devices)
                and g.plan.predicted_peak(device) > 0
            )
            or (device == "cpu" and any(not r.on_disk for r in g.plan.residency))
        ]

    def disk_tier(
        self, plan: GraphPlan, locations: Mapping[str, TensorLocation]
    ) -> DiskTier | None:
        """The session's disk tier (one reader and host buffer pool for every graph),
        knowing ``locations`` too; ``None`` while no parameter lives on disk.

        The pool lends read buffers in turn from a block reserved for the most the plans
        hold at once (``GraphPlan.disk_buffer_peak``, within their host budgets) plus the
        largest of them (what wrapping around the block may leave unused): a buffer freshly
        allocated for a read is faulted in by that read, which halved the disk's rate (a
        1.5 GiB Qwen3 streaming half its weights on the 2-core development machine read
        0.7-1.0 GB/s into fresh buffers and 1.6-1.8 GB/s into reused ones). A read the block
        has no room for gets a buffer of its own, freed once given back. A plan that keeps
        the resident copies of the graph called most (``GraphPlan.follows``) reserves no
        more: its reads beyond the block get buffers of their own while it runs, where a
        larger block would stay held beside the other graph's plan, which did not count
        it (prefill streaming decode's weights held 47 MiB more that way in the generate
        bench).
        """
        if not locations and self.disk is None:
            return None
        if self.disk is None:
            bound_heap_retention()
            pin = torch.cuda.is_available() and any(
                d.startswith("cuda") for d in self.settings.devices or ["cuda"]
            )
            pool = HostBufferPool(pin=pin, max_held_bytes=0)
            self.disk = DiskTier(
                locations={},
                reader=DiskReader(pool, threads=self.settings.read_threads),
                pool=pool,
                timeout_s=self.settings.io_timeout_s,
            )
        self.disk.add(locations)
        streamed = [
            p.nbytes
            for p, r in zip(plan.cost.params, plan.residency, strict=True)
            if r.reads_from_disk
        ]
        if streamed and plan.follows is None:
            self.disk.pool.reserve(plan.disk_buffer_peak() + read_buffer_bytes(max(streamed)))
        return self.disk


def make_resident(plan: GraphPlan, runtime: Runtime, example_inputs: Sequence[Any]) -> None:
    """Copy every resident parameter to its device now (reading those that live on disk),
    so later graphs plan around it; one an earlier graph of the session already holds there
    is shared, as the plan assumed, not copied again."""
    for param, residency in zip(plan.cost.params, plan.residency, strict=True):
        if residency.keeps_copy:
            runtime.resident_copy(param.fqn, example_inputs[param.arg_index], residency.device)


def shared_names(session: Session, cost: CostGraph) -> frozenset[str]:
    """The fqns of ``cost``'s parameters and the keys of the row chunks earlier graphs cut
    them into: a graph shares the resident copies of both."""
    names = {p.fqn for p in cost.params}
    for graph in session.graphs:
        if graph.chunks is not None:
            names |= {p.fqn for p in graph.plan.cost.params if graph.chunks.parent(p) in names}
    return frozenset(names)


def share_resident(
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
        session.planned,
        len(shared),
        device,
    )
    params = list(cost.params)
    for i in shared:
        params[i] = dataclasses.replace(params[i], nbytes=0)
    return dataclasses.replace(cost, params=tuple(params))
