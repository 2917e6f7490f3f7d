"""TensorTorrent: a torch.compile backend that plans heterogeneous execution on one machine.

``torch.compile(model, backend="tensortorrent", options={...})`` or
``tt.compile(model, example_inputs=(x,), budgets={...})``.
"""

from .api import CompiledModule, compile
from .backend import TensorTorrentBackend, tensortorrent_backend
from .errors import (
    BudgetParseError,
    NativePlannerUnavailable,
    OptionsError,
    PlanInfeasible,
    TensorTorrentError,
    TensorTorrentWarning,
    UnsupportedNodeError,
    VirtualDeviceOutOfMemory,
)
from .settings import Settings, VirtualDeviceSpec, parse_options
from .units import parse_bytes

__version__ = "0.1.0"

__all__ = [
    "BudgetParseError",
    "CompiledModule",
    "NativePlannerUnavailable",
    "OptionsError",
    "PlanInfeasible",
    "Settings",
    "TensorTorrentBackend",
    "TensorTorrentError",
    "TensorTorrentWarning",
    "UnsupportedNodeError",
    "VirtualDeviceOutOfMemory",
    "VirtualDeviceSpec",
    "__version__",
    "compile",
    "parse_bytes",
    "parse_options",
    "tensortorrent_backend",
]
