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
from .io.reader import DEFAULT_READ_THREADS
from .units import parse_bytes, parse_rate

Objective = Literal["latency", "memory", "throughput"]
Compiler = Literal["inductor", "eager"]
Replan = Literal["new", "error", "auto"]
ProfileChoice = Literal["auto", "nominal"]
OBJECTIVES, COMPILERS, REPLANS = get_args(Objective), get_args(Compiler), get_args(Replan)
PROFILE_ENV = "TENSORTORRENT_PROFILE"
PLAN_CACHE_ENV = "TENSORTORRENT_PLAN_CACHE"
DEFAULT_STREAM_CHUNK_BYTES = 16 * 2**20
"""The row chunks a disk plan is planned in by default; with ``stream_chunk_bytes="auto"``,
4 MiB ones too where the profile measured 4 MiB reads faster (``plan.chunk_sizes``)."""

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


def _option(default: Any = dataclasses.MISSING, *, help: str, **kw: Any) -> Any:
    """A settings field with its help text (what ``OPTION_HELP`` and errors show)."""
    return dataclasses.field(default=default, metadata={"help": help}, **kw)


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    return default if value is None else value != "0"


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything the backend was asked to do, parsed and checked: each field is an
    option of ``options={...}``, its default written here once, its help text beside it
    (``OPTION_HELP``, generated from these fields). Environment variables are read here
    too, as defaults: ``TENSORTORRENT_PROFILE`` (``profile``) and
    ``TENSORTORRENT_PLAN_CACHE`` (``plan_cache``)."""

    budgets: Mapping[str, int] = _option(
        default_factory=dict,
        help=(
            "dict device -> size, e.g. {'virtual:0': '64MiB', 'cpu': '8GiB'}: bytes each "
            "device may hold; a device without one gets its capacity (cpu: the machine's RAM)"
        ),
    )
    objective: Objective = _option(
        "latency",
        help="one of "
        + ", ".join(repr(x) for x in get_args(Objective))
        + ": the fastest forward, or the least accelerator memory within the memory slack "
        "of the fastest; 'throughput' chooses as 'latency' does (the fastest step at the "
        "batch called with) and explain() shows a decode graph's tokens/s at larger batches",
    )
    compiler: Compiler = _option(
        "inductor",
        help="one of "
        + ", ".join(repr(x) for x in get_args(Compiler))
        + " for host and CUDA segments; virtual devices always run eager",
    )
    devices: tuple[str, ...] | None = _option(
        None,
        help=f"list of compute devices the planner may use, each {DEVICE_FORMS} "
        "(default: every device seen or declared, and cpu)",
    )
    strict: bool = _option(
        False, help="bool: error instead of CPU fallback for nodes that cannot be placed"
    )
    virtual_devices: Mapping[str, VirtualDeviceSpec] = _option(
        default_factory=dict,
        help="dict 'virtual:N' -> {" + ", ".join(_VIRTUAL_KEYS) + "}: accelerators that run "
        "on the CPU with a memory ledger of their own",
    )
    profile: str = _option(
        default_factory=default_profile,
        help="'auto' (measured once per hardware, cached), 'nominal' (built-in rates) or the "
        f"path of a profile JSON (tensortorrent validate-hardware --output); default 'auto' "
        f"or ${PROFILE_ENV}",
    )
    plan: str | None = _option(
        None, help="path of a saved plan to reproduce instead of searching (CompiledModule.save)"
    )
    replan: Replan = _option(
        "new",
        help="what a saved plan does with a graph it lacks (one the saving session did not "
        "trace: a call of other shapes) and with one it no longer matches: 'new' (default: "
        "plan the first with a warning, refuse the second), 'error' (refuse both) or 'auto' "
        "(plan both, with a warning)",
    )
    offload_dir: str | None = _option(
        None,
        help="directory of the disk tier: weights the plan puts on disk are written there "
        "once and read back each run (default: <cache dir>/offload)",
    )
    checkpoint: str | None = _option(
        None,
        help="safetensors checkpoint with the weights of a model built on the meta device: a "
        "file, or a sharded one's index (*.safetensors.index.json) or directory",
    )
    stream_chunk_bytes: int | None = _option(
        DEFAULT_STREAM_CHUNK_BYTES,
        help="size, e.g. '16MiB' (the default), or 'auto': weights the plan puts on disk that "
        "are used only by linear layers are planned in row chunks of at most this size; "
        "'auto' plans 16 MiB chunks, and 4 MiB ones too where the profile measured 4 MiB "
        "reads faster, and keeps the plan predicted faster (opt-in: small models' 4 MiB "
        "plans ran up to 43% slower than predicted); 0 turns it off",
    )
    io_timeout_s: float = _option(
        300.0, help="seconds a call waits for one disk read or copy before failing (default 300)"
    )
    verify: bool = _option(
        False, help="bool: check the first call segment by segment against eager (a debug mode)"
    )
    read_threads: int = _option(
        DEFAULT_READ_THREADS,
        help=f"threads reading weights from disk (default {DEFAULT_READ_THREADS})",
    )
    prefetch_depth: int = _option(
        1, help="segments ahead a streamed weight is prefetched (default 1: a double buffer)"
    )
    memory_slack: float = _option(
        0.10,
        help="objective='memory': the fraction over the fastest plan's time it may take "
        "(default 0.1)",
    )
    planner_node_limit: int | None = _option(
        None,
        help="nodes the planner's local search may simulate (default: 32 simulations of "
        "the whole graph)",
    )
    planner_time_limit_s: float | None = _option(
        None,
        help="seconds the planner's search may take (default: none; a limit makes plans "
        "depend on the machine's speed)",
    )
    plan_cache: bool = _option(
        default_factory=lambda: _env_flag(PLAN_CACHE_ENV, True),
        help=f"bool: replay a plan searched before on this machine (default: True, or "
        f"${PLAN_CACHE_ENV} != '0')",
    )
    keep_heap: bool = _option(
        True,
        help="bool: from the first call, have glibc keep the host memory a call frees for "
        "the next one, not fault in fresh pages each call (default True; a disk tier "
        "bounds it instead; it is the process's setting)",
    )

    def fingerprint(self) -> str:
        """A stable text form, used as a cache key and in plan hashes."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True, default=str)

    def to_options(self) -> dict[str, Any]:
        """Options that :func:`parse_options` turns back into these settings (less the
        saved-plan keys), for writing into a saved plan."""
        options = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in _NOT_SAVED
        }
        options["budgets"] = dict(self.budgets)
        options["devices"] = list(self.devices) if self.devices is not None else None
        options["virtual_devices"] = {
            name: {
                "capacity": spec.capacity_bytes,
                "flops": spec.flops_per_s,
                "bandwidth": spec.link_bytes_per_s,
                "latency": spec.latency_s,
            }
            for name, spec in self.virtual_devices.items()
        }
        return options


