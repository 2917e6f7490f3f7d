"""Native planner of tensortorrent (the compiled ``tensortorrent-planner-py`` crate).

Errors are raised as the classes of :mod:`tensortorrent_dynamo.errors`:
``InvalidCostGraph``, ``InvalidDevices``, ``InvalidObjective``, ``OptionsError``
(a limit or option out of range), ``InvalidPlacement`` (a placement given to
``simulate`` that does not fit the graph) and ``PlanInfeasible``.
"""

from collections.abc import Sequence
from typing import TypeAlias, final

__all__ = [
    "Candidate",
    "CostGraph",
    "Device",
    "Optimum",
    "Plan",
    "Simulation",
    "exhaustive",
    "plan",
    "replay",
    "simulate",
    "version",
]

# One timeline record: (resource, kind, index, start_s, end_s). ``resource`` is a
# device name (its compute queue), "<host>-><device>" or "<device>-><host>" (copy
# engines) or "disk-><host>"; ``kind`` is "node", "param", "value" or "output";
# ``index`` is the node (or, for "param", the parameter).
_TimelineRecord: TypeAlias = tuple[str, str, int, float, float]
_PeakTuple: TypeAlias = tuple[
    int, int, list[int], list[tuple[str, int, int]], tuple[str, int] | None
]

