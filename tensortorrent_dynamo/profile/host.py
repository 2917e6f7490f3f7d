"""The profile the planner reads: one :class:`DeviceProfile` per device, the host first."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any, Literal

import psutil

from ..io.reader import READ_HANDOFF_S
from .schema import (
    ATTENTION_SHAPE,
    INLINE_PROBE_BYTES,
    SMALL_STREAM_BYTES,
    WIDE_ROWS_N,
    Figure,
    Measurements,
)

DeviceKind = Literal["cpu", "cuda", "virtual"]

# Nominal rates, used when nothing was measured. They only need to rank plans sensibly.
NOMINAL_CPU_FLOPS = 5e10
NOMINAL_CPU_LATENCY_S = 5e-6
NOMINAL_CUDA_FLOPS = 5e13
NOMINAL_CUDA_LINK_BYTES_PER_S = 2.5e10
NOMINAL_CUDA_LATENCY_S = 1e-5
NOMINAL_DISK_READ_BYTES_PER_S = 1e9
# The disk's latency for one read where the profile did not measure it (a random 4 KiB
# read; 0.04 ms on the 2-core development machine's virtual disk).
NOMINAL_DISK_LATENCY_S = 1e-4

_DEVICE_NAME = {"cpu": re.compile("cpu"), "cuda": re.compile("cuda:[0-9]+")}
"""The name a device of each kind the planner reads has in a profile."""


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """One compute device as the planner sees it.

    ``h2d``/``d2h`` rates are the link between host RAM and this device (infinite for the
    host). ``flops_per_s`` is the float32 matmul rate; ``flops_by_dtype`` holds every
    dtype that was measured, and ``memory_bandwidth_bytes_per_s`` the device memory's
    copy bandwidth (``None`` when not measured).
    """

    name: str
    kind: DeviceKind
    memory_bytes: int
    flops_per_s: float
    h2d_bytes_per_s: float
    d2h_bytes_per_s: float
    latency_s: float
    flops_by_dtype: Mapping[str, float] = dataclasses.field(default_factory=dict, hash=False)
    memory_bandwidth_bytes_per_s: float | None = None
    flops_by_rows: Mapping[str, Mapping[int, float]] = dataclasses.field(
        default_factory=dict, hash=False
    )
    """The measured rate of a matmul of few rows, by dtype then rows
    (``DeviceFigures.matmul_rows``); the planner interpolates it (``plan.planner.node_rate``)."""
    rows_width: int | None = None
    """The width of the weights ``flops_by_rows`` was measured with."""
    flops_by_rows_wide: Mapping[int, Mapping[str, Mapping[int, float]]] = dataclasses.field(
        default_factory=dict, hash=False
    )
    """Rates of few-row matmuls by wider weights than ``rows_width``: by width, dtype, rows
    (``DeviceFigures.matmul_rows_wide``)."""
    latency_by_op: Mapping[str, float] = dataclasses.field(default_factory=dict, hash=False)
    """The measured fixed cost of an op, by the name a cost graph gives it
    (``DeviceFigures.op_latencies``); an op it does not list costs ``latency_s``."""
    attention_flops_per_s: float | None = None
    """The measured rate of float32 attention (``DeviceFigures.attention``); ``None``:
    attention is costed at ``flops_per_s``."""
    attention_by_tokens: Mapping[int, float] = dataclasses.field(default_factory=dict, hash=False)
    """The measured rates of float32 attention by the query's tokens (``attention`` at
    ``ATTENTION_SHAPE``'s tokens and ``DeviceFigures.attention_tokens``); the planner
    interpolates them (``plan.planner.attention_rate``). Empty where only one was measured."""
    cold_latency_s: float = 0.0
    """What a segment pays beyond its ops' fixed costs the first time it runs a kind of op,
    its code and data evicted from the caches since (``DeviceFigures.op_cold_latency``; 0
    where not measured; the native planner adds it, knowing the segments)."""

    @property
    def is_host(self) -> bool:
        return self.kind == "cpu"


def _value(figure_value: float | None, fallback: float) -> float:
    return fallback if figure_value is None else figure_value


def _measured_by_rows(
    figures: Mapping[str, Mapping[int, Figure]],
) -> dict[str, dict[int, float]]:
    """Few-row matmul figures by dtype and rows as the rates measured (a dtype with none
    left out)."""
    rates = {
        dtype: {rows: f.value for rows, f in by_rows.items() if f.value is not None}
        for dtype, by_rows in figures.items()
    }
    return {dtype: table for dtype, table in rates.items() if table}


def _device_from(m: Measurements, name: str) -> DeviceProfile:
    dev = m.device(name)
    if dev is None:
        raise ValueError(f"profile has no device {name!r}")
    flops = {dtype: f.value for dtype, f in dev.matmul.items() if f.value is not None}
    by_rows = _measured_by_rows(dev.matmul_rows)
    by_op = {op: f.value for op, f in dev.op_latencies.items() if f.value is not None}
    cold = dev.op_cold_latency.value if dev.op_cold_latency is not None else None
    wide = _measured_by_rows(dev.matmul_rows_wide)
    attention = dev.attention.value if dev.attention is not None else None
    by_tokens = {t: f.value for t, f in dev.attention_tokens.items() if f.value is not None}
    shared: dict[str, Any] = {
        "attention_flops_per_s": attention,
        "attention_by_tokens": (
            {**by_tokens, ATTENTION_SHAPE[2]: attention} if by_tokens and attention else {}
        ),
        "rows_width": dev.matmul_rows_n,
        "flops_by_rows_wide": {WIDE_ROWS_N: wide} if wide and dev.matmul_rows_n else {},
    }
    if dev.kind == "cpu":
        return DeviceProfile(
            name=name,
            kind="cpu",
            # The host's capacity is what is free now, not what was free when measured.
            memory_bytes=int(psutil.virtual_memory().available),
            flops_per_s=flops.get("float32", NOMINAL_CPU_FLOPS),
            h2d_bytes_per_s=float("inf"),
            d2h_bytes_per_s=float("inf"),
            latency_s=_value(dev.op_latency.value, NOMINAL_CPU_LATENCY_S),
            flops_by_dtype=flops,
            memory_bandwidth_bytes_per_s=dev.memory_bandwidth.value,
            flops_by_rows=by_rows,
            latency_by_op=by_op,
            cold_latency_s=cold or 0.0,
            **shared,
        )
    h2d, d2h = m.link("h2d pinned", "cpu", name), m.link("d2h pinned", name, "cpu")
    return DeviceProfile(
        name=name,
        kind="cuda",
        memory_bytes=int(_value(dev.memory.value, 0)),
        flops_per_s=flops.get("float32", NOMINAL_CUDA_FLOPS),
        h2d_bytes_per_s=_value(h2d.bandwidth.value if h2d else None, NOMINAL_CUDA_LINK_BYTES_PER_S),
        d2h_bytes_per_s=_value(d2h.bandwidth.value if d2h else None, NOMINAL_CUDA_LINK_BYTES_PER_S),
        latency_s=_value(dev.op_latency.value, NOMINAL_CUDA_LATENCY_S),
        flops_by_dtype=flops,
        memory_bandwidth_bytes_per_s=dev.memory_bandwidth.value,
        flops_by_rows=by_rows,
        latency_by_op=by_op,
        **shared,
    )


@dataclasses.dataclass(frozen=True)
class HostProfile:
    """The devices of this machine, the host first, and where the figures came from.

    ``source`` is ``"nominal"``, ``"measured now"``, ``"measured (cached <path>, <age>)"``
    or the path of a profile file. ``measurements`` holds every figure with its unit and
    method; virtual devices are declared by the settings, so they are in ``devices`` only.
    """

    devices: tuple[DeviceProfile, ...]
    source: str
    measurements: Measurements | None = dataclasses.field(default=None, hash=False)

    def device(self, name: str) -> DeviceProfile:
        for dev in self.devices:
            if dev.name == name:
                return dev
        seen = ", ".join(d.name for d in self.devices)
        raise KeyError(f"device {name!r} is not on this machine (devices seen: {seen})")

    @property
    def disk_read_bytes_per_s(self) -> float | None:
        """Sequential read bandwidth at the offload directory, if measured."""
        return self.measurements.disk.read.value if self.measurements else None

    @property
    def disk_stream_bytes_per_s(self) -> float | None:
        """The rate of the disk reader's verified reads while the host computes on them, as
        a streamed plan's (``disk.stream``), if measured."""
        return self.measurements.disk.stream.value if self.measurements else None

    @property
    def disk_stream_small_bytes_per_s(self) -> float | None:
        """The same stream's rate in 4 MiB reads (``disk.stream_small``), if measured."""
        return self.measurements.disk.stream_small.value if self.measurements else None

    def disk_read_rate(self, chunk_bytes: int | None = None) -> tuple[float, str]:
        """The rate the planner costs a plan's disk reads at, and which figure it is: for a
        plan whose large weights are read in row chunks of at most ``chunk_bytes``
        (``None``: whole), those of at most ``SMALL_STREAM_BYTES`` at the small stream's
        (``disk.stream_small``) where measured, any other at
        :attr:`planned_disk_read_bytes_per_s`."""
        small = self.disk_stream_small_bytes_per_s
        if small and chunk_bytes is not None and chunk_bytes <= SMALL_STREAM_BYTES:
            return small, (
                "profile disk.stream_small: the reader's verified reads of 4 MiB while the "
                "host computes"
            )
        return self.planned_disk_read_bytes_per_s, self.planned_disk_read_source

    @property
    def planned_disk_read_bytes_per_s(self) -> float:
        """The disk read rate the planner costs reads at: the reader's while the host
        computes (``disk.stream``), else the disk's own (``disk.read``), else the nominal
        1 GB/s."""
        return (
            self.disk_stream_bytes_per_s
            or self.disk_read_bytes_per_s
            or NOMINAL_DISK_READ_BYTES_PER_S
        )

    @property
    def planned_disk_read_source(self) -> str:
        """Which figure :attr:`planned_disk_read_bytes_per_s` is."""
        if self.disk_stream_bytes_per_s:
            return "profile disk.stream: the reader's verified reads while the host computes"
        if self.disk_read_bytes_per_s:
            return "profile disk.read: the disk's own rate"
        return "nominal: the disk was not measured"

    @property
    def disk_write_bytes_per_s(self) -> float | None:
        """Sequential write bandwidth at the offload directory, if measured."""
        return self.measurements.disk.write.value if self.measurements else None

    @property
    def disk_latency_s(self) -> float | None:
        """Time of one random 4 KiB read at the offload directory, if measured."""
        return self.measurements.disk.latency.value if self.measurements else None

    @property
    def compute_slowdown_while_reading(self) -> float:
        """How many times longer the host's compute takes while the disk reader streams
        weights (``disk.compute_slowdown``): measured, at least 1 (a figure under 1 is the
        noise of an unslowed machine), else 1."""
        value = self.measurements.disk.compute_slowdown.value if self.measurements else None
        return max(1.0, value) if value else 1.0

    @property
    def request_latency_s(self) -> float:
        """The disk's own latency: the measured time of a random 4 KiB read, else the
        nominal 0.1 ms."""
        measured = self.disk_latency_s
        return NOMINAL_DISK_LATENCY_S if measured is None else measured

    @property
    def planned_disk_latency_s(self) -> float:
        """The fixed cost of a disk read that the planner uses (less what the transfer of a
        read queued before it hides): the disk's latency (``request_latency_s``) plus what
        the reader's hand-offs cost a read (``io.reader.READ_HANDOFF_S``)."""
        return self.request_latency_s + READ_HANDOFF_S

    @property
    def read_cpu_s(self) -> float:
        """Seconds of the host's compute a disk read takes while in flight
        (``disk.read_cpu``): measured, else 0 (not modelled)."""
        value = self.measurements.disk.read_cpu.value if self.measurements else None
        return max(0.0, value) if value else 0.0

    @property
    def inline_read_s(self) -> float:
        """The fixed cost of a read the calling thread makes itself (a tensor of at most
        ``io.reader.INLINE_READ_BYTES``), beyond its bytes at the planned rate: the measured
        time of such a verified read (``disk.read_inline``) less its bytes at that rate,
        else the disk's latency (``request_latency_s``)."""
        value = self.measurements.disk.read_inline.value if self.measurements else None
        if value:
            return max(0.0, value - INLINE_PROBE_BYTES / self.planned_disk_read_bytes_per_s)
        return self.request_latency_s

    @property
    def runtime_work_s(self) -> tuple[float, float, float]:
        """What the runtime's own work between segments costs the calling thread: a
        segment's call, a resident parameter's lookup, and a streamed parameter's prefetch,
        wait and evict beyond its read (``runtime.segment_call``, ``runtime.resident``,
        ``runtime.stream``), each as measured, else 0 (not modelled)."""
        if self.measurements is None:
            return (0.0, 0.0, 0.0)
        work = self.measurements.runtime
        call, resident, stream = (
            max(0.0, f.value or 0.0) for f in (work.segment_call, work.resident, work.stream)
        )
        return call, resident, stream

    @classmethod
    def from_measurements(cls, m: Measurements, source: str) -> HostProfile:
        """The planner's view of ``m``: float32 FLOP/s, pinned link rates, host RAM free now.

        Rates ``m`` lacks (for example CUDA links in a short profile) take nominal values.
        """
        names = [d.name for d in m.devices if d.kind in ("cpu", "cuda")]
        if "cpu" not in names:
            raise ValueError("profile has no 'cpu' device")
        for dev in m.devices:
            if dev.kind in ("cpu", "cuda") and not _DEVICE_NAME[dev.kind].fullmatch(dev.name):
                raise ValueError(f"profile has a {dev.kind} device named {dev.name!r}")
        cuda = sorted((n for n in names if n != "cpu"), key=lambda n: int(n.split(":")[1]))
        devices = tuple(_device_from(m, n) for n in ["cpu", *cuda])
        return cls(devices=devices, source=source, measurements=m)

    def to_dict(self) -> dict[str, Any]:
        """The versioned JSON form (the measurements); virtual devices are not part of it."""
        if self.measurements is None:
            raise ValueError("this HostProfile was built by hand and has no measurements")
        return self.measurements.to_dict()

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, raw: object, source: str) -> HostProfile:
        """Read the JSON form; raises ``ValueError`` naming the first bad key."""
        return cls.from_measurements(Measurements.from_dict(raw), source)

    @classmethod
    def from_json(cls, text: str, source: str) -> HostProfile:
        """Read the JSON text; raises ``ValueError`` naming the first bad key."""
        return cls.from_measurements(Measurements.from_json(text), source)
