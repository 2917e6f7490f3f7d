"""Which profile the planner uses: cached measurements (``"auto"``), nominal rates, or a file."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

import psutil

from ..errors import OptionsError
from ..settings import Settings
from ..units import format_rate
from . import cache
from .detect import cuda_properties, current_fingerprint, detect_cuda_devices
from .host import (
    NOMINAL_CPU_FLOPS,
    NOMINAL_CPU_LATENCY_S,
    NOMINAL_CUDA_FLOPS,
    NOMINAL_CUDA_LATENCY_S,
    NOMINAL_CUDA_LINK_BYTES_PER_S,
    DeviceProfile,
    HostProfile,
)
from .measure import DTYPES, dtype_name, links_without_cuda, measure_host
from .schema import DeviceFigures, DiskFigures, Figure, LinkFigure, Measurements, RuntimeFigures

log = logging.getLogger(__name__)

_NOMINAL = "nominal: a built-in rate, not measured"
_NOT_NOMINAL = "the nominal profile has no figure for this"

# The profile this process measured, by cache path, with the text it cached: a process
# measures its host once, also where the cache could not keep it, or keeps it but judges it
# suspicious when read back (measured while other work used the CPUs: measured again at each
# new graph, each took ~20 s, on a machine no less busy). A cached file that is no longer the
# one this process wrote is judged as any other.
_measured_here: dict[str, tuple[Measurements, str]] = {}


def _ours(path: Path) -> Measurements | None:
    """The profile this process measured and cached at ``path``, if the file there is still
    the one it wrote (or none is there: the cache could not keep it)."""
    here = _measured_here.get(str(path))
    if here is None:
        return None
    try:
        same = path.read_text() == here[1]
    except OSError:
        same = not path.exists()
    return here[0] if same else None


def _nominal_device(name: str) -> DeviceFigures:
    if name == "cpu":
        memory = Figure(float(psutil.virtual_memory().total), "B", "psutil.virtual_memory().total")
        flops, latency, description = NOMINAL_CPU_FLOPS, NOMINAL_CPU_LATENCY_S, "host CPU"
    else:
        description, total = cuda_properties(name)
        index = name.split(":")[1]
        memory = Figure(
            float(total), "B", f"torch.cuda.get_device_properties({index}).total_memory"
        )
        flops, latency = NOMINAL_CUDA_FLOPS, NOMINAL_CUDA_LATENCY_S
    matmul = {dtype_name(dt): Figure.absent("FLOP/s", _NOT_NOMINAL) for dt in DTYPES}
    matmul["float32"] = Figure(flops, "FLOP/s", _NOMINAL)
    return DeviceFigures(
        name=name,
        kind="cpu" if name == "cpu" else "cuda",
        description=description,
        memory=memory,
        matmul=matmul,
        memory_bandwidth=Figure.absent("B/s", _NOT_NOMINAL),
        op_latency=Figure(latency, "s", _NOMINAL),
    )


def nominal_measurements() -> Measurements:
    """The built-in rates for this machine's devices, in the measured profile's form."""
    cuda = detect_cuda_devices()
    links = links_without_cuda() if not cuda else []
    for dev in cuda:
        rate = Figure(NOMINAL_CUDA_LINK_BYTES_PER_S, "B/s", _NOMINAL)
        links += [
            LinkFigure("h2d pinned", "cpu", dev, rate),
            LinkFigure("d2h pinned", dev, "cpu", rate),
        ]
    return Measurements(
        mode="nominal",
        created_at=time.time(),
        duration=Figure(0.0, "s", "nothing was measured"),
        load=Figure.absent("%", "nothing was measured"),
        fingerprint=current_fingerprint(),
        devices=tuple(_nominal_device(name) for name in ["cpu", *cuda]),
        links=tuple(links),
        disk=DiskFigures.absent(_NOT_NOMINAL),
        runtime=RuntimeFigures.absent(_NOT_NOMINAL),
    )


def nominal_profile() -> HostProfile:
    """This machine's devices with the built-in nominal rates (``profile="nominal"``)."""
    return HostProfile.from_measurements(nominal_measurements(), "nominal")