@final
class CostGraph:
    """A validated cost graph: flat arrays in topological order.

    ``node_bytes_accessed`` (bytes each node moves through device memory; a node takes
    at least that over its device's ``mem_bytes_per_s``) defaults to zeros;
    ``param_home`` ("host" or "disk" per parameter) defaults to "host";
    ``param_disk_allowed`` (per parameter: whether the planner may move it from the host
    to disk when the host budget cannot hold the weights) defaults to all false;
    ``state`` (``(input, output, in_place)``: a graph input written in place, such as a
    KV cache buffer, and the output that is its new value, which goes at the end of a
    call to the device the input is placed on rather than to the host; with ``in_place``
    the output is written into the input itself, which then lives where that runs) to
    none; ``node_rate_class`` (per node: which of a device's compute rates its FLOPs run
    at, see ``Device.class_flops_per_s``) to all 0; ``node_ops`` (per node: the ops it
    runs, each paying its device's ``latency_s``: 0 for a graph input or an item taken from
    a tuple, 1 for an op, a view included) to 1 for a node that computes or moves bytes and
    0 otherwise; ``node_alias`` (per node: the input whose storage its value shares, a
    view of it, which then allocates nothing on its device and keeps that input's copy
    there alive as long as itself; ``None`` for a node with storage of its own) to all
    ``None``; ``node_kinds`` (per node: the ids of the kinds of op it runs, from 0, each
    once; a segment pays its device's ``cold_latency_s`` the first time it runs a kind) to
    none. Raises
    ``InvalidCostGraph`` when an array has the wrong length, an id is out of range, an
    input does not come before its consumer or a home is unknown.
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
        *,
        node_bytes_accessed: Sequence[int] | None = None,
        param_home: Sequence[str] | None = None,
        param_disk_allowed: Sequence[bool] | None = None,
        state: Sequence[tuple[int, int, bool]] | None = None,
        node_rate_class: Sequence[int] | None = None,
        node_ops: Sequence[int] | None = None,
        node_alias: Sequence[int | None] | None = None,
        node_kinds: Sequence[Sequence[int]] | None = None,
    ) -> CostGraph: ...
    @property
    def num_nodes(self) -> int:
        """Number of nodes."""
    @property
    def num_params(self) -> int:
        """Number of parameters."""

@final
class Device:
    """One device: the host (index 0 of a device list) or an accelerator.

    ``mem_bytes_per_s`` (device-memory bandwidth) and ``disk_bytes_per_s`` (disk read
    rate, used on the host) default to infinity: not modelled. ``class_flops_per_s``
    holds the compute rate of each rate class from 1 (class ``c`` at index ``c - 1``);
    class 0 and the classes it does not list run at ``flops_per_s``. ``disk_latency_s`` is
    the fixed cost of a disk read issued while no other is in flight, beyond its bytes over
    ``disk_bytes_per_s`` (a queued read overlaps it; used on the host; 0, the default, is
    not modelled). ``read_slowdown`` is how many times longer the host's compute takes
    while disk reads run: the part of a node's run that overlaps the reads queued so far
    is slowed (at least 1; 1, the default, is not modelled). ``class_latency_s`` holds the
    fixed cost of a node of each rate class from 1 that calls any op, all its ops together;
    class 0 and the classes it does not list pay ``latency_s`` an op. ``cold_latency_s`` is
    what a segment pays the first time it runs each kind of op (``CostGraph``'s
    ``node_kinds``), beyond the ops' fixed costs (0, the default, is not modelled).
    ``read_cpu_s`` is the host's compute each disk read takes while in flight, charged on
    the host when the read is issued (used on the host; 0, the default, is not modelled).
    A read of a parameter of at most ``inline_read_bytes`` is made by the host's calling
    thread when issued: the host computes nothing for ``inline_read_s`` plus its bytes over
    ``disk_bytes_per_s``, and it queues behind no other read (used on the host; 0, the
    default, hands every read to the reader's threads). ``segment_call_s``,
    ``resident_lookup_s`` and ``stream_op_s`` are the runtime's own work on the calling
    thread before a segment starts: its call (none in a plan of one host segment that needs
    none of this work: it is called as that segment), each resident parameter first passed
    to a segment on its device there (one on an accelerator, or one whose home is disk),
    and each parameter streamed in for it beyond its read and copy (used on the host; 0,
    the default, is not modelled).
    """

    def __new__(
        cls,
        name: str,
        is_host: bool,
        flops_per_s: float,
        budget_bytes: int,
        h2d_bytes_per_s: float,
        d2h_bytes_per_s: float,
        latency_s: float,
        *,
        mem_bytes_per_s: float = ...,
        disk_bytes_per_s: float = ...,
        class_flops_per_s: Sequence[float] = ...,
        disk_latency_s: float = ...,
        read_slowdown: float = ...,
        class_latency_s: Sequence[float] = ...,
        cold_latency_s: float = ...,
        read_cpu_s: float = ...,
        inline_read_bytes: int = ...,
        inline_read_s: float = ...,
        segment_call_s: float = ...,
        resident_lookup_s: float = ...,
        stream_op_s: float = ...,
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
    def class_flops_per_s(self) -> list[float]:
        """Compute rate of each rate class from 1 (class ``c`` at index ``c - 1``);
        class 0 and unlisted classes run at ``flops_per_s``."""
    @property
    def class_latency_s(self) -> list[float]:
        """Fixed cost of a node of each rate class from 1 (class ``c`` at index ``c - 1``),
        all its ops together; class 0 and unlisted classes pay ``latency_s`` an op."""
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
        """Fixed cost per op, in seconds (a node of a class ``class_latency_s`` lists pays
        that instead)."""
    @property
    def cold_latency_s(self) -> float:
        """What a segment pays the first time it runs each kind of op, beyond the ops'
        fixed costs, in seconds (0: not modelled)."""
    @property
    def mem_bytes_per_s(self) -> float:
        """Device-memory bandwidth in bytes per second (infinite: not modelled)."""
    @property
    def disk_bytes_per_s(self) -> float:
        """Disk read rate in bytes per second, used on the host (infinite: not modelled)."""
    @property
    def disk_latency_s(self) -> float:
        """Fixed cost in seconds of a disk read, less what the transfer of a read queued
        before it hides, used on the host (0: not modelled)."""
    @property
    def read_slowdown(self) -> float:
        """How many times longer the host's compute takes while disk reads run (1: not
        modelled)."""
    @property
    def read_cpu_s(self) -> float:
        """Seconds of the host's compute each disk read takes while in flight, used on the
        host (0: not modelled)."""
    @property
    def inline_read_bytes(self) -> int:
        """A disk read of a parameter of at most this many bytes is made by the host's
        calling thread, used on the host (0: every read is handed on)."""
    @property
    def inline_read_s(self) -> float:
        """Fixed cost of a read the host's calling thread makes, beyond its bytes over the
        disk rate, used on the host."""
    @property
    def segment_call_s(self) -> float:
        """The calling thread's cost of calling one segment of a plan of several, used on
        the host (0: not modelled)."""
    @property
    def resident_lookup_s(self) -> float:
        """The calling thread's cost of looking up one resident parameter, used on the host
        (0: not modelled)."""
    @property
    def stream_op_s(self) -> float:
        """The calling thread's cost of one streamed parameter beyond its read and copy,
        used on the host (0: not modelled)."""

@final
class Candidate:
    """One candidate placement the planner simulated."""

    @property
    def name(self) -> str:
        """Candidate name, for example ``"all-on-virtual:0/streamed"``."""
    @property
    def family(self) -> str:
        """The family that proposed it: ``"single-device"``, ``"knapsack"``,
        ``"segments"``, ``"host-stretches"`` or ``"local-search"``."""
    @property
    def predicted_time_s(self) -> float:
        """Simulated time until the last output is on the host, in seconds."""
    @property
    def feasible(self) -> bool:
        """Whether every device's peak fits its budget."""
    @property
    def peak_bytes(self) -> list[int]:
        """Simulated peak memory per device, in bytes."""
    @property
    def node_device(self) -> list[int]:
        """Device index of each node."""
    @property
    def param_streamed(self) -> list[bool]:
        """Whether each parameter is streamed."""
    @property
    def value_spilled(self) -> list[bool]:
        """Whether each node's value is spilled to the host."""
    @property
    def prefetch_depth(self) -> int:
        """Prefetch depth (0: each segment reads its own parameters)."""
    @property
    def prefetch_window_bytes(self) -> int:
        """Bytes of buffers prefetches may fill ahead of use (0: none)."""
    @property
    def plan_hash(self) -> str:
        """The hash of this candidate's plan (replaying its decisions gives it)."""

