"""Tokens per second at larger batches (``objective="throughput"``): FlexGen's lever.

A decode step reads every streamed weight once whatever the batch, so a larger batch
shares those bytes among more tokens until compute (or memory) becomes the bottleneck.
:func:`batch_sweep` asks the simulator: the graph as planned (the same placement,
streaming and prefetch decisions, replayed without searching) with its activations and
its KV cache scaled to each larger batch (every value, its FLOPs and its reads of values
grow with the batch; the parameters and their reads do not). A batch whose values do not
fit the budgets is reported as such. It is a prediction from the plan at the traced
batch: at a larger batch the planner could choose another placement, and the graph is
planned for the batch it is called with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..cost_graph import CostGraph
from ..errors import PlanInfeasible
from ..profile import HostProfile
from ..settings import Settings
from .decisions import Decisions
from .planner import (
    GraphPlan,
    native_device_list,
    planned_devices,
    rate_keys,
    replay_decisions,
)

# the batch multiples the sweep simulates
FACTORS = (1, 2, 4, 8, 16, 32, 64)


@dataclasses.dataclass(frozen=True)
class BatchPoint:
    """The simulated decode step at one batch: ``step_s`` (``None``: does not fit), the
    tokens per second, and the busiest resource (name and fraction of the step)."""

    batch: int
    step_s: float | None
    busiest: str = ""
    busy: float = 0.0

    @property
    def tokens_per_s(self) -> float | None:
        return self.batch / self.step_s if self.step_s else None


def batch_of(cost: CostGraph) -> int | None:
    """The batch of a decode graph: the first dimension of its largest state buffer (a KV
    cache's), ``None`` for a graph without state."""
    tensors = [r for r in cost.state if r.shape]
    if not tensors:
        return None
    return max(tensors, key=lambda r: r.nbytes).shape[0]


def scaled(cost: CostGraph, factor: int) -> CostGraph:
    """``cost`` at ``factor`` times its batch: every node's value, FLOPs, matmul rows and
    reads of other values ``factor`` times larger; its reads of parameters and the
    parameters as they are."""
    param_reads = [0] * len(cost.nodes)
    for param in cost.params:
        for user in set(param.users):
            param_reads[user] += param.nbytes
    nodes = tuple(
        dataclasses.replace(
            node,
            flops=node.flops * factor,
            rows=None if node.rows is None else node.rows * factor,
            out_bytes=node.out_bytes * factor,
            bytes_accessed=param_reads[i] + max(0, node.bytes_accessed - param_reads[i]) * factor,
        )
        for i, node in enumerate(cost.nodes)
    )
    state = tuple(dataclasses.replace(r, nbytes=r.nbytes * factor) for r in cost.state)
    return dataclasses.replace(cost, nodes=nodes, state=state)


def batch_sweep(
    plan: GraphPlan,
    profile: HostProfile,
    settings: Settings,
    factors: Sequence[int] = FACTORS,
) -> list[BatchPoint]:
    """The decode step of ``plan`` simulated at each multiple of its batch (none for a
    graph without state)."""
    batch = batch_of(plan.cost)
    if batch is None:
        return []
    _, host_compute = planned_devices(profile, settings, {})
    decisions = Decisions.of(plan.native, plan.split)
    points = []
    for factor in factors:
        graph = scaled(plan.cost, factor)
        keys = rate_keys([graph], [d.profile for d in plan.devices])
        devices = native_device_list(plan.devices, profile, graph, keys, plan.chunk_bytes)
        try:
            step = replay_decisions(graph, devices, settings, host_compute, decisions, keys)
        except PlanInfeasible:
            points.append(BatchPoint(batch * factor, None))
            continue
        busiest, busy = max(step.busy_fraction.items(), key=lambda kv: (kv[1], kv[0]))
        points.append(BatchPoint(batch * factor, step.predicted_time_s, busiest, busy))
    return points


def compute_bound_from(points: Sequence[BatchPoint], devices: Sequence[str]) -> int | None:
    """The first batch whose busiest resource is a device's compute (not the disk or a
    link): from there on a larger batch no longer shares the streamed bytes for free."""
    for point in points:
        if point.step_s is not None and point.busiest in devices:
            return point.batch
    return None
