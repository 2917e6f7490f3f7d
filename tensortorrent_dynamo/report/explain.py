"""The text of ``explain()``: devices, budgets, segments, streaming, predicted time."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..io.reader import INLINE_READ_BYTES
from ..plan.peaks import say_peak
from ..plan.planner import (
    RATE_DTYPES,
    GraphPlan,
    attention_rate,
    calls_attention,
    dtype_rate,
    node_rate,
    op_latency,
    resident_set,
    rows_table,
)
from ..plan.throughput import batch_sweep, compute_bound_from
from ..run import ops
from ..shapes import format_range
from ..units import format_bytes, format_rate, format_seconds
from .fidelity import union_s

if TYPE_CHECKING:
    from ..profile import DeviceProfile
    from ..session import CompiledGraph


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return indent + "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return [line(header), *(line(r) for r in rows)]


def _flops(f: float) -> str:
    return format_rate(f, "FLOP") if f else "0"


def explain_devices(graphs: Sequence[CompiledGraph]) -> list[str]:
    """One row per device: kind, budget, rates, predicted and measured peak."""
    first = graphs[0]
    rows = []
    for planned in first.plan.devices:
        dev = planned.profile
        predicted = max(g.plan.predicted_peak(dev.name) for g in graphs)
        virtual = first.runtime.virtual.get(dev.name)
        measured = format_bytes(virtual.ledger.peak) if virtual and first.calls else "-"
        rss = [g.last_rss_peak for g in graphs if g.last_rss_peak is not None]
        if dev.is_host and rss:
            measured = f"{format_bytes(max(rss))} RSS"
        link = "-" if dev.is_host else format_rate(dev.h2d_bytes_per_s, "B/s")
        budget = first.settings.budgets.get(dev.name, planned.budget_bytes)
        rows.append(
            [
                dev.name,
                dev.kind,
                format_bytes(budget),
                format_rate(dev.flops_per_s, "FLOP/s"),
                link,
                format_bytes(predicted),
                measured,
            ]
        )
    header = ["device", "kind", "budget", "compute", "link h2d", "peak predicted", "peak measured"]
    lines = ["Devices", *_table(header, rows), *_explain_rates(graphs), *_explain_ops(graphs)]
    if any(g.last_rss_peak is not None for g in graphs):
        lines.append(
            "  host RSS: the whole process's resident memory during the last call (sampled "
            "every 2 ms), Python and torch included; the budget and prediction cover the "
            "model's weights and activations"
        )
    disk = first.runtime.disk
    if disk is not None:
        on_disk = sum(loc.nbytes for loc in disk.locations.values())
        lines.append(
            f"  disk tier: {len(disk.locations)} parameters ({format_bytes(on_disk)}) read "
            f"from disk, page cache bypassed; {format_bytes(disk.reader.bytes_read)} read so far"
        )
    return lines


# the row counts of a dtype's matmuls explain() names per device, the most FLOPs first
RATE_ROWS_SHOWN = 3


def _explain_rates(graphs: Sequence[CompiledGraph]) -> list[str]:
    """Which compute rate the FLOPs of each dtype, of matmuls of each count of rows and of
    attention were costed at, per device (the "compute" column is the float32
    square-matmul rate); nothing for float32 FLOPs all costed at that."""
    flops: dict[tuple[str, int | None, int | None], float] = {}
    attention: dict[tuple[str, int | None], float] = {}  # by dtype and query tokens
    for graph in graphs:
        nodes, keys = graph.plan.cost.nodes, graph.plan.cost.rate_keys()
        for node, key in zip(nodes, keys, strict=True):
            if node.flops > 0 and calls_attention(key):
                at = (key.dtype, key.rows)
                attention[at] = attention.get(at, 0.0) + node.flops
            elif node.flops > 0:
                shape = (key.dtype, key.rows, key.width)
                flops[shape] = flops.get(shape, 0.0) + node.flops
    devices = [planned.profile for planned in graphs[0].plan.devices]
    if all(
        key[0] == "float32" and node_rate(dev, *key) == dev.flops_per_s
        for key in flops
        for dev in devices
    ) and all(attention_rate(dev, *at) == dev.flops_per_s for at in attention for dev in devices):
        return []
    by_dtype: dict[str, dict[int | None, dict[int | None, float]]] = {}
    for (dtype, rows, width), total in flops.items():
        by_dtype.setdefault(dtype, {}).setdefault(rows, {})[width] = total
    lines = ["  FLOPs by dtype, and the rate each device's are costed at:"]
    for dtype, by_rows in sorted(by_dtype.items(), key=lambda item: -_total(item[1])):
        rates = [_device_rates(dev, dtype, by_rows) for dev in devices]
        lines.append(
            f"    {dtype}: {_flops(_total(by_rows))} (each graph once); costed at "
            f"{'; '.join(rates)}"
        )
    for (dtype, tokens), total in sorted(attention.items(), key=lambda item: -item[1]):
        rates = [
            f"{dev.name} {format_rate(attention_rate(dev, dtype, tokens), 'FLOP/s')}"
            + (" (measured)" if dev.attention_flops_per_s is not None else "")
            for dev in devices
        ]
        over = f" over {tokens} tokens" if tokens is not None else ""
        lines.append(
            f"    attention in {dtype}{over}: {_flops(total)} (each graph once); costed at "
            f"{', '.join(rates)}"
        )
    return lines


def _total(by_rows: dict[int | None, dict[int | None, float]]) -> float:
    return sum(sum(by_width.values()) for by_width in by_rows.values())


def _explain_ops(graphs: Sequence[CompiledGraph]) -> list[str]:
    """How many ops the graphs call and the fixed cost each device charges an op."""
    ops = sum(node.op_count for graph in graphs for node in graph.plan.cost.nodes)
    views = sum(
        1
        for graph in graphs
        for node in graph.plan.cost.nodes
        if not node.is_graph_input
        and node.flops == 0
        and node.bytes_accessed == 0
        and node.target != "getitem"
    )
    called = {op for graph in graphs for key in graph.plan.cost.rate_keys() for op in key.ops}
    costs = ", ".join(_op_costs(planned.profile, called) for planned in graphs[0].plan.devices)
    return [
        f"  ops: {ops} (each graph once; {views} views or other ops moving no bytes), each "
        f"costed a fixed {costs} beyond its FLOPs or bytes"
    ]


def _op_costs(dev: DeviceProfile, called: set[str]) -> str:
    """The fixed cost ``dev`` charges an op, and where the profile measured the ops
    ``called`` (by name) one by one, for how many and their range."""
    own = sorted(op_latency(dev, op) for op in called if op in dev.latency_by_op)
    text = f"{dev.name} {format_seconds(dev.latency_s)}"
    if own:
        text += (
            f", or the op's own where measured ({len(own)} of the {len(called)} kinds of op "
            f"called: {format_seconds(own[0])} to {format_seconds(own[-1])})"
        )
    if dev.cold_latency_s > 0:
        text += (
            f", and {format_seconds(dev.cold_latency_s)} more the first time a segment runs "
            "each kind (caches cold)"
        )
    return text


def _device_rates(
    dev: DeviceProfile, dtype: str, by_rows: dict[int | None, dict[int | None, float]]
) -> str:
    """The rates ``dev``'s FLOPs of ``dtype`` were costed at: one, or one per count of rows
    of its matmuls (``by_rows``: FLOPs by rows and weight width; the rate of a count of rows
    over all its widths) where the profile measured rates by rows."""
    if dtype == "float32" or (dtype in RATE_DTYPES and dtype in dev.flops_by_dtype):
        note = ""
    else:
        note = " (float32's: not measured)" if dtype in RATE_DTYPES else " (float32's)"
    matmuls = sorted(
        ((sum(w.values()), r, w) for r, w in by_rows.items() if r is not None),
        key=lambda item: (item[0], item[1]),
        reverse=True,  # the most FLOPs first, as many: the most rows first
    )
    if not rows_table(dev, dtype) or not matmuls:
        return f"{dev.name} {format_rate(dtype_rate(dev, dtype), 'FLOP/s')}{note}"

    def rate(rows: int, by_width: dict[int | None, float]) -> float:
        seconds = sum(f / node_rate(dev, dtype, rows, width) for width, f in by_width.items())
        return sum(by_width.values()) / seconds

    parts = [
        f"{format_rate(rate(rows, by_width), 'FLOP/s')} at {rows} rows ({_flops(f)})"
        for f, rows, by_width in matmuls[:RATE_ROWS_SHOWN]
    ]
    if len(matmuls) > RATE_ROWS_SHOWN:
        rest = sum(f for f, _, _ in matmuls[RATE_ROWS_SHOWN:])
        parts.append(f"{len(matmuls) - RATE_ROWS_SHOWN} more row counts ({_flops(rest)})")
    if None in by_rows:
        elsewhere = format_rate(dtype_rate(dev, dtype), "FLOP/s")
        parts.append(f"{elsewhere} elsewhere ({_flops(sum(by_rows[None].values()))})")
    return f"{dev.name} matmuls {', '.join(parts)}"


def _other_chunk_plans(plan: GraphPlan) -> str:
    """How the plans in row chunks of other sizes compared (``plan.chunk_sizes``)."""
    if not plan.other_chunk_plans:
        return ""
    others = [
        (format_seconds(t) if t is not None else "no plan that fits and reads chunks")
        + f" in {format_bytes(size)} chunks"
        for size, t in plan.other_chunk_plans
    ]
    return " auto: the faster predicted, against " + ", ".join(others)


def _explain_disk(graph: CompiledGraph) -> list[str]:
    """What the graph reads from disk: planned bytes and time, and the last call's."""
    plan = graph.plan
    params = plan.cost.params
    on_disk = [i for i, r in enumerate(plan.residency) if r.on_disk]
    if not on_disk:
        return []
    read = [i for i in on_disk if plan.residency[i].streams]
    kept = [i for i in on_disk if not plan.residency[i].streams]
    # a read per stay: a weight used again after a gap in its uses is read again
    reads = [stay.param for stay in plan.stays() if plan.residency[stay.param].reads_from_disk]
    read_bytes = sum(params[i].nbytes for i in reads)
    inline = [i for i in reads if params[i].nbytes <= INLINE_READ_BYTES]
    rate, rate_source = graph.profile.disk_read_rate(plan.chunk_bytes)
    latency = graph.profile.planned_disk_latency_s
    inline_s = graph.profile.inline_read_s
    handed = len(reads) - len(inline)
    planned = handed * latency + len(inline) * inline_s + read_bytes / rate
    per_read = f" and {format_seconds(latency)} a read" if handed else ""
    what = f"{len(read)} parameters ({format_bytes(read_bytes)}) read from disk each run"
    if len(reads) > len(read):
        what = (
            f"{len(read)} parameters read from disk each run in {len(reads)} reads "
            f"({format_bytes(read_bytes)}: one used again after a gap in its uses is read again)"
        )
    lines = [
        f"  disk tier: {what}, {len(kept)} ({format_bytes(sum(params[i].nbytes for i in kept))}) "
        f"kept in RAM; planned read time {format_seconds(planned)} at "
        f"{format_rate(rate, 'B/s')}{per_read}",
        f"    read rate from {rate_source}",
    ]
    if inline:
        lines.append(
            f"    {len(inline)} of {len(reads)} reads, of at most "
            f"{format_bytes(INLINE_READ_BYTES)}, made by the calling thread at "
            f"{format_seconds(inline_s)} each (profile disk.read_inline): the host computes "
            "nothing meanwhile"
        )
    read_cpu = graph.profile.read_cpu_s
    if read_cpu > 0 and handed:
        lines.append(
            f"    each read handed to the reader's threads costed {format_seconds(read_cpu)} of "
            "host compute while in flight (profile disk.read_cpu: their hand-offs share the "
            "interpreter lock)"
        )
    slowdown = graph.profile.compute_slowdown_while_reading
    if slowdown > 1 and read:
        lines.append(
            f"    host compute costed {slowdown:.2f}x its rates while reads run: its measured "
            "slowdown while the disk reader streams (profile disk.compute_slowdown)"
        )
    if graph.chunks is not None and plan.chunk_bytes is not None:
        chunked = graph.chunks
        chunks = [p for p in params if chunked.parent(p) != p.fqn]
        lines.append(
            f"    {len({chunked.parent(p) for p in chunks})} large weights planned as "
            f"{len(chunks)} row chunks of at most {format_bytes(plan.chunk_bytes)} "
            f"(stream_chunk_bytes{_other_chunk_plans(plan)})"
        )
    spans = [
        (e.start_s, e.end_s) for e in graph.runtime.recorder.events if e.resource == "disk->cpu"
    ]
    if spans:
        busy = union_s(spans)
        lines.append(
            f"    measured (last call): {len(spans)} reads, disk busy {format_seconds(busy)}"
            + (f", {format_rate(read_bytes / busy, 'B/s')}" if busy > 0 and read else "")
        )
    return lines


