"""Ask the native planner where each node runs and which parameters stream.

This module only gathers the planner's inputs (cost graph, devices, budgets,
objective) and names its answer; the decisions themselves are made in Rust
(``csrc_rs/planner``).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import math
import types
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, cast

import psutil

from .._native import native_planner
from ..cost_graph import CostGraph, RateKey, is_attention
from ..errors import InvalidPlacement, PeakUse, PlanInfeasible
from ..io.pool import read_buffer_bytes
from ..io.reader import INLINE_READ_BYTES
from ..profile import DeviceProfile, HostProfile
from ..settings import Settings
from . import cache as plan_cache
from .decisions import Decisions
from .peaks import named_peaks, named_refusal
from .residency import Residency, residencies

if TYPE_CHECKING:
    from .. import _planner

log = logging.getLogger(__name__)


RATE_DTYPES = ("bfloat16", "float16")
"""The dtypes whose FLOPs are costed at a device's rate of their own besides float32's (its
``flops_per_s``), where it was measured: a bfloat16 matmul on a CPU with AMX runs several
times faster than a float32 one, and on a GPU a half-precision one faster still. The FLOPs
of any other dtype are costed at the float32 rate."""


def dtype_rate(device: DeviceProfile, dtype: str) -> float:
    """The rate ``device``'s FLOPs in ``dtype`` are costed at outside matmuls of known rows:
    its measured square-matmul rate in that dtype for one of :data:`RATE_DTYPES`, else its
    float32 rate."""
    if dtype in RATE_DTYPES:
        return device.flops_by_dtype.get(dtype, device.flops_per_s)
    return device.flops_per_s


def rows_table(device: DeviceProfile, dtype: str) -> Mapping[int, float]:
    """``device``'s measured matmul rates by rows in ``dtype`` (empty where not measured, or
    for a dtype costed at float32's rate)."""
    if dtype != "float32" and dtype not in RATE_DTYPES:
        return {}
    return device.flops_by_rows.get(dtype, {})


def _log_interp(points: Sequence[tuple[int, float]], x: int) -> float:
    """``points`` (sorted by x) interpolated at ``x``, linearly in log x and log value; the
    nearest point's value beyond them."""
    if x <= points[0][0]:
        return points[0][1]
    for (low, low_value), (high, high_value) in itertools.pairwise(points):
        if x <= high:
            share = math.log(x / low) / math.log(high / low)
            return math.exp(math.log(low_value) + share * math.log(high_value / low_value))
    return points[-1][1]


def node_rate(
    device: DeviceProfile, dtype: str, rows: int | None, width: int | None = None
) -> float:
    """The rate ``device`` runs FLOPs of ``dtype`` at, in a matmul whose result has ``rows``
    rows (``None``: not a matmul): interpolated, linearly in log rows and log rate, between
    the rows the profile measured (``DeviceProfile.flops_by_rows``), the nearest one's
    beyond them; :func:`dtype_rate` where they were not measured. A linear layer at batch 1
    reads its whole weight for two FLOPs per weight and runs at a tenth of the square rate
    or less. A matmul by weights wider than those rates were measured with (``width``: the
    square root of its weight's elements) runs at them times :func:`width_factor`."""
    points = sorted(rows_table(device, dtype).items())
    if rows is None or not points:
        return dtype_rate(device, dtype)
    return _log_interp(points, rows) * width_factor(device, rows, width)


def calls_attention(key: RateKey) -> bool:
    """Whether a node of rate key ``key`` calls attention, and so runs at its rate."""
    return any(is_attention(op) for op in key.ops)


def attention_rate(device: DeviceProfile, dtype: str, tokens: int | None = None) -> float:
    """The rate ``device`` runs attention's FLOPs in ``dtype`` at, over a query of
    ``tokens`` tokens: its measured float32 attention rates by tokens
    (``DeviceProfile.attention_by_tokens``) interpolated, linearly in log tokens and log
    rate, the nearest one's beyond them (the rate at most tokens where ``tokens`` is not
    known), else its one measured rate (``attention_flops_per_s``); scaled as ``dtype``'s
    :func:`dtype_rate` is to float32's; :func:`dtype_rate` where none was measured.
    Attention over few tokens runs far below its rate over many (on the 2-core
    development machine 24 GFLOP/s at 16 tokens, 101 at 64, 139 at 128, 175 at 256)."""
    points = sorted(device.attention_by_tokens.items())
    if points:
        rate = _log_interp(points, tokens if tokens is not None else points[-1][0])
    elif device.attention_flops_per_s is not None:
        rate = device.attention_flops_per_s
    else:
        return dtype_rate(device, dtype)
    return rate * dtype_rate(device, dtype) / device.flops_per_s


