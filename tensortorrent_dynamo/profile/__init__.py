"""What the machine can do: devices, their memory, compute rates, links and disk.

``host_profile(settings)`` is what the backend plans with. With ``profile="auto"`` (the
default) it is measured once per hardware fingerprint and cached as JSON
(:mod:`.cache`); ``tensortorrent validate-hardware`` measures everything and reports it
(:mod:`.measure`, :mod:`.disk`, :mod:`.report`).
"""

from .detect import detect_cuda_devices, detect_xpu_devices
from .host import (
    NOMINAL_CPU_FLOPS,
    NOMINAL_CPU_LATENCY_S,
    NOMINAL_CUDA_FLOPS,
    NOMINAL_CUDA_LATENCY_S,
    NOMINAL_CUDA_LINK_BYTES_PER_S,
    DeviceKind,
    DeviceProfile,
    HostProfile,
)
from .measure import measure_host
from .resolve import host_profile, load_profile_file, nominal_profile
from .schema import FORMAT_VERSION, Figure, Fingerprint, Measurements

__all__ = [
    "FORMAT_VERSION",
    "NOMINAL_CPU_FLOPS",
    "NOMINAL_CPU_LATENCY_S",
    "NOMINAL_CUDA_FLOPS",
    "NOMINAL_CUDA_LATENCY_S",
    "NOMINAL_CUDA_LINK_BYTES_PER_S",
    "DeviceKind",
    "DeviceProfile",
    "Figure",
    "Fingerprint",
    "HostProfile",
    "Measurements",
    "detect_cuda_devices",
    "detect_xpu_devices",
    "host_profile",
    "load_profile_file",
    "measure_host",
    "nominal_profile",
]