def _explain_peaks(graph: CompiledGraph) -> list[str]:
    """What each device with a budget holds at its predicted peak (the host's only where
    its memory is budgeted: else it holds every weight whose home is host memory)."""
    budgeted = graph.settings.budgets
    return [
        f"  {say_peak(peak)}"
        for peak in graph.plan.peaks
        if peak.bytes and (peak.device != "cpu" or "cpu" in budgeted)
    ]


def _explain_runtime_work(graph: CompiledGraph) -> list[str]:
    """What the runtime's own work between the segments was costed at on the calling
    thread: the rewritten graph's segment calls, resident lookups and streamed weights."""
    call_s, resident_s, stream_s = graph.profile.runtime_work_s
    if graph.direct is not None or not (call_s or resident_s or stream_s):
        return []  # called as its one segment, or not measured
    counts = {"call": 0, "resident": 0, "stream": 0}
    for node in graph.module.graph.nodes:
        if node.op == "call_module":
            counts["call"] += 1
        elif node.target is ops.resident:
            counts["resident"] += 1
        elif node.target is ops.prefetch:
            counts["stream"] += 1
    total = counts["call"] * call_s + counts["resident"] * resident_s + counts["stream"] * stream_s
    return [
        f"  the runtime's own work between segments, costed on the calling thread: "
        f"{format_seconds(total)} a call ({counts['call']} segment calls at "
        f"{format_seconds(call_s)}, {counts['resident']} resident weights looked up at "
        f"{format_seconds(resident_s)}, {counts['stream']} streamed weights' prefetch, wait "
        f"and evict at {format_seconds(stream_s)}; profile runtime.segment_call, "
        "runtime.resident, runtime.stream)"
    ]


