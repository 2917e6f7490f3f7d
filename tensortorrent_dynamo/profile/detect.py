"""Which devices this machine has, and the fingerprint that identifies its hardware."""

from __future__ import annotations

import functools
import platform
from pathlib import Path

import psutil
import torch

from .schema import Fingerprint


def detect_cuda_devices() -> list[str]:
    """Names of the CUDA devices torch can use (none when torch has no CUDA runtime).

    On a ROCm build of torch these are the AMD GPUs (``torch.version.hip`` is set).
    """
    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except RuntimeError:
        count = 0
    return [f"cuda:{i}" for i in range(count)]


def detect_xpu_devices() -> list[str]:
    """Names of the Intel XPU devices torch can use (the planner does not place on them yet)."""
    try:
        count = torch.xpu.device_count() if torch.xpu.is_available() else 0
    except (AttributeError, RuntimeError):
        count = 0
    return [f"xpu:{i}" for i in range(count)]


def cuda_properties(name: str) -> tuple[str, int]:
    """(model name, total memory in bytes) of the CUDA device ``cuda:N``."""
    props = torch.cuda.get_device_properties(int(name.split(":")[1]))
    return str(props.name), int(props.total_memory)


def gpu_runtime() -> str:
    """The GPU runtime this torch was built with, e.g. ``"CUDA 12.4"``, ``"ROCm 6.2"``."""
    if torch.version.hip:
        return f"ROCm {torch.version.hip}"
    if torch.version.cuda:
        return f"CUDA {torch.version.cuda}"
    return "none"


def cpu_model() -> str:
    """The CPU's model name (psutil does not report it; Linux has it in /proc/cpuinfo)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


@functools.cache
def current_fingerprint() -> Fingerprint:
    """The fingerprint of this machine (computed once per process)."""
    return Fingerprint(
        cpu_model=cpu_model(),
        cpu_cores=int(psutil.cpu_count(logical=True) or 1),
        ram_total_bytes=int(psutil.virtual_memory().total),
        gpus=tuple(cuda_properties(name) for name in detect_cuda_devices()),
        torch_version=str(torch.__version__),
    )