def key_rate(device: DeviceProfile, key: RateKey) -> float:
    """The rate ``device`` runs the FLOPs of a node of rate key ``key`` at: attention's for
    a node that calls attention (:func:`attention_rate`, at its query's tokens), else
    :func:`node_rate`."""
    if calls_attention(key):
        return attention_rate(device, key.dtype, key.rows)
    return node_rate(device, key.dtype, key.rows, key.width)


def width_factor(device: DeviceProfile, rows: int, width: int | None) -> float:
    """How much faster (above 1) or slower a matmul of ``rows`` rows by a weight of
    ``width`` squared elements runs than by the weights ``device``'s rates by rows were
    measured with: float32's rate at the measured widths (``flops_by_rows_wide``) over its
    rate at ``rows_width`` (at the most rows measured wide, for more), interpolated in log
    width; 1 at or below ``rows_width``, or where no wider rates were measured."""
    base = sorted(device.flops_by_rows.get("float32", {}).items())
    wider = sorted(
        (w, sorted(table["float32"].items()))
        for w, table in device.flops_by_rows_wide.items()
        if table.get("float32")
    )
    if (
        width is None
        or device.rows_width is None
        or width <= device.rows_width
        or not base
        or not wider
    ):
        return 1.0
    factors = [(device.rows_width, 1.0)]
    for w, table in wider:
        at = min(rows, table[-1][0])  # beyond its rows: the factor at its last
        factors.append((w, _log_interp(table, at) / _log_interp(base, at)))
    return _log_interp(factors, width)


def op_latency(device: DeviceProfile, op: str) -> float:
    """The fixed cost ``device`` charges a call of ``op`` (a cost node's ``target``): the
    profile's figure for that op where it measured one (``DeviceProfile.latency_by_op``),
    else its fixed cost per op over a model's mix of ops."""
    return device.latency_by_op.get(op, device.latency_s)


def fixed_cost(device: DeviceProfile, ops: Sequence[str]) -> float:
    """The fixed cost ``device`` charges a node that calls ``ops``: each op's
    :func:`op_latency` (and, the first time its segment runs a kind of op, the device's
    ``cold_latency_s``: the native planner adds that, knowing the segments)."""
    return sum(op_latency(device, op) for op in ops)


def rate_keys(
    graphs: Sequence[CostGraph | None], devices: Sequence[DeviceProfile]
) -> tuple[RateKey, ...]:
    """The rate keys of the nodes in ``graphs`` that some of ``devices`` costs otherwise
    than a float32 node of no rows (another compute rate for nodes with FLOPs, another
    fixed cost for nodes that call an op), sorted: the rate classes beyond 0 that
    ``CostGraph.to_native`` numbers from 1, each costed at a device's :func:`key_rate`
    and :func:`fixed_cost` for it. Any other node is of class 0, run at a device's
    ``flops_per_s`` paying its ``latency_s`` an op, so a graph costed throughout at those
    plans and hashes as it did before classes."""
    keys = {
        key
        for graph in graphs
        if graph is not None
        for node, key in zip(graph.nodes, graph.rate_keys(), strict=True)
        if node.flops > 0 or node.op_count > 0
    }
    differ = {
        key
        for key in keys
        if any(
            key_rate(d, key) != d.flops_per_s or any(op in d.latency_by_op for op in key.ops)
            for d in devices
        )
    }
    return tuple(
        sorted(
            differ,
            key=lambda k: (
                k.dtype,
                -1 if k.rows is None else k.rows,
                -1 if k.width is None else k.width,
                k.ops,
            ),
        )
    )


def class_rates(device: DeviceProfile, keys: Sequence[RateKey]) -> list[float]:
    """``device``'s compute rate for each of ``keys`` (rate classes 1, 2, ...)."""
    return [key_rate(device, k) for k in keys]