@final
class Plan:
    """The chosen plan: placement, residency, segments and predictions."""

    @property
    def node_device(self) -> tuple[int, ...]:
        """Device index of each node."""
    @property
    def node_segment(self) -> tuple[int, ...]:
        """Segment index of each node."""
    @property
    def segment_device(self) -> tuple[int, ...]:
        """Device index of each segment."""
    @property
    def param_streamed(self) -> tuple[bool, ...]:
        """Whether each parameter is streamed (otherwise resident where used)."""
    @property
    def param_device(self) -> tuple[int, ...]:
        """Accelerator using each parameter (0 when only the host does)."""
    @property
    def stream_param(self) -> tuple[int, ...]:
        """Parameter of each stay of a streamed parameter on a device, stays ordered by
        first segment, then parameter; a parameter used again after a gap has a stay per
        run of uses."""
    @property
    def stream_device(self) -> tuple[int, ...]:
        """Device index each stay brings its parameter to."""
    @property
    def stream_issue_segment(self) -> tuple[int, ...]:
        """Segment whose start issues each stay's prefetch; -1 for the start of the run."""
    @property
    def stream_first_segment(self) -> tuple[int, ...]:
        """First segment each stay serves."""
    @property
    def stream_last_segment(self) -> tuple[int, ...]:
        """Last segment each stay serves (it is evicted after it)."""
    @property
    def value_spilled(self) -> tuple[bool, ...]:
        """Whether each node's value is spilled to the host between its producing
        segment and its next use."""
    @property
    def value_reload_segment(self) -> tuple[int, ...]:
        """Segment whose start issues each spilled value's copy back to its device;
        -1 for values not spilled."""
    @property
    def prefetch_depth(self) -> int:
        """How many segments ahead streamed parameters are prefetched; 0 when each
        segment reads its own when it starts (a "-sync" candidate)."""
    @property
    def prefetch_window_bytes(self) -> int:
        """Bytes of buffers prefetches may fill ahead of use, each issued as early as
        they allow (a "/window-<N>KiB" candidate); 0 when the depth alone says when."""
    @property
    def param_home(self) -> tuple[str, ...]:
        """The home of each parameter of the graph planned, ``"host"`` or ``"disk"``
        (the planner may have moved disk-allowed parameters to disk)."""
    @property
    def split(self) -> bool:
        """Whether the ``split`` graph given to ``plan`` was planned: then every node
        and parameter index of the plan refers to it."""
    @property
    def predicted_time_s(self) -> float:
        """Simulated time until the last output is on the host, in seconds."""
    @property
    def peak_bytes(self) -> tuple[int, ...]:
        """Simulated peak memory per device, in bytes."""
    @property
    def peaks(self) -> list[_PeakTuple]:
        """What each device holds at its peak, in device order, by index:
        ``(device, bytes, resident, live, reached_by)``; each piece of ``live`` is
        ``(what, index, bytes)`` and ``reached_by`` ``(what, index)`` or ``None``, with
        ``what`` one of ``"weight"`` and ``"staging"`` (by parameter) and ``"value"`` (by
        node; for ``reached_by`` also ``"copy"``, a node's value copied from another
        device)."""
    @property
    def lower_bound_s(self) -> float:
        """The busiest resource's seconds of work (no schedule is faster)."""
    @property
    def busy_fraction(self) -> dict[str, float]:
        """Fraction of the predicted time each resource is busy, by name."""
    @property
    def timeline(self) -> list[_TimelineRecord]:
        """The simulated timeline: ``(resource, kind, index, start_s, end_s)``."""
    @property
    def candidates(self) -> list[Candidate]:
        """Every candidate listed, in search order."""
    @property
    def chosen(self) -> str:
        """Name of the chosen candidate."""
    @property
    def report(self) -> str:
        """What the search did and why it stopped, as a sentence."""
    @property
    def stop_reason(self) -> str:
        """Why the search stopped."""
    @property
    def candidates_simulated(self) -> int:
        """Placements simulated by the search."""
    @property
    def nodes_simulated(self) -> int:
        """Nodes simulated by the search, over all its simulations."""
    @property
    def plan_hash(self) -> str:
        """Stable hash of the inputs and the decisions (16 hex digits)."""

