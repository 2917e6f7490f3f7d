"""The JSON form of a host's measurements: figures with units and methods, and the fingerprint.

Every figure carries its unit and how it was obtained; an absent figure is ``null`` with a
note saying why (no such device, not measured by this mode, unsupported), never a zero.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import sys
from collections.abc import Mapping
from typing import Any, Literal, cast, get_args

from ..io.files import digest

FORMAT_VERSION = 1
"""Version of the JSON form; a file with another version is not read."""
METHODS_REVISION = 16
"""Revision of how the figures are measured, raised when a method changes what it measures
(2: the op latency is timed on direct calls, as eager segments make them; 3: few-row
matmuls cycle through weights larger than the caches, ``measure.ROWS_WEIGHT_BYTES``, and
every figure is timed with the Python dispatcher off, also inside a compile; 4: the compute
slowdown's reads are verified as the runtime's are; 5: the op latency's probe builds masks,
embeds tokens and runs norms and activations as models' graphs do, and each of its ops is
timed too, ``DeviceFigures.op_latencies``; 6: the host's few-row matmuls are timed at a
large model's width too, ``DeviceFigures.matmul_rows_wide``; 7: the op latency's probe is
timed with its caches evicted before each call too, ``DeviceFigures.op_cold_latency``, and
attention's rate is measured, ``DeviceFigures.attention``; 8: the disk's reads land in the
memory the runtime reads into, ``io.pool.direct_io_memory``; 9: the compute slowdown is
timed on a stream of reads as the runtime's, which gives the reader's rate too,
``DiskFigures.stream``, ``measure.StreamProbe``, and what a small read takes from the host's
compute while in flight is measured, ``measure.SmallReadProbe``; 10: a small read the
calling thread makes itself is timed, ``DiskFigures.read_inline``, and the reads in flight
that the small-read probe times are of a size the reader hands to its threads,
``io.reader.INLINE_READ_BYTES``; 11: the runtime's own work between segments is timed,
``Measurements.runtime``; 12: the stream is timed in 4 MiB reads too,
``DiskFigures.stream_small``; 13: each op of the op latency's probe is timed in a loop of
its own, the figures scaled to the probe's time, ``OpProbe._each_op``; 14: the probe's
cold cost is timed in pairs of a call after another and a cold one, ``OpProbe._cold``; 15:
each small read made inline is timed after the caches were evicted, as a streamed plan's
reads come after segments, ``SmallReadProbe.read_inline``; 16: attention's rate is timed
at few tokens too, ``DeviceFigures.attention_tokens``): a
cached short profile of an older revision is measured again. A file without one is revision 1."""

SMALL_STREAM_BYTES = 4 * 2**20
"""The reads of the disk reader's small stream (``DiskFigures.stream_small``): a plan in row
chunks of at most this size is costed at its rate (``HostProfile.disk_read_rate``)."""

INLINE_PROBE_BYTES = 32 * 2**10
"""The size of the reads ``disk.read_inline`` times (``measure.SmallReadProbe``), half the
largest a calling thread makes itself (``io.reader.INLINE_READ_BYTES``): the planner takes
the figure less these bytes at its read rate as such a read's fixed cost."""

ATTENTION_SHAPE = (1, 8, 256, 64)
"""(batch, heads, tokens, head size) of the attention whose rate ``measure.attention_flops``
times (``DeviceFigures.attention``): a decoder's prefill of a few hundred tokens. On the
2-core development machine float32 attention ran at 290-300 GFLOP/s so (the square matmul
at 400-415), 225 at 128 tokens by 32 heads, 75 at 16 tokens."""

ATTENTION_TOKENS = (16, 64)
"""The query tokens attention's rate is timed at too (``DeviceFigures.attention_tokens``),
at :data:`ATTENTION_SHAPE` otherwise: attention over few tokens runs far below its rate
over many (on the 2-core development machine, 2026-12-06: 24-25, 101-108, 139-143 and
175-181 GFLOP/s at 16, 64, 128 and 256 tokens, 131-134 at 128 tokens by 32 heads)."""

WIDE_ROWS_N = 4096
"""The width of the host's second set of few-row matmul figures (``measure.matmul_rows_flops``
at ``n``): layers as wide as large models' read their weights at other rates than the square
size's (on the 2-core development machine a 4096-wide float32 layer at 4 rows ran about a
fifth slower than 1024-wide ones, through as many bytes of weights)."""