def class_latencies(device: DeviceProfile, keys: Sequence[RateKey]) -> list[float]:
    """The fixed cost ``device`` charges a node of each of ``keys``, all its ops."""
    return [fixed_cost(device, k.ops) for k in keys]


@dataclasses.dataclass(frozen=True)
class PlannedDevice:
    """A device as planned: its profile and the budget the plan had to respect."""

    profile: DeviceProfile
    budget_bytes: int

    @property
    def name(self) -> str:
        return self.profile.name


@dataclasses.dataclass(frozen=True)
class Split:
    """The graph with large weights cut into row chunks (``passes.chunk_weights``): what the
    planner plans instead when weights must live on disk. ``rows[i]`` are the rows of its
    weight that parameter ``i`` of ``cost`` stands for (``None`` for one not cut)."""

    cost: CostGraph
    rows: tuple[tuple[int, int] | None, ...]
    # the most bytes of a chunk (``stream_chunk_bytes``): its reads are costed at the rate
    # of reads that size (``HostProfile.disk_read_rate``)
    chunk_bytes: int


@dataclasses.dataclass(frozen=True)
class Stay:
    """One stay of a streamed parameter on a device that uses it (by name): prefetched
    when ``issue_segment`` starts (-1: at the start of the run), serving its uses there in
    segments ``first_segment`` to ``last_segment``, evicted after the last. A parameter
    used again after a gap in its uses (a tied embedding, a layer applied in a loop) has a
    stay per run of uses, so that its device does not hold it across the gap."""

    param: int
    device: str
    issue_segment: int
    first_segment: int
    last_segment: int


@dataclasses.dataclass(frozen=True)
class GraphPlan:
    """The planner's answer for one graph, with names instead of indices."""

    graph_index: int
    # the graph planned: the traced one, or its ``Split`` when the plan chose that
    cost: CostGraph
    devices: tuple[PlannedDevice, ...]
    native: _planner.Plan
    objective: str
    # where each parameter of ``cost`` lives (built once from ``native``)
    residency: tuple[Residency, ...]
    # the graph as traced (``cost`` unless the plan chose the split graph)
    traced: CostGraph
    # whether the plan is for the graph with large weights cut into row chunks
    split: bool = False
    # the graph whose resident copies this plan keeps instead of a set of its own (see
    # ``Keep``), and the predicted time of the plan it would have had with its own set
    follows: int | None = None
    alone_predicted_s: float | None = None
    # the most bytes of a row chunk when the plan is of the split graph (else ``None``),
    # and, of each other chunk size planned (``plan.chunk_sizes``), the predicted time of
    # its plan (``None``: it did not fit, or planned no weight in chunks)
    chunk_bytes: int | None = None
    other_chunk_plans: tuple[tuple[int, float | None], ...] = ()
    # why the recorded decisions it was given (a saved plan's, the plan cache's) did not
    # replay, so that it was searched ("" where they did, or none were given)
    replay_refused: str = ""
    # where the decisions it replayed came from ("" where it was searched)
    replayed_from: str = ""

    @property
    def plan_hash(self) -> str:
        return self.native.plan_hash

    @functools.cached_property
    def peaks(self) -> tuple[PeakUse, ...]:
        """What each device holds at its peak, by name, in device order."""
        return named_peaks(self.cost, [d.name for d in self.devices], self.native.peaks)

    @property
    def predicted_time_s(self) -> float:
        return self.native.predicted_time_s

    def node_segment(self, node_id: int) -> int:
        """The segment the node runs in: the plan's, or for a view of a parameter its
        reader's (``CostGraph.runs_with``)."""
        runs_with = self.cost.runs_with
        return self.native.node_segment[runs_with[node_id] if runs_with else node_id]

    def node_device(self, node_id: int) -> str:
        return self.segment_device(self.node_segment(node_id))

    def segment_device(self, segment: int) -> str:
        return self.devices[self.native.segment_device[segment]].name

    def spilled_nodes(self) -> list[int]:
        """The nodes whose values go to host memory between their producing segment and
        their next use (copied back when ``native.value_reload_segment`` starts)."""
        return [i for i, spilled in enumerate(self.native.value_spilled) if spilled]

    def param_placement(self) -> dict[str, str]:
        """Where each parameter lives during a run, Accelerate's way: its device when
        resident there, ``"cpu"`` when it stays in host RAM (used there or streamed)."""
        return {
            p.fqn: "cpu" if r.streams else r.device
            for p, r in zip(self.cost.params, self.residency, strict=True)
        }

    def stays(self) -> list[Stay]:
        """Each stay of a streamed parameter on a device, in order of first use."""
        native = self.native
        return [
            Stay(param, self.devices[device].name, issue, first, last)
            for param, device, issue, first, last in zip(
                native.stream_param,
                native.stream_device,
                native.stream_issue_segment,
                native.stream_first_segment,
                native.stream_last_segment,
                strict=True,
            )
        ]

    def disk_buffer_peak(self) -> int:
        """The most bytes of read buffers the parameters this plan reads from disk hold at
        once: each read from the start of the segment that issues it (-1 for the start of
        the run) to the end of the last use it serves (:meth:`stays`), a buffer of
        ``read_buffer_bytes`` each. The host's budget covers them; a reader's pool may
        keep that much for reuse."""
        params = self.cost.params
        spans = [
            (stay.issue_segment, stay.last_segment, read_buffer_bytes(params[stay.param].nbytes))
            for stay in self.stays()
            if self.residency[stay.param].reads_from_disk
        ]
        # held from segment `issue` through `evict`: +size there, -size after
        change: dict[int, int] = {}
        for issue, evict, size in spans:
            after = max(issue, evict) + 1
            change[issue] = change.get(issue, 0) + size
            change[after] = change.get(after, 0) - size
        return max(itertools.accumulate(change[s] for s in sorted(change)), default=0)

    def predicted_peak(self, device: str) -> int:
        for i, dev in enumerate(self.devices):
            if dev.name == device:
                return self.native.peak_bytes[i]
        raise KeyError(device)

    def kept_bytes(self, device: str) -> int:
        """Bytes of parameters the plan keeps on ``device`` from run to run: its resident
        copies there and, on the host, the weights kept in RAM as they are (both in its
        predicted peak there)."""
        return sum(
            p.nbytes
            for p, r in zip(self.cost.params, self.residency, strict=True)
            if (r.keeps_copy and r.device == device) or (device == "cpu" and not r.on_disk)
        )


