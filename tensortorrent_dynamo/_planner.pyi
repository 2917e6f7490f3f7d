"""Native planner of tensortorrent (the compiled ``tensortorrent-planner-py`` crate).

Errors are raised as the classes of :mod:`tensortorrent_dynamo.errors`:
``InvalidCostGraph``, ``InvalidDevices``, ``InvalidObjective`` and ``PlanInfeasible``.
"""

from collections.abc import Sequence
from typing import final

__all__ = ["Candidate", "CostGraph", "Device", "Plan", "plan", "version"]

@final
class CostGraph:
    """A validated cost graph: flat arrays in topological order.

    Raises ``InvalidCostGraph`` when an array has the wrong length, an id is out of
    range or an input does not come before its consumer.
    """

    def __new__(
        cls,
        node_flops: Sequence[float],
        node_out_bytes: Sequence[int],
        node_host_only: Sequence[bool],
        input_offsets: Sequence[int],
        input_ids: Sequence[int],
        param_bytes: Sequence[int],
        param_offsets: Sequence[int],
        param_users: Sequence[int],
        output_ids: Sequence[int],
    ) -> CostGraph: ...
    @property
    def num_nodes(self) -> int:
        """Number of nodes."""
    @property
    def num_params(self) -> int:
        """Number of parameters."""

@final
class Device:
    """One device: the host (index 0 of a device list) or an accelerator."""

    def __new__(
        cls,
        name: str,
        is_host: bool,
        flops_per_s: float,
        budget_bytes: int,
        h2d_bytes_per_s: float,
        d2h_bytes_per_s: float,
        latency_s: float,
    ) -> Device: ...
    @property
    def name(self) -> str:
        """Unique device name."""
    @property
    def is_host(self) -> bool:
        """Whether this is the host."""
    @property
    def flops_per_s(self) -> float:
        """Compute rate in floating-point operations per second."""
    @property
    def budget_bytes(self) -> int:
        """Memory the plan may use on this device, in bytes."""
    @property
    def h2d_bytes_per_s(self) -> float:
        """Host-to-device copy rate in bytes per second."""
    @property
    def d2h_bytes_per_s(self) -> float:
        """Device-to-host copy rate in bytes per second."""
    @property
    def latency_s(self) -> float:
        """Fixed cost per node, in seconds."""

@final
class Candidate:
    """One candidate placement the planner simulated."""

    @property
    def name(self) -> str:
        """Candidate name, for example ``"all-on-virtual:0/streamed"``."""
    @property
    def predicted_time_s(self) -> float:
        """Simulated time until the last output is on the host, in seconds."""
    @property
    def feasible(self) -> bool:
        """Whether every device's peak fits its budget."""
    @property
    def peak_bytes(self) -> list[int]:
        """Simulated peak memory per device, in bytes."""

@final
class Plan:
    """The chosen plan: placement, residency, segments and predictions."""

    @property
    def node_device(self) -> list[int]:
        """Device index of each node."""
    @property
    def node_segment(self) -> list[int]:
        """Segment index of each node."""
    @property
    def segment_device(self) -> list[int]:
        """Device index of each segment."""
    @property
    def param_streamed(self) -> list[bool]:
        """Whether each parameter is streamed (otherwise resident where used)."""
    @property
    def param_device(self) -> list[int]:
        """Accelerator using each parameter (0 when only the host does)."""
    @property
    def param_prefetch_segment(self) -> list[int]:
        """First segment using each streamed parameter; -1 when not streamed."""
    @property
    def param_evict_segment(self) -> list[int]:
        """Last segment using each streamed parameter; -1 when not streamed."""
    @property
    def predicted_time_s(self) -> float:
        """Simulated time until the last output is on the host, in seconds."""
    @property
    def peak_bytes(self) -> list[int]:
        """Simulated peak memory per device, in bytes."""
    @property
    def candidates(self) -> list[Candidate]:
        """Every candidate considered, in search order."""
    @property
    def chosen(self) -> str:
        """Name of the chosen candidate."""
    @property
    def plan_hash(self) -> str:
        """Stable hash of the inputs and the decisions (16 hex digits)."""

def plan(graph: CostGraph, devices: Sequence[Device], objective: str, host_compute: bool) -> Plan:
    """Plan ``graph`` over ``devices`` (the host first) for ``objective``.

    ``objective`` is ``"latency"``, ``"memory"`` or ``"throughput"``; with
    ``host_compute`` false only host-only nodes run on the host. Releases the GIL
    while planning. Raises ``PlanInfeasible`` (with ``min_budgets``) when no
    candidate fits the budgets.
    """

def version() -> str:
    """The planner's version."""
