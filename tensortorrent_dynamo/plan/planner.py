"""Ask the native planner where each node runs and which parameters stream.

This module only gathers the planner's inputs (cost graph, devices, budgets,
objective) and names its answer; the decisions themselves are made in Rust
(``csrc_rs/planner``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import psutil

from .._native import native_planner
from ..cost_graph import CostGraph
from ..errors import InvalidPlacement, PlanInfeasible
from ..profile import DeviceProfile, HostProfile
from ..settings import Settings
from . import cache as plan_cache

if TYPE_CHECKING:
    from .. import _planner

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PlannedDevice:
    """A device as planned: its profile and the budget the plan had to respect."""

    profile: DeviceProfile
    budget_bytes: int

    @property
    def name(self) -> str:
        return self.profile.name


@dataclasses.dataclass(frozen=True)
class GraphPlan:
    """The planner's answer for one graph, with names instead of indices."""

    graph_index: int
    cost: CostGraph
    devices: tuple[PlannedDevice, ...]
    native: _planner.Plan
    objective: str
    # each parameter's tier between runs: "host" (RAM) or "disk"
    param_home: tuple[str, ...] = ()

    @property
    def plan_hash(self) -> str:
        return self.native.plan_hash

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

    def param_device(self, param_id: int) -> str:
        return self.devices[self.native.param_device[param_id]].name

    def is_streamed(self, param_id: int) -> bool:
        return self.native.param_streamed[param_id]

    def spilled_nodes(self) -> list[int]:
        """The nodes whose values go to host memory between their producing segment and
        their next use (copied back when ``native.value_reload_segment`` starts)."""
        return [i for i, spilled in enumerate(self.native.value_spilled) if spilled]

    def on_disk(self, param_id: int) -> bool:
        """Whether the parameter's home is disk (read from there, kept in RAM only
        when the plan keeps it resident)."""
        return bool(self.param_home) and self.param_home[param_id] == "disk"

    def param_placement(self) -> dict[str, str]:
        """Where each parameter lives during a run, Accelerate's way: its device when
        resident there, ``"cpu"`` when it stays in host RAM (used there or streamed)."""
        return {
            p.fqn: "cpu" if self.is_streamed(i) else self.param_device(i)
            for i, p in enumerate(self.cost.params)
        }

    def predicted_peak(self, device: str) -> int:
        for i, dev in enumerate(self.devices):
            if dev.name == device:
                return self.native.peak_bytes[i]
        raise KeyError(device)


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


# Given each parameter's home, with some on disk: the cost graph to plan instead and the
# homes of its parameters (``chunking.WeightChunker`` splits large weights into row chunks).
SplitWeights = Callable[[Sequence[str]], tuple[CostGraph, list[str]]]


def plan_graph(
    graph_index: int,
    cost: CostGraph,
    profile: HostProfile,
    settings: Settings,
    already_resident: Mapping[str, int],
    on_disk: frozenset[str] = frozenset(),
    split: SplitWeights | None = None,
) -> GraphPlan:
    """Plan ``cost``; raises ``PlanInfeasible`` when nothing fits.

    Parameters named in ``on_disk`` (by fqn) live on disk already. The others live in
    host RAM, unless the host budget cannot hold them: then every parameter's home is
    disk, and the planner picks which ones the host keeps in RAM and which it reads
    from disk on each run. Whenever some home is disk, ``split`` (when given) names the
    graph to plan instead: the plan's ``cost`` is then that graph.
    """

    def with_homes(homes: list[str]) -> GraphPlan:
        graph = cost
        if split is not None and "disk" in homes:
            graph, homes = split(homes)
        return _plan_with_homes(graph_index, graph, profile, settings, already_resident, homes)

    homes = ["disk" if p.fqn in on_disk else "host" for p in cost.params]
    try:
        return with_homes(homes)
    except PlanInfeasible as exc:
        left = _host_budget(profile, settings) - already_resident.get("cpu", 0)
        host_short = exc.min_budgets.get("cpu", 0) > left
        if "host" not in homes or not host_short:
            raise
        log.info(
            "graph %d: the host budget cannot hold its weights in RAM (%s); planning with "
            "the weights on disk",
            graph_index,
            exc,
        )
    return with_homes(["disk"] * len(cost.params))


def _host_budget(profile: HostProfile, settings: Settings) -> int:
    host = next(d for d in profile.devices if d.is_host)
    return settings.budgets.get(host.name, _default_budget(host))


def _plan_with_homes(
    graph_index: int,
    cost: CostGraph,
    profile: HostProfile,
    settings: Settings,
    already_resident: Mapping[str, int],
    homes: list[str],
) -> GraphPlan:
    devices, host_compute = planned_devices(profile, settings, already_resident)
    planner = native_planner()
    native_devices = [
        planner.Device(
            name=d.name,
            is_host=d.profile.is_host,
            flops_per_s=d.profile.flops_per_s,
            budget_bytes=d.budget_bytes,
            # the host has no link to itself: its rates are never used
            h2d_bytes_per_s=0.0 if d.profile.is_host else d.profile.h2d_bytes_per_s,
            d2h_bytes_per_s=0.0 if d.profile.is_host else d.profile.d2h_bytes_per_s,
            latency_s=d.profile.latency_s,
            # an unmeasured bandwidth is infinite: memory traffic is then not modelled
            mem_bytes_per_s=d.profile.memory_bandwidth_bytes_per_s or math.inf,
            # only the host reads from disk, and only when some parameter lives there
            disk_bytes_per_s=(
                profile.planned_disk_read_bytes_per_s
                if d.profile.is_host and "disk" in homes
                else math.inf
            ),
        )
        for d in devices
    ]
    log.debug(
        "planning graph %d: %d nodes, %d params, devices %s, host compute %s",
        graph_index,
        len(cost.nodes),
        len(cost.params),
        [(d.name, d.budget_bytes) for d in devices],
        host_compute,
    )
    native_graph = cost.to_native(homes)
    native = None
    entry = ""
    if plan_cache.enabled():
        entry = plan_cache.key(
            cost, native_devices, settings.objective, host_compute, planner.version(), homes
        )
        cached = plan_cache.lookup(entry)
        if cached is not None:
            try:
                native = planner.replay(
                    native_graph,
                    native_devices,
                    settings.objective,
                    host_compute,
                    cached["chosen"],
                    cached["node_device"],
                    cached["param_streamed"],
                    value_spilled=cached.get("value_spilled", []),
                )
            except (InvalidPlacement, PlanInfeasible) as exc:
                log.warning("plan cache entry %s does not replay (%s): searching", entry, exc)
            else:
                log.info(
                    "graph %d: plan %s taken from the plan cache, search skipped",
                    graph_index,
                    native.plan_hash,
                )
    if native is None:
        native = planner.plan(native_graph, native_devices, settings.objective, host_compute)
        if entry:
            plan_cache.store(entry, native)
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
    return GraphPlan(
        graph_index=graph_index,
        cost=cost,
        devices=devices,
        native=native,
        objective=settings.objective,
        param_home=tuple(homes),
    )