@dataclasses.dataclass(frozen=True)
class Keep:
    """Another graph's resident copies, (fqn, device) each, for a plan to keep as they are
    where it fits: an alternative of the graph called most (``Session.enter``) then runs
    beside that graph's copies instead of dropping them and making its own."""

    graph_index: int
    copies: frozenset[tuple[str, str]]
    # the row chunks that graph's plan is in (``GraphPlan.chunk_bytes``): the copies are
    # named by chunk, so this plan is made in chunks of that size too
    chunk_bytes: int | None = None


def resident_set(plan: GraphPlan) -> frozenset[tuple[str, str]]:
    """(fqn, device) of each resident copy the plan keeps."""
    return frozenset(
        (p.fqn, r.device)
        for p, r in zip(plan.cost.params, plan.residency, strict=True)
        if r.keeps_copy
    )


def _default_budget(dev: DeviceProfile) -> int:
    """A device's budget when the user gave none: its capacity.

    For the host that is the machine's RAM, not the RAM free right now: free RAM
    moves from one process to the next, and plans (and their hashes) must not.
    """
    if dev.is_host:
        return int(psutil.virtual_memory().total)
    return dev.memory_bytes


def planned_devices(
    profile: HostProfile, settings: Settings, already_resident: Mapping[str, int]
) -> tuple[tuple[PlannedDevice, ...], bool]:
    """The devices to plan over (host first) and whether the host may compute.

    A device's budget is the user's (or its capacity), less what earlier graphs of
    the same model keep resident on it.
    """
    wanted = settings.devices
    devices: list[PlannedDevice] = []
    for dev in profile.devices:
        if not dev.is_host and wanted is not None and dev.name not in wanted:
            continue
        budget = settings.budgets.get(dev.name, _default_budget(dev))
        budget = max(0, budget - already_resident.get(dev.name, 0))
        devices.append(PlannedDevice(profile=dev, budget_bytes=budget))
    host_compute = wanted is None or "cpu" in wanted
    return tuple(devices), host_compute