Mode = Literal["nominal", "short", "quick", "full"]
"""How much was measured: nothing (built-in rates), the planner's minimum, or a report."""


def _get(raw: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in raw:
        raise ValueError(f"{where}: missing key {key!r}")
    value = raw[key]
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ValueError(f"{where}.{key}: expected {kind}, got {value!r}")
    if not isinstance(value, kind):
        raise ValueError(f"{where}.{key}: expected {kind}, got {type(value).__name__}")
    return value


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: expected an object, got {type(value).__name__}")
    return cast(Mapping[str, Any], value)


COMPUTE_SLOWDOWN_NOTE = "not measured (a profile written before this figure was)"
"""Why a profile has no ``disk.compute_slowdown``, ``disk.stream``, ``disk.stream_small``,
``disk.read_cpu``, ``disk.read_inline`` or ``runtime`` figures: it was measured before the
figure was."""


@dataclasses.dataclass(frozen=True)
class Figure:
    """One quantity: its value (``None`` when absent), unit, method and an optional note.

    ``note`` says why a value is absent, or what a reader should know about it (for
    example that a dtype runs far slower than float32 on this device).
    """

    value: float | None
    unit: str
    method: str
    note: str = ""

    @classmethod
    def absent(cls, unit: str, reason: str) -> Figure:
        """A figure that was not measured, and why."""
        return cls(value=None, unit=unit, method="not measured", note=reason)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"value": self.value, "unit": self.unit, "method": self.method}
        if self.note:
            out["note"] = self.note
        return out

    @classmethod
    def from_dict(cls, raw: object, where: str) -> Figure:
        data = _mapping(raw, where)
        value = _get(data, "value", (int, float, type(None)), where)
        # every figure is a size, rate, time or share: finite and not negative
        if value is not None and not 0 <= value <= sys.float_info.max:
            raise ValueError(f"{where}.value: expected a finite number >= 0, got {value!r}")
        note = data.get("note", "")
        if not isinstance(note, str):
            raise ValueError(f"{where}.note: expected a string")
        return cls(
            value=None if value is None else float(value),
            unit=_get(data, "unit", str, where),
            method=_get(data, "method", str, where),
            note=note,
        )


# the relative difference of total RAM within which two machines are of one kind
RAM_TOLERANCE = 0.02


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    """What identifies the hardware a profile was measured on.

    A cached profile is used only on a machine with the same fingerprint.
    """

    cpu_model: str
    cpu_cores: int
    ram_total_bytes: int
    gpus: tuple[tuple[str, int], ...]
    """(name, memory in bytes) of each CUDA device, in index order."""
    torch_version: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "cpu_model": self.cpu_model,
            "cpu_cores": self.cpu_cores,
            "ram_total_bytes": self.ram_total_bytes,
            "gpus": [{"name": n, "memory_bytes": m} for n, m in self.gpus],
            "torch_version": self.torch_version,
        }

    @classmethod
    def from_dict(cls, raw: object, where: str = "fingerprint") -> Fingerprint:
        data = _mapping(raw, where)
        gpus = []
        for i, gpu in enumerate(_get(data, "gpus", list, where)):
            at = f"{where}.gpus[{i}]"
            g = _mapping(gpu, at)
            gpus.append((_get(g, "name", str, at), _get(g, "memory_bytes", int, at)))
        return cls(
            cpu_model=_get(data, "cpu_model", str, where),
            cpu_cores=_get(data, "cpu_cores", int, where),
            ram_total_bytes=_get(data, "ram_total_bytes", int, where),
            gpus=tuple(gpus),
            torch_version=_get(data, "torch_version", str, where),
        )

    def digest(self) -> str:
        """A short stable hash, used in the cache file name."""
        return digest(self.to_dict())

    def other_kind(self, other: Fingerprint) -> list[str]:
        """The fields in which ``other`` is another kind of machine than this one: each but
        the total RAM, which within :data:`RAM_TOLERANCE` is the same kind (the RAM the
        kernel reports differs by some MiB between machines of one kind, and after a kernel
        upgrade)."""
        ours, theirs = self.to_dict(), other.to_dict()
        ram = abs(self.ram_total_bytes - other.ram_total_bytes)
        near = ram <= RAM_TOLERANCE * max(self.ram_total_bytes, other.ram_total_bytes)
        return [k for k in ours if ours[k] != theirs[k] and not (k == "ram_total_bytes" and near)]

    def differences(self, other: Fingerprint) -> list[str]:
        """``"field: theirs -> ours"`` for each field where ``other`` differs from this one."""
        ours, theirs = self.to_dict(), other.to_dict()
        return [f"{k}: {theirs[k]!r} -> {ours[k]!r}" for k in ours if ours[k] != theirs[k]]