def load_profile_file(path: Path) -> HostProfile:
    """The profile in the JSON file at ``path`` (``profile="<path>"``).

    Raises :class:`OptionsError` when the file cannot be read or is not a profile.
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise OptionsError(f"option 'profile': cannot read {path} ({exc.strerror})") from None
    try:  # UnicodeDecodeError is a ValueError too
        profile = HostProfile.from_json(raw.decode(), source=str(path))
    except ValueError as exc:
        raise OptionsError(
            f"option 'profile': {path} is not a TensorTorrent host profile ({exc}); write one "
            f"with `tensortorrent validate-hardware --output {path}`"
        ) from None
    assert profile.measurements is not None
    diffs = current_fingerprint().differences(profile.measurements.fingerprint)
    if diffs:
        log.warning(
            "profile file %s was measured on other hardware (%s); planning with it as asked",
            path,
            "; ".join(diffs),
        )
    return profile


def auto_profile() -> HostProfile:
    """The cached measured profile of this machine, measuring a short one on first use."""
    fingerprint = current_fingerprint()
    found = cache.lookup(fingerprint)
    if found.measurements is not None:
        age = cache.age_text(found.measurements.created_at)
        return HostProfile.from_measurements(
            found.measurements, f"measured (cached {found.path}, {age} old)"
        )
    ours = _ours(found.path)
    if ours is not None:
        return HostProfile.from_measurements(ours, "measured now")
    if found.suspicious:
        log.warning("%s; measuring this machine again", found.problem)
    else:
        log.info("%s", found.problem)
    offload, problem = cache.measured_offload_dir()
    if problem:
        log.info("%s; measuring the disk at %s instead", problem, offload)
    log.info(
        "measuring a short host profile (CPU float32 and bfloat16 matmul, square and by rows, "
        "memory bandwidth, per-op cost, the disk at %s)",
        offload,
    )
    started = time.perf_counter()
    measured = measure_host("short", offload)
    _measured_here[str(found.path)] = (measured, measured.to_json())
    profile = HostProfile.from_measurements(measured, "measured now")
    log.info(
        "measured the host profile in %.1f s: cpu %s, disk read %s; run "
        "`tensortorrent validate-hardware` for every device, dtype and link",
        time.perf_counter() - started,
        format_rate(profile.device("cpu").flops_per_s, "FLOP/s"),
        format_rate(profile.disk_read_bytes_per_s, "B/s")
        if profile.disk_read_bytes_per_s
        else f"not measured ({measured.disk.read.note})",
    )
    try:
        log.info("cached the host profile at %s", cache.save(measured))
    except OSError as exc:
        log.warning(
            "could not cache the host profile in %s (%s); set %s to a writable directory",
            cache.cache_dir(),
            exc.strerror or exc,
            cache.CACHE_DIR_ENV,
        )
    return HostProfile.from_measurements(measured, "measured now")


def _virtual_devices(settings: Settings) -> list[DeviceProfile]:
    devices = []
    for name in sorted(settings.virtual_devices, key=lambda n: int(n.split(":")[1])):
        spec = settings.virtual_devices[name]
        devices.append(
            DeviceProfile(
                name=name,
                kind="virtual",
                memory_bytes=spec.capacity_bytes,
                flops_per_s=spec.flops_per_s,
                h2d_bytes_per_s=spec.link_bytes_per_s,
                d2h_bytes_per_s=spec.link_bytes_per_s,
                latency_s=spec.latency_s,
            )
        )
    return devices


def check_devices_exist(settings: Settings) -> None:
    """Raise :class:`OptionsError` when ``budgets`` or ``devices`` names a device that this
    machine does not have (virtual accelerators exist by being declared)."""
    present = ["cpu", *detect_cuda_devices(), *sorted(settings.virtual_devices)]
    for option, names in (("budgets", settings.budgets), ("devices", settings.devices or ())):
        absent = [name for name in names if name not in present]
        if absent:
            raise OptionsError(
                f"option {option!r} names {', '.join(map(repr, absent))}, which this machine "
                f"does not have; the devices here are {', '.join(map(repr, present))}. A "
                "virtual accelerator ('virtual:N') is declared by giving it a budget"
            )


def host_profile(
    settings: Settings, given: Measurements | None = None, source: str = ""
) -> HostProfile:
    """Build the profile the planner uses for ``settings`` (host first, then CUDA, then virtual).

    ``settings.profile`` picks the figures: ``"auto"`` (cached measurements, measured on
    first use), ``"nominal"`` (built-in rates) or the path of a profile file; ``given``
    figures (a saved plan's, said to come from ``source``) are taken instead. Virtual
    devices are declared by the settings, never measured. Raises :class:`OptionsError` when
    the settings name a device this machine does not have.
    """
    check_devices_exist(settings)
    if given is not None:
        base = HostProfile.from_measurements(given, source)
    elif settings.profile == "nominal":
        base = nominal_profile()
    elif settings.profile == "auto":
        base = auto_profile()
    else:
        base = load_profile_file(Path(settings.profile))
    real = tuple(d for d in base.devices if d.kind != "virtual")
    return dataclasses.replace(base, devices=real + tuple(_virtual_devices(settings)))
