"""The one frozen settings object every stage reads, and the parsing of ``options=``.

Defaults are named in one place: the field defaults of :class:`Settings`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, cast, get_args

from .errors import OptionsError
from .units import parse_bytes, parse_rate

Objective = Literal["latency", "memory", "throughput"]
Compiler = Literal["inductor", "eager"]
Replan = Literal["error", "auto"]
ProfileChoice = Literal["auto", "nominal"]
PROFILE_ENV = "TENSORTORRENT_PROFILE"
DEFAULT_STREAM_CHUNK_BYTES = 16 * 2**20

_DEVICE_RE = re.compile(r"^(cpu|cuda:\d+|virtual:\d+)$")
DEVICE_FORMS = "'cpu', 'cuda:N' (or 'cuda'), 'virtual:N'"


def default_profile() -> str:
    """The ``profile`` used when the options name none: ``$TENSORTORRENT_PROFILE`` or ``"auto"``."""
    return os.environ.get(PROFILE_ENV) or "auto"


@dataclasses.dataclass(frozen=True)
class VirtualDeviceSpec:
    """A virtual accelerator: runs on the CPU with its own memory ledger and real copies.

    Attributes:
        capacity_bytes: memory of the device; allocations beyond it fail like a real OOM.
        flops_per_s: compute rate the planner assumes for it.
        link_bytes_per_s: host<->device bandwidth the planner assumes, each direction.
        latency_s: fixed cost per operation the planner assumes.
    """

    capacity_bytes: int
    flops_per_s: float = 2e12
    link_bytes_per_s: float = 16e9
    latency_s: float = 10e-6


_VIRTUAL_KEYS = {
    "capacity": "memory of the device, e.g. '64MiB' (default: its budget)",
    "flops": "FLOP/s the planner assumes, e.g. 2e12 or '2T' (default 2T)",
    "bandwidth": "host<->device bytes/s, e.g. '16GB' (default 16 GB/s)",
    "latency": "seconds per operation (default 1e-5)",
}


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything the backend was asked to do, parsed and checked.

    Attributes:
        budgets: bytes each device or tier may hold, e.g. ``{"virtual:0": 67108864}``.
            Devices without an entry get their capacity (for ``cpu``: the machine's RAM).
        objective: ``"latency"`` (fastest forward), ``"memory"`` (least accelerator
            memory within a 10% latency slack) or ``"throughput"``.
        compiler: ``"inductor"`` or ``"eager"`` for host and CUDA subgraphs; virtual
            devices always run eager.
        devices: compute devices the planner may use; ``None`` means every device seen
            or declared plus ``cpu``. The host always keeps parameters and runs nodes
            that cannot run elsewhere.
        strict: raise instead of falling back to the CPU for nodes that cannot be
            costed or placed.
        virtual_devices: declared virtual accelerators by name (``virtual:N``).
        profile: which host profile to plan with: ``"auto"`` (this machine's measured
            profile, cached per hardware fingerprint; the first use measures a short one in
            a few seconds), ``"nominal"`` (built-in rates) or the path of a profile JSON
            written by ``tensortorrent validate-hardware --output``. The default is
            ``"auto"``, or the value of the environment variable ``TENSORTORRENT_PROFILE``.
        plan: path of a saved plan (``CompiledModule.save``) to reproduce instead of
            searching; each graph must match the graph and hardware it was saved for.
        replan: what a saved plan that no longer matches does: ``"error"`` refuses it,
            ``"auto"`` plans again and warns why.
        offload_dir: directory of the disk tier: parameters whose home the plan makes disk
            are written there once (safetensors shards with a manifest of checksums) and read
            back each run. ``None`` means ``<cache dir>/offload``.
        checkpoint: path of a safetensors file holding the weights of a model built on the
            meta device; its parameters stay on disk and are read from this file.
        stream_chunk_bytes: weights read from disk that are larger than this, and used only
            as the weight of linear layers, are split into row chunks of at most this size,
            each planned (kept in RAM or read each run) on its own (``chunking.py``); 0
            turns it off.
        io_timeout_s: how long a call waits for one read from disk or one copy between
            devices before it gives up with an error naming it (a hung disk must not hang
            the caller).
        verify: check the first call of each graph segment by segment against eager on the
            same inputs, and raise ``VerifyMismatch`` naming the first segment (its nodes
            and modules) whose outputs differ (``verify.py``; a debug mode: it holds every
            intermediate value).
    """

    budgets: Mapping[str, int] = dataclasses.field(default_factory=dict)
    objective: Objective = "latency"
    compiler: Compiler = "inductor"
    devices: tuple[str, ...] | None = None
    strict: bool = False
    virtual_devices: Mapping[str, VirtualDeviceSpec] = dataclasses.field(default_factory=dict)
    profile: str = dataclasses.field(default_factory=default_profile)
    plan: str | None = None
    replan: Replan = "error"
    offload_dir: str | None = None
    checkpoint: str | None = None
    stream_chunk_bytes: int = DEFAULT_STREAM_CHUNK_BYTES
    io_timeout_s: float = 300.0
    verify: bool = False

    def fingerprint(self) -> str:
        """A stable text form, used as a cache key and in plan hashes."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True, default=str)

    def to_options(self) -> dict[str, Any]:
        """Options that :func:`parse_options` turns back into these settings (less the
        saved-plan keys), for writing into a saved plan."""
        return {
            "budgets": dict(self.budgets),
            "objective": self.objective,
            "compiler": self.compiler,
            "devices": list(self.devices) if self.devices is not None else None,
            "strict": self.strict,
            "virtual_devices": {
                name: {
                    "capacity": spec.capacity_bytes,
                    "flops": spec.flops_per_s,
                    "bandwidth": spec.link_bytes_per_s,
                    "latency": spec.latency_s,
                }
                for name, spec in self.virtual_devices.items()
            },
            "profile": self.profile,
            "offload_dir": self.offload_dir,
            "checkpoint": self.checkpoint,
            "stream_chunk_bytes": self.stream_chunk_bytes,
            "io_timeout_s": self.io_timeout_s,
            "verify": self.verify,
        }


OPTION_HELP: dict[str, str] = {
    "budgets": "dict device -> size, e.g. {'virtual:0': '64MiB', 'cpu': '8GiB'}",
    "objective": "one of " + ", ".join(repr(x) for x in get_args(Objective)),
    "compiler": "one of " + ", ".join(repr(x) for x in get_args(Compiler)),
    "devices": f"list of compute devices, each {DEVICE_FORMS}",
    "strict": "bool: error instead of CPU fallback for nodes that cannot be placed",
    "virtual_devices": "dict 'virtual:N' -> {" + ", ".join(_VIRTUAL_KEYS) + "}",
    "plan": "path of a saved plan to reproduce (CompiledModule.save)",
    "replan": "when a saved plan no longer matches: 'error' (default) or 'auto'",
    "offload_dir": "directory of the disk tier (default: <cache dir>/offload)",
    "checkpoint": "safetensors file with the weights of a model built on the meta device",
    "stream_chunk_bytes": (
        "size, e.g. '16MiB' (the default): weights read from disk are split into row chunks "
        "of at most this size; 0 turns it off"
    ),
    "io_timeout_s": (
        "seconds a call waits for one disk read or copy before failing "
        f"(default {Settings.io_timeout_s:g})"
    ),
    "verify": "bool: check the first call segment by segment against eager (a debug mode)",
    "profile": (
        "'auto' (measured, cached), 'nominal' (built-in rates) or the path of a profile JSON; "
        f"default 'auto' or ${PROFILE_ENV}"
    ),
}


def _profile(value: object, where: str) -> str:
    """``"auto"``, ``"nominal"``, or the absolute path of an existing profile file."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise OptionsError(f"{where}: expected a string, {OPTION_HELP['profile']}; got {value!r}")
    if value in get_args(ProfileChoice):
        return value
    path = os.path.abspath(os.path.expanduser(value))
    if not os.path.isfile(path):
        choices = " or ".join(repr(x) for x in get_args(ProfileChoice))
        raise OptionsError(
            f"{where}: {value!r} is neither {choices} nor an existing profile file "
            f"(no file at {path}); write one with `tensortorrent validate-hardware --output FILE`"
        )
    return path


