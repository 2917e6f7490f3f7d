"""Loading of the compiled planner extension, with a clear error when it is missing."""

from __future__ import annotations

import functools
from types import ModuleType

from .errors import NativePlannerUnavailable


@functools.cache
def native_planner() -> ModuleType:
    """The compiled planner extension, or a clear error saying how to build it."""
    try:
        from . import _planner
    except ImportError as exc:
        raise NativePlannerUnavailable(
            f"the native planner (tensortorrent_dynamo._planner) is not built: {exc}. "
            "Build it with `pip install -e .` (needs a Rust toolchain) or `make demo`."
        ) from exc
    return _planner