# the options a saved plan does not record: where it came from, and what reading it does
_NOT_SAVED = frozenset({"plan", "replan", "plan_cache"})

OPTION_HELP: dict[str, str] = {f.name: f.metadata["help"] for f in dataclasses.fields(Settings)}
"""Each option's help text, from the fields of :class:`Settings`."""

SAVED_OPTIONS = frozenset(OPTION_HELP) - _NOT_SAVED
"""The options :meth:`Settings.to_options` writes into a saved plan."""


def _default(name: str) -> Any:
    """The default of the settings field ``name``."""
    field = next(f for f in dataclasses.fields(Settings) if f.name == name)
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


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


def _flag(merged: Mapping[str, Any], key: str) -> bool:
    value = merged.get(key, _default(key))
    if not isinstance(value, bool):
        raise OptionsError(f"option {key!r}: expected True or False, got {value!r}")
    return value


def _number(
    merged: Mapping[str, Any],
    key: str,
    what: str,
    minimum: float,
    inclusive: bool = True,
    optional: bool = False,
) -> Any:
    """The option ``key`` as a float of at least (or, not ``inclusive``, above) ``minimum``;
    ``None`` stays ``None`` where ``optional``."""
    value = merged.get(key, _default(key))
    if value is None and optional:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not (value >= minimum if inclusive else value > minimum) or value != value:
        bound = f"{'>=' if inclusive else '>'} {minimum:g}"
        raise OptionsError(f"option {key!r}: expected {what} {bound}, got {value!r}")
    try:
        return float(value)
    except OverflowError:  # an int past the largest float
        raise OptionsError(
            f"option {key!r}: expected {what}, got an integer of {value.bit_length()} bits, "
            "past the largest float"
        ) from None


def _count(
    merged: Mapping[str, Any], key: str, minimum: int, maximum: int, optional: bool = False
) -> Any:
    """The option ``key`` as an integer in ``[minimum, maximum]``; ``None`` stays ``None``
    where ``optional``."""
    value = merged.get(key, _default(key))
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise OptionsError(
            f"option {key!r}: expected an integer from {minimum} to {maximum}, got {value!r}"
        )
    return value


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

    strict, verify, plan_cache, keep_heap = (
        _flag(merged, key) for key in ("strict", "verify", "plan_cache", "keep_heap")
    )

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
        if not isinstance(checkpoint, (str, os.PathLike)) or not Path(checkpoint).exists():
            raise OptionsError(
                f"option 'checkpoint': no safetensors file, index or directory at {checkpoint!r}"
            )
        checkpoint = str(Path(checkpoint).resolve())

    chunk_option = merged.get("stream_chunk_bytes", _default("stream_chunk_bytes"))
    stream_chunk_bytes = (
        None
        if chunk_option is None or chunk_option == "auto"
        else parse_bytes(chunk_option, "option 'stream_chunk_bytes'")
    )
    io_timeout_s = _number(merged, "io_timeout_s", "seconds", minimum=0.0, inclusive=False)
    memory_slack = _number(merged, "memory_slack", "a fraction", minimum=0.0)
    time_limit = _number(merged, "planner_time_limit_s", "seconds", minimum=0.0, optional=True)
    read_threads = _count(merged, "read_threads", minimum=1, maximum=256)
    # the native planner's types: a u32 depth, a u64 node count
    prefetch_depth = _count(merged, "prefetch_depth", minimum=1, maximum=2**32 - 1)
    node_limit = _count(merged, "planner_node_limit", 1, 2**64 - 1, optional=True)

    return Settings(
        io_timeout_s=io_timeout_s,
        memory_slack=memory_slack,
        planner_time_limit_s=time_limit,
        read_threads=read_threads,
        prefetch_depth=prefetch_depth,
        planner_node_limit=node_limit,
        plan_cache=plan_cache,
        keep_heap=keep_heap,
        verify=verify,
        offload_dir=offload_dir,
        checkpoint=checkpoint,
        stream_chunk_bytes=stream_chunk_bytes,
        plan=str(Path(str(plan)).resolve()) if plan is not None else None,
        replan=cast(
            Replan, _choice(merged.get("replan", _default("replan")), "replan", get_args(Replan))
        ),
        budgets=budgets,
        objective=cast(
            Objective,
            _choice(
                merged.get("objective", _default("objective")), "objective", get_args(Objective)
            ),
        ),
        compiler=cast(
            Compiler,
            _choice(merged.get("compiler", _default("compiler")), "compiler", COMPILERS),
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
