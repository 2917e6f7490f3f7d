"""The text report of ``tensortorrent validate-hardware``: one row per figure."""

from __future__ import annotations

from collections.abc import Sequence

from ..units import format_bytes, format_rate, format_seconds
from .schema import WIDE_ROWS_N, Figure, Measurements


def format_value(figure: Figure) -> str:
    """A figure's value in the unit a reader expects; ``-`` when absent."""
    v = figure.value
    if v is None:
        return "-"
    if figure.unit == "B":
        return format_bytes(v)
    if figure.unit == "s":
        return format_seconds(v)
    if figure.unit == "%":
        return f"{v:.0f}%"
    if figure.unit.endswith("/s"):
        return format_rate(v, figure.unit)
    return f"{v:.2f} {figure.unit}"


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]


def _disk_how(figure: Figure) -> str:
    if figure.value is None:
        return figure.note
    if "O_DIRECT" in figure.method:
        how = "O_DIRECT"
    elif "evicting" in figure.method:
        how = "page cache evicted first"
    else:
        how = ""
    return "; ".join(x for x in (how, figure.note) if x)


def format_report(m: Measurements) -> str:
    """The summary table: devices, links and the disk, then where the methods are."""
    fp = m.fingerprint
    head = [
        f"TensorTorrent hardware profile ({m.mode}, measured in {format_value(m.duration)}, "
        f"fingerprint {fp.digest()})",
        f"{fp.cpu_model}, {fp.cpu_cores} logical cores, {format_bytes(fp.ram_total_bytes)} RAM, "
        f"{len(fp.gpus)} CUDA device(s), torch {fp.torch_version}",
    ]
    if m.load.note:
        head.append(f"other work used {format_value(m.load)} of the CPUs: {m.load.note}")
    rows: list[list[str]] = [["where", "figure", "value", "note"]]
    for dev in m.devices:
        rows.append([dev.name, "memory", format_value(dev.memory), dev.description])
        for dtype, fig in dev.matmul.items():
            rows.append([dev.name, f"matmul {dtype}", format_value(fig), fig.note])
        if dev.attention is not None:
            attention = dev.attention
            rows.append([dev.name, "attention float32", format_value(attention), attention.note])
        for count, fig in sorted(dev.attention_tokens.items()):
            figure = f"attention float32 at {count} tokens"
            rows.append([dev.name, figure, format_value(fig), fig.note])
        for dtype, by_rows in dev.matmul_rows.items():
            for count, fig in sorted(by_rows.items()):
                figure = f"matmul {dtype} {count} rows"
                rows.append([dev.name, figure, format_value(fig), fig.note])
        for dtype, by_rows in dev.matmul_rows_wide.items():
            for count, fig in sorted(by_rows.items()):
                figure = f"matmul {dtype} {count} rows, {WIDE_ROWS_N} wide"
                rows.append([dev.name, figure, format_value(fig), fig.note])
        rows.append(
            [
                dev.name,
                "memory bandwidth",
                format_value(dev.memory_bandwidth),
                dev.memory_bandwidth.note,
            ]
        )
        rows.append([dev.name, "op latency", format_value(dev.op_latency), dev.op_latency.note])
        cold = dev.op_cold_latency
        if cold is not None:
            rows.append([dev.name, "op latency, first call cold", format_value(cold), cold.note])
    for link in m.links:
        fig = link.bandwidth
        rows.append([f"{link.src}->{link.dst}", link.name, format_value(fig), fig.note])
    work = m.runtime
    rows += [
        ["runtime", "a segment's call", format_value(work.segment_call), work.segment_call.note],
        ["runtime", "a resident weight", format_value(work.resident), work.resident.note],
        ["runtime", "a streamed weight", format_value(work.stream), work.stream.note],
    ]
    disk = m.disk
    rows += [
        ["disk", "write", format_value(disk.write), _disk_how(disk.write)],
        ["disk", "read", format_value(disk.read), _disk_how(disk.read)],
        ["disk", "read while streaming", format_value(disk.stream), disk.stream.note],
        [
            "disk",
            "read while streaming 4 MiB reads",
            format_value(disk.stream_small),
            disk.stream_small.note,
        ],
        ["disk", "cpu a read in flight takes", format_value(disk.read_cpu), disk.read_cpu.note],
        ["disk", "32 KiB read inline", format_value(disk.read_inline), disk.read_inline.note],
        ["disk", "4 KiB random read", format_value(disk.latency), _disk_how(disk.latency)],
        ["disk", "free", format_value(disk.free), disk.path or disk.free.note],
        [
            "disk",
            "cpu matmul slowdown while reading",
            format_value(disk.compute_slowdown),
            disk.compute_slowdown.note,
        ],
    ]
    tail = (
        "Values are medians after warm-up, the disk's rates bytes over the time of all passes; "
        "the JSON (--output) says how each was measured."
    )
    return "\n".join([*head, "", *_table(rows), "", tail])