@final
class Simulation:
    """One simulated placement: time, memory, resources and timeline."""

    @property
    def predicted_time_s(self) -> float:
        """Simulated time until the last output is on the host, in seconds."""
    @property
    def peak_bytes(self) -> list[int]:
        """Simulated peak memory per device, in bytes."""
    @property
    def lower_bound_s(self) -> float:
        """The busiest resource's seconds of work (no schedule is faster)."""
    @property
    def busy_fraction(self) -> dict[str, float]:
        """Fraction of the predicted time each resource is busy, by name."""
    @property
    def timeline(self) -> list[_TimelineRecord]:
        """Every piece of work: ``(resource, kind, index, start_s, end_s)``."""

@final
class Optimum:
    """The fastest placement that fits, found by enumeration."""

    @property
    def node_device(self) -> list[int]:
        """Device index of each node."""
    @property
    def param_streamed(self) -> list[bool]:
        """Whether each parameter is streamed."""
    @property
    def predicted_time_s(self) -> float:
        """Simulated time, in seconds."""
    @property
    def peak_bytes(self) -> list[int]:
        """Simulated peak memory per device, in bytes."""
    @property
    def placements(self) -> int:
        """Placements simulated."""

def plan(
    graph: CostGraph,
    devices: Sequence[Device],
    objective: str,
    host_compute: bool,
    *,
    node_limit: int | None = None,
    time_limit_s: float | None = None,
    prefetch_depth: int = 1,
    memory_slack: float = ...,
    split: CostGraph | None = None,
) -> Plan:
    """Plan ``graph`` over ``devices`` (the host first) for ``objective``.

    ``objective`` is ``"latency"`` (one forward), ``"memory"`` (least accelerator
    memory within ``memory_slack``, by default 0.1, of the fastest) or ``"throughput"`` (the same
    choice as latency: the planner has no batch information and simulates one run
    at a time). With ``host_compute`` false only host-only nodes run on the host.
    ``node_limit`` (nodes simulated; default 32 whole-graph simulations, at least
    262144) bounds local search; ``time_limit_s`` bounds the whole search (the
    single-device candidates always run); ``prefetch_depth`` is how many segments
    ahead streamed parameters are prefetched. Releases the GIL while planning.

    Each parameter keeps its home as ``graph`` gives it, unless nothing fits because
    the host budget is short while some parameter homed on the host is disk-allowed
    (``CostGraph(param_disk_allowed=...)``): then the planner plans the disk variant,
    ``split`` when given (the same work with large weights cut into row chunks;
    ``Plan.split`` is then true and the plan's indices refer to it) or else ``graph``,
    with every disk-allowed parameter homed on disk; ``Plan.param_home`` says which
    homes were planned. When some home of ``graph`` is disk already, ``split`` is
    planned from the start (its homes as given), the same fallback moving its other
    disk-allowed parameters to disk. Raises ``PlanInfeasible`` (with ``min_budgets``) when no
    candidate fits the budgets (the disk variant's error when it was planned) and
    ``OptionsError`` for an option out of range.
    """

