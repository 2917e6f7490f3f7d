"""The profile cache: one JSON file per hardware fingerprint in the user cache directory."""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from pathlib import Path

from ..io.files import write_text
from .disk import writable_problem
from .measure import BUDGETS, SHORT_NOTE, dtype_name
from .schema import COMPUTE_SLOWDOWN_NOTE, METHODS_REVISION, Fingerprint, Measurements

CACHE_DIR_ENV = "TENSORTORRENT_CACHE_DIR"
_PREFIX = "host-profile-"


def cache_dir() -> Path:
    """``$TENSORTORRENT_CACHE_DIR``, else ``$XDG_CACHE_HOME/tensortorrent``, else
    ``~/.cache/tensortorrent``."""
    override = os.environ.get(CACHE_DIR_ENV)
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "tensortorrent"


def default_offload_dir() -> Path:
    """Where offloaded weights and the disk benchmark go unless told otherwise."""
    return cache_dir() / "offload"


def fallback_offload_dir() -> Path:
    """The offload directory to use when the default one cannot be written."""
    return Path(tempfile.gettempdir()) / "tensortorrent" / "offload"


def measured_offload_dir() -> tuple[Path, str | None]:
    """Where to measure the disk unless told: the default offload directory, or the fallback
    one when the default cannot be written (then also why not)."""
    offload = default_offload_dir()
    problem = writable_problem(offload)
    return (fallback_offload_dir(), problem) if problem else (offload, None)


def profile_path(fingerprint: Fingerprint) -> Path:
    """The cache file for the hardware ``fingerprint`` identifies."""
    return cache_dir() / f"{_PREFIX}{fingerprint.digest()}.json"


@dataclasses.dataclass(frozen=True)
class CacheLookup:
    """The result of looking for this machine's cached profile.

    ``measurements`` is set when a usable one was found; otherwise ``problem`` says why not
    and ``suspicious`` whether the user should hear about it (a corrupt file or one from
    other hardware, as opposed to nothing cached yet).
    """

    path: Path
    measurements: Measurements | None
    problem: str = ""
    suspicious: bool = False


def _other_hardware(fingerprint: Fingerprint, path: Path) -> CacheLookup:
    others = sorted(
        (p for p in cache_dir().glob(f"{_PREFIX}*.json") if p != path),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for other in others[:1]:
        try:
            theirs = Measurements.from_json(other.read_text()).fingerprint
        except (OSError, ValueError):
            continue
        diffs = "; ".join(fingerprint.differences(theirs))
        problem = f"the cached profile {other} was measured on other hardware ({diffs})"
        return CacheLookup(path, None, problem, suspicious=True)
    return CacheLookup(path, None, f"no cached profile at {path}")


def lookup(fingerprint: Fingerprint) -> CacheLookup:
    """Find the cached profile measured on hardware with this ``fingerprint``."""
    path = profile_path(fingerprint)
    if not path.exists():
        return _other_hardware(fingerprint, path)
    try:
        measurements = Measurements.from_json(path.read_text())
    except (OSError, ValueError) as exc:
        return CacheLookup(path, None, f"the cached profile {path} is unreadable ({exc})", True)
    if measurements.fingerprint != fingerprint:
        diffs = "; ".join(fingerprint.differences(measurements.fingerprint))
        problem = f"the cached profile {path} was measured on other hardware ({diffs})"
        return CacheLookup(path, None, problem, suspicious=True)
    if measurements.mode == "short" and measurements.revision < METHODS_REVISION:
        problem = (
            f"the cached profile {path} was measured by older methods (revision "
            f"{measurements.revision}, now {METHODS_REVISION})"
        )
        return CacheLookup(path, None, problem)
    missing = _missing_dtypes(measurements)
    if missing:
        problem = (
            f"the cached profile {path} has no CPU {', '.join(missing)} matmul rate "
            "(measured before the short profile measured it)"
        )
        return CacheLookup(path, None, problem)
    if _missing_rows(measurements):
        problem = (
            f"the cached profile {path} has no CPU matmul rates by rows "
            "(measured before the short profile measured them)"
        )
        return CacheLookup(path, None, problem)
    if _missing_disk(measurements):
        problem = (
            f"the cached profile {path} has no disk figures, or none of how compute slows "
            "while the disk reads (measured before the short profile measured them)"
        )
        return CacheLookup(path, None, problem)
    busy = _busy(measurements)
    if busy:
        problem = f"the cached profile {path} {busy}"
        return CacheLookup(path, None, problem, suspicious=True)
    return CacheLookup(path, measurements)


def _missing_dtypes(measurements: Measurements) -> list[str]:
    """The dtypes a short profile measures the CPU's matmul rate in that ``measurements``,
    a cached short profile, has no figure for, or lists as not measured."""
    cpu = measurements.device("cpu")
    if measurements.mode != "short" or cpu is None:
        return []
    names = [dtype_name(d) for d in BUDGETS["short"].dtypes]
    # an older short profile lists the dtype as not measured (a failed one has another note)
    return [n for n in names if n not in cpu.matmul or cpu.matmul[n].note == SHORT_NOTE]


def _missing_rows(measurements: Measurements) -> bool:
    """Whether ``measurements``, a cached short profile, lacks the CPU's matmul rates by rows
    (a profile measured before they were)."""
    cpu = measurements.device("cpu")
    return measurements.mode == "short" and cpu is not None and not cpu.matmul_rows


def _missing_disk(measurements: Measurements) -> bool:
    """Whether ``measurements``, a cached short profile, lacks the disk, or how compute
    slows while it reads, because short profiles did not measure them then."""
    disk = measurements.disk
    old = disk.read.note == SHORT_NOTE or (
        disk.read.value is not None and disk.compute_slowdown.note == COMPUTE_SLOWDOWN_NOTE
    )
    return measurements.mode == "short" and old


def _busy(measurements: Measurements) -> str:
    """Why a cached short profile should be measured again because other work was running
    when it was measured (its figures may be low), or ``""``. A profile the user measured
    with ``validate-hardware`` is theirs to keep."""
    load = measurements.load
    if measurements.mode != "short" or load.value is None or not load.note:
        return ""
    return f"was measured while other work used {load.value:.0f}% of the CPUs"


def save(measurements: Measurements) -> Path:
    """Write ``measurements`` as the cached profile of their fingerprint; returns the path.

    The file is replaced atomically, so a reader never sees half of it. Raises ``OSError``.
    """
    path = profile_path(measurements.fingerprint)
    write_text(path, measurements.to_json())
    return path


def age_text(created_at: float) -> str:
    """``"3 h"``: how long ago ``created_at`` (unix time) was, in a unit a reader expects."""
    seconds = max(0.0, time.time() - created_at)
    for unit, size in (("days", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"