@dataclasses.dataclass(frozen=True)
class DeviceFigures:
    """What was measured of one compute device (``cpu`` or ``cuda:N``)."""

    name: str
    kind: str
    description: str
    memory: Figure
    matmul: Mapping[str, Figure]
    """FLOP/s of a square matmul, by dtype name (``float32``, ``bfloat16``, ``float16``)."""
    memory_bandwidth: Figure
    op_latency: Figure
    matmul_rows: Mapping[str, Mapping[int, Figure]] = dataclasses.field(default_factory=dict)
    """FLOP/s of a matmul of few rows by a square weight (``[rows, n] @ [n, n]``, the weights
    too large for the caches), by dtype name then rows: a linear layer at a small batch reads
    its weight for few FLOPs and runs far below the square rate. Empty in profiles measured
    before it was."""
    matmul_rows_n: int | None = None
    """The width of ``matmul_rows``' weights (``None`` in profiles that did not record it)."""
    matmul_rows_wide: Mapping[str, Mapping[int, Figure]] = dataclasses.field(default_factory=dict)
    """As ``matmul_rows``, at ``measure.WIDE_ROWS_N``-wide weights (float32 on the host,
    where its square size is narrower): a large model's layers. Empty where not measured."""
    op_latencies: Mapping[str, Figure] = dataclasses.field(default_factory=dict)
    """The fixed cost of each op of the probe whose mean is ``op_latency``, by the name a
    cost graph gives the op (``"addmm.default"``): an attention call or a concatenation
    costs several times a view. Empty where not measured (an accelerator, whose ops are
    timed as a launch), and in profiles measured before it was."""
    op_cold_latency: Figure | None = None
    """What a segment pays beyond its ops' fixed costs the first time it runs a kind of op,
    when the caches hold none of its code and data: the probe graph timed with the caches
    evicted before each call, less its time back to back, over its kinds of op. Between two
    calls of a model the framework's and the user's code and the weights streamed evict
    them, and between two segments of a streamed plan the runtime's work and the reads do
    (on the 2-core development machine a small Llama's graph ran 20% slower so). ``None``
    where not measured (an accelerator, and profiles measured before it was)."""
    attention: Figure | None = None
    """FLOP/s of float32 attention (``scaled_dot_product_attention`` at
    :data:`ATTENTION_SHAPE`, its FLOPs as a cost graph counts them): a fraction of the
    square matmul's rate. ``None`` in profiles measured before it was."""
    attention_tokens: Mapping[int, Figure] = dataclasses.field(default_factory=dict)
    """As ``attention``, by the query's tokens, at :data:`ATTENTION_TOKENS` (the rate at
    :data:`ATTENTION_SHAPE`'s tokens is ``attention``). Empty in profiles measured before
    it was."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "description": self.description,
            "memory": self.memory.to_dict(),
            "matmul": {dtype: fig.to_dict() for dtype, fig in self.matmul.items()},
            "memory_bandwidth": self.memory_bandwidth.to_dict(),
            "op_latency": self.op_latency.to_dict(),
            "matmul_rows": {
                dtype: {str(rows): fig.to_dict() for rows, fig in by_rows.items()}
                for dtype, by_rows in self.matmul_rows.items()
            },
            "matmul_rows_n": self.matmul_rows_n,
            "matmul_rows_wide": {
                dtype: {str(rows): fig.to_dict() for rows, fig in by_rows.items()}
                for dtype, by_rows in self.matmul_rows_wide.items()
            },
            "op_latencies": {op: fig.to_dict() for op, fig in self.op_latencies.items()},
            "op_cold_latency": (
                self.op_cold_latency.to_dict() if self.op_cold_latency is not None else None
            ),
            "attention": self.attention.to_dict() if self.attention is not None else None,
            "attention_tokens": {
                str(tokens): fig.to_dict() for tokens, fig in self.attention_tokens.items()
            },
        }

    @classmethod
    def from_dict(cls, raw: object, where: str) -> DeviceFigures:
        data = _mapping(raw, where)
        matmul = _mapping(_get(data, "matmul", Mapping, where), f"{where}.matmul")
        return cls(
            name=_get(data, "name", str, where),
            kind=_get(data, "kind", str, where),
            description=_get(data, "description", str, where),
            memory=Figure.from_dict(data.get("memory"), f"{where}.memory"),
            matmul={k: Figure.from_dict(v, f"{where}.matmul.{k}") for k, v in matmul.items()},
            memory_bandwidth=Figure.from_dict(
                data.get("memory_bandwidth"), f"{where}.memory_bandwidth"
            ),
            op_latency=Figure.from_dict(data.get("op_latency"), f"{where}.op_latency"),
            matmul_rows=_rows_figures(data.get("matmul_rows", {}), f"{where}.matmul_rows"),
            matmul_rows_n=_get(data, "matmul_rows_n", int, where)
            if data.get("matmul_rows_n") is not None
            else None,
            matmul_rows_wide=_rows_figures(
                data.get("matmul_rows_wide", {}), f"{where}.matmul_rows_wide"
            ),
            op_latencies={
                str(op): Figure.from_dict(fig, f"{where}.op_latencies.{op}")
                for op, fig in _mapping(
                    data.get("op_latencies", {}), f"{where}.op_latencies"
                ).items()
            },
            op_cold_latency=(
                Figure.from_dict(data["op_cold_latency"], f"{where}.op_cold_latency")
                if data.get("op_cold_latency") is not None
                else None
            ),
            attention=(
                Figure.from_dict(data["attention"], f"{where}.attention")
                if data.get("attention") is not None
                else None
            ),
            attention_tokens=_by_count(
                data.get("attention_tokens", {}), f"{where}.attention_tokens", "tokens"
            ),
        )


def _by_count(raw: object, where: str, what: str) -> dict[int, Figure]:
    """Figures by a positive count (``what``: of what, for the message) from their JSON
    form (counts as decimal strings)."""
    figures: dict[int, Figure] = {}
    for count, fig in _mapping(raw, where).items():
        if not (isinstance(count, str) and count.isdigit() and int(count) > 0):
            raise ValueError(f"{where}: {count!r} is not a number of {what}")
        figures[int(count)] = Figure.from_dict(fig, f"{where}.{count}")
    return figures


def _rows_figures(raw: object, where: str) -> dict[str, dict[int, Figure]]:
    """``DeviceFigures.matmul_rows`` from its JSON form (rows as decimal strings)."""
    return {
        str(dtype): _by_count(by_rows, f"{where}.{dtype}", "rows")
        for dtype, by_rows in _mapping(raw, where).items()
    }


@dataclasses.dataclass(frozen=True)
class LinkFigure:
    """Bandwidth of one copy path, e.g. ``h2d pinned`` from ``cpu`` to ``cuda:0``."""

    name: str
    src: str
    dst: str
    bandwidth: Figure

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "src": self.src,
            "dst": self.dst,
            "bandwidth": self.bandwidth.to_dict(),
        }

    @classmethod
    def from_dict(cls, raw: object, where: str) -> LinkFigure:
        data = _mapping(raw, where)
        return cls(
            name=_get(data, "name", str, where),
            src=_get(data, "src", str, where),
            dst=_get(data, "dst", str, where),
            bandwidth=Figure.from_dict(data.get("bandwidth"), f"{where}.bandwidth"),
        )


def _optional(data: Mapping[str, Any], name: str, unit: str, where: str) -> Figure:
    """The figure ``name`` of ``data``, absent where a profile written before it lacks it."""
    if data.get(name) is None:
        return Figure.absent(unit, COMPUTE_SLOWDOWN_NOTE)
    return Figure.from_dict(data[name], f"{where}.{name}")


@dataclasses.dataclass(frozen=True)
class DiskFigures:
    """The disk tier at the offload directory (``path`` is ``None`` when it was not measured)."""

    path: str | None
    free: Figure
    read: Figure
    write: Figure
    latency: Figure
    """Median time of one random 4 KiB read."""
    compute_slowdown: Figure = dataclasses.field(
        default_factory=lambda: Figure.absent("x", COMPUTE_SLOWDOWN_NOTE)
    )
    """How many times longer the host's few-row matmul takes while the disk reader streams
    weights (unit ``x``; at least 1 but for noise)."""
    stream: Figure = dataclasses.field(
        default_factory=lambda: Figure.absent("B/s", COMPUTE_SLOWDOWN_NOTE)
    )
    """The rate of the disk reader's verified reads while the host computes on them, as a
    streamed plan's (``measure.StreamProbe``): what the planner costs reads at."""
    stream_small: Figure = dataclasses.field(
        default_factory=lambda: Figure.absent("B/s", COMPUTE_SLOWDOWN_NOTE)
    )
    """The same stream's rate in reads of ``SMALL_STREAM_BYTES`` (4 MiB), landing in fewer
    buffers: what the planner costs the reads of a plan in row chunks that small at."""
    read_cpu: Figure = dataclasses.field(
        default_factory=lambda: Figure.absent("s", COMPUTE_SLOWDOWN_NOTE)
    )
    """The host's compute a read takes while in flight (``measure.SmallReadProbe``)."""
    read_inline: Figure = dataclasses.field(
        default_factory=lambda: Figure.absent("s", COMPUTE_SLOWDOWN_NOTE)
    )
    """The fixed time of a small read the calling thread makes itself, beyond its bytes at
    the disk's rate (``measure.SmallReadProbe``, ``io.reader.INLINE_READ_BYTES``)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "free": self.free.to_dict(),
            "read": self.read.to_dict(),
            "write": self.write.to_dict(),
            "latency": self.latency.to_dict(),
            "compute_slowdown": self.compute_slowdown.to_dict(),
            "stream": self.stream.to_dict(),
            "stream_small": self.stream_small.to_dict(),
            "read_cpu": self.read_cpu.to_dict(),
            "read_inline": self.read_inline.to_dict(),
        }

    @classmethod
    def from_dict(cls, raw: object, where: str) -> DiskFigures:
        data = _mapping(raw, where)
        return cls(
            path=_get(data, "path", (str, type(None)), where),
            free=Figure.from_dict(data.get("free"), f"{where}.free"),
            read=Figure.from_dict(data.get("read"), f"{where}.read"),
            write=Figure.from_dict(data.get("write"), f"{where}.write"),
            latency=Figure.from_dict(data.get("latency"), f"{where}.latency"),
            compute_slowdown=_optional(data, "compute_slowdown", "x", where),
            stream=_optional(data, "stream", "B/s", where),
            stream_small=_optional(data, "stream_small", "B/s", where),
            read_cpu=_optional(data, "read_cpu", "s", where),
            read_inline=_optional(data, "read_inline", "s", where),
        )

    @classmethod
    def absent(cls, reason: str, path: str | None = None) -> DiskFigures:
        """A disk section with every figure absent for ``reason``."""
        return cls(
            path=path,
            free=Figure.absent("B", reason),
            read=Figure.absent("B/s", reason),
            write=Figure.absent("B/s", reason),
            latency=Figure.absent("s", reason),
            compute_slowdown=Figure.absent("x", reason),
            stream=Figure.absent("B/s", reason),
            stream_small=Figure.absent("B/s", reason),
            read_cpu=Figure.absent("s", reason),
            read_inline=Figure.absent("s", reason),
        )


@dataclasses.dataclass(frozen=True)
class RuntimeFigures:
    """What the runtime's own work between segments costs the calling thread
    (``runtime_work.RuntimeProbe``): a segment's call, a resident parameter's lookup, and
    a streamed parameter's prefetch, wait and evict beyond its read or copy."""

    segment_call: Figure
    resident: Figure
    stream: Figure

    def to_dict(self) -> dict[str, Any]:
        return {
            "segment_call": self.segment_call.to_dict(),
            "resident": self.resident.to_dict(),
            "stream": self.stream.to_dict(),
        }

    @classmethod
    def from_dict(cls, raw: object, where: str) -> RuntimeFigures:
        if raw is None:  # a profile written before these were measured
            return cls.absent(COMPUTE_SLOWDOWN_NOTE)
        data = _mapping(raw, where)
        return cls(
            segment_call=Figure.from_dict(data.get("segment_call"), f"{where}.segment_call"),
            resident=Figure.from_dict(data.get("resident"), f"{where}.resident"),
            stream=Figure.from_dict(data.get("stream"), f"{where}.stream"),
        )

    @classmethod
    def absent(cls, reason: str) -> RuntimeFigures:
        """Every figure absent for ``reason``."""
        return cls(*(Figure.absent("s", reason) for _ in range(3)))