def _device_name(name: object, where: str) -> str:
    if not isinstance(name, str):
        raise OptionsError(f"{where}: device names are strings ({DEVICE_FORMS}), got {name!r}")
    canonical = "cuda:0" if name == "cuda" else name
    if not _DEVICE_RE.match(canonical):
        raise OptionsError(f"{where}: unknown device {name!r}; valid forms are {DEVICE_FORMS}")
    return canonical


def _choice(value: object, key: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise OptionsError(
            f"option {key!r}: got {value!r}; valid values are {', '.join(map(repr, allowed))}"
        )
    return str(value)


def _virtual_spec(name: str, raw: object, budget: int | None) -> VirtualDeviceSpec:
    where = f"virtual_devices[{name!r}]"
    if not isinstance(raw, Mapping):
        raise OptionsError(f"{where}: expected a dict with keys {', '.join(_VIRTUAL_KEYS)}")
    unknown = sorted(set(raw) - set(_VIRTUAL_KEYS))
    if unknown:
        valid = "; ".join(f"{k}: {v}" for k, v in _VIRTUAL_KEYS.items())
        raise OptionsError(f"{where}: unknown key(s) {unknown}; valid keys are {valid}")
    if "capacity" in raw:
        capacity = parse_bytes(raw["capacity"], f"{where}['capacity']")
    elif budget is not None:
        capacity = budget
    else:
        raise OptionsError(f"{where}: give a 'capacity' or a budget for {name!r}")
    defaults = VirtualDeviceSpec(capacity_bytes=capacity)
    latency = raw.get("latency", defaults.latency_s)
    if isinstance(latency, bool) or not isinstance(latency, (int, float)) or latency < 0:
        raise OptionsError(f"{where}['latency']: expected seconds >= 0, got {latency!r}")
    return VirtualDeviceSpec(
        capacity_bytes=capacity,
        flops_per_s=parse_rate(raw.get("flops", defaults.flops_per_s), f"{where}['flops']"),
        link_bytes_per_s=parse_rate(
            raw.get("bandwidth", defaults.link_bytes_per_s), f"{where}['bandwidth']"
        ),
        latency_s=float(latency),
    )


def parse_options(options: Mapping[str, Any] | None = None, **overrides: Any) -> Settings:
    """Turn the user's ``options`` dict (plus keyword overrides) into :class:`Settings`.

    Raises :class:`OptionsError` naming the bad key or value and listing what is valid.
    """
    merged: dict[str, Any] = dict(options or {})
    merged.update(overrides)
    unknown = sorted(set(merged) - set(OPTION_HELP))
    if unknown:
        valid = "\n".join(f"  {k}: {v}" for k, v in OPTION_HELP.items())
        raise OptionsError(f"unknown option(s) {unknown}; valid options are:\n{valid}")

    raw_budgets = merged.get("budgets", {})
    if not isinstance(raw_budgets, Mapping):
        raise OptionsError(f"option 'budgets': expected a dict, {OPTION_HELP['budgets']}")
    budgets: dict[str, int] = {}
    for dev, size in raw_budgets.items():
        name = _device_name(dev, "option 'budgets'")
        budgets[name] = parse_bytes(size, f"budget for {name}")

    raw_virtual = merged.get("virtual_devices", {})
    if not isinstance(raw_virtual, Mapping):
        raise OptionsError(f"option 'virtual_devices': {OPTION_HELP['virtual_devices']}")
    virtual: dict[str, VirtualDeviceSpec] = {}
    for dev, spec in raw_virtual.items():
        name = _device_name(dev, "option 'virtual_devices'")
        if not name.startswith("virtual:"):
            raise OptionsError(f"option 'virtual_devices': {name!r} is not a 'virtual:N' name")
        virtual[name] = _virtual_spec(name, spec, budgets.get(name))
    for name, budget in budgets.items():
        if name.startswith("virtual:") and name not in virtual:
            virtual[name] = VirtualDeviceSpec(capacity_bytes=budget)

    devices: tuple[str, ...] | None = None
    if merged.get("devices") is not None:
        raw_devices = merged["devices"]
        if isinstance(raw_devices, str) or not isinstance(raw_devices, (list, tuple)):
            raise OptionsError(f"option 'devices': expected a list, {OPTION_HELP['devices']}")
        devices = tuple(_device_name(d, "option 'devices'") for d in raw_devices)
        if not devices:
            raise OptionsError("option 'devices': the list is empty; name at least one device")
        for d in devices:
            if d.startswith("virtual:") and d not in virtual:
                raise OptionsError(
                    f"option 'devices': {d!r} is not declared; give it a budget "
                    f"(budgets={{{d!r}: '64MiB'}}) or declare it in 'virtual_devices'"
                )

    strict = merged.get("strict", False)
    if not isinstance(strict, bool):
        raise OptionsError(f"option 'strict': expected True or False, got {strict!r}")
    verify = merged.get("verify", False)
    if not isinstance(verify, bool):
        raise OptionsError(f"option 'verify': expected True or False, got {verify!r}")

    plan = merged.get("plan")
    if plan is not None and not Path(str(plan)).is_file():
        raise OptionsError(f"option 'plan': no saved plan at {plan!r}")

    offload_dir = merged.get("offload_dir")
    if offload_dir is not None:
        if not isinstance(offload_dir, (str, os.PathLike)):
            raise OptionsError(f"option 'offload_dir': {OPTION_HELP['offload_dir']}")
        offload_dir = str(Path(offload_dir).expanduser().resolve())
    checkpoint = merged.get("checkpoint")
    if checkpoint is not None:
        if not isinstance(checkpoint, (str, os.PathLike)) or not Path(checkpoint).is_file():
            raise OptionsError(f"option 'checkpoint': no safetensors file at {checkpoint!r}")
        checkpoint = str(Path(checkpoint).resolve())

    stream_chunk_bytes = parse_bytes(
        merged.get("stream_chunk_bytes", DEFAULT_STREAM_CHUNK_BYTES), "option 'stream_chunk_bytes'"
    )

    io_timeout_s = merged.get("io_timeout_s", Settings.io_timeout_s)
    if (
        isinstance(io_timeout_s, bool)
        or not isinstance(io_timeout_s, (int, float))
        or not io_timeout_s > 0
    ):
        raise OptionsError(f"option 'io_timeout_s': expected seconds > 0, got {io_timeout_s!r}")

    return Settings(
        io_timeout_s=float(io_timeout_s),
        verify=verify,
        offload_dir=offload_dir,
        checkpoint=checkpoint,
        stream_chunk_bytes=stream_chunk_bytes,
        plan=str(Path(str(plan)).resolve()) if plan is not None else None,
        replan=cast(Replan, _choice(merged.get("replan", "error"), "replan", get_args(Replan))),
        budgets=budgets,
        objective=cast(
            Objective, _choice(merged.get("objective", "latency"), "objective", get_args(Objective))
        ),
        compiler=cast(
            Compiler, _choice(merged.get("compiler", "inductor"), "compiler", get_args(Compiler))
        ),
        devices=devices,
        strict=strict,
        virtual_devices=virtual,
        profile=(
            _profile(merged["profile"], "option 'profile'")
            if "profile" in merged
            else _profile(default_profile(), f"environment variable {PROFILE_ENV}")
        ),
    )