def native_device_list(
    devices: Sequence[PlannedDevice],
    profile: HostProfile,
    cost: CostGraph,
    keys: Sequence[RateKey] = (),
    chunk_bytes: int | None = None,
) -> list[_planner.Device]:
    """The devices as the native planner takes them (host first), with a rate for each of
    ``cost``'s rate ``keys`` (:func:`rate_keys`); the host's compute slowed as measured
    while the disk reader streams (``disk.compute_slowdown``), which the simulator applies
    to the part of each host node that runs while reads do; its disk read at the rate of
    reads of row chunks of at most ``chunk_bytes`` (``None``: whole weights;
    ``HostProfile.disk_read_rate``)."""
    planner = native_planner()
    has_params = bool(cost.params)
    segment_call, resident_lookup, stream_op = profile.runtime_work_s
    return [
        planner.Device(
            name=d.name,
            is_host=d.profile.is_host,
            flops_per_s=d.profile.flops_per_s,
            class_flops_per_s=class_rates(d.profile, keys),
            class_latency_s=class_latencies(d.profile, keys),
            budget_bytes=d.budget_bytes,
            # the host has no link to itself: its rates are never used
            h2d_bytes_per_s=0.0 if d.profile.is_host else d.profile.h2d_bytes_per_s,
            d2h_bytes_per_s=0.0 if d.profile.is_host else d.profile.d2h_bytes_per_s,
            latency_s=d.profile.latency_s,
            cold_latency_s=d.profile.cold_latency_s,
            # an unmeasured bandwidth is infinite: memory traffic is then not modelled
            mem_bytes_per_s=d.profile.memory_bandwidth_bytes_per_s or math.inf,
            # only the host reads from disk
            disk_bytes_per_s=(
                profile.disk_read_rate(chunk_bytes)[0]
                if d.profile.is_host and has_params
                else math.inf
            ),
            disk_latency_s=(
                profile.planned_disk_latency_s if d.profile.is_host and has_params else 0.0
            ),
            read_slowdown=(
                profile.compute_slowdown_while_reading if d.profile.is_host and has_params else 1.0
            ),
            read_cpu_s=profile.read_cpu_s if d.profile.is_host and has_params else 0.0,
            # the runtime's reader makes these reads on the calling thread
            inline_read_bytes=INLINE_READ_BYTES if d.profile.is_host and has_params else 0,
            inline_read_s=profile.inline_read_s if d.profile.is_host and has_params else 0.0,
            # the calling thread's own work between segments: the host's
            segment_call_s=segment_call if d.profile.is_host else 0.0,
            resident_lookup_s=resident_lookup if d.profile.is_host else 0.0,
            stream_op_s=stream_op if d.profile.is_host else 0.0,
        )
        for d in devices
    ]