def _explain_spills(graph: CompiledGraph) -> list[str]:
    """The activations sent to host memory between uses, and when each comes back."""
    plan = graph.plan
    spilled = plan.spilled_nodes()
    if not spilled:
        return []
    nodes, native = plan.cost.nodes, plan.native
    total = sum(nodes[i].out_bytes for i in spilled)
    trips = [
        f"{nodes[i].name} ({format_bytes(nodes[i].out_bytes)}, made in submod_"
        f"{native.node_segment[i]}, back when submod_{native.value_reload_segment[i]} starts)"
        for i in spilled
    ]
    shown = ", ".join(trips[:6]) + (", ..." if len(trips) > 6 else "")
    lines = [
        f"  spilled activations ({len(spilled)}, {format_bytes(total)}; to host memory once "
        f"made, so the device need not hold them meanwhile): {shown}"
    ]
    copies = [e for e in graph.runtime.recorder.events if e.kind in ("spill", "reload")]
    if copies:
        busy = sum(e.end_s - e.start_s for e in copies)
        lines.append(
            f"    measured (last call): {len(copies)} copies, {format_seconds(busy)} of copying"
        )
    return lines


def _explain_state(graph: CompiledGraph) -> list[str]:
    """The inputs the graph writes in place (a static KV cache): where each lives between
    calls, and what that costs per call."""
    plan = graph.plan
    cost = plan.cost
    if not cost.state:
        return []
    where: dict[str, list[int]] = {}
    for i, ref in enumerate(cost.state):
        where.setdefault(plan.node_device(ref.input), []).append(i)
    lines = [
        f"  written in place ({len(cost.state)} inputs, {format_bytes(cost.state_bytes)}; a "
        "static KV cache's buffers and the like), placed by the plan:"
    ]
    for device, refs in where.items():
        nbytes = sum(cost.state[i].nbytes for i in refs)
        largest = max(refs, key=lambda i: (cost.state[i].nbytes, -i))
        ref = cost.state[largest]
        shape = "x".join(str(d) for d in ref.shape) or "scalar"
        copied_in, copied_out = _state_copies(graph, refs, device)
        if not copied_in and not copied_out:
            in_place = sum(cost.state[i].in_place for i in refs)
            if in_place == len(refs):
                how = "in place there"
            elif in_place:
                how = f"there ({in_place} in place, {len(refs) - in_place} as a new value)"
            else:
                how = "there (as a new value)"
            cost_text = f"read and updated {how}: no copy per call"
        else:
            cost_text = _copy_cost(graph, copied_in, copied_out)
        held = "held on" if device != "cpu" else "in host memory on"
        lines.append(
            f"    {len(refs)} ({format_bytes(nbytes)}, the largest {ref.source} {shape} "
            f"{ref.dtype}) {held} {device} between calls; {cost_text}"
        )
    return lines


