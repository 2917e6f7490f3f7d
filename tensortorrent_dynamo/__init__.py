"""TensorTorrent: a torch.compile backend that plans heterogeneous execution on one machine.

``torch.compile(model, backend="tensortorrent", options={...})`` or
``tt.compile(model, example_inputs=(x,), budgets={...})``.

The public names load on first use: torch imports ``tensortorrent_dynamo._logs``
while ``import torch`` is still running, so this package must import nothing heavy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import CompiledModule, compile, export_cost_graphs, load
    from .backend import TensorTorrentBackend, tensortorrent_backend
    from .cost_graph import CostGraph
    from .errors import (
        BudgetParseError,
        CheckpointError,
        CopyTimeout,
        KvCacheTooLarge,
        NativePlannerUnavailable,
        OffloadCorruptError,
        OffloadError,
        OptionsError,
        PlanFormatError,
        PlanInfeasible,
        StalePlanError,
        TensorTorrentError,
        TensorTorrentWarning,
        UnsavedGraphError,
        UnsupportedNodeError,
        VerifyMismatch,
        VirtualDeviceOutOfMemory,
    )
    from .settings import Settings, VirtualDeviceSpec, parse_options
    from .units import parse_bytes
    from .weights.released import bind_checkpoint

__version__ = "0.1.0"

_HOME = {
    "CompiledModule": "api",
    "compile": "api",
    "export_cost_graphs": "api",
    "load": "api",
    "bind_checkpoint": "weights.released",
    "CheckpointError": "errors",
    "CopyTimeout": "errors",
    "KvCacheTooLarge": "errors",
    "OffloadCorruptError": "errors",
    "OffloadError": "errors",
    "PlanFormatError": "errors",
    "StalePlanError": "errors",
    "CostGraph": "cost_graph",
    "TensorTorrentBackend": "backend",
    "tensortorrent_backend": "backend",
    "BudgetParseError": "errors",
    "NativePlannerUnavailable": "errors",
    "OptionsError": "errors",
    "PlanInfeasible": "errors",
    "TensorTorrentError": "errors",
    "TensorTorrentWarning": "errors",
    "UnsavedGraphError": "errors",
    "UnsupportedNodeError": "errors",
    "VerifyMismatch": "errors",
    "VirtualDeviceOutOfMemory": "errors",
    "Settings": "settings",
    "VirtualDeviceSpec": "settings",
    "parse_options": "settings",
    "parse_bytes": "units",
}

__all__ = [
    "BudgetParseError",
    "CheckpointError",
    "CompiledModule",
    "CopyTimeout",
    "CostGraph",
    "KvCacheTooLarge",
    "NativePlannerUnavailable",
    "OffloadCorruptError",
    "OffloadError",
    "OptionsError",
    "PlanFormatError",
    "PlanInfeasible",
    "Settings",
    "StalePlanError",
    "TensorTorrentBackend",
    "TensorTorrentError",
    "TensorTorrentWarning",
    "UnsavedGraphError",
    "UnsupportedNodeError",
    "VerifyMismatch",
    "VirtualDeviceOutOfMemory",
    "VirtualDeviceSpec",
    "__version__",
    "bind_checkpoint",
    "compile",
    "export_cost_graphs",
    "load",
    "parse_bytes",
    "parse_options",
    "tensortorrent_backend",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])