def replay(
    graph: CostGraph,
    devices: Sequence[Device],
    objective: str,
    host_compute: bool,
    name: str,
    node_device: Sequence[int],
    param_streamed: Sequence[bool],
    *,
    value_spilled: Sequence[bool] = ...,
    prefetch_depth: int = 1,
    prefetch_window_bytes: int = 0,
    search_prefetch_depth: int | None = None,
    memory_slack: float = ...,
) -> Plan:
    """The plan a search made, rebuilt from its decisions without searching (same
    plan, same hash): for plans saved or cached by their decisions.

    ``name`` (the chosen candidate's) is only a label; ``prefetch_depth`` and
    ``prefetch_window_bytes`` are the plan's recorded ones (``Plan.prefetch_depth``,
    0 for a synchronous candidate, and ``Plan.prefetch_window_bytes``);
    ``search_prefetch_depth`` is the depth the search was configured with (``plan``'s
    ``prefetch_depth``), by default the recorded depth, or 1 when that is 0. ``graph``
    is the graph planned, homes included: the split graph when ``Plan.split``, with
    each parameter's home as in ``Plan.param_home``. Raises ``InvalidPlacement`` for a
    placement that does not fit the graph and ``PlanInfeasible`` when it does not fit
    the budgets.
    """

def simulate(
    graph: CostGraph,
    devices: Sequence[Device],
    node_device: Sequence[int],
    param_streamed: Sequence[bool],
    *,
    value_spilled: Sequence[bool] = ...,
    prefetch_depth: int = 1,
) -> Simulation:
    """Simulate one placement: each node's device and whether each parameter is
    streamed (ignored for parameters no accelerator uses, unless their home is disk),
    and which values are spilled to the host between uses (one flag per node;
    ignored where a value cannot be).
    Raises ``InvalidPlacement`` for wrong lengths, unknown devices or a host-only node
    placed elsewhere. Releases the GIL.
    """

def exhaustive(
    graph: CostGraph,
    devices: Sequence[Device],
    host_compute: bool,
    *,
    prefetch_depth: int = 1,
    limit: int = 1000000,
) -> Optimum | None:
    """The fastest placement that fits every budget, by simulating every placement
    the planner could choose; ``None`` when none fits. Raises ``OptionsError`` when
    that could exceed ``limit`` placements. For checking the planner on small graphs.
    """

def version() -> str:
    """The planner's version."""