@dataclasses.dataclass(frozen=True)
class Measurements:
    """Everything measured (or assumed, for ``mode="nominal"``) about one host.

    This is the JSON that ``validate-hardware --output`` writes, the cache stores, and
    ``profile=<path>`` loads.
    """

    mode: Mode
    created_at: float
    """Unix time of the measurement."""
    duration: Figure
    load: Figure
    """How busy the CPUs were with other work just before measuring: busy machines measure low."""
    fingerprint: Fingerprint
    devices: tuple[DeviceFigures, ...]
    links: tuple[LinkFigure, ...]
    disk: DiskFigures
    runtime: RuntimeFigures = dataclasses.field(
        default_factory=lambda: RuntimeFigures.absent(COMPUTE_SLOWDOWN_NOTE)
    )
    """The runtime's own work between segments, on the host's calling thread."""
    revision: int = METHODS_REVISION
    """The :data:`METHODS_REVISION` the figures were measured by."""

    def device(self, name: str) -> DeviceFigures | None:
        return next((d for d in self.devices if d.name == name), None)

    def link(self, name: str, src: str, dst: str) -> LinkFigure | None:
        return next(
            (lk for lk in self.links if (lk.name, lk.src, lk.dst) == (name, src, dst)), None
        )

    def to_dict(self) -> dict[str, Any]:
        created = datetime.datetime.fromtimestamp(self.created_at, tz=datetime.timezone.utc)
        return {
            "format_version": FORMAT_VERSION,
            "methods_revision": self.revision,
            "mode": self.mode,
            "created_at": created.isoformat(),
            "duration": self.duration.to_dict(),
            "load": self.load.to_dict(),
            "fingerprint": self.fingerprint.to_dict(),
            "devices": [d.to_dict() for d in self.devices],
            "links": [lk.to_dict() for lk in self.links],
            "disk": self.disk.to_dict(),
            "runtime": self.runtime.to_dict(),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, raw: object) -> Measurements:
        """Parse the JSON form; raises ``ValueError`` naming the first bad key."""
        data = _mapping(raw, "profile")
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise ValueError(
                f"format_version is {version!r}; this TensorTorrent reads version {FORMAT_VERSION}"
            )
        mode = _get(data, "mode", str, "profile")
        if mode not in get_args(Mode):
            raise ValueError(f"profile.mode: {mode!r} is not one of {get_args(Mode)}")
        try:
            created = datetime.datetime.fromisoformat(_get(data, "created_at", str, "profile"))
            created_at = created.timestamp()
        except ValueError as exc:
            raise ValueError(f"profile.created_at: {exc}") from None
        return cls(
            mode=cast(Mode, mode),
            created_at=created_at,
            duration=Figure.from_dict(data.get("duration"), "profile.duration"),
            load=Figure.from_dict(data.get("load"), "profile.load"),
            fingerprint=Fingerprint.from_dict(data.get("fingerprint"), "profile.fingerprint"),
            devices=tuple(
                DeviceFigures.from_dict(d, f"profile.devices[{i}]")
                for i, d in enumerate(_get(data, "devices", list, "profile"))
            ),
            links=tuple(
                LinkFigure.from_dict(lk, f"profile.links[{i}]")
                for i, lk in enumerate(_get(data, "links", list, "profile"))
            ),
            disk=DiskFigures.from_dict(data.get("disk"), "profile.disk"),
            runtime=RuntimeFigures.from_dict(data.get("runtime"), "profile.runtime"),
            revision=_get(data, "methods_revision", int, "profile")
            if "methods_revision" in data
            else 1,
        )

    @classmethod
    def from_json(cls, text: str) -> Measurements:
        """Parse JSON text; raises ``ValueError`` (``json.JSONDecodeError`` included)."""
        try:
            data = json.loads(text)
        except RecursionError:
            raise ValueError("the JSON is nested too deeply to be a profile") from None
        return cls.from_dict(data)
