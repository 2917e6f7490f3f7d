"""Parsing and printing of byte sizes, bandwidths and rates."""

from __future__ import annotations

import math
import re

from .errors import BudgetParseError

_BYTE_UNITS: dict[str, int] = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
VALID_BYTE_UNITS = ("B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB")
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*$")


def parse_bytes(value: object, what: str = "size") -> int:
    """Parse ``value`` (an int, or a string such as ``"64MiB"`` or ``"1.5 GB"``) into bytes.

    KB/MB/GB are powers of 1000, KiB/MiB/GiB powers of 1024. A bare number is bytes.
    """
    if isinstance(value, bool):
        raise BudgetParseError(f"{what}: expected a byte count, got the bool {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise BudgetParseError(f"{what}: a byte count cannot be negative, got {value}")
        return value
    if isinstance(value, float):
        if not 0 <= value < math.inf:
            raise BudgetParseError(f"{what}: expected a finite byte count >= 0, got {value!r}")
        return int(value)
    if not isinstance(value, str):
        raise BudgetParseError(
            f"{what}: expected an int or a string like '64MiB', got {type(value).__name__}"
        )
    match = _SIZE_RE.match(value)
    unit = match.group(2).lower() if match else ""
    if match is None or (unit and unit not in _BYTE_UNITS):
        raise BudgetParseError(
            f"{what}: cannot parse {value!r} as a size; write a number followed by one of "
            f"{', '.join(VALID_BYTE_UNITS)} (e.g. '64MiB', '1.5GB') or give an int of bytes"
        )
    size = float(match.group(1)) * _BYTE_UNITS[unit or "b"]
    if not size < math.inf:
        raise BudgetParseError(f"{what}: {value!r} is too large to be a size")
    return int(size)


def parse_rate(value: object, what: str = "rate") -> float:
    """Parse a positive rate: a number, or a string with an SI suffix (``"2.5T"``, ``"8G"``).

    Byte units are accepted too, so a bandwidth may be written ``"16GB"`` (per second).
    """
    if isinstance(value, bool):
        raise BudgetParseError(f"{what}: expected a positive number, got {value!r}")
    if isinstance(value, (int, float)):
        try:
            rate = float(value)
        except OverflowError:  # an int beyond any float
            rate = math.inf
    elif isinstance(value, str):
        text = value.strip().removesuffix("/s")
        si = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}
        if text and text[-1].lower() in si and text[:-1].replace(".", "", 1).isdigit():
            rate = float(text[:-1]) * si[text[-1].lower()]
        else:
            try:
                rate = float(parse_bytes(text, what))
            except BudgetParseError:
                raise BudgetParseError(
                    f"{what}: cannot parse {value!r}; give a number, an SI suffix "
                    "(k, M, G, T, P: '2.5T') or bytes per second ('16GB', '16GB/s')"
                ) from None
    else:
        raise BudgetParseError(f"{what}: expected a number or string, got {type(value).__name__}")
    if not 0 < rate < math.inf:
        raise BudgetParseError(f"{what}: must be positive and finite, got {value!r}")
    return rate


def format_bytes(n: float) -> str:
    """``1536`` → ``'1.50 KiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} B" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_seconds(s: float) -> str:
    """Seconds in the unit a reader expects (us, ms or s), in ASCII."""
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.3f} s"


def format_rate(r: float, unit: str) -> str:
    """``2.5e12, 'FLOP/s'`` → ``'2.50 TFLOP/s'``."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if r >= scale:
            return f"{r / scale:.2f} {prefix}{unit}"
    return f"{r:.2f} {unit}"