def _state_copies(
    graph: CompiledGraph, refs: Sequence[int], device: str
) -> tuple[dict[str, int], dict[str, int]]:
    """Bytes of the state ``refs`` (kept on ``device``) copied each call: to each other
    device reading them, and back from each device making their new values."""
    plan = graph.plan
    cost = plan.cost
    copied_in: dict[str, int] = {}
    copied_out: dict[str, int] = {}
    for i in refs:
        ref = cost.state[i]
        readers = {
            plan.node_device(n)
            for n, node in enumerate(cost.nodes)
            if ref.input in node.inputs and not node.is_graph_input
        }
        for reader in readers - {device}:
            copied_in[reader] = copied_in.get(reader, 0) + ref.nbytes
        made = plan.node_device(ref.output)
        if made != device:
            copied_out[made] = copied_out.get(made, 0) + cost.nodes[ref.output].out_bytes
    return copied_in, copied_out


def _copy_cost(graph: CompiledGraph, copied_in: dict[str, int], copied_out: dict[str, int]) -> str:
    """The per-call copies of state as text, with their time at the planned link rates."""
    rates = {d.name: d.profile for d in graph.plan.devices}
    parts = []
    seconds = 0.0
    for dev, nbytes in copied_in.items():
        parts.append(f"{format_bytes(nbytes)} copied to {dev}")
        seconds += nbytes / rates[dev].h2d_bytes_per_s if dev in rates else 0.0
    for dev, nbytes in copied_out.items():
        parts.append(f"{format_bytes(nbytes)} of new values copied back from {dev}")
        seconds += nbytes / rates[dev].d2h_bytes_per_s if dev in rates else 0.0
    return f"{', '.join(parts)} each call (planned {format_seconds(seconds)} of copying)"


