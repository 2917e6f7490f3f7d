"""What a device holds at its peak: the planner's peaks, given by index, named with the
graph's weights and nodes (:class:`~tensortorrent_dynamo.errors.PeakUse`) and said in
words, for a plan's ``explain()`` and for a refusal's message, where the user sees what
makes the need and what to change."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..cost_graph import CostGraph
from ..errors import PeakUse, PlanInfeasible
from ..units import format_bytes

# the pieces of one kind a message names; the rest are counted
SHOWN = 3


def named_refusal(
    error: PlanInfeasible,
    whole: CostGraph,
    split: CostGraph | None,
    devices: Sequence[str],
    budgets: Mapping[str, int],
) -> PlanInfeasible:
    """``error`` (raised by the native planner for ``whole``, or for ``split``, the graph
    with its large weights in row chunks, where it says so) with its peaks named and said:
    what each device it needs more of holds at its peak, in the candidate closest to
    fitting. ``devices`` are the planner's devices by index, ``budgets`` their budgets."""
    if error.native_peaks is None:
        return error
    of_split, raw = error.native_peaks
    graph = split if of_split and split is not None else whole
    peaks = named_peaks(graph, devices, raw)
    said = " ".join(say_peak(p, budgets.get(p.device)) for p in peaks)
    return PlanInfeasible(f"{error} {said}" if said else str(error), error.min_budgets, peaks)


def named_peaks(
    graph: CostGraph, devices: Sequence[str], raw: Sequence[Any]
) -> tuple[PeakUse, ...]:
    """The planner's peaks of a plan of ``graph`` (``Plan.peaks``, or a refusal's), named;
    ``devices`` are the planner's devices by index."""
    return tuple(_peak(graph, devices, p) for p in raw)


def _peak(graph: CostGraph, devices: Sequence[str], raw: Any) -> PeakUse:
    device, total, resident, live, reached = raw
    params = graph.params

    def weights(kind: str) -> tuple[tuple[str, int], ...]:
        return tuple((params[i].fqn, b) for k, i, b in live if k == kind)

    def what(kind: str, index: int) -> str:
        if kind == "copy":
            return f"a copy of {_node(graph, index)} arrives from another device"
        if kind == "value" and graph.nodes[index].is_graph_input:
            return f"{_node(graph, index)} is passed in"
        if kind == "value":
            return f"{_node(graph, index)} allocates its output"
        if kind == "weight":
            return f"{params[index].fqn} is prefetched"
        return f"{params[index].fqn} is read from disk"

    return PeakUse(
        device=devices[device],
        bytes=total,
        resident=tuple(sorted(((params[q].fqn, params[q].nbytes) for q in resident), key=_largest)),
        streamed=weights("weight"),
        reading=weights("staging"),
        activations=tuple((_node(graph, i), b) for k, i, b in live if k == "value"),
        reached_by=what(*reached) if reached is not None else None,
    )


def _largest(piece: tuple[str, int]) -> tuple[int, str]:
    return -piece[1], piece[0]


def _node(graph: CostGraph, index: int) -> str:
    """A node by name, and the module that made it where known."""
    node = graph.nodes[index]
    if node.is_graph_input:
        return f"input {node.name}"
    scope = graph.scopes[index] if index < len(graph.scopes) else ""
    return f"{node.name} ({scope})" if scope else node.name


def _listed(what: str, pieces: Sequence[tuple[str, int]]) -> str:
    """``what`` with its bytes in all and the largest pieces by name."""
    total = sum(b for _, b in pieces)
    shown = [f"{name} {format_bytes(b)}" for name, b in pieces[:SHOWN]]
    if len(pieces) > SHOWN:
        rest = pieces[SHOWN:]
        shown.append(f"{len(rest)} more {format_bytes(sum(b for _, b in rest))}")
    return f"{format_bytes(total)} of {what} ({', '.join(shown)})"


def say_peak(peak: PeakUse, budget: int | None = None) -> str:
    """One device's peak in words, and, given its budget, the piece that alone is more."""
    parts = []
    if peak.resident:
        kept = "weights in host memory" if peak.device == "cpu" else "weights kept there"
        parts.append(_listed(kept, peak.resident))
    if peak.streamed:
        # on the host, a streamed weight is one read from disk for the host's own use
        streamed = "weights read from disk" if peak.device == "cpu" else "streamed weights"
        parts.append(_listed(streamed, peak.streamed))
    if peak.reading:
        parts.append(_listed("weights read from disk for a copy on", peak.reading))
    if peak.activations:
        parts.append(_listed("activations", peak.activations))
    when = f" comes when {peak.reached_by}" if peak.reached_by else ""
    text = f"{peak.device}'s peak of {format_bytes(peak.bytes)}{when}; it then holds " + (
        "; ".join(parts) + "."
    )
    if budget is None:
        return text
    # the largest piece that no plan can make smaller
    weight = (
        "a weight is read from disk whole, or in row chunks of at most the "
        "stream_chunk_bytes option where only linear layers use it"
        if peak.device == "cpu"
        else "a weight is copied to a device whole"
    )
    whole = [(n, b, weight) for n, b in peak.streamed]
    whole += [
        (n, b, "a value is made whole (a smaller batch or input makes it smaller)")
        for n, b in peak.activations
    ]
    over = [w for w in whole if w[1] > budget]
    if over:
        name, size, why = max(over, key=lambda w: w[1])
        text += (
            f" {name} alone ({format_bytes(size)}) is more than the budget of {peak.device} "
            f"({format_bytes(budget)}): {why}."
        )
    return text
