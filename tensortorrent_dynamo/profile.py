"""What the machine can do: devices, their memory, compute rates and links.

This first version uses nominal rates (``profile="nominal"``); the measured,
cached profile replaces them without changing this interface.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import psutil
import torch

from .settings import Settings

DeviceKind = Literal["cpu", "cuda", "virtual"]

# Nominal rates, used when nothing was measured. They only need to rank plans sensibly.
NOMINAL_CPU_FLOPS = 5e10
NOMINAL_CPU_LATENCY_S = 5e-6
NOMINAL_CUDA_FLOPS = 5e13
NOMINAL_CUDA_LINK_BYTES_PER_S = 2.5e10
NOMINAL_CUDA_LATENCY_S = 1e-5


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """One compute device as the planner sees it.

    ``h2d``/``d2h`` rates are the link between host RAM and this device (infinite for the host).
    """

    name: str
    kind: DeviceKind
    memory_bytes: int
    flops_per_s: float
    h2d_bytes_per_s: float
    d2h_bytes_per_s: float
    latency_s: float

    @property
    def is_host(self) -> bool:
        return self.kind == "cpu"


@dataclasses.dataclass(frozen=True)
class HostProfile:
    """The devices of this machine, the host first, and where the figures came from."""

    devices: tuple[DeviceProfile, ...]
    source: str

    def device(self, name: str) -> DeviceProfile:
        for dev in self.devices:
            if dev.name == name:
                return dev
        seen = ", ".join(d.name for d in self.devices)
        raise KeyError(f"device {name!r} is not on this machine (devices seen: {seen})")


def detect_cuda_devices() -> list[str]:
    """Names of the CUDA devices torch can use (none when torch has no CUDA runtime)."""
    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except RuntimeError:
        count = 0
    return [f"cuda:{i}" for i in range(count)]


def host_profile(settings: Settings) -> HostProfile:
    """Build the profile the planner uses for ``settings`` (host first, then accelerators)."""
    inf = float("inf")
    devices = [
        DeviceProfile(
            name="cpu",
            kind="cpu",
            memory_bytes=int(psutil.virtual_memory().available),
            flops_per_s=NOMINAL_CPU_FLOPS,
            h2d_bytes_per_s=inf,
            d2h_bytes_per_s=inf,
            latency_s=NOMINAL_CPU_LATENCY_S,
        )
    ]
    for name in detect_cuda_devices():
        props = torch.cuda.get_device_properties(int(name.split(":")[1]))
        devices.append(
            DeviceProfile(
                name=name,
                kind="cuda",
                memory_bytes=int(props.total_memory),
                flops_per_s=NOMINAL_CUDA_FLOPS,
                h2d_bytes_per_s=NOMINAL_CUDA_LINK_BYTES_PER_S,
                d2h_bytes_per_s=NOMINAL_CUDA_LINK_BYTES_PER_S,
                latency_s=NOMINAL_CUDA_LATENCY_S,
            )
        )
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
    return HostProfile(devices=tuple(devices), source=settings.profile)