def _explain_throughput(graph: CompiledGraph) -> list[str]:
    """``objective="throughput"``: the decode step simulated at larger batches, and the
    batch from which compute, not the disk or a link, is the bottleneck."""
    points = batch_sweep(graph.plan, graph.profile, graph.settings)
    if not points:
        return []
    cells = []
    fit = [p for p in points if p.step_s is not None and p.tokens_per_s is not None]
    for point in fit:
        rate = point.tokens_per_s or 0.0
        cells.append(
            f"batch {point.batch}: {rate:.1f} tok/s "
            f"({format_seconds(point.step_s or 0.0)} a step, {point.busiest} {point.busy:.0%})"
        )
    too_large = [p.batch for p in points if p not in fit]
    if too_large:
        cells.append(f"batch {min(too_large)} and larger: does not fit the budgets")
    lines = [
        "  throughput (this plan's decode step simulated at larger batches, its placement "
        "kept, activations and KV cache scaled with the batch):",
        *(f"    {cell}" for cell in cells),
    ]
    first = compute_bound_from(fit, [d.name for d in graph.plan.devices])
    if not fit:
        return lines
    if first is None:
        lines.append(
            f"    the disk or a link is the bottleneck at every batch that fits (up to "
            f"{fit[-1].batch})"
        )
    elif first == points[0].batch:
        lines.append("    compute is the bottleneck already at this batch")
    else:
        lines.append(
            f"    the disk or a link is the bottleneck below batch {first}, compute from it"
        )
    return lines