def plan_graph(
    graph_index: int,
    cost: CostGraph,
    profile: HostProfile,
    settings: Settings,
    already_resident: Mapping[str, int],
    on_disk: frozenset[str] = frozenset(),
    split: Split | None = None,
    decisions: Decisions | None = None,
    keep: Keep | None = None,
    in_ram: frozenset[str] = frozenset(),
    lean: bool = False,
) -> GraphPlan:
    """Plan ``cost``; raises ``PlanInfeasible`` when nothing fits.

    Parameters named in ``on_disk`` (by fqn, or a row chunk's parent fqn) live on disk
    already; those named in ``in_ram`` stay in host RAM (another graph's plan, final,
    keeps them there: ``Session.in_ram_for_good``). The native planner decides every other
    parameter's tier: host RAM, or disk when the host budget cannot hold the weights in
    RAM (then it plans ``split`` instead, when given). With ``decisions`` (a saved plan's),
    those are replayed instead of searching; otherwise the plan cache's are, when it has
    this graph's. With ``keep``, the plan found then keeps exactly those resident copies
    (each parameter of ``keep`` resident where the plan uses it, every other one
    streamed), its decisions otherwise the same, where that fits the budgets
    (:func:`_keeping`). With ``lean``, it keeps as little as it can: where the host's
    memory is budgeted, every parameter not named in ``in_ram`` is read from disk, and
    none is kept where it runs, where that fits: the graphs of other frames need the room
    (``pipeline._plan``).
    """
    if lean and "cpu" in settings.budgets:  # every weight it may move read from disk
        on_disk = on_disk | {p.fqn for p in cost.params if not _named(p.fqn, in_ram)}
    devices, host_compute = planned_devices(profile, settings, already_resident)
    planner = native_planner()
    keys = rate_keys(
        [cost, split.cost if split is not None else None], [d.profile for d in devices]
    )
    native_devices = native_device_list(
        devices, profile, cost, keys, split.chunk_bytes if split is not None else None
    )
    log.debug(
        "planning graph %d: %d nodes, %d params, devices %s, host compute %s",
        graph_index,
        len(cost.nodes),
        len(cost.params),
        [(d.name, d.budget_bytes) for d in devices],
        host_compute,
    )

    movable = state_movable(devices)

    def native_graph(graph: CostGraph) -> _planner.CostGraph:
        homes = ["disk" if _named(p.fqn, on_disk) else "host" for p in graph.params]
        return graph.to_native(
            homes,
            disk_allowed=[not _named(p.fqn, in_ram) for p in graph.params],
            state_movable=movable,
            rate_classes=keys,
        )

    whole = native_graph(cost)
    chunked = native_graph(split.cost) if split is not None else None
    chose_split = False
    entry = ""
    source = f"the saved plan {settings.plan}"
    if decisions is not None and not decisions.plan_hash:
        source += " (for this graph at other sizes)"
    if decisions is None and settings.plan_cache:
        entry = plan_cache.key(
            cost,
            split.cost if split is not None else None,
            sorted(on_disk),
            native_devices,
            sorted(in_ram),
            {
                **_search_options(settings, host_compute),
                "node_limit": settings.planner_node_limit,
                "time_limit_s": settings.planner_time_limit_s,
            },
            planner.version(),
        )
        decisions, source = plan_cache.lookup(entry), "the plan cache"
    native = None
    replay_refused = replayed_from = ""
    if decisions is not None:
        native, replay_refused = _replay(
            planner, cost, split, native_devices, settings, host_compute, decisions, keys
        )
        if native is not None:
            replayed_from = source
            chose_split = decisions.split
            log.info(
                "graph %d: plan %s taken from %s, search skipped",
                graph_index,
                native.plan_hash,
                source,
            )
    if native is None:
        try:
            native = planner.plan(
                whole,
                native_devices,
                split=chunked,
                node_limit=settings.planner_node_limit,
                time_limit_s=settings.planner_time_limit_s,
                **_search_options(settings, host_compute),
            )
        except PlanInfeasible as exc:
            raise named_refusal(
                exc,
                cost,
                split.cost if split is not None else None,
                [d.name for d in devices],
                {d.name: d.budget_bytes for d in devices},
            ) from None
        chose_split = native.split
        if entry:
            plan_cache.store(entry, Decisions.of(native, native.split))
    for cand in native.candidates:
        log.debug(
            "  candidate %-28s family=%s feasible=%s predicted=%.6fs peaks=%s",
            cand.name,
            cand.family,
            cand.feasible,
            cand.predicted_time_s,
            list(cand.peak_bytes),
        )
    log.debug(
        "  chose %s (plan %s), %.2fx its lower bound; %s",
        native.chosen,
        native.plan_hash,
        native.predicted_time_s / native.lower_bound_s if native.lower_bound_s else 1.0,
        native.report,
    )
    if chose_split:
        log.info(
            "graph %d: planned with its weights on disk, large ones read in row chunks (%s)",
            graph_index,
            "the model's weights are on disk" if on_disk else "the host budget cannot hold them",
        )
    planned = split.cost if chose_split and split is not None else cost
    rows = split.rows if chose_split and split is not None else None
    follows = alone = None
    found = _Found(planned, native, devices, native_devices, settings, host_compute, keys)
    if lean:
        leaner = found.keeping(frozenset(), "lean")
        native = leaner if leaner is not None else native
    elif keep is not None:
        kept = _keeping(found, keep)
        if kept is not None:
            follows, alone, native = keep.graph_index, native.predicted_time_s, kept
    return GraphPlan(
        graph_index=graph_index,
        cost=planned,
        devices=devices,
        native=native,
        objective=settings.objective,
        residency=residencies(
            [d.name for d in devices],
            native.param_device,
            native.param_streamed,
            native.param_home,
            rows,
        ),
        traced=cost,
        split=chose_split,
        follows=follows,
        alone_predicted_s=alone,
        chunk_bytes=split.chunk_bytes if chose_split and split is not None else None,
        replay_refused=replay_refused,
        replayed_from=replayed_from,
    )


