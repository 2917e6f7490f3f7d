"""The ``tensortorrent`` command: ``doctor`` and ``demo``."""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Sequence


def doctor() -> int:
    """Print what this machine offers TensorTorrent and what is missing."""
    import psutil
    import torch

    from ._native import native_planner
    from .errors import NativePlannerUnavailable
    from .profile import detect_cuda_devices
    from .units import format_bytes

    mem = psutil.virtual_memory()
    print(f"python        {platform.python_version()}")
    print(f"torch         {torch.__version__} (CUDA runtime {torch.version.cuda or 'none'})")
    print(f"cpu           {psutil.cpu_count(logical=True)} logical cores")
    print(f"ram           {format_bytes(mem.total)} total, {format_bytes(mem.available)} available")
    cuda = detect_cuda_devices()
    if cuda:
        for name in cuda:
            props = torch.cuda.get_device_properties(int(name.split(":")[1]))
            print(f"{name:<13} {props.name}, {format_bytes(props.total_memory)}")
    else:
        print("accelerators  none seen (virtual:N devices can be declared through options)")
    problems = 0
    try:
        planner = native_planner()
        print(f"planner       native, version {planner.version()}")
    except NativePlannerUnavailable as exc:
        problems += 1
        print(f"planner       MISSING: {exc}")
    backends = torch._dynamo.list_backends()
    if "tensortorrent" in backends:
        print("backend       'tensortorrent' registered with torch.compile")
    else:
        problems += 1
        print("backend       NOT registered: reinstall the package (`pip install -e .`)")
    return 1 if problems else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tensortorrent", description="Plan heterogeneous execution for PyTorch models."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="what was detected, what is missing")
    sub.add_parser("demo", help="plan, explain and run a model larger than its budget")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        return doctor()
    from .demo import main as demo_main

    return demo_main()


if __name__ == "__main__":
    sys.exit(main())