def explain_graph(graph: CompiledGraph) -> str:
    """The plan of one graph as text."""
    plan = graph.plan
    cost = plan.cost
    native = plan.native
    lines = [
        f"Graph {plan.graph_index}: {len(cost.nodes)} nodes, {len(cost.params)} parameters "
        f"({format_bytes(cost.param_bytes)}), {_flops(cost.total_flops)}, plan {plan.plan_hash}",
    ]
    families: dict[str, list[str]] = {}
    for cand in native.candidates:
        time = format_seconds(cand.predicted_time_s) if cand.feasible else "does not fit"
        mark = " (chosen)" if cand.name == native.chosen else ""
        families.setdefault(cand.family, []).append(f"{cand.name} {time}{mark}")
    source = f"; the decisions of {plan.replayed_from}" if plan.replayed_from else ""
    if not source and graph.settings.plan is not None:
        source = (
            f"; searched, not replayed from the saved plan {graph.settings.plan}: "
            f"{plan.replay_refused or 'it has no plan for this graph'}"
        )
    lines.append(f"  candidates ({native.report}{source}):")
    lines += [f"    {family}: " + " | ".join(c) for family, c in families.items()]
    bound = native.lower_bound_s
    ratio = f"{plan.predicted_time_s / bound:.2f}x" if bound > 0 else "-"
    busiest = sorted(native.busy_fraction.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    lines.append(
        f"  lower bound {format_seconds(bound)} (busiest resource's work); predicted / bound "
        f"{ratio}; busy: " + ", ".join(f"{r} {f:.0%}" for r, f in busiest)
    )

    seg_nodes: dict[int, list[int]] = {}
    for nid in range(len(cost.nodes)):
        seg_nodes.setdefault(plan.node_segment(nid), []).append(nid)
    measured: dict[str, float] = {}
    for event in graph.runtime.recorder.events:
        if event.kind == "segment":
            measured[event.label] = measured.get(event.label, 0.0) + event.end_s - event.start_s
    rows = []
    for name, device in graph.compilers_by_device():
        seg = int(name.removeprefix("submod_"))
        nodes = [n for n in seg_nodes.get(seg, []) if not cost.nodes[n].is_graph_input]
        members = set(nodes)
        used = {p for p, ref in enumerate(cost.params) if set(ref.users) & members}
        resident = sum(cost.params[p].nbytes for p in used if not plan.residency[p].streams)
        streamed = sum(cost.params[p].nbytes for p in used if plan.residency[p].streams)
        moved_in = {
            i
            for n in nodes
            for i in cost.nodes[n].inputs
            if i not in members and plan.node_device(i) != device
        }
        rows.append(
            [
                name,
                device,
                graph.compilers[name],
                str(len(nodes)),
                _flops(sum(cost.nodes[n].flops for n in nodes)),
                format_bytes(resident),
                format_bytes(streamed),
                format_bytes(sum(cost.nodes[i].out_bytes for i in moved_in)),
                format_seconds(measured[name]) if name in measured else "-",
            ]
        )
    header = [
        "segment",
        "device",
        "compiler",
        "nodes",
        "FLOPs",
        "params resident",
        "streamed",
        "copied in",
        "measured",
    ]
    lines += _table(header, rows)
    lines += _explain_runtime_work(graph)
    if graph.compiler_note:
        lines.append(f"  compiler: {graph.compiler_note}")
    streamed_names = [p.fqn for p, r in zip(cost.params, plan.residency, strict=True) if r.streams]
    if streamed_names:
        shown = ", ".join(streamed_names[:8]) + (", ..." if len(streamed_names) > 8 else "")
        if native.prefetch_window_bytes:
            window = format_bytes(native.prefetch_window_bytes)
            when = f"each prefetched as early as a {window} window of buffers allows"
        elif native.prefetch_depth == 1:
            when = "prefetched one segment ahead"
        elif native.prefetch_depth:
            when = f"prefetched {native.prefetch_depth} segments ahead"
        else:
            when = "each read when its segment starts, one buffer"
        stays = collections.Counter(stay.param for stay in plan.stays())
        # in order of first use
        again = [f"{cost.params[q].fqn} x{n}" for q, n in stays.items() if n > 1]
        evicted = "evicted after last use"
        if again:
            evicted = (
                f"evicted after each run of uses: {len(again)} come back after a gap in their "
                f"uses, {sum(stays.values())} stays in all ({', '.join(again[:4])}"
                + (", ...)" if len(again) > 4 else ")")
            )
        lines.append(f"  streamed parameters ({len(streamed_names)}, {when}, {evicted}): {shown}")
    else:
        lines.append("  streamed parameters: none")
    lines += _explain_peaks(graph)
    lines += _explain_state(graph)
    if graph.settings.objective == "throughput":
        lines += _explain_throughput(graph)
    lines += _explain_spills(graph)
    lines += _explain_disk(graph)
    fallbacks = cost.fallbacks
    if fallbacks:
        lines.append("  on the CPU because they cannot be placed elsewhere:")
        lines += [f"    {n.name} ({n.target}): {n.fallback}" for n in fallbacks]
    if cost.assumed_sizes:
        lines.append(
            f"  dynamic sizes planned for: {format_range(cost.assumed_sizes)} (costed at "
            "those bounds; a call with larger sizes is planned again)"
        )
    timing = f"  predicted time: {format_seconds(plan.predicted_time_s)}"
    if graph.last_call_s is not None:
        timing += f", measured (last call): {format_seconds(graph.last_call_s)}"
    lines.append(timing)
    lines += _explain_prediction_off(graph)
    return "\n".join(lines)


PREDICTION_OFF = 1.3
"""How many times the predicted time (or a fraction of it) a call may take before explain()
points at the profile the plan was made with: with a profile measured minutes before, the
fidelity bench's calls came within 22% of their predictions on the 2-core development
machine, where the same plans made with its cached profile, three hours old, were predicted
up to 36% short (``docs/profile.md``)."""


def _explain_prediction_off(graph: CompiledGraph) -> list[str]:
    """A line when the last call (not the one that compiled the graph, which warms the
    caches up) took more than ``PREDICTION_OFF`` times the predicted time or less than its
    inverse: the plan's choices rest on the profile's rates, which drift on a shared
    machine."""
    predicted, measured = graph.plan.predicted_time_s, graph.last_call_s
    if graph.calls < 2 or measured is None or predicted <= 0 or measured <= 0:
        return []
    ratio = measured / predicted
    if 1 / PREDICTION_OFF <= ratio <= PREDICTION_OFF:
        return []
    plan = graph.plan
    segments = {plan.segment_device(s) for s in range(len(plan.native.segment_device))}
    virtual = sorted(segments & graph.runtime.virtual.keys())
    if virtual:
        # the profile is not what is off: the emulation is slower than any device
        return [
            f"  the last call took {ratio:.2f}x the predicted time (more than "
            f"{PREDICTION_OFF:.1f}x off): {', '.join(virtual)} "
            f"{'runs' if len(virtual) == 1 else 'run'} its ops on the CPU, one by one "
            "through the layer that keeps its memory ledger, at no accelerator's speed; "
            "its plan's memory figures are exact, its times are the spec's"
        ]
    return [
        f"  the last call took {ratio:.2f}x the predicted time (more than "
        f"{PREDICTION_OFF:.1f}x off): the plan rests on the profile's rates (profile "
        f"{graph.profile.source}), and a shared machine's rates drift within hours; "
        "`tensortorrent validate-hardware` measures them again, and the next compile plans "
        "with them"
    ]


def _frames(graphs: Sequence[CompiledGraph]) -> list[list[CompiledGraph]]:
    """The graphs grouped by the Dynamo frame they were captured from, in order (a graph
    outside Dynamo alone)."""
    groups: dict[object, list[CompiledGraph]] = {}
    for i, g in enumerate(graphs):
        groups.setdefault(g.frame if g.frame is not None else ("alone", i), []).append(g)
    return list(groups.values())


def explain_workload(graphs: Sequence[CompiledGraph]) -> list[str]:
    """What was assumed of how often each graph runs: the graphs of one frame are
    alternatives (a prefill and a decode graph of ``generate()``), one per call; the others
    keep the resident copies of the one called most where they fit (``Session.enter``)."""
    lines = []
    for members in _frames(graphs):
        if len(members) < 2:
            continue
        ids = ", ".join(str(g.plan.graph_index) for g in members)
        calls = ", ".join(str(g.calls) for g in members)
        sets = [resident_set(g.plan) for g in members]
        sizes = {
            (p.fqn, r.device): p.nbytes
            for g in members
            for p, r in zip(g.plan.cost.params, g.plan.residency, strict=True)
        }
        differ = frozenset().union(*sets) - frozenset.intersection(*sets)
        weighted = sum(g.calls * g.plan.predicted_time_s for g in members)
        switching = (
            f"switching from one to another drops and makes again "
            f"{format_bytes(sum(sizes[k] for k in differ))} of resident copies"
            if differ
            else "switching from one to another drops and makes no resident copy"
        )
        followers = [g for g in members if g.plan.follows is not None]
        if followers:
            index = {g.plan.graph_index: i for i, g in enumerate(members)}
            sharing = []
            for g in followers:
                theirs = sets[index[g.plan.follows]] if g.plan.follows in index else frozenset()
                kept = resident_set(g.plan) & theirs
                what = (
                    f"the {len(kept)} resident copies"
                    if kept == theirs
                    else f"{len(kept)} of the {len(theirs)} resident copies "
                    f"({format_bytes(sum(sizes[k] for k in kept))} of "
                    f"{format_bytes(sum(sizes[k] for k in theirs))}, the most that fit)"
                )
                sharing.append(
                    f"  graph {g.plan.graph_index} keeps {what} of graph {g.plan.follows}, "
                    f"called most, planned again to do so: predicted "
                    f"{format_seconds(g.plan.predicted_time_s)} a call (with a set of its own "
                    f"{format_seconds(g.plan.alone_predicted_s or 0.0)}); {switching}"
                )
        elif members[0].settings.plan is not None:
            searched = [g.plan.graph_index for g in members if not g.plan.replayed_from]
            also = f" (graph {', '.join(map(str, searched))} searched)" if searched else ""
            sharing = [f"  each planned as the saved plan has it{also}; {switching}"]
        elif any(g.followed for g in members):
            sharing = [
                "  each keeps a resident set of its own: planned again to keep those of the "
                "graph called most, the others could not fit them or would cost more with "
                f"them (counting the copies made again at each switch); {switching}"
            ]
        else:
            sharing = [
                "  each is planned on its own, with the whole budget and a resident set of "
                "its own; once one is called more than the others, they are planned again, "
                f"once, to keep its resident copies where they fit; {switching}"
            ]
        lines += [
            f"Workload: graphs {ids} are alternatives of one frame, one of them per call "
            f"(recompiles for other shapes or guards, such as generate()'s prefill and "
            f"decode graphs); calls so far: {calls}",
            *sharing,
            f"  predicted time of the calls so far: {format_seconds(weighted)}",
        ]
    return lines


def explain(graphs: Sequence[CompiledGraph]) -> str:
    """The whole report: a devices table, then one section per graph."""
    if not graphs:
        return "TensorTorrent: nothing compiled yet (call the model once, or use tt.compile)."
    first = graphs[0]
    head = (
        f"TensorTorrent plan: {len(graphs)} graph(s), objective {first.settings.objective}, "
        f"profile {first.profile.source}"
    )
    sections = [head, "\n".join(explain_devices(graphs))]
    sections += [explain_graph(g) for g in graphs]
    workload = explain_workload(graphs)
    if workload:
        sections.append("\n".join(workload))
    # one graph of each frame runs per forward: the one called most
    total = sum(
        max(members, key=lambda g: g.calls).plan.predicted_time_s for members in _frames(graphs)
    )
    sections.append(f"Predicted time per forward: {format_seconds(total)}")
    return "\n\n".join(sections)