def _keeping(found: _Found, keep: Keep) -> _planner.Plan | None:
    """The plan ``found`` replayed keeping the resident copies of ``keep``:
    each parameter that could keep a copy (used on an accelerator, or on the host with its
    bytes on disk) keeps one where ``keep`` has it there and streams otherwise. Where all
    of them do not fit the budgets, the most that do, dropping the largest first (the
    graph of ``keep`` makes those again when it next runs).

    ``None`` where the plan with a set of its own costs less: each call of this graph is
    taken to come between calls of the other (as prefill between ``generate()``'s decode
    steps), so its cost is its predicted time plus the time to make again the copies one
    of the two drops for the other (bytes over the disk's rate for copies in RAM, over the
    link's for copies on an accelerator)."""
    graph, native = found.graph, found.native
    names = [d.name for d in found.devices]
    made = Decisions.of(native, False)
    params = list(zip(graph.params, native.param_device, native.param_home, strict=True))
    sizes = {(p.fqn, names[d]): p.nbytes for p, d, _ in params}
    copyable = found.copyable()
    own = frozenset(  # the copies the plan keeps with a set of its own
        (p.fqn, names[d])
        for (p, d, _), was, can in zip(params, made.param_streamed, copyable, strict=True)
        if can and not was
    )
    rates = {
        d.name: d.disk_bytes_per_s if d.is_host else d.h2d_bytes_per_s for d in found.native_devices
    }

    def seconds(copies: frozenset[tuple[str, str]]) -> float:
        return sum(sizes[c] / rates[c[1]] for c in copies if rates.get(c[1], 0.0) > 0)

    def keeping(copies: frozenset[tuple[str, str]]) -> _planner.Plan | None:
        return found.keeping(copies, f"graph-{keep.graph_index}-residents")

    # the other graph's copies this graph could keep, the largest first
    usable = sorted((c for c in keep.copies if c in sizes), key=lambda c: (-sizes[c], c))
    kept, dropped = keeping(frozenset(usable)), 0
    if kept is None:  # the fewest dropped that fit (fewer copies kept hold fewer bytes)
        low, high = 1, len(usable) - 1  # keeping none of them is not keeping its copies
        while low <= high:
            mid = (low + high) // 2
            trial = keeping(frozenset(usable[mid:]))
            if trial is not None:
                kept, dropped, high = trial, mid, mid - 1
            else:
                low = mid + 1
    if kept is None:
        log.info(
            "keeping graph %d's resident copies does not fit: a set of its own", keep.graph_index
        )
        return None
    alone = native.predicted_time_s + seconds(own ^ frozenset(usable))
    shared = kept.predicted_time_s + seconds(frozenset(usable[:dropped]))
    log.info(
        "keeping %d of graph %d's %d resident copies it could: %.6f s a call with the copies "
        "made again, %.6f s with a set of its own",
        len(usable) - dropped,
        keep.graph_index,
        len(usable),
        shared,
        alone,
    )
    return kept if shared <= alone else None


@dataclasses.dataclass(frozen=True)
class _Found:
    """The plan found for ``graph`` (``native``) and what it was planned with, to replay
    it with other decisions."""

    graph: CostGraph
    native: _planner.Plan
    devices: Sequence[PlannedDevice]
    native_devices: list[_planner.Device]
    settings: Settings
    host_compute: bool
    keys: Sequence[RateKey]

    def copyable(self) -> list[bool]:
        """Per parameter, whether the plan could keep a copy of it (``Residency.keeps_copy``
        when not streamed): used on an accelerator, or on the host with its bytes on disk."""
        names = [d.name for d in self.devices]
        return [
            names[d] != "cpu" or home == "disk"
            for d, home in zip(self.native.param_device, self.native.param_home, strict=True)
        ]

    def keeping(self, copies: frozenset[tuple[str, str]], label: str) -> _planner.Plan | None:
        """The plan replayed with each parameter that could keep a copy (used on an
        accelerator, or on the host with its bytes on disk) keeping one where ``copies``
        has it there and streaming otherwise (``label`` added to its name); the plan itself
        where that changes nothing, ``None`` where it does not fit the budgets."""
        names = [d.name for d in self.devices]
        made = Decisions.of(self.native, False)
        streamed = tuple(
            (p.fqn, names[d]) not in copies if can else was
            for p, d, can, was in zip(
                self.graph.params,
                self.native.param_device,
                self.copyable(),
                made.param_streamed,
                strict=True,
            )
        )
        if streamed == made.param_streamed:
            return self.native
        wanted = dataclasses.replace(made, chosen=f"{made.chosen}+{label}", param_streamed=streamed)
        try:
            return replay_decisions(
                self.graph, self.native_devices, self.settings, self.host_compute, wanted, self.keys
            )
        except (InvalidPlacement, PlanInfeasible):
            return None


def state_movable(devices: Sequence[PlannedDevice] | Sequence[_planner.Device]) -> bool:
    """Whether the planner may keep the inputs a graph writes in place (a KV cache) on an
    accelerator between calls: on virtual devices, whose tensors are host tensors
    accounted on the device, so that the cache's own tensors can be; not yet on CUDA,
    where that would move the caller's tensors to the device (they stay in host memory
    there, copied to the device and back each call, which explain() shows)."""
    names = [d.name for d in devices]
    return all(name == "cpu" or name.startswith("virtual:") for name in names)


def _search_options(settings: Settings, host_compute: bool) -> dict[str, object]:
    """The options of the native search that shape its plan (and are in its hash)."""
    return {
        "objective": settings.objective,
        "host_compute": host_compute,
        "prefetch_depth": settings.prefetch_depth,
        "memory_slack": settings.memory_slack,
    }


def _named(fqn: str, names: frozenset[str]) -> bool:
    """Whether a parameter is one of the weights ``names`` names, or a row chunk of one
    (``fqn[r0:r1]``)."""
    return fqn in names or fqn.split("[", 1)[0] in names


def replay_decisions(
    graph: CostGraph,
    devices: list[_planner.Device],
    settings: Settings,
    host_compute: bool,
    decisions: Decisions,
    keys: Sequence[RateKey] = (),
) -> _planner.Plan:
    """The native plan ``decisions`` make on ``graph`` (the graph they were made for, or
    one costed otherwise), rebuilt without searching; ``devices`` hold a rate for each of
    ``keys``, the rate keys of ``graph`` (or of several graphs ``graph`` is one of). Raises
    ``InvalidPlacement`` or ``PlanInfeasible`` where they do not apply."""
    native = native_planner().replay(
        graph.to_native(
            list(decisions.param_home),
            state_movable=state_movable(devices),
            rate_classes=keys,
        ),
        devices,
        name=decisions.chosen,
        node_device=list(decisions.node_device),
        param_streamed=list(decisions.param_streamed),
        value_spilled=list(decisions.value_spilled),
        prefetch_depth=decisions.prefetch_depth,
        prefetch_window_bytes=decisions.prefetch_window_bytes,
        search_prefetch_depth=settings.prefetch_depth,
        objective=settings.objective,
        host_compute=host_compute,
        memory_slack=settings.memory_slack,
    )
    return cast("_planner.Plan", native)


def _replay(
    planner: types.ModuleType,
    cost: CostGraph,
    split: Split | None,
    devices: list[_planner.Device],
    settings: Settings,
    host_compute: bool,
    decisions: Decisions,
    keys: Sequence[RateKey],
) -> tuple[_planner.Plan | None, str]:
    """The plan ``decisions`` make, rebuilt without searching; ``None`` (with a warning)
    and why, when they no longer apply or give another plan."""
    graph = split.cost if decisions.split and split is not None else cost
    if decisions.split and split is None:
        why = "they are for a split graph this one does not have"
        log.warning("recorded decisions do not replay (%s): searching", why)
        return None, why
    try:
        native = replay_decisions(graph, devices, settings, host_compute, decisions, keys)
    except (InvalidPlacement, PlanInfeasible) as exc:
        log.warning("recorded decisions do not replay (%s): searching", exc)
        return None, str(exc)
    # decisions of no plan hash were made for this graph at other sizes (``plan.files``)
    if decisions.plan_hash and native.plan_hash != decisions.plan_hash:
        why = f"they replay to plan {native.plan_hash}, not {decisions.plan_hash}"
        log.warning("recorded decisions do not replay (%s): searching", why)
        return None, why
    return native, ""
